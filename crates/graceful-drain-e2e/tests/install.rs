//! The install manifests on the simulated cluster, as a user without Helm would use them:
//! `deploy/graceful-drain.yaml` (the chart rendered in cert-manager mode) is applied with
//! the real `kubectl`; the test plays cert-manager (serving certificate, CA injection) and
//! the kubelet (it starts the real `graceful-drain webhook` binary with the Deployment's own
//! command line and environment), then checks what a user would see: evictions and deletes
//! reach the webhook through the rendered configurations and isolate the pod first, and
//! the DaemonSet's node agent, started with its rendered command line, drains a node when
//! `graceful-drain drain NODE` creates a LifecycleEvent.
//! Every request the webhook and the agent make is also checked against the RBAC rules
//! the manifests bind to their ServiceAccounts ([`rbac`]), so a missing permission shows
//! here and not on the first real cluster.
//!
//! The `real_tier_*` tests install the chart on a real control plane
//! (`graceful_drain_e2e::tier`) with Helm 4, in its self-signed certificate mode, and run
//! the same checks: kube-apiserver calls the webhook through the chart's Service and
//! configurations, and judges every request of the webhook and the agent by the RBAC Helm
//! installed. The machine's network plays the cluster's: the Service becomes an
//! `ExternalName` of `localhost` (kube-apiserver then dials `localhost` at the
//! configurations' port and still checks the Service's name in the certificate), and the
//! webhook listens there. Helm is found through `GRACEFUL_DRAIN_HELM` or at
//! `.tools/bin/helm` (`.ci/install-tools.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "install_support/rbac.rs"]
mod rbac;

use graceful_drain_e2e::kubectl;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use graceful_drain_e2e::tier::{TestCluster, Tier};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube_sim::cluster::{Access, ClusterConfig, WebSpec, wait_for};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Bound for every wait; runs take a few seconds.
const TIMEOUT: Duration = Duration::from_secs(30);
const MANIFESTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/graceful-drain.yaml"
);
const NAMESPACE: &str = "graceful-drain";
const NAME: &str = "graceful-drain-webhook";
/// Kinds the manifests must bring to any cluster; the simulator must serve them all.
const ESSENTIAL: &[&str] = &[
    "Namespace",
    "ServiceAccount",
    "Service",
    "Deployment",
    "DaemonSet",
    "PodDisruptionBudget",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];

fn manifests() -> Vec<Value> {
    let text = std::fs::read_to_string(MANIFESTS).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|doc| doc.is_object())
        .collect()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// `(apiVersion, kind)` pairs the cluster serves, from kubectl's own discovery.
fn served_kinds(kubeconfig: &Path) -> Vec<(String, String)> {
    kubectl::stdout(kubeconfig, &["api-resources", "--no-headers"])
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let n = cols.len();
            (n >= 4).then(|| (cols[n - 3].to_string(), cols[n - 1].to_string()))
        })
        .collect()
}

fn write_docs(path: &Path, docs: &[&Value]) {
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string(d).unwrap())
        .collect();
    // JSON documents are YAML documents.
    std::fs::write(path, text.join("\n---\n")).unwrap();
}

/// Applies the manifests the cluster can serve, namespace first, like a user would;
/// returns the kinds it left out (cert-manager's, RBAC where the simulator lacks it).
fn apply(kubeconfig: &Path, dir: &Path, docs: &[Value]) -> Vec<String> {
    let served = served_kinds(kubeconfig);
    let is_served = |d: &Value| {
        let api = d["apiVersion"].as_str().unwrap_or_default();
        served.iter().any(|(a, k)| a == api && k == kind(d))
    };
    let (namespaces, rest): (Vec<&Value>, Vec<&Value>) =
        docs.iter().partition(|d| kind(d) == "Namespace");
    let (applied, skipped): (Vec<&Value>, Vec<&Value>) =
        rest.into_iter().partition(|d| is_served(d));
    for want in ESSENTIAL {
        assert!(
            namespaces.iter().chain(&applied).any(|d| kind(d) == *want),
            "{want} missing from the manifests or not served by the simulator"
        );
    }
    let ns_file = dir.join("namespace.yaml");
    let rest_file = dir.join("rest.yaml");
    write_docs(&ns_file, &namespaces);
    write_docs(&rest_file, &applied);
    kubectl::stdout(kubeconfig, &["apply", "-f", ns_file.to_str().unwrap()]);
    kubectl::stdout(kubeconfig, &["apply", "-f", rest_file.to_str().unwrap()]);
    let mut skipped: Vec<String> = skipped.iter().map(|d| kind(d).to_string()).collect();
    skipped.dedup();
    skipped
}

