//! `graceful-drain status [NODE] [-o text|json|yaml]`: an operator's view of the install,
//! top first — which release it reports on, whether evictions reach that release's webhook
//! (its protection probe, recorded on its deleter Lease), who holds that Lease, the node
//! agents per node, the isolated pods and who removes each, which lifecycle APIs the
//! cluster serves, the LifecycleEvents, the nodes' lifecycle conditions and the
//! maintenance hooks' last runs.
//!
//! [`fetch`] first finds the releases by the chart's labels ([`release`]; `--namespace`
//! and `--release` narrow the search, and several releases are each reported), then reads
//! the objects (one list or get per part; a part the user may not read is shown as
//! unavailable with the reason, a LifecycleEvent that does not parse is named and left
//! out, any other failure names its object and fails); [`report::report`] turns them into
//! one serializable [`Report`] without I/O; [`format()`] prints it as text ([`text`]),
//! JSON or YAML.

pub mod release;
pub mod report;
pub mod text;

#[cfg(test)]
mod tests;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;

use super::events::{self, Listed};
use super::{Error, Result};
use graceful_drain_core::labels::DRAINING_LABEL;
pub use release::{AGENT_SELECTOR, Release, WEBHOOK_SELECTOR};
pub use report::Report;

/// Where the webhook's Lease and the node agents are looked for when no release carries
/// the chart's labels and `--namespace` names none.
pub const DEFAULT_NAMESPACE: &str = "graceful-drain";

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

/// Where `status` looks for the install.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Only this namespace (`--namespace`); every namespace when `None`.
    pub namespace: Option<String>,
    /// Only the release of this name (`--release`).
    pub release: Option<String>,
}

impl Scope {
    fn place(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "in any namespace".into(),
        }
    }

    fn api<K>(&self, client: &kube::Client) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
}

/// A part read from the cluster, or why the user may not read it.
pub type Fetch<T> = std::result::Result<T, String>;

/// One release's parts as read.
#[derive(Clone, Debug)]
pub struct FetchedRelease {
    /// The release and where its parts are.
    pub release: Release,
    /// Its webhook's deleter Lease (`None`: it does not exist).
    pub lease: Fetch<Option<Lease>>,
    /// Its node agents' pods.
    pub agents: Fetch<Vec<Pod>>,
}

/// Everything the report is built from.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// Only this node.
    pub node: Option<String>,
    /// The release reported on first: the only one found, the first by namespace and
    /// name of several, or the install namespace's defaults when none carries the labels.
    pub release: FetchedRelease,
    /// The other releases found.
    pub other_releases: Vec<FetchedRelease>,
    /// Pods with the draining label, in every namespace.
    pub isolated: Fetch<Vec<Pod>>,
    /// The nodes (just `node`, when given).
    pub nodes: Fetch<Vec<Node>>,
    /// The LifecycleEvents and the ones that do not parse (`None`: the CRDs are not
    /// installed).
    pub events: Fetch<Option<Listed>>,
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

/// Reads every part of the report for `node` (or every node) from the releases in
/// `scope`.
pub async fn fetch(client: &kube::Client, scope: &Scope, node: Option<&str>) -> Result<Fetched> {
    let (first, others) = find_releases(client, scope).await?;
    let release = fetch_release(client, first).await?;
    let mut other_releases = Vec::new();
    for other in others {
        other_releases.push(fetch_release(client, other).await?);
    }
    let draining = ListParams::default().labels(DRAINING_LABEL);
    let isolated = forbidden(
        format!("list pods -l {DRAINING_LABEL} in all namespaces"),
        Api::<Pod>::all(client.clone()).list(&draining),
    )
    .await?
    .map(|l| l.items);
    let events = match events::list(client).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        result => forbidden("list lifecycleevents".into(), async { result })
            .await?
            .map(Some),
    };
    Ok(Fetched {
        node: node.map(str::to_string),
        release,
        other_releases,
        isolated,
        nodes: fetch_nodes(client, node).await?,
        events,
        served: served(client).await,
    })
}

/// The releases in `scope` by their labels, first by namespace and name; where none
/// carries them (or the user may not list workloads), the defaults of the install
/// namespace. A `--release` that is not found is an error.
async fn find_releases(client: &kube::Client, scope: &Scope) -> Result<(Release, Vec<Release>)> {
    let place = scope.place();
    let only = scope.release.as_deref();
    let webhooks = release::selector(WEBHOOK_SELECTOR, only);
    let deployments = forbidden(
        format!("list deployments -l {webhooks} {place}"),
        scope
            .api::<Deployment>(client)
            .list(&ListParams::default().labels(&webhooks)),
    )
    .await?;
    let agents = release::selector(AGENT_SELECTOR, only);
    let daemonsets = forbidden(
        format!("list daemonsets -l {agents} {place}"),
        scope
            .api::<DaemonSet>(client)
            .list(&ListParams::default().labels(&agents)),
    )
    .await?;
    let note = match (deployments, daemonsets) {
        (Ok(deployments), Ok(daemonsets)) => {
            let mut found = release::discover(&deployments.items, &daemonsets.items).into_iter();
            if let Some(first) = found.next() {
                return Ok((first, found.collect()));
            }
            if let Some(name) = only {
                return Err(Error::ReleaseNotFound {
                    release: name.to_string(),
                    place,
                    selector: release::selector(release::NAME_LABEL, only),
                });
            }
            format!(
                "no Deployment or DaemonSet labelled {} {place}",
                release::NAME_LABEL
            )
        }
        (Err(reason), _) | (_, Err(reason)) => reason,
    };
    let namespace = scope.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
    Ok((release::fallback(namespace, note), Vec::new()))
}

/// Reads a release's Lease and node agents.
async fn fetch_release(client: &kube::Client, release: Release) -> Result<FetchedRelease> {
    let lease = match &release.lease {
        Some((ns, name)) => {
            forbidden(
                format!("read Lease {ns}/{name}"),
                Api::<Lease>::namespaced(client.clone(), ns).get_opt(name),
            )
            .await?
        }
        None => Err(format!(
            "release {} has no webhook Deployment ({WEBHOOK_SELECTOR})",
            release.describe()
        )),
    };
    let agents = match &release.agent_selector {
        Some(selector) => forbidden(
            format!("list pods -l {selector} in namespace {}", release.namespace),
            Api::<Pod>::namespaced(client.clone(), &release.namespace)
                .list(&ListParams::default().labels(selector)),
        )
        .await?
        .map(|l| l.items),
        None => Err(format!(
            "release {} has no node-agent DaemonSet ({AGENT_SELECTOR})",
            release.describe()
        )),
    };
    Ok(FetchedRelease {
        release,
        lease,
        agents,
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

/// The text report for `node` (or every node) of the releases found in any namespace, as
/// of `now`.
pub async fn render(client: &kube::Client, node: Option<&str>, now: Timestamp) -> Result<String> {
    let fetched = fetch(client, &Scope::default(), node).await?;
    Ok(text::text(&report::report(&fetched, now)))
}
