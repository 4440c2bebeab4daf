//! End-to-end scenarios of the webhook on the simulated cluster: the real webhook (started
//! from its documented flags), the simulated API server calling it over HTTPS, the
//! ReplicaSet/EndpointSlice controllers, kubelets and load balancers with traffic.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::time::{Duration, Instant};

use clap::Parser;
use graceful_drain::runtime::Shutdown;
use graceful_drain::sim::apiserver::ClientCert;
use graceful_drain::sim::cluster::{Cluster, ClusterConfig, WebSpec, wait_for};
use graceful_drain::sim::scenario::actions;
use graceful_drain::sim::traffic::TrafficConfig;
use graceful_drain::webhook::{ConfigurationsSpec, Target, webhook_configurations};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound for any convergence here; runs take seconds.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The webhook's service account in these scenarios (passed as `--own-user`; the token
/// of the kubeconfig is the user name).
const WEBHOOK_USER: &str = "system:serviceaccount:graceful-drain:graceful-drain-webhook";

#[derive(Parser)]
struct WebhookCli {
    #[command(flatten)]
    args: graceful_drain::webhook::Args,
}

/// The running webhook; dropping it stops it.
struct Webhook {
    stop: Shutdown,
    /// Where it serves admission reviews.
    listen: std::net::SocketAddr,
    /// The CA of its serving certificate (PEM).
    ca: String,
    _dir: tempfile::TempDir,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

async fn ready(admin: std::net::SocketAddr) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(admin).await else {
        return false;
    };
    let request = "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut answer)).await;
    answer.starts_with(b"HTTP/1.1 200")
}

/// Starts `graceful-drain webhook` from its documented flags against `cluster` and
/// registers it with the configurations [`webhook_configurations`] builds.
async fn start_webhook(cluster: &Cluster, delay: Duration, timeout_seconds: u32) -> Webhook {
    start_webhook_with(cluster, delay, timeout_seconds, &[]).await
}

/// [`start_webhook`] with extra flags.
async fn start_webhook_with(
    cluster: &Cluster,
    delay: Duration,
    timeout_seconds: u32,
    extra: &[&str],
) -> Webhook {
    let dir = tempfile::tempdir().unwrap();
    let bundle = graceful_drain::certs::generate(
        "webhook",
        &["localhost".into()],
        &["127.0.0.1".parse().unwrap()],
    )
    .unwrap();
    let tls = graceful_drain::certs::write(&bundle, dir.path()).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster
        .api()
        .write_kubeconfig(&kubeconfig, WEBHOOK_USER)
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": "graceful-drain"}}))
        .unwrap();
    let _ = namespaces.create(&PostParams::default(), &ns).await;
    let (listen, admin) = (free_port(), free_port());
    let delay = humantime::format_duration(delay).to_string();
    let argv = [
        "webhook",
        "--listen",
        &listen.to_string(),
        "--admin-listen",
        &admin.to_string(),
        "--tls-cert",
        tls.cert.to_str().unwrap(),
        "--tls-key",
        tls.key.to_str().unwrap(),
        "--deregistration-delay",
        &delay,
        "--timeout-seconds",
        &timeout_seconds.to_string(),
        "--lease-namespace",
        "graceful-drain",
        "--identity",
        "webhook-0",
        "--own-user",
        WEBHOOK_USER,
        "--shutdown-delay",
        "0s",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ];
    let cli = WebhookCli::try_parse_from(argv.iter().chain(extra)).unwrap();
    let stop = Shutdown::new();
    tokio::spawn(graceful_drain::webhook::run(cli.args, stop.clone()));
    wait_for("webhook ready", TIMEOUT, || ready(admin))
        .await
        .unwrap();
    let (mutating, validating) = webhook_configurations(&ConfigurationsSpec {
        target: Target::Url(format!("https://127.0.0.1:{}", listen.port())),
        ca_bundle: Some(bundle.ca_cert.clone()),
        timeout_seconds: i32::try_from(timeout_seconds).unwrap(),
        ..ConfigurationsSpec::default()
    });
    let pp = PostParams::default();
    Api::<MutatingWebhookConfiguration>::all(cluster.client())
        .create(&pp, &mutating)
        .await
        .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(cluster.client())
        .create(&pp, &validating)
        .await
        .unwrap();
    Webhook {
        stop,
        listen,
        ca: bundle.ca_cert,
        _dir: dir,
    }
}