/// What cert-manager's cainjector does for `cert-manager.io/inject-ca-from`.
fn inject_ca(kubeconfig: &Path, resource: &str, ca_pem: &str) {
    let config: Value = serde_json::from_str(&kubectl::stdout(
        kubeconfig,
        &["get", resource, NAME, "-o", "json"],
    ))
    .unwrap();
    let annotation = &config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"];
    assert_eq!(
        annotation,
        &json!(format!("{NAMESPACE}/{NAME}")),
        "{resource}"
    );
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let patch: Vec<Value> = (0..config["webhooks"].as_array().unwrap().len())
        .map(|i| json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}))
        .collect();
    let patch = serde_json::to_string(&patch).unwrap();
    kubectl::stdout(
        kubeconfig,
        &["patch", resource, NAME, "--type=json", "-p", &patch],
    );
}

/// The first container of the workload `kind`/`name`, with its command line and
/// environment as the kubelet would run it: downward-API fields filled from `fields`,
/// each argument passed through `rewrite` (files and folders pointed at this machine),
/// addresses on loopback with any free port (it logs where it listens), JSON logs.
fn container_command(
    docs: &[Value],
    (kind_, name): (&str, &str),
    fields: &BTreeMap<&str, String>,
    rewrite: impl Fn(&str) -> String,
    kubeconfig: &Path,
) -> tokio::process::Command {
    let workload = docs
        .iter()
        .find(|d| kind(d) == kind_ && d["metadata"]["name"] == name)
        .unwrap();
    let container = &workload["spec"]["template"]["spec"]["containers"][0];
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_graceful-drain-e2e"));
    for arg in container["args"].as_array().unwrap() {
        cmd.arg(rewrite(arg.as_str().unwrap()));
    }
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()));
    cmd.env_clear();
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some(field) => fields[field].clone(),
            None => var["value"].as_str().unwrap().to_string(),
        };
        cmd.env(name, value);
    }
    cmd.env("GRACEFUL_DRAIN_LISTEN", "127.0.0.1:0")
        .env("GRACEFUL_DRAIN_ADMIN_LISTEN", "127.0.0.1:0")
        .env("GRACEFUL_DRAIN_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Reads a component's JSON log until it has logged an address under each of `keys`
/// (e.g. `addr`, `admin_addr`); returns them in that order. Every line also goes to the
/// file `log`, which [`Installed`] prints when a test fails.
async fn listening(
    child: &mut tokio::process::Child,
    keys: &[&str],
    log: &Path,
) -> Vec<SocketAddr> {
    use tokio::io::AsyncWriteExt;
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut file = tokio::fs::File::create(log).await.unwrap();
    let found = tokio::time::timeout(TIMEOUT, async {
        let mut found: Vec<Option<SocketAddr>> = vec![None; keys.len()];
        while let Some(line) = lines.next_line().await.unwrap() {
            file.write_all(format!("{line}\n").as_bytes())
                .await
                .unwrap();
            let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            assert_ne!(entry["level"], "ERROR", "component failed: {line}");
            for (slot, key) in found.iter_mut().zip(keys) {
                let addr = entry["fields"][key].as_str().map(|a| a.parse().unwrap());
                *slot = slot.or(addr);
            }
            if found.iter().all(Option::is_some) {
                return found.into_iter().flatten().collect();
            }
        }
        panic!("component exited before listening");
    })
    .await
    .expect("component listening in time");
    // Keep draining its log so the process never blocks on a full pipe.
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = file.write_all(format!("{line}\n").as_bytes()).await;
        }
    });
    found
}

/// The whole answer of the plain-HTTP admin port at `admin` to `GET path`; `None` while
/// nothing answers there.
async fn admin_get(admin: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(admin).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).await.ok()?;
    Some(response)
}

/// Whether the admin port answers `/readyz` with 200 (certificate loaded, caches synced).
async fn ready(admin: SocketAddr) -> bool {
    admin_get(admin, "/readyz")
        .await
        .is_some_and(|r| r.starts_with("HTTP/1.1 200"))
}

fn draining(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(graceful_drain_core::labels::DRAINING_LABEL))
}

/// A cluster with graceful-drain installed and the webhook running behind its Service:
/// on the simulated cluster as after `kubectl apply -f deploy/graceful-drain.yaml` with
/// cert-manager, on the real tier as after `helm install`.
struct Installed {
    cluster: TestCluster,
    dir: tempfile::TempDir,
    docs: Vec<Value>,
    admin: PathBuf,
    /// The webhook's admin port (`/readyz`, `/metrics`).
    webhook_admin: SocketAddr,
    _webhook: tokio::process::Child,
}

