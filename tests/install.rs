//! The install manifests on the simulated cluster, as a user without Helm would use them:
//! `deploy/graceful-drain.yaml` (the chart rendered in cert-manager mode) is applied with
//! the real `kubectl`; the test plays cert-manager (serving certificate, CA injection) and
//! the kubelet (it starts the real `graceful-drain webhook` binary with the Deployment's own
//! command line and environment). An eviction sent to the API server must then reach the
//! webhook through the rendered webhook configurations and be turned into an isolation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use graceful_drain::runtime::Shutdown;
use graceful_drain::sim::cluster::{Cluster, ClusterConfig, WebSpec, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Bound for every wait; runs take a few seconds.
const TIMEOUT: Duration = Duration::from_secs(30);
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/graceful-drain.yaml");
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

/// Runs kubectl against the simulated cluster; panics with its output on failure.
fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {}: {stdout}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `(apiVersion, kind)` pairs the cluster serves, from kubectl's own discovery.
fn served_kinds(kubeconfig: &Path) -> Vec<(String, String)> {
    kubectl(kubeconfig, &["api-resources", "--no-headers"])
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
    kubectl(kubeconfig, &["apply", "-f", ns_file.to_str().unwrap()]);
    kubectl(kubeconfig, &["apply", "-f", rest_file.to_str().unwrap()]);
    let mut skipped: Vec<String> = skipped.iter().map(|d| kind(d).to_string()).collect();
    skipped.dedup();
    skipped
}

/// What cert-manager's cainjector does for `cert-manager.io/inject-ca-from`.
fn inject_ca(kubeconfig: &Path, resource: &str, ca_pem: &str) {
    let config: Value =
        serde_json::from_str(&kubectl(kubeconfig, &["get", resource, NAME, "-o", "json"])).unwrap();
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
    kubectl(
        kubeconfig,
        &["patch", resource, NAME, "--type=json", "-p", &patch],
    );
}

/// The webhook container's command line and environment, as the kubelet would run them,
/// with files and addresses pointed at this machine.
fn webhook_command(docs: &[Value], tls_dir: &Path, kubeconfig: &Path) -> tokio::process::Command {
    let deployment = docs
        .iter()
        .find(|d| kind(d) == "Deployment" && d["metadata"]["name"] == NAME)
        .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_graceful-drain"));
    for arg in container["args"].as_array().unwrap() {
        let arg = arg.as_str().unwrap();
        cmd.arg(match arg.split_once('=') {
            Some(("--tls-cert", _)) => format!("--tls-cert={}", tls_dir.join("tls.crt").display()),
            Some(("--tls-key", _)) => format!("--tls-key={}", tls_dir.join("tls.key").display()),
            _ => arg.to_string(),
        });
    }
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()));
    let fields: BTreeMap<&str, &str> = [
        ("metadata.namespace", NAMESPACE),
        ("metadata.name", "webhook-0"),
    ]
    .into();
    cmd.env_clear();
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some(field) => fields[field].to_string(),
            None => var["value"].as_str().unwrap().to_string(),
        };
        cmd.env(name, value);
    }
    // Loopback only, any free port: the webhook logs where it listens.
    cmd.env("GRACEFUL_DRAIN_LISTEN", "127.0.0.1:0")
        .env("GRACEFUL_DRAIN_ADMIN_LISTEN", "127.0.0.1:0")
        .env("GRACEFUL_DRAIN_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// The webhook's HTTPS and admin addresses, from its "listening" log lines.
struct Listening {
    https: SocketAddr,
    admin: SocketAddr,
}

/// Reads the webhook's JSON log until it has logged both listening addresses.
async fn listening(child: &mut tokio::process::Child) -> Listening {
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let found = tokio::time::timeout(TIMEOUT, async {
        let (mut https, mut admin) = (None, None);
        while let Some(line) = lines.next_line().await.unwrap() {
            let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            assert_ne!(entry["level"], "ERROR", "webhook failed: {line}");
            let fields = &entry["fields"];
            let addr = |key: &str| fields[key].as_str().map(|a| a.parse().unwrap());
            https = https.or(addr("addr"));
            admin = admin.or(addr("admin_addr"));
            if let (Some(https), Some(admin)) = (https, admin) {
                return Listening { https, admin };
            }
        }
        panic!("webhook exited before listening");
    })
    .await
    .expect("webhook listening in time");
    // Keep draining its log so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    found
}

/// Whether the admin port answers `/readyz` with 200 (certificate loaded, caches synced).
async fn ready(admin: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut conn) = tokio::net::TcpStream::connect(admin).await else {
        return false;
    };
    let request = b"GET /readyz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n";
    let mut response = String::new();
    conn.write_all(request).await.is_ok()
        && conn.read_to_string(&mut response).await.is_ok()
        && response.starts_with("HTTP/1.1 200")
}

fn draining(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(graceful_drain::labels::DRAINING_LABEL))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_applied_with_kubectl_route_evictions_to_the_webhook() {
    graceful_drain::runtime::install_crypto_provider();
    let cluster = Cluster::start(ClusterConfig::default(), Shutdown::new())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin.kubeconfig");
    cluster.api().write_kubeconfig(&admin, "admin").unwrap();
    let docs = manifests();

    let skipped = apply(&admin, dir.path(), &docs);
    eprintln!("applied the manifests; kinds the simulator does not serve: {skipped:?}");

    // cert-manager: a serving certificate for the Service's names, CA injected.
    let names = graceful_drain::certs::service_dns_names(NAME, NAMESPACE);
    let bundle = graceful_drain::certs::generate("graceful-drain webhook", &names, &[]).unwrap();
    let tls_dir: PathBuf = dir.path().join("tls");
    graceful_drain::certs::write(&bundle, &tls_dir).unwrap();
    for resource in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
    ] {
        inject_ca(&admin, resource, &bundle.ca_cert);
    }

    // A Deployment behind a load balancer, whose pods the webhook must keep serving.
    // Budget for two disruptions: each isolation counts as one.
    let spec = WebSpec {
        min_available: 2,
        ..WebSpec::default()
    };
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    let listed = pods
        .list(&ListParams::default().labels(&format!("app={}", spec.name)))
        .await
        .unwrap();
    let victims: Vec<String> = listed
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();

    // The kubelet: the webhook as its ServiceAccount, reached through its Service.
    let sa = dir.path().join("webhook.kubeconfig");
    let user = format!("system:serviceaccount:{NAMESPACE}:{NAME}");
    cluster.api().write_kubeconfig(&sa, &user).unwrap();
    let mut webhook = webhook_command(&docs, &tls_dir, &sa).spawn().unwrap();
    let addrs = listening(&mut webhook).await;
    cluster.api().route_service(NAMESPACE, NAME, addrs.https);
    wait_for("webhook ready", TIMEOUT, || ready(addrs.admin))
        .await
        .unwrap();
    let admission_before = cluster.api().stats().admission_total();

    // An eviction (a proper policy/v1 Eviction, as kubectl drain sends it) reaches the
    // webhook through the rendered MutatingWebhookConfiguration, which isolates the pod:
    // out of its ReplicaSet and Services, still running, marked draining.
    let eviction = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victims[0], "namespace": spec.namespace},
    });
    pods.create_subresource::<_, Value>("eviction", &victims[0], &PostParams::default(), &eviction)
        .await
        .unwrap();
    assert!(cluster.api().stats().admission_total() > admission_before);
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