async fn setup(spec: &WebSpec, delay: Duration, timeout_seconds: u32) -> (Cluster, Webhook) {
    graceful_drain::runtime::install_crypto_provider();
    graceful_drain::runtime::init_tracing(graceful_drain::runtime::LogFormat::Text);
    let cluster = Cluster::start(ClusterConfig::default(), Shutdown::new())
        .await
        .unwrap();
    let webhook = start_webhook(&cluster, delay, timeout_seconds).await;
    cluster.deploy_web(spec, TIMEOUT).await.unwrap();
    // Isolation needs an observed PDB, exactly like an eviction does.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), &spec.namespace);
    let allowed = spec.replicas - spec.min_available;
    wait_for("pdb observed", TIMEOUT, || async {
        pdbs.get(&spec.name)
            .await
            .ok()
            .and_then(|p| p.status)
            .is_some_and(|s| s.disruptions_allowed == allowed)
    })
    .await
    .unwrap();
    (cluster, webhook)
}

async fn web_pods(cluster: &Cluster, spec: &WebSpec) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    api.list(&ListParams::default()).await.unwrap().items
}

async fn event_reasons(cluster: &Cluster, ns: &str, pod: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(cluster.client(), ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .filter_map(|e| e.reason)
        .collect()
}

fn is_draining(pod: &Pod) -> bool {
    pod.labels().contains_key("graceful-drain.io/draining")
}

/// A plain eviction-based drain (what `kubectl drain` does) with the webhook installed:
/// every evicted pod is isolated first, keeps serving until the load balancer let go,
/// and is deleted after the delay — no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_drain_behind_a_lagging_load_balancer_has_no_5xx() {
    let spec = WebSpec::default();
    // The simulated LB takes 3 s to deregister; 5 s of delay covers it.
    let (cluster, _webhook) = setup(&spec, Duration::from_secs(5), 10).await;
    let client = cluster.client();
    let node = cluster.nodes()[0].clone();
    let before = actions::pods_on(&client, &node).await.unwrap();
    assert!(!before.is_empty());
    let traffic = cluster.traffic(
        &spec,
        TrafficConfig {
            rate: 200.0,
            request_duration: Duration::from_millis(5),
            max_requests: 20_000,
            max_duration: TIMEOUT,
        },
    );
    let started = Instant::now();
    actions::plain_drain(&client, &node, TIMEOUT).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "pods were deleted before their deregistration delay"
    );
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
    let report = traffic.stop().await;
    assert!(report.requests > 100, "traffic ran: {}", report.requests);
    assert_eq!(report.errors_5xx, 0, "5xx during a protected drain");
    for pod in &before {
        let reasons = event_reasons(&cluster, "default", &pod.name_any()).await;
        assert!(
            reasons.iter().any(|r| r == "graceful-drain.io/Isolated"),
            "{reasons:?}"
        );
        assert!(
            reasons.iter().any(|r| r == "graceful-drain.io/Deleted"),
            "{reasons:?}"
        );
    }
}

/// Concurrent evictions of every pod behind a PDB with one disruption left: exactly one
/// pod is isolated (the eviction answered as a dry run), the others are refused with 429
/// by the API server, and the pods still serving are at least minAvailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_evictions_take_only_the_disruptions_the_pdb_allows() {
    let spec = WebSpec {
        replicas: 3,
        min_available: 2,
        ..WebSpec::default()
    };
    let (cluster, _webhook) = setup(&spec, Duration::from_secs(30), 10).await;
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let all = web_pods(&cluster, &spec).await;
    let evictions = all.iter().map(|pod| {
        let pods = pods.clone();
        let name = pod.name_any();
        async move {
            let body = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": "default"}});
            pods.create_subresource::<_, serde_json::Value>(
                "eviction",
                &name,
                &PostParams::default(),
                &body,
            )
            .await
        }
    });
    let results = futures::future::join_all(evictions).await;
    let accepted = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(kube::Error::Api(s)) if s.code == 429))
        .count();
    assert_eq!((accepted, refused), (1, 2), "{results:?}");
    let now = web_pods(&cluster, &spec).await;
    let draining: Vec<&Pod> = now.iter().filter(|p| is_draining(p)).collect();
    assert_eq!(draining.len(), 1, "one isolated pod");
    assert!(
        draining[0].metadata.deletion_timestamp.is_none(),
        "still alive, serving"
    );
    // Isolated pods count as unavailable: the ones still serving are at least minAvailable.
    let serving = now
        .iter()
        .filter(|p| !is_draining(p) && p.labels().get("app").map(String::as_str) == Some("web"))
        .count();
    assert!(serving >= 2, "only {serving} pods serve");
}