impl Drop for Installed {
    /// A failed test prints the last lines of the components' logs.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for name in ["webhook.log", "agent.log"] {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "--- {name} (last {} lines)\n{}",
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

fn fields(pairs: &[(&'static str, &str)]) -> BTreeMap<&'static str, String> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// A kubeconfig with the token of ServiceAccount `sa` of the release namespace.
async fn sa_kubeconfig(cluster: &TestCluster, dir: &Path, sa: &str) -> PathBuf {
    let path = dir.join(format!("{sa}.kubeconfig"));
    let user = format!("system:serviceaccount:{NAMESPACE}:{sa}");
    cluster.write_kubeconfig(&path, &user).await.unwrap();
    path
}

/// The Helm 4 binary: `GRACEFUL_DRAIN_HELM`, else `.tools/bin/helm` of this workspace.
/// `None` (the test ends) where neither exists, except in CI.
fn helm_binary() -> Option<PathBuf> {
    let path = std::env::var_os("GRACEFUL_DRAIN_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin/helm"));
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must install helm before the tests (bash .ci/install-tools.sh): none at {}",
        path.display()
    );
    eprintln!(
        "real tier skipped: no helm at {} (bash .ci/install-tools.sh)",
        path.display()
    );
    None
}

/// Runs helm with `args` against the cluster of `kubeconfig`, its cache and config under
/// `dir`; panics with its output when it fails. Returns its standard output.
fn helm(helm: &Path, kubeconfig: &Path, dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {}: {stdout}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/graceful-drain");

/// `helm install` of the chart as release `graceful-drain` (the names the rendered
/// manifests carry) in self-signed mode, the configurations calling the Service at
/// `port`; the lifecycle CRDs are the data plane's already. Then the Service becomes an
/// `ExternalName` of `localhost`, before anything could make kube-apiserver call it, and
/// the serving certificate is written under `tls_dir` as the Secret's volume would hold
/// it. `values` are more `--set` values. Returns the release's manifests.
fn helm_install(
    helm_bin: &Path,
    admin: &Path,
    dir: &Path,
    port: u16,
    tls_dir: &Path,
    values: &[&str],
) -> Vec<Value> {
    let port = format!("webhook.service.port={port}");
    let mut args = vec![
        "install",
        NAMESPACE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--set",
        "certificates.mode=self-signed",
        "--set",
        "lifecycleCrds.install=false",
        "--set",
        &port,
        "--wait",
        "--timeout",
        "90s",
    ];
    for value in values {
        args.extend(["--set", value]);
    }
    helm(helm_bin, admin, dir, &args);
    let external = r#"{"spec": {"type": "ExternalName", "externalName": "localhost"}}"#;
    kubectl::stdout(
        admin,
        &[
            "-n",
            NAMESPACE,
            "patch",
            "service",
            NAME,
            "--type=merge",
            "-p",
            external,
        ],
    );
    let secret: Value = serde_json::from_str(&kubectl::stdout(
        admin,
        &[
            "-n",
            NAMESPACE,
            "get",
            "secret",
            &format!("{NAME}-tls"),
            "-o",
            "json",
        ],
    ))
    .unwrap();
    std::fs::create_dir_all(tls_dir).unwrap();
    for file in ["tls.crt", "tls.key"] {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(secret["data"][file].as_str().unwrap())
            .unwrap();
        std::fs::write(tls_dir.join(file), pem).unwrap();
    }
    let manifest = helm(
        helm_bin,
        admin,
        dir,
        &["get", "manifest", NAMESPACE, "--namespace", NAMESPACE],
    );
    serde_saphyr::from_multiple::<Value>(&manifest)
        .unwrap()
        .into_iter()
        .filter(|doc| doc.is_object())
        .collect()
}

/// Installs graceful-drain on `tier` (kubectl and the rendered manifests on the simulated
/// cluster, Helm on the real tier), deploys `spec` (before the webhook starts, so its
/// caches hold the endpoints from the first list) and waits until the webhook is ready.
/// `None` when the real tier or Helm is not available here.
async fn install(tier: Tier, spec: &WebSpec) -> Option<Installed> {
    install_with(tier, spec, &[]).await
}

/// [`install`], the chart installed with the Helm `values` (`key=value`, as for `--set`);
/// on the real tier only, where the chart is rendered (the simulated tier applies the
/// manifests rendered with the defaults).
async fn install_with(tier: Tier, spec: &WebSpec, values: &[&str]) -> Option<Installed> {
    if !kubectl::available("install tests") {
        return None;
    }
    assert!(
        values.is_empty() || tier == Tier::Real,
        "Helm values need the real tier"
    );
    graceful_drain_core::runtime::install_crypto_provider();
    rbac::install();
    let helm_bin = match tier {
        Tier::Simulated => None,
        Tier::Real => Some(helm_binary()?),
    };
    let cluster = TestCluster::start_bare(tier, ClusterConfig::default())
        .await
        .unwrap()?;
    let dir = tempfile::tempdir().unwrap();
    let admin = cluster.admin_kubeconfig().to_path_buf();
    let tls_dir = dir.path().join("tls");
    // Where the webhook serves admission: any free port behind the simulated API
    // server's route; on the real tier the port the configurations call.
    let (docs, listen) = match &helm_bin {
        None => {
            let docs = manifests();
            let skipped = apply(&admin, dir.path(), &docs);
            eprintln!("applied the manifests; kinds the simulator does not serve: {skipped:?}");
            // cert-manager: a serving certificate for the Service's names, CA injected.
            let names = graceful_drain_core::certs::service_dns_names(NAME, NAMESPACE);
            let bundle =
                graceful_drain_core::certs::generate("graceful-drain webhook", &names, &[])
                    .unwrap();
            graceful_drain_core::certs::write(&bundle, &tls_dir).unwrap();
            for resource in [
                "mutatingwebhookconfiguration",
                "validatingwebhookconfiguration",
            ] {
                inject_ca(&admin, resource, &bundle.ca_cert);
            }
            (docs, "127.0.0.1:0".to_string())
        }
        Some(helm_bin) => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let docs = helm_install(helm_bin, &admin, dir.path(), port, &tls_dir, values);
            (docs, format!("127.0.0.1:{port}"))
        }
    };
    cluster.deploy_web(spec, TIMEOUT).await.unwrap();
    // The webhook refuses to isolate while the PDB's budget is not yet observed.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), &spec.namespace);
    let budget = spec.replicas - spec.min_available;
    wait_for("PDB budget observed", TIMEOUT, || {
        let pdbs = pdbs.clone();
        async move {
            let pdb = pdbs.get(&spec.name).await.unwrap();
            pdb.status.is_some_and(|s| s.disruptions_allowed >= budget)
        }
    })
    .await
    .unwrap();

    // The kubelet: the webhook as its ServiceAccount, reached through its Service.
    let rewrite = |arg: &str| match arg.split_once('=') {
        Some(("--tls-cert", _)) => format!("--tls-cert={}", tls_dir.join("tls.crt").display()),
        Some(("--tls-key", _)) => format!("--tls-key={}", tls_dir.join("tls.key").display()),
        _ => arg.to_string(),
    };
    let fields = fields(&[
        ("metadata.namespace", NAMESPACE),
        ("metadata.name", "webhook-0"),
    ]);
    let kubeconfig = sa_kubeconfig(&cluster, dir.path(), NAME).await;
    let mut cmd = container_command(&docs, ("Deployment", NAME), &fields, rewrite, &kubeconfig);
    // Seconds instead of the default minute, so isolated pods go within the test's bounds.
    cmd.env("GRACEFUL_DRAIN_DEREGISTRATION_DELAY", "2s")
        .env("GRACEFUL_DRAIN_LISTEN", &listen);
    let mut webhook = cmd.spawn().unwrap();
    let addrs = listening(
        &mut webhook,
        &["addr", "admin_addr"],
        &dir.path().join("webhook.log"),
    )
    .await;
    if let Some(sim) = cluster.simulated() {
        sim.api().route_service(NAMESPACE, NAME, addrs[0]);
    }
    wait_for("webhook ready", TIMEOUT, || ready(addrs[1]))
        .await
        .unwrap();
    Some(Installed {
        cluster,
        dir,
        docs,
        admin,
        webhook_admin: addrs[1],
        _webhook: webhook,
    })
}

async fn web_pods(cluster: &TestCluster, spec: &WebSpec) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    pods.list(&ListParams::default().labels(&format!("app={}", spec.name)))
        .await
        .unwrap()
        .items
}

/// Asserts that each of `accounts` (ServiceAccount names in the release namespace) made
/// requests, and that the manifests' RBAC allows every one of them. On the real tier
/// kube-apiserver enforced that RBAC on every request already.
fn assert_rbac_allows(installed: &Installed, accounts: &[&str]) {
    if installed.cluster.tier() == Tier::Real {
        return;
    }
    let requests = rbac::recorded();
    for sa in accounts {
        let user = format!("system:serviceaccount:{NAMESPACE}:{sa}");
        let made = requests.iter().filter(|r| r.user == user).count();
        assert!(made > 0, "no request recorded for {user}");
        let denied = rbac::denied(&installed.docs, &user, &requests);
        assert!(
            denied.is_empty(),
            "RBAC of {sa} refuses {} of its {made} requests:\n{}",
            denied.len(),
            denied.join("\n")
        );
    }
}

/// Budget for two disruptions out of four replicas: each isolation counts as one.
fn web() -> WebSpec {
    WebSpec {
        min_available: 2,
        ..WebSpec::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_applied_with_kubectl_route_evictions_and_deletes_to_the_webhook() {
    evictions_and_deletes_reach_the_webhook(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_chart_installed_with_helm_routes_evictions_and_deletes_to_the_webhook() {
    evictions_and_deletes_reach_the_webhook(Tier::Real).await;
}

/// Admission reviews the webhook answered so far, from its `/metrics`: what reached it,
/// on either tier; its own protection probes' reviews not counted.
async fn reviews_answered(installed: &Installed) -> u64 {
    admin_get(installed.webhook_admin, "/metrics")
        .await
        .expect("the webhook's admin port answers /metrics")
        .lines()
        .filter(|l| l.starts_with("graceful_drain_webhook_reviews_total{"))
        .filter(|l| !l.contains("outcome=\"probe\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn evictions_and_deletes_reach_the_webhook(tier: Tier) {
    let spec = web();
    let Some(installed) = install(tier, &spec).await else {
        return;
    };
    let cluster = &installed.cluster;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    let victims: Vec<String> = web_pods(cluster, &spec)
        .await
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let reviews_before = reviews_answered(&installed).await;

    // An eviction (a proper policy/v1 Eviction, as kubectl drain sends it) reaches the
    // webhook through the rendered MutatingWebhookConfiguration, which isolates the pod:
    // out of its ReplicaSet and Services, still running, marked draining; the caller is
    // told to come back once the pod has left its load balancers (429).
    let eviction = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victims[0], "namespace": spec.namespace},
    });
    let answer = pods
        .create_subresource::<_, Value>("eviction", &victims[0], &PostParams::default(), &eviction)
        .await;
    assert!(
        matches!(&answer, Err(kube::Error::Api(s)) if s.code == 429 && s.message.contains("leaving its load balancers")),
        "{answer:?}"
    );
    assert!(reviews_answered(&installed).await > reviews_before);
    let isolated = pods.get(&victims[0]).await.unwrap();
    assert!(
        draining(&isolated),
        "evicted pod not isolated: {:?}",
        isolated.metadata
    );

    // A direct DELETE (a rollout, kubectl delete) reaches it through the rendered
    // ValidatingWebhookConfiguration: the pod is isolated before its deletion is admitted.
    pods.delete(&victims[1], &DeleteParams::default())
        .await
        .unwrap();
    let deleted = pods.get_opt(&victims[1]).await.unwrap();
    let deleted = deleted.expect("pod still terminating after its grace period started");
    assert!(deleted.metadata.deletion_timestamp.is_some());
    assert!(
        draining(&deleted),
        "deleted pod not isolated first: {:?}",
        deleted.metadata
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_agent_from_the_manifests_drains_a_node_through_a_lifecycle_event() {
    the_node_agent_drains_a_node(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_node_agent_from_the_helm_release_drains_a_node_through_a_lifecycle_event() {
    the_node_agent_drains_a_node(Tier::Real).await;
}

async fn the_node_agent_drains_a_node(tier: Tier) {
    let spec = web();
    let Some(installed) = install(tier, &spec).await else {
        return;
    };
    let (cluster, dir) = (&installed.cluster, installed.dir.path());
    // The node with the most web pods.
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for pod in web_pods(cluster, &spec).await {
        let node = pod.spec.and_then(|s| s.node_name).unwrap();
        *per_node.entry(node).or_default() += 1;
    }
    let (node, on_node) = per_node.into_iter().max_by_key(|(_, n)| *n).unwrap();

    // The DaemonSet's pod on that node, its kubelet folders under a scratch directory.
    let kubelet = dir.join("kubelet");
    std::fs::create_dir_all(kubelet.join("plugins_registry")).unwrap();
    let rewrite = |arg: &str| arg.replace("=/var/lib/kubelet", &format!("={}", kubelet.display()));
    let fields = fields(&[("spec.nodeName", &node)]);
    // The token the kubelet projects into the agent's pod names its node.
    let kubeconfig = dir.join("graceful-drain-agent.kubeconfig");
    let agent_user = format!("system:serviceaccount:{NAMESPACE}:graceful-drain-agent");
    cluster
        .write_node_kubeconfig(&kubeconfig, &agent_user, &node)
        .await
        .unwrap();
    let agent_name = "graceful-drain-agent";
    let mut agent = container_command(
        &installed.docs,
        ("DaemonSet", agent_name),
        &fields,
        rewrite,
        &kubeconfig,
    )
    .spawn()
    .unwrap();
    let admin = listening(&mut agent, &["admin_addr"], &dir.join("agent.log")).await;
    wait_for("agent ready", TIMEOUT, || ready(admin[0]))
        .await
        .unwrap();
    let reviews_before = reviews_answered(&installed).await;

    // The user's side: `graceful-drain drain NODE`, which creates the LifecycleEvent and
    // follows it until the agent reports drain-complete.
    let drain = tokio::process::Command::new(env!("CARGO_BIN_EXE_graceful-drain-e2e"))
        .args(["drain", &node, "--timeout=60s", "--kubeconfig"])
        .arg(&installed.admin)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), drain)
        .await
        .expect("drain finished in time")
        .unwrap();
    assert!(
        out.status.success(),
        "graceful-drain drain {node}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let nodes: Api<Node> = Api::all(cluster.client());
    let drained = nodes.get(&node).await.unwrap();
    assert_eq!(drained.spec.and_then(|s| s.unschedulable), Some(true));
    let reason = drained
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "LifecycleTransition")
        .and_then(|c| c.reason);
    assert_eq!(reason.as_deref(), Some("drain-complete"));
    // Every pod of the namespace, isolated ones included (they lost the `app` label).
    let all: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    let left: Vec<String> = all
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(left.is_empty(), "web pods left on {node}: {left:?}");
    assert!(
        reviews_answered(&installed).await >= reviews_before + on_node as u64,
        "each of the {on_node} evictions went through the webhook"
    );
    assert_rbac_allows(&installed, &[NAME, agent_name]);
}

/// How often the protection test's release probes (`webhook.probe.interval`).
const PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// Probes in a row that stand for more than the alert's `for: 2m` once each probe counts as
/// one scrape of the default 30 s interval: 6 × 30 s.
const PROBES_PER_PHASE: usize = 6;

/// promtool, as `.ci/checks/alerts.sh` builds it into the cache outside the clone:
/// `GRACEFUL_DRAIN_PROMTOOL`, else `tools/promtool-*/promtool` there. `None` (the test
/// ends) where it is not built, except in CI.
fn promtool_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("GRACEFUL_DRAIN_PROMTOOL") {
        return Some(PathBuf::from(path));
    }
    let tools = kube_control_plane::cache_dir().join("tools");
    let found = std::fs::read_dir(&tools)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("promtool-"))
        .map(|e| e.path().join("promtool"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must build promtool before the tests (bash .ci/checks/alerts.sh --build-only): none under {}",
            tools.display()
        );
        eprintln!(
            "skipped: no promtool under {} (bash .ci/checks/alerts.sh --build-only)",
            tools.display()
        );
    }
    found
}

/// The value of the metric `name` (without labels) on the admin port `admin`.
async fn gauge(admin: SocketAddr, name: &str) -> Option<f64> {
    admin_get(admin, "/metrics")
        .await?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// What one probe left behind: the Lease's annotations and the replica's gauge.
#[derive(Debug)]
struct Probed {
    protection: String,
    checked_at: String,
    gauge: f64,
}

/// Waits for the next probe the Lease records (its checked-at annotation changes from
/// `last`), bounded by two probe intervals and the Lease's renewal, and returns it.
async fn next_probe(installed: &Installed, lease: &str, last: Option<&str>) -> Probed {
    use graceful_drain_webhook::probe;
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(installed.cluster.client(), NAMESPACE);
    let seen = std::sync::Mutex::new(None);
    let bound = PROBE_INTERVAL * 2 + graceful_drain_webhook::lease::RETRY;
    wait_for("the next probe on the Lease", bound, || {
        let (leases, seen) = (&leases, &seen);
        async move {
            let annotations = leases
                .get_opt(lease)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.metadata.annotations)
                .unwrap_or_default();
            let checked = annotations.get(probe::CHECKED_AT_ANNOTATION).cloned();
            if checked.is_none() || checked.as_deref() == last {
                return false;
            }
            *seen.lock().unwrap() = Some((
                annotations[probe::PROTECTION_ANNOTATION].clone(),
                checked.unwrap(),
            ));
            true
        }
    })
    .await
    .unwrap();
    let (protection, checked_at) = seen.into_inner().unwrap().unwrap();
    let gauge = gauge(
        installed.webhook_admin,
        "graceful_drain_webhook_protection_active",
    )
    .await
    .expect("the webhook exports graceful_drain_webhook_protection_active");
    Probed {
        protection,
        checked_at,
        gauge,
    }
}

/// The chart's alert rules (its PrometheusRule's spec, release `graceful-drain`) as the
/// file promtool reads (`rules.yaml` in `dir`); returns the spec.
fn alert_rules(helm_bin: &Path, dir: &Path) -> Value {
    let out = std::process::Command::new(helm_bin)
        .args(["template", NAMESPACE, CHART, "--namespace", NAMESPACE])
        .args(["--set", "metrics.prometheusRule.enabled=true"])
        .args(["--set", "metrics.serviceMonitor.enabled=true"])
        .args(["--show-only", "templates/prometheus-rule.yaml"])
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template: {out:?}");
    let rule: Value = serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    // JSON is YAML: promtool reads it as it is.
    std::fs::write(dir.join("rules.yaml"), rule["spec"].to_string()).unwrap();
    rule["spec"].clone()
}

/// Protection observed on a release installed as users install it: `helm install` of the
/// chart, its own webhook configurations (matchConditions included), the webhook under its
/// own ServiceAccount, probing every [`PROBE_INTERVAL`]. Protection is `active` on the
/// Lease and the gauge within two probes; with the MutatingWebhookConfiguration pointed at
/// a closed port it turns `lost`, with one Warning Event however many probes fail; set
/// back, `active` again. The gauge's series this run produced, each probe one scrape of
/// the default 30 s interval, goes through the chart's alert rules in promtool:
/// GracefulDrainProtectionLost fires only in the broken phase. And the probe's exception
/// in the matchConditions is only the probe's: the deleter's own DELETE of a scale-down's
/// pod still skips the webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_a_helm_release_reports_whether_the_api_server_calls_it() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Event;
    let interval = format!("webhook.probe.interval={}s", PROBE_INTERVAL.as_secs());
    let Some(installed) = install_with(Tier::Real, &web(), &[&interval]).await else {
        return;
    };
    let Some(promtool) = promtool_binary() else {
        return;
    };
    let helm_bin = helm_binary().unwrap();
    let dir = installed.dir.path();
    // The Lease the release's webhook writes, from its command line.
    let webhook = installed
        .docs
        .iter()
        .find(|d| kind(d) == "Deployment" && d["metadata"]["name"] == NAME)
        .unwrap();
    let lease = webhook["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--lease-name="))
        .expect("the chart names the webhook's Lease")
        .to_string();

    let mut series: Vec<f64> = Vec::new();
    let mut last: Option<String> = None;
    let probe = async |series: &mut Vec<f64>, last: &mut Option<String>| {
        let probed = next_probe(&installed, &lease, last.as_deref()).await;
        eprintln!("probe: {probed:?}");
        series.push(probed.gauge);
        *last = Some(probed.checked_at.clone());
        probed
    };

    // Active from the first probe on, through the chart's own configurations.
    for _ in 0..PROBES_PER_PHASE {
        let probed = probe(&mut series, &mut last).await;
        assert_eq!(
            (probed.protection.as_str(), probed.gauge),
            ("active", 1.0),
            "a release whose webhook the API server calls reports protection"
        );
    }
    let active_until = series.len();

    // The mutating configuration (evictions) pointed at a port where nothing listens.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(installed.cluster.client());
    let name = installed
        .docs
        .iter()
        .find(|d| kind(d) == "MutatingWebhookConfiguration")
        .and_then(|d| d["metadata"]["name"].as_str())
        .unwrap()
        .to_string();
    let original = configurations.get(&name).await.unwrap();
    let mut broken = original.clone();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for hook in broken.webhooks.iter_mut().flatten() {
        let service = hook.client_config.service.as_mut().unwrap();
        service.port = Some(i32::from(closed));
    }
    configurations
        .replace(&name, &PostParams::default(), &broken)
        .await
        .unwrap();
    // Probes that may still have gone through before the API server saw the change.
    let mut lost = 0;
    while lost < PROBES_PER_PHASE {
        let probed = probe(&mut series, &mut last).await;
        if probed.protection == "active" {
            assert_eq!(lost, 0, "protection came back while the path was broken");
            assert!(
                series.len() - active_until <= 2,
                "protection not reported lost within two probes: {series:?}"
            );
            continue;
        }
        assert_eq!((probed.protection.as_str(), probed.gauge), ("lost", 0.0));
        lost += 1;
    }
    let lost_until = series.len();
    let events: Api<Event> = Api::namespaced(installed.cluster.client(), NAMESPACE);
    let warnings: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref()
                == Some(graceful_drain_core::labels::webhook_reason::PROTECTION_LOST)
        })
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one Warning Event for {lost} failed probes: {warnings:?}"
    );
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
    assert!(
        warnings[0].count.unwrap_or(1) == 1 && warnings[0].series.is_none(),
        "the Event repeated: {:?}",
        warnings[0]
    );

    // Set back: active again within two probes.
    let mut fixed = configurations.get(&name).await.unwrap();
    fixed.webhooks = original.webhooks;
    configurations
        .replace(&name, &PostParams::default(), &fixed)
        .await
        .unwrap();
    loop {
        let probed = probe(&mut series, &mut last).await;
        if probed.protection == "active" {
            assert_eq!(probed.gauge, 1.0);
            break;
        }
        assert!(
            series.len() - lost_until < 2,
            "protection not back within two probes: {series:?}"
        );
    }

    // The probe's exception in the chart's matchConditions lets nothing else of the webhook
    // through: a scale-down's pod, isolated when the replicaset-controller deletes it, is
    // deleted by the webhook's deleter at its delete time, and that DELETE skips the webhook.
    let own = |text: String| {
        text.lines()
            .filter(|l| l.starts_with("graceful_drain_webhook_reviews_total{"))
            .filter(|l| l.contains("outcome=\"own_request\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let metrics = || async {
        admin_get(installed.webhook_admin, "/metrics")
            .await
            .expect("the webhook's admin port answers /metrics")
    };
    let reviews_before = reviews_answered(&installed).await;
    let spec = web();
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(installed.cluster.client(), &spec.namespace);
    let scale = json!({"spec": {"replicas": spec.replicas - 1}});
    deployments
        .patch_scale(
            &spec.name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&scale),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(installed.cluster.client(), &spec.namespace);
    let isolated = || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(draining)
            .collect::<Vec<Pod>>()
    };
    wait_for("the scale-down's pod isolated", TIMEOUT, || async {
        !isolated().await.is_empty()
    })
    .await
    .unwrap();
    wait_for(
        "the isolated pod deleted by the deleter",
        TIMEOUT,
        || async {
            isolated()
                .await
                .iter()
                .all(|p| p.metadata.deletion_timestamp.is_some())
        },
    )
    .await
    .unwrap();
    assert!(
        reviews_answered(&installed).await > reviews_before,
        "the replicaset-controller's DELETE reached the webhook"
    );
    assert_eq!(
        own(metrics().await),
        0.0,
        "the deleter's own DELETE went through the webhook"
    );

    // The chart's alert rules on this series; the alert as the chart words it.
    let rules = alert_rules(&helm_bin, dir);
    let alert = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .find(|r| r["alert"] == "GracefulDrainProtectionLost")
        .expect("the chart has the GracefulDrainProtectionLost alert");
    let at = |probes: usize| format!("{}s", (probes - 1) * 30);
    let values: Vec<String> = series.iter().map(|v| v.to_string()).collect();
    // The alert keeps the namespace (and cluster, which this series has not) it fired for.
    let mut labels = alert["labels"].clone();
    labels["namespace"] = json!(NAMESPACE);
    let tests = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "30s",
        "tests": [{
            "name": "protection as this run's probes saw it",
            "interval": "30s",
            "input_series": [{
                "series": format!(
                    "graceful_drain_webhook_protection_active{{namespace=\"{NAMESPACE}\",pod=\"webhook-0\"}}"
                ),
                "values": values.join(" "),
            }],
            "alert_rule_test": [
                {"eval_time": at(active_until), "alertname": "GracefulDrainProtectionLost", "exp_alerts": []},
                {"eval_time": at(lost_until), "alertname": "GracefulDrainProtectionLost",
                 "exp_alerts": [{"exp_labels": labels, "exp_annotations": alert["annotations"]}]},
                {"eval_time": at(series.len()), "alertname": "GracefulDrainProtectionLost", "exp_alerts": []},
            ],
        }],
    });
    let tests_path = dir.join("protection-test.yaml");
    std::fs::write(&tests_path, tests.to_string()).unwrap();
    let out = std::process::Command::new(&promtool)
        .args(["test", "rules"])
        .arg(&tests_path)
        .current_dir(dir)
        .output()
        .unwrap();
    eprintln!(
        "promtool test rules on {} probes:\n{}{}",
        series.len(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the chart's alerts misjudge this run's series: {tests}"
    );
}

