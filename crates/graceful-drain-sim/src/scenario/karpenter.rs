//! The real tier's Karpenter rows: Karpenter (sigs.k8s.io/karpenter with its KWOK cloud
//! provider, built into the cache outside the clone by `.ci/drainers.sh`) provisions KWOK
//! nodes for a Deployment behind a Service, then disrupts them under traffic —
//! consolidation after a scale-down, and drift after a NodePool change that replaces every
//! node. Karpenter drains a node by evicting its pods from a queue (client-go follows a
//! 429's `Retry-After`, then the queue retries with backoff from 100 ms to 10 s, see
//! `pkg/controllers/node/termination/terminator/eviction.go`), so graceful-drain's held
//! evictions reach it as they reach `kubectl drain`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, Node};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, ResourceExt};

use super::{Error, Measured, Protection, ScenarioConfig, actions, measure, workloads};
use kube_sim::cluster::{RealCluster, wait_for};

/// The Karpenter version `.ci/drainers.sh` builds.
pub const KARPENTER_VERSION: &str = "v1.15.0";

/// The one instance type the rows' NodePools allow: 8 CPUs, 7.9 allocatable once the
/// provider's 100m are reserved (kwok/cloudprovider/helpers.go), so seven pods of one CPU
/// each fit.
const INSTANCE_TYPE: &str = "c-8x-amd64-linux";
/// Pods of the rows' Deployment per node of [`INSTANCE_TYPE`].
const PODS_PER_NODE: usize = 7;
/// Replicas the rows deploy (the issue's "at least 20").
const REPLICAS: i32 = 21;
/// Replicas left after the consolidation row's scale-down.
const SCALED_TO: i32 = 6;
/// The label the drift row changes on the NodePool's template.
const GENERATION_LABEL: &str = "graceful-drain.io/generation";
/// Provisioning: Karpenter's batch window, the NodeClaims, KWOK's nodes, the scheduler.
const PROVISION_TIMEOUT: Duration = Duration::from_secs(180);
/// Karpenter's consolidation re-validates each decision 15 s after it made it
/// (`commandValidationDelay`, pkg/controllers/disruption/consolidation.go), and may take two
/// rounds; drift replaces nodes a budget at a time.
const DISRUPTION_TIMEOUT: Duration = Duration::from_secs(300);

/// Slack for Karpenter's own pace inside its drains, which differs between two runs of the
/// same row: its eviction queue's backoff (up to 10 s), its node requeue (1 s), a drift's
/// replacement nodes.
const KARPENTER_SLACK: Duration = Duration::from_secs(15);

/// Which disruption a row asks Karpenter for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// Scale the Deployment from 21 pods to 6, then let Karpenter
    /// consolidate the emptied nodes.
    Consolidation,
    /// Change the NodePool's template: every node drifts and is replaced.
    Drift,
}

