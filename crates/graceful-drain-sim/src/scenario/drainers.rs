//! The real tier's rows for drainers we did not write, run as their users run them: the
//! descheduler (sigs.k8s.io/descheduler, built into the cache outside the clone by
//! `.ci/drainers.sh`) evicting under traffic, one eviction after another or in the
//! background; and the bound no drain can beat, which every drainer's row checks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::components::Components;
use super::{Error, Measured, Protection, ScenarioConfig, actions, measure, workloads};
use graceful_drain_core::labels::{DESCHEDULER_EVICT_IN_BACKGROUND_ANNOTATION, DRAINING_LABEL};
use kube_sim::cluster::{RealCluster, wait_for};
use kube_sim::traffic::timeline::{Event, EventKind};

/// The descheduler version `.ci/drainers.sh` builds.
pub const DESCHEDULER_VERSION: &str = "v0.36.0";

/// Where the descheduler binary is: `$GRACEFUL_DRAIN_DESCHEDULER`, else where
/// `.ci/drainers.sh` builds it; `None` when it is not there.
pub fn descheduler() -> Option<PathBuf> {
    let dir = format!("descheduler-{DESCHEDULER_VERSION}");
    cached_tool("GRACEFUL_DRAIN_DESCHEDULER", &dir, "descheduler")
}

/// A drainer `.ci/drainers.sh` built: the path in `$env` when set (CI names it: the row
/// runs, and fails if it is not there), else `<cache>/tools/<dir>/<binary>` if it exists.
pub(super) fn cached_tool(env: &str, dir: &str, binary: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path));
    }
    let path = kube_control_plane::cache_dir()
        .join("tools")
        .join(dir)
        .join(binary);
    path.is_file().then_some(path)
}

/// How far past the bound no drain can beat (the slowest pod's deregistration delay plus
/// its exit after SIGTERM) a drainer may finish with graceful-drain installed: a process
/// start, a cordon, a list and the API server's round trips fit in it, a second of
/// polling (kubectl drain's wait for deletion) or a serial eviction does not. The
/// descheduler's rows count from its first eviction: its start (informers over every
/// node and pod) is its own, before anything reaches graceful-drain.
pub(super) const BOUND_FACTOR: f64 = 1.15;

/// `took` against `bound`, for the row's report.
pub(super) fn against_bound(drainer: &str, took: Duration, bound: Duration) -> String {
    format!(
        "{drainer}: {:.1} s against a bound of {:.1} s ({:.2}x)",
        took.as_secs_f64(),
        bound.as_secs_f64(),
        took.as_secs_f64() / bound.as_secs_f64()
    )
}

/// Fails the row when `drainer` took longer than [`BOUND_FACTOR`] times `bound`: graceful-drain
/// stalled it.
pub(super) fn within_bound(drainer: &str, took: Duration, bound: Duration) -> Result<(), Error> {
    if took.as_secs_f64() <= bound.as_secs_f64() * BOUND_FACTOR {
        return Ok(());
    }
    Err(Error::Component {
        name: drainer.to_string(),
        reason: format!(
            "graceful-drain stalled it: {}, past {BOUND_FACTOR}x",
            against_bound(drainer, took, bound)
        ),
    })
}

/// The policy of the row: RemoveDuplicates, at most one eviction per node (the limit the
/// row checks is kept).
const POLICY: &str = r#"apiVersion: "descheduler/v1alpha2"
kind: "DeschedulerPolicy"
maxNoOfPodsToEvictPerNode: 1
profiles:
  - name: graceful-drain-row
    pluginConfig:
    - name: "DefaultEvictor"
    - name: "RemoveDuplicates"
    plugins:
      balance:
        enabled:
          - "RemoveDuplicates"
"#;

