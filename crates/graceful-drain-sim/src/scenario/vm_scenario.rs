//! The `vm-evacuation-drain` scenario of `simulate --matrix`: the worked example of
//! docs/hooks.md on the simulated cluster. Every node also hosts VMs (the simulated VM
//! host, [`crate::vmhost`]); the busiest node is drained under traffic and then
//! returned to service.
//!
//! With graceful-drain the node agents run the example's two hooks: `evacuate-vms` before
//! eviction and `enable-vms` after the uncordon. The check: the node had no VM left before
//! the first of its pods was isolated or deleted, and takes VMs again at the end. Without
//! protection (`kubectl drain`, `kubectl uncordon`) nothing moves the VMs: they are still
//! on the node when it goes down for maintenance, which the row reports as expected.

use std::time::{Duration, Instant};

use kube::ResourceExt;

use super::components::Components;
use super::spec::{Outcome, Scenario, set_budget, unprotected_deletions};
use super::{Error, Protection, ScenarioConfig, actions, busiest_node, measure, workloads};
use crate::vmhost::VmHost;
use kube_sim::cluster::Access;
use kube_sim::traffic::timeline::EventKind;

/// VMs on each node.
const VMS_PER_NODE: usize = 4;
/// One live migration.
const MIGRATE_EACH: Duration = Duration::from_millis(250);
/// The hooks' timeout.
const HOOK_TIMEOUT: &str = "2m";

/// Runs the scenario once (see the module documentation).
pub(super) async fn run(
    cluster: &impl Access,
    cfg: &ScenarioConfig,
    scenario: &Scenario,
    protection: Protection,
    started_at: &std::sync::Mutex<Option<Instant>>,
) -> Result<Outcome, Error> {
    let hosts = VmHost::start(
        cluster.nodes(),
        VMS_PER_NODE,
        MIGRATE_EACH,
        cluster.shutdown(),
    )
    .await
    .map_err(|e| Error::Component {
        name: "vm host".into(),
        reason: format!("{e:#}"),
    })?;
    hosts.record_to(cluster.timeline().clone());
    let hooks = hosts.hooks_json(HOOK_TIMEOUT);
    let mut components = match protection {
        Protection::None => None,
        Protection::GracefulDrain => {
            let flags = ["--hooks", hooks.as_str()];
            Some(Components::start_with(cluster, &cfg.components, &flags).await?)
        }
    };
    workloads::deploy(cluster, &cfg.web, cfg.phase_timeout, scenario.workload).await?;
    set_budget(cluster, cfg, &scenario.budget).await?;
    let client = cluster.client();
    let node = busiest_node(cluster, &cfg.web).await?;
    let pods: Vec<String> = actions::pods_on(&client, &node)
        .await?
        .iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    let started = Instant::now();
    if let Ok(mut at) = started_at.lock() {
        *at = Some(started);
    }
    cluster.step(format!("{}: {}", scenario.name, scenario.about));
    let timeout = cfg.phase_timeout;
    let action = async {
        match protection {
            Protection::None => {
                actions::plain_drain(&client, &node, timeout).await?;
                cluster.step(format!("node {node} down for maintenance, then uncordoned"));
                actions::cordon(&client, &node, false).await
            }
            Protection::GracefulDrain => {
                actions::lifecycle_drain(&client, &node, timeout).await?;
                cluster.step(format!(
                    "node {node} down for maintenance, then returned to service"
                ));
                actions::lifecycle_uncordon(&client, &node, timeout).await
            }
        }
    };
    let measured = measure(cluster, cfg, action).await?;
    if let Some(c) = components.as_mut() {
        c.check().await?;
    }
    let timeline = cluster.timeline();
    let events = timeline.between(timeline.start(), Instant::now());
    let window = started.saturating_duration_since(timeline.start());
    let first_eviction = events
        .iter()
        .filter(|e| e.at >= window && pods.contains(&e.subject))
        .filter(|e| matches!(e.kind, EventKind::Isolated | EventKind::Terminating))
        .map(|e| e.at)
        .min();
    let emptied = hosts
        .emptied_at(&node)
        .map(|at| at.saturating_duration_since(timeline.start()));
    let checked = match protection {
        Protection::GracefulDrain => match (emptied, first_eviction) {
            (Some(emptied), Some(first)) if emptied <= first && hosts.enabled(&node) => {
                Ok(format!(
                    "{VMS_PER_NODE} VMs left {node} {:.1}s before its first eviction; enabled after uncordon",
                    (first - emptied).as_secs_f64()
                ))
            }
            (Some(emptied), Some(first)) if emptied > first => Err(format!(
                "a pod of {node} was evicted {:.1}s before its last VM left",
                (emptied - first).as_secs_f64()
            )),
            (None, _) => Err(format!(
                "{} VMs still on {node} after the drain",
                hosts.vms_on(&node).len()
            )),
            (_, None) => Err(format!("no pod of {node} was evicted")),
            _ => Err(format!("{node} does not take VMs after the uncordon")),
        },
        Protection::None => match hosts.vms_on(&node).len() {
            0 => Err(format!("no VM stranded on {node} without the hooks")),
            n => Ok(format!("{n} VMs stranded on {node} while it was down")),
        },
    };
    Ok(Outcome {
        measured,
        unprotected: unprotected_deletions(&events, window),
        checked: Some(checked),
    })
}
