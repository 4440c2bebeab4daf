//! The tiered drain of the matrix (`tiered-drain`): next to the web Deployment behind the
//! load balancer, the node to drain carries a DNS-like Deployment of priority class
//! `system-cluster-critical` and an ingress-like Deployment the node agents'
//! `--last-pod-selector` picks, both pinned to that node (a `kubernetes.io/hostname`
//! nodeSelector) so each of the three tiers has pods there; their replacements wait
//! unscheduled while the node is cordoned. [`check_order`] reads the cluster's timeline:
//! every pod of a tier must be gone from the node before any pod of the next tier is
//! evicted (isolated by the webhook or terminating, whichever shows first).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

use super::{Error, ScenarioConfig, actions};
use kube_sim::cluster::{DataPlane, WebSpec, wait_for};
use kube_sim::traffic::timeline::{Event, EventKind};

/// The timeline's `deleted` is the simulated kubelet seeing the pod gone through its own
/// watch, which can trail the node agent's watch of the same deletion by a few
/// microseconds to milliseconds; a later tier's eviction that close after it is not out
/// of order.
const WATCH_SKEW: Duration = Duration::from_millis(50);

/// The node agents' flags in the protected row: the ingress-like pods go last.
pub const AGENT_FLAGS: &[&str] = &["--last-pod-selector", "app=ingress"];

/// The later tiers' Deployments: name (also the `app` label) and priority class.
const LATER_TIERS: [(&str, Option<&str>); 2] =
    [("dns", Some("system-cluster-critical")), ("ingress", None)];

/// The pods of `node` by tier, in eviction order: the web pods (workloads), the DNS-like
/// pod (system-critical), the ingress-like pod (last). Names are `ns/name`.
pub type Tiers = Vec<Vec<String>>;

/// Creates the later tiers' Deployments pinned to `node` and waits until their pods are
/// ready there; returns the node's pods by tier.
pub async fn place(cluster: &DataPlane, cfg: &ScenarioConfig, node: &str) -> Result<Tiers, Error> {
    let client = cluster.client();
    let ns = &cfg.web.namespace;
    for (name, class) in LATER_TIERS {
        let deployment = pinned(&cfg.web, name, class, node);
        Api::<Deployment>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &deployment)
            .await
            .map_err(|source| Error::Api {
                action: "create deployment",
                object: format!("{ns}/{name}"),
                source,
            })?;
    }
    let what = format!("the DNS-like and ingress-like pods ready on node {node}");
    wait_for(&what, cfg.phase_timeout, || async {
        let Ok(pods) = actions::pods_on(&client, node).await else {
            return false;
        };
        LATER_TIERS.iter().all(|(app, _)| {
            pods.iter().any(|p| {
                p.labels().get("app").map(String::as_str) == Some(*app)
                    && kube_sim::controllers::pod_ready(p)
            })
        })
    })
    .await?;
    let mut tiers: Tiers = vec![Vec::new(); LATER_TIERS.len() + 1];
    for pod in actions::pods_on(&client, node).await? {
        let app = pod.labels().get("app").cloned().unwrap_or_default();
        let tier = LATER_TIERS
            .iter()
            .position(|(name, _)| *name == app)
            .map_or(0, |i| i + 1);
        let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        tiers[tier].push(key);
    }
    Ok(tiers)
}

/// A one-replica Deployment like the web one, named `name`, of priority class `class`,
/// whose pod may run on `node` only.
fn pinned(web: &WebSpec, name: &str, class: Option<&str>, node: &str) -> Deployment {
    let spec = WebSpec {
        name: name.into(),
        replicas: 1,
        min_available: 0,
        ..web.clone()
    };
    let mut deployment = spec.deployment();
    let pod = deployment
        .spec
        .get_or_insert_with(Default::default)
        .template
        .spec
        .get_or_insert_with(Default::default);
    pod.node_selector = Some([("kubernetes.io/hostname".to_string(), node.to_string())].into());
    pod.priority_class_name = class.map(str::to_string);
    deployment
}

/// When each pod was first evicted (isolated or terminating) and when it was deleted.
fn moments(events: &[Event]) -> (BTreeMap<&str, Duration>, BTreeMap<&str, Duration>) {
    let (mut evicted, mut deleted) = (BTreeMap::new(), BTreeMap::new());
    for event in events {
        let pod = event.subject.as_str();
        match event.kind {
            EventKind::Isolated | EventKind::Terminating => {
                evicted.entry(pod).or_insert(event.at);
            }
            EventKind::Deleted => {
                deleted.insert(pod, event.at);
            }
            _ => {}
        }
    }
    (evicted, deleted)
}

/// Checks from the timeline that each tier of `tiers` was gone from the node before any
/// pod of the next one was evicted; the error names the pods out of order.
pub fn check_order(tiers: &Tiers, events: &[Event]) -> Result<(), Error> {
    let (evicted, deleted) = moments(events);
    for (i, pair) in tiers.windows(2).enumerate() {
        let (earlier, later) = (&pair[0], &pair[1]);
        let first_evicted = later
            .iter()
            .filter_map(|p| evicted.get(p.as_str()).map(|at| (*at, p)))
            .min();
        let Some((started, first)) = first_evicted else {
            continue;
        };
        for pod in earlier {
            let gone = deleted.get(pod.as_str());
            if gone.is_none_or(|at| *at > started + WATCH_SKEW) {
                let when = gone.map_or("never deleted".into(), |at| format!("deleted at {at:?}"));
                return Err(Error::TierOrder {
                    reason: format!(
                        "tier {} pod {first} evicted at {started:?} while tier {} pod {pod} was \
                         still on the node ({when})",
                        i + 2,
                        i + 1
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ms: u64, kind: EventKind, pod: &str) -> Event {
        Event {
            at: Duration::from_millis(ms),
            kind,
            subject: pod.into(),
        }
    }

    #[test]
    fn a_tier_may_start_only_once_the_one_before_is_gone() {
        let tiers: Tiers = vec![vec!["d/web-1".into()], vec!["d/dns".into()]];
        let in_order = [
            event(10, EventKind::Isolated, "d/web-1"),
            event(20, EventKind::Terminating, "d/web-1"),
            event(30, EventKind::Deleted, "d/web-1"),
            event(40, EventKind::Terminating, "d/dns"),
            event(50, EventKind::Deleted, "d/dns"),
        ];
        assert!(check_order(&tiers, &in_order).is_ok());
        let overlapping = [
            event(10, EventKind::Isolated, "d/web-1"),
            event(20, EventKind::Terminating, "d/dns"),
            event(900, EventKind::Deleted, "d/web-1"),
        ];
        let error = check_order(&tiers, &overlapping).unwrap_err().to_string();
        assert!(
            error.contains("tier 2 pod d/dns evicted at 20ms while tier 1 pod d/web-1"),
            "{error}"
        );
    }
}