/// The protected descheduler-in-background row: the webhook is rolled to require
/// kube-apiserver's client certificate (`--client-ca` with the control plane's
/// `client_ca`), so every review it gets is authenticated, runs the row, and is rolled
/// back to the other rows' flags, whatever the row's outcome.
pub(super) async fn authenticated_row(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    components: &mut Components,
    client_ca: &Path,
    namespace: String,
) -> Result<Measured, Error> {
    let ca = client_ca.to_string_lossy().into_owned();
    let flags = ["--client-ca", ca.as_str()];
    components.add_webhook_flags(&flags);
    let row = async {
        components.roll_webhook(cluster, &cfg.components).await?;
        cluster.step("webhook: requires kube-apiserver's client certificate");
        descheduler_row(cluster, cfg, namespace, true, Protection::GracefulDrain).await
    }
    .await;
    components.remove_webhook_flags(&flags);
    let back = components.roll_webhook(cluster, &cfg.components).await;
    let measured = row?;
    back?;
    Ok(measured)
}

/// The descheduler row: its own Deployment packed onto one or two nodes ([`Layout`]; the
/// others cordoned while it starts, then every node ready and untainted again, read from
/// the API server), then one descheduler pass (RemoveDuplicates) under traffic; it ends when
/// every pod the descheduler evicted is gone and the Deployment serves at its replicas
/// again. Checks that it evicted at least one pod and no more than one per node, and
/// with graceful-drain that it finished within [`BOUND_FACTOR`] of its bound: one pod's
/// delay and exit with evictions in the `background` (they overlap), one delay per
/// evicted pod otherwise (the descheduler waits for each answer before the next).
pub(super) async fn descheduler_row(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    namespace: String,
    background: bool,
    protection: Protection,
) -> Result<Measured, Error> {
    let binary = descheduler().ok_or_else(|| failed(format!(
        "the descheduler {DESCHEDULER_VERSION} is not built: run `bash .ci/drainers.sh` (or set GRACEFUL_DRAIN_DESCHEDULER)"
    )))?;
    let mut cfg = cfg.clone();
    cfg.web.namespace = namespace;
    let client = cluster.client();
    let timeout = cfg.phase_timeout;
    let nodes = cluster.nodes().to_vec();
    let layout = Layout::for_nodes(nodes.len()).ok_or_else(|| {
        failed(format!(
            "the row moves pods between nodes: it needs two or more, the cluster has {}",
            nodes.len()
        ))
    })?;
    // The row's own Deployment, whatever --replicas says: RemoveDuplicates evicts only
    // above an even share (see [`Layout`]).
    cfg.web.replicas = layout.replicas;
    // A budget the evictions fit in: the row measures the descheduler, not the budget.
    cfg.web.min_available = cfg.web.replicas / 2;
    if background {
        cfg.web.pod_annotations.insert(
            DESCHEDULER_EVICT_IN_BACKGROUND_ANNOTATION.to_string(),
            String::new(),
        );
    }
    let (packed, spare) = nodes.split_at(layout.packed);
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    let deployed = async {
        for node in spare {
            actions::cordon(&client, node, true).await?;
        }
        // The cordon seen by the control plane (the node lifecycle controller's taint)
        // before the Deployment's pods are scheduled.
        wait_nodes(&client, spare, timeout, "cordoned", |n| {
            has_unschedulable_taint(n)
        })
        .await?;
        cluster.deploy_web(&cfg.web, timeout).await?;
        let stray = pods_on_nodes(&client, &cfg.web.namespace, spare).await?;
        if !stray.is_empty() {
            return Err(failed(format!(
                "pods {stray:?} were scheduled onto the cordoned nodes {spare:?}"
            )));
        }
        Ok(())
    }
    .await;
    for node in spare {
        actions::cordon(&client, node, false).await?;
    }
    deployed?;
    // Every node a place duplicates may land, as the descheduler reads it when it starts
    // (pkg/descheduler/node/node.go `IsReady`; removeduplicates.go `getTargetNodes`
    // skips nodes with a NoSchedule or NoExecute taint the pods do not tolerate, such as
    // the cordon's, which the node lifecycle controller removes some time after the
    // uncordon).
    wait_nodes(&client, &nodes, timeout, "ready and untainted", |n| {
        ready(n) && !repels(n)
    })
    .await?;
    cluster.step(format!(
        "{} pods on {packed:?}, {} node(s) free for their duplicates",
        cfg.web.replicas,
        spare.len()
    ));
    let pods = Api::<Pod>::namespaced(client.clone(), &cfg.web.namespace);
    let before: Vec<(String, String)> = pods
        .list(&ListParams::default())
        .await
        .map_err(workloads::api(
            "list",
            format!("pods in {}", cfg.web.namespace),
        ))?
        .items
        .iter()
        .map(|p| {
            (
                p.uid().unwrap_or_default(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
            )
        })
        .collect();
    let dir = std::env::temp_dir().join(format!(
        "graceful-drain-{}-{}",
        std::process::id(),
        cfg.web.namespace
    ));
    std::fs::create_dir_all(&dir).map_err(|e| failed(format!("scratch folder: {e}")))?;
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, POLICY).map_err(|e| failed(format!("write the policy: {e}")))?;
    let log = dir.join("descheduler.log");
    let run = async {
        cluster.step(PASS_STEP);
        run_once(
            &binary,
            cluster.kubeconfig(),
            &policy,
            &log,
            background,
            timeout,
        )
        .await?;
        cluster.step("every pod it evicted gone, the Deployment at its replicas");
        let kept: BTreeSet<String> = before.iter().map(|(uid, _)| uid.clone()).collect();
        // An evicted pod is terminating, or isolated until the webhook's deleter removes
        // it (evictions in the background): the row waits for neither to be left.
        wait_for("evicted pods gone", timeout, || async {
            pods.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items.iter().all(|p| {
                    let leaving = p.metadata.deletion_timestamp.is_some()
                        || p.labels().contains_key(DRAINING_LABEL);
                    !leaving || !p.uid().is_some_and(|u| kept.contains(&u))
                })
            })
        })
        .await?;
        cluster.wait_web_ready(&cfg.web, timeout).await?;
        Ok(())
    };
    let measured = measure(cluster, &cfg, run).await;
    let after: BTreeSet<String> = pods
        .list(&ListParams::default())
        .await
        .map_err(workloads::api(
            "list",
            format!("pods in {}", cfg.web.namespace),
        ))?
        .items
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    let measured = measured?;
    let mut per_node = std::collections::BTreeMap::<&str, usize>::new();
    for (uid, node) in &before {
        if !after.contains(uid) {
            *per_node.entry(node.as_str()).or_default() += 1;
        }
    }
    let evicted: usize = per_node.values().sum();
    if evicted == 0 {
        return Err(failed(format!(
            "the descheduler evicted nothing; its log ends: {}",
            tail(&log_text)
        )));
    }
    // The descheduler's own word that it took the webhook's answer as an eviction under
    // way (`evictPod` in pkg/descheduler/evictions/evictions.go logs it at -v=3).
    if background
        && protection == Protection::GracefulDrain
        && !log_text.contains("Eviction in background assumed")
    {
        return Err(failed(format!(
            "the descheduler did not take any eviction as one in the background; its log ends: {}",
            tail(&log_text)
        )));
    }
    if let Some((node, n)) = per_node.iter().find(|(_, n)| **n > 1) {
        return Err(failed(format!(
            "{n} pods left node {node}, past the policy's maxNoOfPodsToEvictPerNode of 1"
        )));
    }
    let (delay, exit) = (
        cfg.components.deregistration_delay,
        cfg.cluster.kubelet.exit_after_sigterm,
    );
    // In the background the evictions overlap; otherwise each is answered once its pod's
    // delay is over, and the next is sent only then.
    let serial = if background { 1 } else { evicted };
    let bound = delay * u32::try_from(serial).unwrap_or(u32::MAX) + exit;
    let drainer = if background {
        "descheduler (evictions in the background)"
    } else {
        "descheduler (one eviction after another)"
    };
    // The pass starts with the descheduler's own start: its informers list every node
    // and pod of the cluster before any plugin runs. Nothing reaches graceful-drain
    // before its first eviction, so the bound counts from there.
    let lead = first_leaving(&measured.timeline, PASS_STEP, &cfg.web.namespace)
        .unwrap_or_default()
        .min(measured.duration);
    let took = measured.duration - lead;
    let summary = format!(
        "{} ({:.1} s before its first eviction not counted, {:.1} s in all); {evicted} pods evicted ({per_node:?})",
        against_bound(drainer, took, bound),
        lead.as_secs_f64(),
        measured.duration.as_secs_f64(),
    );
    eprintln!("{summary}");
    cluster.step(summary);
    if protection == Protection::GracefulDrain {
        within_bound(drainer, took, bound)?;
    }
    Ok(measured)
}

