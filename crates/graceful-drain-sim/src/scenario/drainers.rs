//! The real tier's rows for drainers we did not write, run as their users run them: the
//! descheduler (sigs.k8s.io/descheduler, built into the cache outside the clone by
//! `.ci/drainers.sh`) evicting under traffic.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::{Error, Measured, ScenarioConfig, actions, measure, workloads};
use kube_sim::cluster::{RealCluster, wait_for};

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

/// The descheduler row: the Deployment packed onto all nodes but the last (cordoned while
/// it starts), then one descheduler pass (RemoveDuplicates) under traffic; it ends when
/// every pod the descheduler evicted is gone and the Deployment serves at its replicas
/// again. Checks that it evicted at least one pod and no more than one per node.
pub(super) async fn descheduler_row(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    namespace: String,
) -> Result<Measured, Error> {
    let binary = descheduler().ok_or_else(|| failed(format!(
        "the descheduler {DESCHEDULER_VERSION} is not built: run `bash .ci/drainers.sh` (or set GRACEFUL_DRAIN_DESCHEDULER)"
    )))?;
    let mut cfg = cfg.clone();
    cfg.web.namespace = namespace;
    // A budget the evictions fit in: the row measures the descheduler, not the budget.
    cfg.web.min_available = cfg.web.replicas / 2;
    let client = cluster.client();
    let timeout = cfg.phase_timeout;
    let spare = cluster
        .nodes()
        .last()
        .cloned()
        .ok_or_else(|| failed("the cluster has no nodes".into()))?;
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    actions::cordon(&client, &spare, true).await?;
    let deployed = cluster.deploy_web(&cfg.web, timeout).await;
    actions::cordon(&client, &spare, false).await?;
    deployed?;
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
        cluster.step("descheduler: one RemoveDuplicates pass");
        run_once(&binary, cluster.kubeconfig(), &policy, &log, timeout).await?;
        cluster.step("every pod it evicted gone, the Deployment at its replicas");
        let kept: BTreeSet<String> = before.iter().map(|(uid, _)| uid.clone()).collect();
        wait_for("evicted pods gone", timeout, || async {
            pods.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items.iter().all(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        || !p.uid().is_some_and(|u| kept.contains(&u))
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
    if let Some((node, n)) = per_node.iter().find(|(_, n)| **n > 1) {
        return Err(failed(format!(
            "{n} pods left node {node}, past the policy's maxNoOfPodsToEvictPerNode of 1"
        )));
    }
    let bound = cfg.components.deregistration_delay + cfg.cluster.kubelet.exit_after_sigterm;
    let summary = format!(
        "descheduler: {evicted} pods evicted ({per_node:?}), one after another, in {:.1} s; one pod's bound {:.1} s",
        measured.duration.as_secs_f64(),
        bound.as_secs_f64()
    );
    eprintln!("{summary}");
    cluster.step(summary);
    Ok(measured)
}

/// Runs one descheduler pass against `kubeconfig` with `policy`, its log in `log`; it
/// serves nothing (no metrics, no HTTPS port) and elects no leader.
async fn run_once(
    binary: &std::path::Path,
    kubeconfig: &std::path::Path,
    policy: &std::path::Path,
    log: &std::path::Path,
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