/// Where the Karpenter binary is: `$GRACEFUL_DRAIN_KARPENTER`, else where
/// `.ci/drainers.sh` builds it; `None` when it is not there. Its CRDs are in `crds/` beside it.
pub fn karpenter() -> Option<PathBuf> {
    let dir = format!("karpenter-kwok-{KARPENTER_VERSION}");
    super::drainers::cached_tool("GRACEFUL_DRAIN_KARPENTER", &dir, "karpenter")
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn node_pools() -> ApiResource {
    resource("karpenter.sh", "v1", "NodePool", "nodepools")
}

fn node_claims() -> ApiResource {
    resource("karpenter.sh", "v1", "NodeClaim", "nodeclaims")
}

/// The row's NodePool: one instance type, on-demand, consolidation of empty or
/// underutilized nodes at once, and no disruption allowed until the row opens its budget.
fn node_pool(name: &str, generation: &str) -> String {
    format!(
        r#"apiVersion: karpenter.kwok.sh/v1alpha1
kind: KWOKNodeClass
metadata:
  name: default
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: {name}
spec:
  template:
    metadata:
      labels:
        {GENERATION_LABEL}: "{generation}"
    spec:
      requirements:
      - {{key: node.kubernetes.io/instance-type, operator: In, values: ["{INSTANCE_TYPE}"]}}
      - {{key: karpenter.sh/capacity-type, operator: In, values: ["on-demand"]}}
      nodeClassRef:
        group: karpenter.kwok.sh
        kind: KWOKNodeClass
        name: default
      expireAfter: Never
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 0s
    budgets:
    - nodes: "0"
"#
    )
}

/// A running Karpenter; dropping it kills the process.
struct Karpenter {
    _child: tokio::process::Child,
    log: PathBuf,
}

impl Karpenter {
    /// Starts `binary` against the cluster as its administrator, its metrics and health
    /// ports on loopback, its log in `dir`.
    fn start(binary: &Path, kubeconfig: &Path, dir: &Path) -> Result<Karpenter, Error> {
        let log = dir.join("karpenter.log");
        let port = |what: &str| {
            kube_control_plane::free_loopback_port()
                .map_err(|e| failed(format!("a loopback port for Karpenter's {what}: {e}")))
        };
        let (metrics, health) = (port("metrics")?, port("health probes")?);
        let child = tokio::process::Command::new(binary)
            .env("KUBECONFIG", kubeconfig)
            .env("DISABLE_LEADER_ELECTION", "true")
            .env("METRICS_PORT", metrics.to_string())
            .env("HEALTH_PROBE_PORT", health.to_string())
            .env("LOG_LEVEL", "debug")
            .env("LOG_OUTPUT_PATHS", &log)
            .env("LOG_ERROR_OUTPUT_PATHS", &log)
            // Short provisioning batches: the rows create their pods at once.
            .env("BATCH_IDLE_DURATION", "1s")
            .env("BATCH_MAX_DURATION", "3s")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("run {}: {e}", binary.display())))?;
        Ok(Karpenter { _child: child, log })
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(6)..].join(" | ")
    }
}

/// The nodes of NodePool `pool`.
async fn pool_nodes(client: &kube::Client, pool: &str) -> Result<Vec<Node>, Error> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
        .await
        .map(|l| l.items)
        .map_err(workloads::api("list", format!("nodes of nodepool {pool}")))
}

/// One Karpenter row. Without protection the Deployment's pods are evicted as Karpenter
/// evicts them; with it, graceful-drain holds each eviction until the load balancers
/// dropped the pod. The row ends when Karpenter has removed the nodes it set out to
/// remove and the Deployment serves at its replicas again. Its time is the time Karpenter
/// spent draining ([`Phases::draining`]). With protection and the `unprotected` row's
/// time, it fails past that time plus the delay and exit per removed node plus
/// [`KARPENTER_SLACK`].
pub(super) async fn row(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    disruption: Disruption,
    protection: Protection,
    unprotected: Option<Duration>,
) -> Result<Measured, Error> {
    let binary = karpenter().ok_or_else(|| {
        failed(format!(
            "Karpenter {KARPENTER_VERSION} is not built: run `bash .ci/drainers.sh` (or set GRACEFUL_DRAIN_KARPENTER)"
        ))
    })?;
    let what = match disruption {
        Disruption::Consolidation => "consolidation",
        Disruption::Drift => "drift",
    };
    let pool = format!("{what}-{protection}");
    let mut cfg = cfg.clone();
    cfg.web.namespace = format!("karpenter-{pool}");
    cfg.web.replicas = REPLICAS;
    cfg.web.cpu_request = Some("1".into());
    cfg.web.node_selector = [("karpenter.sh/nodepool".to_string(), pool.clone())].into();
    // Two pods of the row's Deployment may be down at once: Karpenter's evictions of a
    // node's pods go through together, as a drain of a full node needs.
    cfg.web.min_available = match disruption {
        Disruption::Consolidation => SCALED_TO - 2,
        Disruption::Drift => REPLICAS - 2,
    };
    let client = cluster.client();
    let dir = std::env::temp_dir().join(format!(
        "graceful-drain-{}-{}",
        std::process::id(),
        cfg.web.namespace
    ));
    std::fs::create_dir_all(&dir).map_err(|e| failed(format!("scratch folder: {e}")))?;
    install(cluster, &binary, &pool).await?;
    let karpenter = Karpenter::start(&binary, cluster.kubeconfig(), &dir)?;
    let outcome = run(cluster, &cfg, disruption, &pool).await;
    let outcome = match outcome {
        Err(e) => Err(failed(format!(
            "{}; Karpenter's log ends: {}",
            graceful_drain_core::error::chain(&e),
            karpenter.log_tail()
        ))),
        ok => ok,
    };
    workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    let removed = remove_pool(&client, &pool).await;
    drop(karpenter);
    let _ = std::fs::remove_dir_all(&dir);
    let (measured, removed_nodes, mut summary) = outcome?;
    removed?;
    if let (Protection::GracefulDrain, Some(baseline)) = (protection, unprotected) {
        // Each node Karpenter removed was drained at most once per command, and each drain
        // is held at most the deregistration delay plus the app's exit longer than without
        // protection.
        let per_node = cfg.components.deregistration_delay + cfg.cluster.kubelet.exit_after_sigterm;
        let nodes = u32::try_from(removed_nodes).unwrap_or(u32::MAX);
        let bound = baseline + per_node * nodes + KARPENTER_SLACK;
        summary.push_str(&format!(
            "; bound {:.1} s (unprotected {:.1} s + {removed_nodes} nodes x {:.1} s + {:.0} s)",
            bound.as_secs_f64(),
            baseline.as_secs_f64(),
            per_node.as_secs_f64(),
            KARPENTER_SLACK.as_secs_f64(),
        ));
        if measured.duration > bound {
            return Err(failed(format!(
                "graceful-drain stalled Karpenter: {summary}"
            )));
        }
    }
    eprintln!("karpenter {pool}: {summary}");
    cluster.step(format!("karpenter {pool}: {summary}"));
    Ok(measured)
}