/// A DELETE (`kubectl delete pod`, `kubectl drain --disable-eviction`) is never denied:
/// the pod is isolated, the call is held until shortly before the API server's deadline,
/// then allowed; the ReplicaSet has already started the replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_is_held_within_the_webhook_timeout_then_allowed() {
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    let (cluster, _webhook) = setup(&spec, Duration::from_secs(30), 4).await;
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let victim = web_pods(&cluster, &spec).await.remove(0).name_any();
    let started = Instant::now();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let held = started.elapsed();
    assert!(held >= Duration::from_millis(1500), "not held: {held:?}");
    assert!(
        held < Duration::from_secs(4),
        "held past the 4 s webhook timeout: {held:?}"
    );
    let reasons = event_reasons(&cluster, "default", &victim).await;
    assert!(
        reasons.iter().any(|r| r == "graceful-drain.io/Isolated"),
        "{reasons:?}"
    );
    // The replacement was started while the isolated pod was held.
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
}

/// `kubectl rollout restart`: the ReplicaSet controller deletes old pods; each DELETE
/// isolates the pod and is held until the load balancer let go — no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_behind_a_lagging_load_balancer_has_no_5xx() {
    let spec = WebSpec::default();
    let (cluster, _webhook) = setup(&spec, Duration::from_secs(5), 10).await;
    let client = cluster.client();
    let traffic = cluster.traffic(
        &spec,
        TrafficConfig {
            rate: 200.0,
            request_duration: Duration::from_millis(5),
            max_requests: 40_000,
            max_duration: TIMEOUT,
        },
    );
    let old = web_pods(&cluster, &spec).await;
    actions::rollout(&client, &spec, TIMEOUT).await.unwrap();
    let report = traffic.stop().await;
    assert!(report.requests > 100, "traffic ran: {}", report.requests);
    assert_eq!(report.errors_5xx, 0, "5xx during a protected rollout");
    let mut isolated = 0;
    for pod in &old {
        let reasons = event_reasons(&cluster, "default", &pod.name_any()).await;
        isolated += usize::from(reasons.iter().any(|r| r == "graceful-drain.io/Isolated"));
    }
    assert_eq!(
        isolated,
        old.len(),
        "every replaced pod was isolated before deletion"
    );
}

/// A webhook started with `--client-ca` admits the API server, which presents the
/// client certificate its configuration names (kube-apiserver's admission kubeconfig),
/// and refuses at the TLS handshake a caller that presents none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_with_client_ca_admits_the_api_servers_certificate_and_refuses_others() {
    graceful_drain::runtime::install_crypto_provider();
    let certs_dir = tempfile::tempdir().unwrap();
    let client =
        graceful_drain::certs::generate("kube-apiserver", &["kube-apiserver".into()], &[]).unwrap();
    let client = graceful_drain::certs::write(&client, certs_dir.path()).unwrap();
    let mut config = ClusterConfig::default();
    config.api.webhook_client_cert = Some(ClientCert {
        cert: client.cert.clone(),
        key: client.key.clone(),
    });
    let cluster = Cluster::start(config, Shutdown::new()).await.unwrap();
    let webhook = start_webhook_with(
        &cluster,
        Duration::from_secs(1),
        5,
        &["--client-ca", client.ca_cert.to_str().unwrap()],
    )
    .await;

    // The DELETE of a pod reaches the validating webhook, which allows it.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "bare"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.delete("bare", &DeleteParams::default()).await.unwrap();
    let stats = cluster.api().stats();
    assert!(stats.admission_total() > 0, "{stats:?}");
    assert!(stats.admission_failures.is_empty(), "{stats:?}");

    // A caller without a client certificate gets no HTTP answer.
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(webhook.ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
    let tcp = tokio::net::TcpStream::connect(webhook.listen)
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let refused = match connector.connect(name, tcp).await {
        Err(_) => true,
        Ok(mut stream) => {
            let request = "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
            let _ = stream.write_all(request.as_bytes()).await;
            let mut answer = Vec::new();
            let read = stream.read_to_end(&mut answer).await;
            read.is_err() || !answer.starts_with(b"HTTP/")
        }
    };
    assert!(
        refused,
        "a caller without a client certificate was answered"
    );
}
