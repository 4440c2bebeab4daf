//! The chart's alerts, its Grafana dashboard and docs/troubleshooting.md query only metrics
//! the product exports: the webhook and the node agents run on the simulated cluster, both
//! `/metrics` are scraped, and every `graceful_drain_…` name in those files must be a
//! metric family there, used as its type allows — a counter as `…_total`, a histogram as
//! `…_bucket`, `…_sum` or `…_count`, a gauge by its own name. A renamed metric, or an alert
//! on a metric nobody exports (which would simply never fire), fails here.
//!
//! A labelled family (reviews by outcome, isolation failures by reason, drains by outcome)
//! is not in `/metrics` at all before its first count, so the test first makes the
//! components count: an eviction whose pod cannot leave its Service (an isolation failure,
//! `controller_selector`) and a drain of a node through a LifecycleEvent.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use graceful_drain_core::runtime::Shutdown;
use graceful_drain_sim::scenario::actions;
use graceful_drain_sim::scenario::components::{Components, ComponentsConfig};
use graceful_drain_sim::scenario::spec::Workload;
use graceful_drain_sim::scenario::workloads;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::PostParams;
use kube_sim::cluster::{Cluster, ClusterConfig, WebSpec, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound for every wait; a run takes seconds.
const TIMEOUT: Duration = Duration::from_secs(60);
const NODE: &str = "worker-1";
/// Fast reconciler ticks and event checks, so the drain takes seconds.
const FAST_AGENT: &[&str] = &["--lifecycle-tick", "1s", "--event-check-interval", "1s"];

/// The files whose queries must name exported metrics, from the repository root.
const QUERY_FILES: &[&str] = &[
    "charts/graceful-drain/templates/prometheus-rule.yaml",
    "charts/graceful-drain/files/grafana-dashboard.json",
    "docs/troubleshooting.md",
];

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
}

/// GETs `path` from an admin port and returns the body of a 200 answer.
async fn get(admin: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .expect("the admin port answers within 10 s")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "GET {path}: {answer}");
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    body.to_string()
}

/// Evicts a pod of a StatefulSet whose Service selects its pods only through the
/// StatefulSet's own (pinned) label: the webhook cannot take it out of the Service, lets the
/// eviction through and counts an isolation failure.
async fn isolation_failure(cluster: &Cluster) {
    let db = WebSpec {
        name: "db".into(),
        replicas: 3,
        min_available: 1,
        ..WebSpec::default()
    };
    workloads::deploy(cluster, &db, TIMEOUT, Workload::StatefulSetSharedSelector)
        .await
        .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), "default");
    wait_for("db's PDB allows a disruption", TIMEOUT, || async {
        pdbs.get("db")
            .await
            .ok()
            .and_then(|p| p.status)
            .is_some_and(|s| s.disruptions_allowed > 0)
    })
    .await
    .unwrap();
    let eviction = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "db-0", "namespace": "default"}});
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let _: serde_json::Value = pods
        .create_subresource("eviction", "db-0", &PostParams::default(), &eviction)
        .await
        .expect("the eviction goes through unprotected");
}

/// Metric families of a `/metrics` body, name to type, from its `# TYPE` lines (present for
/// a labelled family before its first series exists).
fn families(body: &str) -> BTreeMap<String, String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