/// Karpenter's CRDs (beside its binary), its KWOKNodeClass and the row's NodePool.
async fn install(cluster: &RealCluster, binary: &Path, pool: &str) -> Result<(), Error> {
    let crds = binary
        .parent()
        .map(|d| d.join("crds"))
        .ok_or_else(|| failed("Karpenter's binary has no folder".into()))?;
    let mut manifest = String::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&crds)
        .map_err(|e| failed(format!("read {}: {e}", crds.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| failed(format!("read {}: {e}", path.display())))?;
        manifest.push_str("---\n");
        manifest.push_str(&text);
        manifest.push('\n');
    }
    actions::kubectl_apply(cluster.kubeconfig(), &manifest)
        .await
        .map_err(|e| failed(format!("install Karpenter's CRDs: {e}")))?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(cluster.client());
    for name in [
        "nodepools.karpenter.sh",
        "nodeclaims.karpenter.sh",
        "kwoknodeclasses.karpenter.kwok.sh",
    ] {
        kube::runtime::wait::await_condition(
            crds.clone(),
            name,
            kube::runtime::wait::conditions::is_crd_established(),
        )
        .await
        .map_err(|e| failed(format!("CRD {name} established: {e}")))?;
    }
    actions::kubectl_apply(cluster.kubeconfig(), &node_pool(pool, "1"))
        .await
        .map_err(|e| failed(format!("create NodePool {pool}: {e}")))
}

