//! Finding the graceful-drain releases `status` reports on, by the labels the chart puts on
//! its workloads (charts/graceful-drain/templates/_helpers.tpl: `graceful-drain.labels`
//! and `graceful-drain.componentLabels`): the webhook Deployment carries
//! `app.kubernetes.io/component=webhook`, the node agents' DaemonSet `…=agent`, both
//! `app.kubernetes.io/name=graceful-drain` and the Helm release name in
//! `app.kubernetes.io/instance`. A release is a namespace and that instance; a release
//! renamed with `nameOverride` is not found (nor was it before by name).
//!
//! Everything here is pure: [`discover`] groups listed objects into [`Release`]s and reads
//! where each webhook keeps its deleter Lease from its own command line; [`fallback`] is
//! the install namespace's defaults where nothing carries the labels (manifests of one's
//! own, or a cluster the user may not list workloads in).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Container;
use kube::ResourceExt;
use serde::Serialize;

use graceful_drain_webhook::lease::DEFAULT_NAME as LEASE_NAME;

/// The chart's name label and value.
pub const NAME_LABEL: &str = "app.kubernetes.io/name=graceful-drain";
/// The label that holds the Helm release name.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The webhook Deployment's labels.
pub const WEBHOOK_SELECTOR: &str =
    "app.kubernetes.io/name=graceful-drain,app.kubernetes.io/component=webhook";
/// The node agents' labels (their DaemonSet's and its pods'; the release name is left out,
/// so any release matches).
pub const AGENT_SELECTOR: &str =
    "app.kubernetes.io/name=graceful-drain,app.kubernetes.io/component=agent";
/// The webhook's `--lease-namespace` default (crates/graceful-drain-webhook `Args`).
const WEBHOOK_LEASE_NAMESPACE: &str = "graceful-drain";

/// One install of graceful-drain and where its parts are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Release {
    /// Its namespace.
    pub namespace: String,
    /// The Helm release name (`app.kubernetes.io/instance`); absent when the release was
    /// not found by its labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The webhook's Deployment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// The node agents' DaemonSet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Why no release was found by its labels, when the namespace's defaults are shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The webhook's deleter Lease, `(namespace, name)`.
    #[serde(skip)]
    pub lease: Option<(String, String)>,
    /// The label selector of the node agents' pods.
    #[serde(skip)]
    pub agent_selector: Option<String>,
}

impl Release {
    /// `name in namespace ns`, or `namespace ns` when it has no name.
    pub fn describe(&self) -> String {
        match &self.name {
            Some(name) => format!("{name} in namespace {}", self.namespace),
            None => format!("namespace {}", self.namespace),
        }
    }
}

/// The label selector of `component`'s workloads, of release `release` if given.
pub fn selector(component_selector: &str, release: Option<&str>) -> String {
    match release {
        Some(name) => format!("{component_selector},{INSTANCE_LABEL}={name}"),
        None => component_selector.to_string(),
    }
}

/// The releases the webhook Deployments and agent DaemonSets (listed by
/// [`WEBHOOK_SELECTOR`] and [`AGENT_SELECTOR`]) make up, by namespace and name.
pub fn discover(deployments: &[Deployment], daemonsets: &[DaemonSet]) -> Vec<Release> {
    let mut releases = BTreeMap::new();
    for d in deployments {
        let release = release_of(&mut releases, d);
        release.webhook = Some(d.name_any());
        release.lease = Some(lease_of(d));
    }
    for ds in daemonsets {
        let release = release_of(&mut releases, ds);
        release.agent = Some(ds.name_any());
        release.agent_selector = Some(pod_selector(ds));
    }
    releases.into_values().collect()
}

/// The release `object` belongs to: its namespace and instance label (its own name
/// without one).
fn release_of<'a, K: ResourceExt>(
    releases: &'a mut BTreeMap<(String, String), Release>,
    object: &K,
) -> &'a mut Release {
    let namespace = object.namespace().unwrap_or_default();
    let instance = object
        .labels()
        .get(INSTANCE_LABEL)
        .cloned()
        .unwrap_or_else(|| object.name_any());
    releases
        .entry((namespace.clone(), instance.clone()))
        .or_insert_with(|| Release {
            namespace,
            name: Some(instance),
            webhook: None,
            agent: None,
            note: None,
            lease: None,
            agent_selector: None,
        })
}

/// What `status` showed before releases were found by their labels: the Lease of the
/// webhook's default name and the pods labelled as agents, in `namespace`.
pub fn fallback(namespace: &str, note: String) -> Release {
    Release {
        namespace: namespace.to_string(),
        name: None,
        webhook: None,
        agent: None,
        note: Some(note),
        lease: Some((namespace.to_string(), LEASE_NAME.to_string())),
        agent_selector: Some(AGENT_SELECTOR.to_string()),
    }
}

/// Where the webhook of `deployment` keeps its deleter Lease, read from its command line
/// as the webhook reads it: `--lease-name` (default [`LEASE_NAME`]; the chart passes the
/// Deployment's name) and `--lease-namespace`, else `GRACEFUL_DRAIN_NAMESPACE` (the chart
/// sets it to the pod's namespace), else the webhook's default.
pub fn lease_of(deployment: &Deployment) -> (String, String) {
    let own_namespace = deployment.namespace().unwrap_or_default();
    let containers: &[Container] = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let webhook = containers
        .iter()
        .find(|c| command_line(c).iter().any(|a| a == "webhook"))
        .or(containers.first());
    let Some(webhook) = webhook else {
        return (own_namespace, LEASE_NAME.to_string());
    };
    let args = command_line(webhook);
    let name = flag(&args, "--lease-name").unwrap_or_else(|| LEASE_NAME.to_string());
    let namespace = flag(&args, "--lease-namespace")
        .or_else(|| namespace_env(webhook, &own_namespace))
        .unwrap_or_else(|| WEBHOOK_LEASE_NAMESPACE.to_string());
    (namespace, name)
}

fn command_line(c: &Container) -> Vec<String> {
    let command = c.command.iter().flatten();
    command.chain(c.args.iter().flatten()).cloned().collect()
}

/// The value of `--name=value` or `--name value`; the last one wins, as with clap.
fn flag(args: &[String], name: &str) -> Option<String> {
    let mut value = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if let Some(v) = arg.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            value = Some(v.to_string());
        } else if arg == name {
            value = args.next().cloned();
        }
    }
    value
}

/// `GRACEFUL_DRAIN_NAMESPACE` of the container: its value, or the pod's namespace when it
/// comes from the `metadata.namespace` field.
fn namespace_env(c: &Container, own_namespace: &str) -> Option<String> {
    let var = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "GRACEFUL_DRAIN_NAMESPACE")?;
    if let Some(value) = &var.value {
        return Some(value.clone());
    }
    let field = var.value_from.as_ref()?.field_ref.as_ref()?;
    (field.field_path == "metadata.namespace").then(|| own_namespace.to_string())
}

/// The DaemonSet's pod selector (its `matchLabels`), else the agents' labels with its
/// release's instance.
fn pod_selector(ds: &DaemonSet) -> String {
    let labels = ds
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .filter(|l| !l.is_empty());
    match labels {
        Some(labels) => {
            let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            pairs.join(",")
        }
        None => selector(
            AGENT_SELECTOR,
            ds.labels().get(INSTANCE_LABEL).map(String::as_str),
        ),
    }
}