/// The timeline step that starts the descheduler's pass.
const PASS_STEP: &str = "descheduler: one RemoveDuplicates pass";

/// From the timeline's `step` to the first pod of `namespace` isolated or terminating
/// after it: what a drainer spent before its first eviction was admitted. `None` when
/// the step or such a pod is not in the timeline.
fn first_leaving(timeline: &[Event], step: &str, namespace: &str) -> Option<Duration> {
    let started = timeline
        .iter()
        .find(|e| e.kind == EventKind::Step && e.subject == step)?
        .at;
    let prefix = format!("{namespace}/");
    timeline
        .iter()
        .filter(|e| e.at >= started)
        .find(|e| {
            matches!(e.kind, EventKind::Isolated | EventKind::Terminating)
                && e.subject.starts_with(&prefix)
        })
        .map(|e| e.at - started)
}

/// Where the row's Deployment runs before the pass. RemoveDuplicates
/// (pkg/framework/plugins/removeduplicates/removeduplicates.go, `Balance`) evicts from a
/// node only the pods above `ceil(replicas / feasible nodes)`: the same Deployment spread
/// evenly (2 + 2 pods with 3 nodes, say) gives it nothing to do. So the row packs
/// `replicas = packed × nodes` pods onto `packed` nodes (two, or one on a two-node
/// cluster), the others cordoned while they start: each packed node holds about
/// `nodes` pods, more than the share of `packed`, and the pass evicts from each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    /// Nodes that hold the pods; the rest are free for the duplicates.
    packed: usize,
    /// The row's replicas.
    replicas: i32,
}