/// Deploys, disrupts under traffic, and says what Karpenter did.
async fn run(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    disruption: Disruption,
    pool: &str,
) -> Result<(Measured, usize, String), Error> {
    let client = cluster.client();
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    cluster.step(format!("Karpenter provisions nodes for {REPLICAS} pods"));
    cluster
        .deploy_web(&cfg.web, PROVISION_TIMEOUT.max(cfg.phase_timeout))
        .await?;
    let mut cfg = cfg.clone();
    if disruption == Disruption::Consolidation {
        cluster.step(format!("scale to {SCALED_TO}"));
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client.clone(), &cfg.web.namespace);
        let patch = serde_json::json!({"spec": {"replicas": SCALED_TO}});
        deployments
            .patch(
                &cfg.web.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(workloads::api(
                "scale",
                format!("deployment {}", cfg.web.service_key()),
            ))?;
        cfg.web.replicas = SCALED_TO;
        cluster.wait_web_ready(&cfg.web, cfg.phase_timeout).await?;
    }
    let before: Vec<String> = pool_nodes(&client, pool)
        .await?
        .iter()
        .map(|n| n.name_any())
        .collect();
    let pools = Api::<DynamicObject>::all_with(client.clone(), &node_pools());
    let phases = Phases::default();
    let watching = tokio::spawn(phases.clone().watch(client.clone(), pool.to_string()));
    let started = Instant::now();
    let act = async {
        match disruption {
            Disruption::Consolidation => {
                let target = usize::try_from(SCALED_TO)
                    .unwrap_or(0)
                    .div_ceil(PODS_PER_NODE);
                cluster.step(format!(
                    "open the disruption budget: Karpenter consolidates {} nodes to {target}",
                    before.len()
                ));
                open_budget(&pools, pool).await?;
                wait_for(
                    &format!("Karpenter to consolidate nodepool {pool} to {target} nodes"),
                    DISRUPTION_TIMEOUT,
                    || async {
                        pool_nodes(&client, pool)
                            .await
                            .is_ok_and(|n| n.len() <= target)
                    },
                )
                .await?;
            }
            Disruption::Drift => {
                cluster.step(format!("change the NodePool: {} nodes drift", before.len()));
                let patch = serde_json::json!({"spec": {
                    "template": {"metadata": {"labels": {GENERATION_LABEL: "2"}}},
                    "disruption": {"budgets": [{"nodes": "100%"}]},
                }});
                pools
                    .patch(pool, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(workloads::api("patch", format!("nodepool {pool}")))?;
                wait_for(
                    &format!("Karpenter to replace every node of nodepool {pool}"),
                    DISRUPTION_TIMEOUT,
                    || async {
                        pool_nodes(&client, pool).await.is_ok_and(|nodes| {
                            nodes.iter().all(|n| {
                                !before.contains(&n.name_any())
                                    && n.labels().get(GENERATION_LABEL).map(String::as_str)
                                        == Some("2")
                            })
                        })
                    },
                )
                .await?;
            }
        }
        cluster.step("every disrupted node gone; the Deployment at its replicas");
        cluster.wait_web_ready(&cfg.web, cfg.phase_timeout).await?;
        Ok(())
    };
    let measured = measure(cluster, &cfg, act).await;
    watching.abort();
    let mut measured = measured?;
    let in_all = measured.duration;
    // The row's time is the time Karpenter spent draining: its decisions before the first
    // drain and between two commands (polls, the 15 s validation) are its own pace, which
    // varied by 16 s between two unprotected runs of this row on the same machine.
    measured.duration = phases.draining(Instant::now());
    let after = pool_nodes(&client, pool).await?;
    let removed = before
        .iter()
        .filter(|b| !after.iter().any(|a| &a.name_any() == *b))
        .count();
    let (refused, messages) = drain_failures(&client, &before).await;
    let bound = cfg.components.deregistration_delay + cfg.cluster.kubelet.exit_after_sigterm;
    let summary = format!(
        "{removed} of {} nodes removed, {} left, {:.1} s draining ({:.1} s in all; Karpenter done {:.1} s after the change); one pod's bound {:.1} s; {refused} FailedDraining events {messages:?}",
        before.len(),
        after.len(),
        measured.duration.as_secs_f64(),
        in_all.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        bound.as_secs_f64(),
    );
    if removed == 0 {
        return Err(failed(format!("Karpenter removed no node: {summary}")));
    }
    Ok((measured, removed, summary))
}

/// When each node of a row's pool was first seen draining (Karpenter's
/// `karpenter.sh/disrupted` taint, set before it evicts anything) and when it was gone.
#[derive(Clone, Default)]
struct Phases(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Phase>>>);

/// One node's draining: from its taint until it is gone (`None`: not yet).
#[derive(Clone, Copy, Debug)]
struct Phase {
    from: Instant,
    gone: Option<Instant>,
}

impl Phases {
    /// Follows the nodes of `pool` until aborted.
    async fn watch(self, client: kube::Client, pool: String) {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let nodes = Api::<Node>::all(client);
        let config = watcher::Config::default().labels(&format!("karpenter.sh/nodepool={pool}"));
        let mut events = std::pin::pin!(watcher(nodes, config));
        while let Some(event) = events.next().await {
            let now = Instant::now();
            let mut table = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match event {
                Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                    let tainted = node
                        .spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .is_some_and(|taints| taints.iter().any(|t| t.key == DISRUPTED_TAINT));
                    if tainted {
                        table.entry(node.name_any()).or_insert(Phase {
                            from: now,
                            gone: None,
                        });
                    }
                }
                Ok(watcher::Event::Delete(node)) => {
                    let phase = table.entry(node.name_any()).or_insert(Phase {
                        from: now,
                        gone: None,
                    });
                    phase.gone.get_or_insert(now);
                }
                Ok(_) => {}
                // The watcher retries with its own backoff; a gap only delays what it sees.
                Err(error) => tracing::debug!(%error, "watch of nodepool {pool}"),
            }
        }
    }

    /// How long, up to `end`, at least one node was draining.
    fn draining(&self, end: Instant) -> Duration {
        let table = self.0.lock().unwrap_or_else(|e| e.into_inner());
        union(
            table
                .values()
                .map(|p| (p.from, p.gone.unwrap_or(end).min(end))),
        )
    }
}

