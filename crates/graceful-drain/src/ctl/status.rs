//! `graceful-drain status [NODE] [-o text|json|yaml]`: an operator's view of the install,
//! top first — whether evictions reach the webhook (its protection probe, recorded on its
//! deleter Lease), who holds that Lease, the isolated pods and who removes each, the node
//! agents per node, which lifecycle APIs the cluster serves, the LifecycleEvents, the
//! nodes' lifecycle conditions and the maintenance hooks' last runs.
//!
//! [`fetch`] reads the objects (one list or get per part; a part the user may not read is
//! shown as unavailable with the reason, any other failure names its object and fails);
//! [`report::report`] turns them into one serializable [`Report`] without I/O; [`format()`]
//! prints it as text ([`text`]), JSON or YAML.

pub mod report;
pub mod text;

#[cfg(test)]
mod tests;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;

use super::{Error, Result};
use graceful_drain_core::labels::DRAINING_LABEL;
use graceful_drain_core::lifecycle::LifecycleEvent;
use graceful_drain_webhook::lease::DEFAULT_NAME as LEASE_NAME;
pub use report::Report;

/// The namespace the chart is installed in unless `--namespace` says otherwise.
pub const DEFAULT_NAMESPACE: &str = "graceful-drain";
/// The labels of the node agents' DaemonSet pods (charts/graceful-drain/templates/
/// _helpers.tpl `graceful-drain.selectorLabels` with component `agent`; the release name
/// is left out so any release matches, and a `nameOverride` is not followed).
pub const AGENT_SELECTOR: &str =
    "app.kubernetes.io/name=graceful-drain,app.kubernetes.io/component=agent";

/// Our lifecycle API.
pub const OURS: &str = "lifecycle.graceful-drain.io/v1alpha1";
/// Kubernetes' EvictionRequest API (KEP-4563), built in since 1.37 behind a feature gate.
pub const UPSTREAM: &str = "lifecycle.k8s.io/v1alpha1";

/// How `status` prints its report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Lines and tables.
    #[default]
    Text,
    /// The report as pretty-printed JSON.
    Json,
    /// The report as YAML.
    Yaml,
}

/// A part read from the cluster, or why the user may not read it.
pub type Fetch<T> = std::result::Result<T, String>;

/// Everything the report is built from.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The install namespace (where the Lease and the agents live).
    pub namespace: String,
    /// Only this node.
    pub node: Option<String>,
    /// The webhook's deleter Lease (`None`: it does not exist).
    pub lease: Fetch<Option<Lease>>,
    /// Pods with the draining label, in every namespace.
    pub isolated: Fetch<Vec<Pod>>,
    /// The node agents' pods.
    pub agents: Fetch<Vec<Pod>>,
    /// The nodes (just `node`, when given).
    pub nodes: Fetch<Vec<Node>>,
    /// The LifecycleEvents (`None`: the CRDs are not installed).
    pub events: Fetch<Option<Vec<LifecycleEvent>>>,
    /// Each lifecycle API group version with its resources (`None`: not served).
    pub served: Vec<(&'static str, Option<Vec<String>>)>,
}

/// Runs one read; a 403 is the user's missing permission for this part: shown, not fatal.
async fn forbidden<T>(
    what: String,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<Fetch<T>> {
    match call.await {
        Ok(value) => Ok(Ok(value)),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Err(format!("{what}: {}", s.message))),
        Err(source) => Err(Error::kube(what, source)),
    }
}

/// Reads every part of the report for `node` (or every node) from the install in
/// `namespace`.
pub async fn fetch(client: &kube::Client, namespace: &str, node: Option<&str>) -> Result<Fetched> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = forbidden(
        format!("read Lease {namespace}/{LEASE_NAME}"),
        leases.get_opt(LEASE_NAME),
    )
    .await?;
    let draining = ListParams::default().labels(DRAINING_LABEL);
    let isolated = forbidden(
        format!("list pods -l {DRAINING_LABEL} in all namespaces"),
        Api::<Pod>::all(client.clone()).list(&draining),
    )
    .await?
    .map(|l| l.items);
    let agents = forbidden(
        format!("list pods -l {AGENT_SELECTOR} in namespace {namespace}"),
        Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(AGENT_SELECTOR)),
    )
    .await?
    .map(|l| l.items);
    let events = match Api::<LifecycleEvent>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        result => forbidden("list lifecycleevents".into(), async { result })
            .await?
            .map(|l| Some(l.items)),
    };
    Ok(Fetched {
        namespace: namespace.to_string(),
        node: node.map(str::to_string),
        lease,
        isolated,
        agents,
        nodes: fetch_nodes(client, node).await?,
        events,
        served: served(client).await,
    })
}

async fn fetch_nodes(client: &kube::Client, node: Option<&str>) -> Result<Fetch<Vec<Node>>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(name) = node else {
        let list = forbidden("list nodes".into(), nodes.list(&ListParams::default())).await?;
        return Ok(list.map(|l| l.items));
    };
    match forbidden(format!("get node {name}"), nodes.get_opt(name)).await? {
        Ok(Some(n)) => Ok(Ok(vec![n])),
        Ok(None) => Err(Error::NodeNotFound {
            node: name.to_string(),
        }),
        Err(reason) => Ok(Err(reason)),
    }
}

/// Which lifecycle API group versions discovery lists (any failure counts as not served).
async fn served(client: &kube::Client) -> Vec<(&'static str, Option<Vec<String>>)> {
    let mut served = Vec::new();
    for group_version in [OURS, UPSTREAM] {
        let resources = client
            .list_api_group_resources(group_version)
            .await
            .ok()
            .map(|list| list.resources.into_iter().map(|r| r.name).collect());
        served.push((group_version, resources));
    }
    served
}

/// The report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// As JSON.
    #[error("write the status report as JSON")]
    Json(#[source] serde_json::Error),
    /// As YAML.
    #[error("write the status report as YAML")]
    Yaml(#[source] serde_saphyr::ser::Error),
}

/// The report as `output`.
pub fn format(report: &Report, output: Output) -> Result<String, FormatError> {
    match output {
        Output::Text => Ok(text::text(report)),
        Output::Json => serde_json::to_string_pretty(report)
            .map(|s| s + "\n")
            .map_err(FormatError::Json),
        Output::Yaml => serde_saphyr::to_string(report).map_err(FormatError::Yaml),
    }
}

/// The text report for `node` (or every node) of the install in [`DEFAULT_NAMESPACE`], as
/// of `now`.
pub async fn render(client: &kube::Client, node: Option<&str>, now: Timestamp) -> Result<String> {
    let fetched = fetch(client, DEFAULT_NAMESPACE, node).await?;
    Ok(text::text(&report::report(&fetched, now)))
}