/// Every `graceful_drain_…` identifier in `text`.
fn referenced(text: &str) -> BTreeSet<String> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("graceful_drain_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail.find(|c: char| !is_ident(c)).unwrap_or(tail.len());
        if !before.is_some_and(is_ident) {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// Which exported family a series name belongs to, or why it belongs to none.
fn resolve(name: &str, exported: &BTreeMap<String, String>) -> Result<String, String> {
    let typed = |base: &str, types: &[&str]| {
        exported
            .get(base)
            .filter(|t| types.contains(&t.as_str()))
            .map(|_| base.to_string())
    };
    let found = typed(name, &["gauge"])
        .or_else(|| typed(name.strip_suffix("_total")?, &["counter"]))
        .or_else(|| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))?;
            typed(base, &["histogram"])
        });
    found.ok_or_else(|| match exported.get(name) {
        Some(t) => format!("{name} is a {t}: query it with its suffix (_total, _bucket, …)"),
        None => format!("{name} is exported by neither the webhook nor the node agent"),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_dashboard_and_troubleshooting_query_only_exported_metrics() {
    graceful_drain_core::runtime::install_crypto_provider();
    let cluster = graceful_drain_sim::setup::start(
        ClusterConfig {
            nodes: 2,
            ..ClusterConfig::default()
        },
        Shutdown::new(),
    )
    .await
    .unwrap();
    let cfg = ComponentsConfig {
        deregistration_delay: Duration::from_secs(1),
        timeout_seconds: 10,
        agent_program: None,
        confirmed_release: false,
        balancer_stats: None,
    };
    let components = Components::start_with(&cluster, &cfg, FAST_AGENT)
        .await
        .unwrap();
    let webhook = components
        .webhook_admin()
        .expect("the webhook's admin port");
    let agent = components
        .agent_admin(NODE)
        .expect("the node agent's admin port");
    cluster
        .deploy_web(
            &WebSpec {
                replicas: 4,
                min_available: 2,
                grace_period_seconds: 1,
                ..WebSpec::default()
            },
            TIMEOUT,
        )
        .await
        .unwrap();
    isolation_failure(&cluster).await;
    actions::lifecycle_drain(&cluster.client(), NODE, TIMEOUT)
        .await
        .unwrap();

    let mut exported = families(&get(webhook, "/metrics").await);
    let webhook_count = exported.len();
    exported.extend(families(&get(agent, "/metrics").await));
    assert!(
        exported.contains_key("graceful_drain_webhook_reviews")
            && exported.contains_key("graceful_drain_evictions"),
        "both components' families were read: {exported:?}"
    );
    assert!(webhook_count > 0 && exported.len() > webhook_count);

    let mut failures = Vec::new();
    let mut checked = 0;
    for file in QUERY_FILES {
        let names = referenced(&repo_file(file));
        assert!(!names.is_empty(), "{file} names no graceful_drain_ metric");
        for name in names {
            checked += 1;
            if let Err(why) = resolve(&name, &exported) {
                failures.push(format!("{file}: {why}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "queries name metrics that are not exported:\n{}",
        failures.join("\n")
    );
    assert!(
        checked > 20,
        "only {checked} names found: is the extraction broken?"
    );
}

/// The resolver itself: what it must refuse, so the test above can fail.
#[test]
fn resolver_refuses_unknown_names_and_wrong_suffixes() {
    let exported: BTreeMap<String, String> = [
        ("graceful_drain_webhook_reviews", "counter"),
        ("graceful_drain_webhook_leader", "gauge"),
        ("graceful_drain_drain_duration_seconds", "histogram"),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t.to_string()))
    .collect();
    let ok = |n: &str| resolve(n, &exported).is_ok();
    assert!(ok("graceful_drain_webhook_reviews_total"));
    assert!(ok("graceful_drain_webhook_leader"));
    assert!(ok("graceful_drain_drain_duration_seconds_bucket"));
    assert!(ok("graceful_drain_drain_duration_seconds_count"));
    assert!(
        !ok("graceful_drain_webhook_reviews"),
        "a counter without _total"
    );
    assert!(
        !ok("graceful_drain_webhook_leader_total"),
        "a gauge as a counter"
    );
    assert!(
        !ok("graceful_drain_drain_duration_seconds"),
        "a bare histogram"
    );
    assert!(!ok("graceful_drain_webhook_certificate_expiry_seconds"));
    let names = referenced(
        "rate(graceful_drain_webhook_reviews_total{a=\"b\"}[5m]) my_graceful_drain_x graceful_drain_leader)",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "graceful_drain_leader",
            "graceful_drain_webhook_reviews_total"
        ]
    );
}