impl Layout {
    /// The layout on a cluster of `nodes` nodes; `None` under two.
    fn for_nodes(nodes: usize) -> Option<Layout> {
        if nodes < 2 {
            return None;
        }
        let packed = (nodes - 1).min(2);
        Some(Layout {
            packed,
            replicas: i32::try_from(packed * nodes).ok()?,
        })
    }
}

pub(super) fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `node` is cordoned or carries a taint that keeps the row's pods (which
/// tolerate nothing) off it.
pub(super) fn repels(node: &Node) -> bool {
    let Some(spec) = &node.spec else {
        return false;
    };
    spec.unschedulable == Some(true)
        || spec
            .taints
            .iter()
            .flatten()
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
}

fn has_unschedulable_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == graceful_drain_core::labels::UNSCHEDULABLE_TAINT)
        })
}

/// Waits until every node of `names` is `what` by `test`, read from the API server.
pub(super) async fn wait_nodes(
    client: &kube::Client,
    names: &[String],
    timeout: Duration,
    what: &str,
    test: impl Fn(&Node) -> bool,
) -> Result<(), Error> {
    let api = Api::<Node>::all(client.clone());
    let test = &test;
    let api = &api;
    wait_for(&format!("nodes {names:?} {what}"), timeout, || async move {
        let mut all = true;
        for name in names {
            all &= api.get(name).await.is_ok_and(|n| test(&n));
        }
        all
    })
    .await?;
    Ok(())
}

/// The pods of `namespace` on any of `nodes`.
async fn pods_on_nodes(
    client: &kube::Client,
    namespace: &str,
    nodes: &[String],
) -> Result<Vec<String>, Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(workloads::api("list", format!("pods in {namespace}")))?;
    Ok(pods
        .items
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| nodes.contains(n))
        })
        .map(|p| p.name_any())
        .collect())
}