/// Karpenter's taint on a node it disrupts (`v1.DisruptedNoScheduleTaint`,
/// pkg/apis/v1/taints.go).
const DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";

/// The length of the union of the intervals `[from, to)`.
fn union(intervals: impl Iterator<Item = (Instant, Instant)>) -> Duration {
    let mut spans: Vec<(Instant, Instant)> = intervals.filter(|(a, b)| a < b).collect();
    spans.sort();
    let mut total = Duration::ZERO;
    let mut open: Option<(Instant, Instant)> = None;
    for (from, to) in spans {
        open = match open {
            Some((a, b)) if from <= b => Some((a, b.max(to))),
            Some((a, b)) => {
                total += b - a;
                Some((from, to))
            }
            None => Some((from, to)),
        };
    }
    total + open.map_or(Duration::ZERO, |(a, b)| b - a)
}

/// Allows every node of the pool to be disrupted at once.
async fn open_budget(pools: &Api<DynamicObject>, pool: &str) -> Result<(), Error> {
    let patch = serde_json::json!({"spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}});
    pools
        .patch(pool, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(workloads::api("patch", format!("nodepool {pool}")))
}

/// The Events Karpenter posted on `nodes` for a failed drain (`FailedDraining`, "Failed
/// to drain node, evicting pod violates a PDB" for an eviction refused with 429): how many,
/// and their distinct messages.
async fn drain_failures(client: &kube::Client, nodes: &[String]) -> (usize, Vec<String>) {
    let events: Api<CoreEvent> = Api::all(client.clone());
    let Ok(list) = events
        .list(&ListParams::default().fields("reason=FailedDraining"))
        .await
    else {
        return (0, Vec::new());
    };
    let mine: Vec<&CoreEvent> = list
        .items
        .iter()
        .filter(|e| {
            e.involved_object
                .name
                .as_ref()
                .is_some_and(|n| nodes.contains(n))
        })
        .collect();
    let count = mine
        .iter()
        .map(|e| usize::try_from(e.count.unwrap_or(1)).unwrap_or(1))
        .sum();
    let mut messages: Vec<String> = mine.iter().filter_map(|e| e.message.clone()).collect();
    messages.sort();
    messages.dedup();
    (count, messages)
}

/// Deletes the row's NodePool and waits until Karpenter has removed its nodes, so later
/// rows see only the tier's own nodes.
async fn remove_pool(client: &kube::Client, pool: &str) -> Result<(), Error> {
    let pools = Api::<DynamicObject>::all_with(client.clone(), &node_pools());
    let _ = pools.delete(pool, &DeleteParams::default()).await;
    let claims = Api::<DynamicObject>::all_with(client.clone(), &node_claims());
    wait_for(
        &format!("nodepool {pool}'s nodes and NodeClaims gone"),
        Duration::from_secs(120),
        || async {
            let nodes = pool_nodes(client, pool).await.is_ok_and(|n| n.is_empty());
            let claims = claims
                .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
                .await
                .is_ok_and(|l| l.items.is_empty());
            nodes && claims
        },
    )
    .await
    .map_err(Error::from)
}

fn failed(reason: String) -> Error {
    Error::Component {
        name: "karpenter".into(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_time_counts_overlapping_drains_once_and_the_pauses_between_not_at_all() {
        let t = Instant::now();
        let s = |n: u64| t + Duration::from_secs(n);
        // Two nodes drained together (0–5, 2–6), a pause, a third (20–23).
        let spans = [(s(0), s(5)), (s(2), s(6)), (s(20), s(23))];
        assert_eq!(union(spans.into_iter()), Duration::from_secs(9));
        assert_eq!(union([(s(3), s(3))].into_iter()), Duration::ZERO);
        assert_eq!(union(std::iter::empty()), Duration::ZERO);
    }
}