#[derive(clap::Parser)]
#[command(name = "graceful-drain")]
struct WebhookCli {
    #[command(subcommand)]
    command: WebhookCommand,
}

#[derive(clap::Subcommand)]
enum WebhookCommand {
    Webhook(Box<graceful_drain_webhook::Args>),
}

/// The chart's confirmed-release values, rendered by Helm, give the webhook a command line
/// it accepts and a balancer configuration it reads: the file the ConfigMap holds, at the
/// path the Deployment mounts and names, with the Secret mounted beside it.
#[test]
fn chart_balancer_values_render_a_configuration_the_webhook_reads() {
    use clap::Parser;
    let Some(helm_bin) = helm_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/graceful-drain");
    let config = json!({
        "source": {"haproxy": {"url": "http://haproxy.ingress.svc:8404/stats", "backend": "be_web"}},
        "timeout": "3s",
        "tokenFile": "/balancer-secret/token",
    });
    let out = std::process::Command::new(&helm_bin)
        .args(["template", "graceful-drain"])
        .arg(&chart)
        .args(["--namespace", NAMESPACE])
        .args(["--set", "certificates.mode=self-signed"])
        .args(["--set-json", &format!("webhook.balancer.config={config}")])
        .args(["--set", "webhook.balancer.pollInterval=2s"])
        .args(["--set", "webhook.balancer.secretName=haproxy-token"])
        .env("HELM_CACHE_HOME", dir.path().join("cache"))
        .env("HELM_CONFIG_HOME", dir.path().join("config"))
        .env("HELM_DATA_HOME", dir.path().join("data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).unwrap();
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let map = docs
        .iter()
        .find(|d| kind(d) == "ConfigMap" && d["metadata"]["name"] == format!("{NAME}-balancer"))
        .expect("the balancer ConfigMap");
    let file = dir.path().join("balancer.yaml");
    std::fs::write(&file, map["data"]["balancer.yaml"].as_str().unwrap()).unwrap();
    graceful_drain_webhook::balancer_lister(&file).expect("the webhook reads the rendered file");

    let deployment = docs
        .iter()
        .find(|d| kind(d) == "Deployment" && d["metadata"]["name"] == NAME)
        .unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mut argv = vec!["graceful-drain".to_string()];
    argv.extend(
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    let WebhookCommand::Webhook(args) = WebhookCli::try_parse_from(&argv).unwrap().command;
    let named = args
        .policy
        .balancer_config
        .clone()
        .expect("--balancer-config");
    assert_eq!(args.policy.balancer_poll_interval, Duration::from_secs(2));
    let mount = |volume: &str| {
        let mounts = container["volumeMounts"].as_array().unwrap();
        let mount = mounts.iter().find(|m| m["name"] == volume).unwrap();
        mount["mountPath"].as_str().unwrap().to_string()
    };
    assert_eq!(named, Path::new(&mount("balancer")).join("balancer.yaml"));
    assert_eq!(mount("balancer-secret"), "/balancer-secret");
    let volumes = pod["volumes"].as_array().unwrap();
    let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap().clone();
    assert_eq!(
        volume("balancer")["configMap"]["name"],
        format!("{NAME}-balancer")
    );
    assert_eq!(
        volume("balancer-secret")["secret"]["secretName"],
        "haproxy-token"
    );
    // A changed configuration rolls the replicas.
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    assert!(
        annotations["checksum/balancer"].is_string(),
        "{annotations}"
    );
}