/// Runs one descheduler pass against `kubeconfig` with `policy`, its log in `log`, with
/// evictions in the `background` or not; it serves nothing (no metrics, no HTTPS port)
/// and elects no leader.
async fn run_once(
    binary: &Path,
    kubeconfig: &Path,
    policy: &Path,
    log: &Path,
    background: bool,
    timeout: Duration,
) -> Result<(), Error> {
    let out =
        std::fs::File::create(log).map_err(|e| failed(format!("create {}: {e}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(|e| failed(format!("open {}: {e}", log.display())))?;
    let mut child = tokio::process::Command::new(binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--policy-config-file")
        .arg(policy)
        .args([
            "--descheduling-interval=0",
            "--leader-elect=false",
            "--disable-metrics",
            "--secure-port=0",
            "--bind-address=127.0.0.1",
            "--v=3",
        ])
        .args(background.then_some("--feature-gates=EvictionsInBackground=true"))
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(format!("run {}: {e}", binary.display())))?;
    let status = tokio::time::timeout(timeout, child.wait())
        .await
        .map_err(|_| {
            failed(format!(
                "the descheduler did not finish its pass within {timeout:?}"
            ))
        })?
        .map_err(|e| failed(format!("wait for the descheduler: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        Err(failed(format!(
            "the descheduler exited with {status}: {}",
            tail(&text)
        )))
    }
}

/// The last lines of a log, for an error message.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join(" | ")
}

fn failed(reason: String) -> Error {
    Error::Component {
        name: "descheduler".into(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(at_ms: u64, kind: EventKind, subject: &str) -> Event {
        Event {
            at: Duration::from_millis(at_ms),
            kind,
            subject: subject.to_string(),
        }
    }

    #[test]
    fn the_bound_counts_from_the_first_eviction_after_the_pass_starts() {
        let timeline = [
            // An earlier row's pod and a pod of the row before the pass: not the pass.
            event(100, EventKind::Terminating, "row/web-a"),
            event(900, EventKind::Step, PASS_STEP),
            event(1000, EventKind::Terminating, "other/web-b"),
            event(1150, EventKind::RemovedFromSlice, "row/web-c"),
            event(1200, EventKind::Isolated, "row/web-c"),
            event(1300, EventKind::Terminating, "row/web-d"),
        ];
        assert_eq!(
            first_leaving(&timeline, PASS_STEP, "row"),
            Some(Duration::from_millis(300))
        );
        assert_eq!(first_leaving(&timeline, PASS_STEP, "none"), None);
        assert_eq!(first_leaving(&timeline[1..2], PASS_STEP, "row"), None);
        assert_eq!(first_leaving(&timeline[2..], PASS_STEP, "row"), None);
    }

    /// RemoveDuplicates' rule (removeduplicates.go `Balance`): a node with `c` pods of the
    /// owner gives up `c - share` of them, `share = ceil(replicas / feasible nodes)`.
    fn evicted_per_node(on_node: i32, replicas: i32, nodes: usize) -> i32 {
        let share = (replicas + nodes as i32 - 1) / nodes as i32;
        (on_node - share).max(0)
    }

    #[test]
    fn every_packed_node_has_duplicates_to_give_up() {
        for nodes in 2..=12 {
            let layout = Layout::for_nodes(nodes).unwrap();
            assert!(layout.packed < nodes, "{layout:?} on {nodes}");
            // The scheduler's spread over the packed nodes: the least loaded gets the floor.
            let fewest = layout.replicas / layout.packed as i32;
            assert!(
                evicted_per_node(fewest, layout.replicas, nodes) >= 1,
                "{layout:?} on {nodes} nodes: nothing to evict"
            );
        }
    }

    #[test]
    fn the_layout_that_failed_alone_had_nothing_to_evict() {
        // 4 replicas over 2 of 3 nodes, as the row ran with the default flags.
        assert_eq!(evicted_per_node(2, 4, 3), 0);
        assert_eq!(Layout::for_nodes(1), None);
        assert_eq!(
            Layout::for_nodes(3),
            Some(Layout {
                packed: 2,
                replicas: 6
            })
        );
    }
}
