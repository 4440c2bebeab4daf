//! End-to-end scenarios of the webhook on the simulated cluster: the real webhook (started
//! from its documented flags), the simulated API server calling it over HTTPS, the
//! ReplicaSet/EndpointSlice controllers, kubelets and load balancers with traffic.
//! The scenarios named `real_tier_*` run the same test on a real control plane
//! (`graceful_drain_e2e::tier`): kube-apiserver calls the webhook, whose token is the
//! chart's ServiceAccount's under the chart's RBAC, and the real controllers act on what
//! it does. The others need what only the simulator has (request counts, injected latency
//! and 429s, client certificates of its own).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use graceful_drain_e2e::kubectl;
use graceful_drain_sim::command::WebhookCommand;
use std::time::{Duration, Instant};

use clap::Parser;
use graceful_drain_core::labels::{
    DELAY_ANNOTATION, DELETE_AT_ANNOTATION, DEREGISTERING_CAUSE, DRAINING_LABEL,
    RESTORE_AT_ANNOTATION, webhook_reason,
};
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_e2e::tier::{TestCluster, Tier};
use graceful_drain_sim::scenario::actions;
use graceful_drain_sim::scenario::shipped;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use kube_sim::apiserver::ClientCert;
use kube_sim::cluster::{Access, Cluster, ClusterConfig, DataPlane, WebSpec, wait_for};
use kube_sim::traffic::TrafficConfig;
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
    args: graceful_drain_webhook::Args,
}

/// The running webhook; dropping it stops it.
struct Webhook {
    stop: Shutdown,
    /// Where it serves admission reviews.
    listen: std::net::SocketAddr,
    /// Its plain-HTTP admin port (`/readyz`, `/metrics`).
    admin: std::net::SocketAddr,
    /// The CA of its serving certificate (PEM).
    ca: String,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Webhook {
    /// Waits until the stopped webhook has finished its shutdown.
    async fn stopped(mut self) {
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
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
/// registers it with the chart's configurations ([`shipped`]).
async fn start_webhook(cluster: &impl Access, delay: Duration, timeout_seconds: u32) -> Webhook {
    start_webhook_with(cluster, delay, timeout_seconds, &[]).await
}

/// [`start_webhook`] with extra command-line flags.
async fn start_webhook_with(
    cluster: &impl Access,
    delay: Duration,
    timeout_seconds: u32,
    extra: &[&str],
) -> Webhook {
    let webhook = launch_webhook(cluster, delay, timeout_seconds, extra).await;
    wait_for("webhook ready", TIMEOUT, || ready(webhook.admin))
        .await
        .unwrap();
    register_webhook(cluster, &webhook, timeout_seconds).await;
    webhook
}

/// Starts `graceful-drain webhook` from its documented flags against `cluster`, without
/// waiting for it to be ready nor registering it.
async fn launch_webhook(
    cluster: &impl Access,
    delay: Duration,
    timeout_seconds: u32,
    extra: &[&str],
) -> Webhook {
    let dir = tempfile::tempdir().unwrap();
    let bundle = graceful_drain_core::certs::generate(
        "webhook",
        &["localhost".into()],
        &["127.0.0.1".parse().unwrap()],
    )
    .unwrap();
    let tls = graceful_drain_core::certs::write(&bundle, dir.path()).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster
        .write_kubeconfig(&kubeconfig, WEBHOOK_USER)
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": "graceful-drain"}}))
        .unwrap();
    let _ = namespaces.create(&PostParams::default(), &ns).await;
    let (listen, admin) = (free_port(), free_port());
    let mut command = WebhookCommand::new(
        (listen, admin),
        (&tls.cert, &tls.key),
        &kubeconfig,
        "webhook-0",
        WEBHOOK_USER,
    );
    command.deregistration_delay = delay;
    command.timeout_seconds = timeout_seconds;
    command.shutdown_delay = Some(Duration::ZERO);
    command.extra = extra.iter().map(|s| s.to_string()).collect();
    let cli = WebhookCli::try_parse_from(command.argv()).unwrap();
    let stop = Shutdown::new();
    let task = tokio::spawn(graceful_drain_webhook::run(cli.args, stop.clone()));
    Webhook {
        stop,
        listen,
        admin,
        ca: bundle.ca_cert,
        task: Some(task),
        _dir: dir,
    }
}

/// Registers `webhook` with the chart's configurations ([`shipped`]).
async fn register_webhook(cluster: &DataPlane, webhook: &Webhook, timeout_seconds: u32) {
    let (mutating, validating) = shipped::webhook_configurations(
        &format!("https://127.0.0.1:{}", webhook.listen.port()),
        &webhook.ca,
        &shipped::Values { timeout_seconds },
    )
    .unwrap();
    let pp = PostParams::default();
    Api::<MutatingWebhookConfiguration>::all(cluster.client())
        .create(&pp, &mutating)
        .await
        .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(cluster.client())
        .create(&pp, &validating)
        .await
        .unwrap();
}

async fn setup(spec: &WebSpec, delay: Duration, timeout_seconds: u32) -> (Cluster, Webhook) {
    setup_with(ClusterConfig::default(), spec, delay, timeout_seconds, &[]).await
}

/// [`setup`] on `tier`; `None` when the real tier is not available here.
async fn setup_on(
    tier: Tier,
    spec: &WebSpec,
    delay: Duration,
    timeout_seconds: u32,
) -> Option<(TestCluster, Webhook)> {
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    let cluster = TestCluster::start(tier, ClusterConfig::default())
        .await
        .unwrap()?;
    let webhook = start_webhook(&cluster, delay, timeout_seconds).await;
    deploy_protected(&cluster, spec).await;
    Some((cluster, webhook))
}

/// Deploys `spec` and waits until its PDB is observed: isolation needs an observed PDB,
/// exactly like an eviction does.
async fn deploy_protected(cluster: &DataPlane, spec: &WebSpec) {
    cluster.deploy_web(spec, TIMEOUT).await.unwrap();
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
}

/// [`setup`] on a cluster started from `config`, the webhook given `extra` flags.
async fn setup_with(
    config: ClusterConfig,
    spec: &WebSpec,
    delay: Duration,
    timeout_seconds: u32,
    extra: &[&str],
) -> (Cluster, Webhook) {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    let cluster = graceful_drain_sim::setup::start(config, Shutdown::new())
        .await
        .unwrap();
    let webhook = start_webhook_with(&cluster, delay, timeout_seconds, extra).await;
    deploy_protected(&cluster, spec).await;
    (cluster, webhook)
}

async fn web_pods(cluster: &DataPlane, spec: &WebSpec) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    api.list(&ListParams::default()).await.unwrap().items
}

/// The node of the first web pod listed: a node that runs some of the web pods.
async fn first_web_pod_node(cluster: &DataPlane, spec: &WebSpec) -> String {
    web_pods(cluster, spec).await[0]
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap()
}

async fn event_reasons(cluster: &DataPlane, ns: &str, pod: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(cluster.client(), ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| graceful_drain_webhook::events::names_pod(e, pod))
        .filter_map(|e| e.reason)
        .collect()
}

fn is_draining(pod: &Pod) -> bool {
    pod.labels().contains_key(DRAINING_LABEL)
}

/// A plain eviction-based drain (what `kubectl drain` does) with the webhook installed:
/// every evicted pod is isolated first and its eviction refused (429) until the load
/// balancer let go; the node is cordoned, so the webhook's deleter then removes each pod
/// (one eviction each) and the drain's retry finds it gone — no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_drain_behind_a_lagging_load_balancer_has_no_5xx() {
    eviction_drain_has_no_5xx(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_eviction_drain_behind_a_lagging_load_balancer_has_no_5xx() {
    eviction_drain_has_no_5xx(Tier::Real).await;
}

async fn eviction_drain_has_no_5xx(tier: Tier) {
    let spec = WebSpec::default();
    // The simulated LB takes 3 s to deregister; 5 s of delay covers it.
    let Some((cluster, _webhook)) = setup_on(tier, &spec, Duration::from_secs(5), 10).await else {
        return;
    };
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
    let stats = cluster.simulated().map(|sim| sim.api().stats());
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
        assert!(
            event_arrives(&cluster, &pod.name_any(), webhook_reason::ISOLATED).await,
            "{:?}",
            event_reasons(&cluster, "default", &pod.name_any()).await
        );
    }
    // Only the simulated API server counts who removed what.
    if let (Some(sim), Some(stats)) = (cluster.simulated(), stats) {
        assert_eq!(
            webhook_removals(&sim.api().stats().since(&stats)),
            before.len() as u64,
            "the deleter removes each pod of the cordoned node once"
        );
    }
}

/// Concurrent evictions of every pod behind a PDB with one disruption left: exactly one
/// pod is isolated (its eviction refused with a deregistering 429 until it is due), the
/// others are refused with 429 by the budget, and the pods still serving are at least
/// minAvailable.
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
    let isolated = results
        .iter()
        .filter(|r| deregistering(r).is_some())
        .count();
    let refused = results
        .iter()
        .filter(|r| deregistering(r).is_none() && too_many_requests(r).is_some())
        .count();
    assert_eq!((isolated, refused), (1, 2), "{results:?}");
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
    assert!(
        event_arrives(&cluster, &victim, webhook_reason::ISOLATED).await,
        "{:?}",
        event_reasons(&cluster, "default", &victim).await
    );
    // The replacement was started while the isolated pod was held.
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
}

/// `kubectl rollout restart`: the ReplicaSet controller deletes old pods; each DELETE
/// isolates the pod and is held until the load balancer let go — no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_behind_a_lagging_load_balancer_has_no_5xx() {
    rollout_has_no_5xx(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_rollout_behind_a_lagging_load_balancer_has_no_5xx() {
    rollout_has_no_5xx(Tier::Real).await;
}

async fn rollout_has_no_5xx(tier: Tier) {
    let spec = WebSpec::default();
    let Some((cluster, _webhook)) = setup_on(tier, &spec, Duration::from_secs(5), 10).await else {
        return;
    };
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
        isolated +=
            usize::from(event_arrives(&cluster, &pod.name_any(), webhook_reason::ISOLATED).await);
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
    graceful_drain_core::runtime::install_crypto_provider();
    let certs_dir = tempfile::tempdir().unwrap();
    let client =
        graceful_drain_core::certs::generate("kube-apiserver", &["kube-apiserver".into()], &[])
            .unwrap();
    let client = graceful_drain_core::certs::write(&client, certs_dir.path()).unwrap();
    let mut config = ClusterConfig::default();
    config.api.webhook_client_cert = Some(ClientCert {
        cert: client.cert.clone(),
        key: client.key.clone(),
    });
    let cluster = graceful_drain_sim::setup::start(config, Shutdown::new())
        .await
        .unwrap();
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
/// Events with `reason` on pod `name` in the default namespace.
async fn has_event(cluster: &DataPlane, pod: &str, reason: &str) -> bool {
    event_reasons(cluster, "default", pod)
        .await
        .iter()
        .any(|r| r == reason)
}

/// How long an Event may take: the webhook sends them in the background, and while they
/// keep coming it gathers them for half a second to group those of one controller.
const EVENT_WAIT: Duration = Duration::from_secs(5);

/// Whether an Event with `reason` about `pod` (in `default`) arrives within [`EVENT_WAIT`].
async fn event_arrives(cluster: &DataPlane, pod: &str, reason: &str) -> bool {
    wait_for(&format!("{reason} Event about {pod}"), EVENT_WAIT, || {
        has_event(cluster, pod, reason)
    })
    .await
    .is_ok()
}

/// A person deleting two pods at once behind a PDB allowing one disruption (10
/// replicas, 9 must stay available): nothing confirms such a DELETE (a review claiming it
/// could be forged), so it is bound by the budget as an eviction is. The first is isolated
/// and held; the second, past the spent budget, goes through as it would without
/// graceful-drain. Both pods are gone, and the Service never lost more than the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deletes_behind_a_pdb_allowing_one_disruption_isolate_only_one() {
    two_deletes_bound_by_the_budget(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_two_deletes_behind_a_pdb_allowing_one_disruption_isolate_only_one() {
    two_deletes_bound_by_the_budget(Tier::Real).await;
}

async fn two_deletes_bound_by_the_budget(tier: Tier) {
    let spec = WebSpec {
        replicas: 10,
        min_available: 9,
        ..WebSpec::default()
    };
    let Some((cluster, _webhook)) = setup_on(tier, &spec, Duration::from_secs(30), 4).await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let victims: Vec<(String, String)> = web_pods(&cluster, &spec)
        .await
        .iter()
        .take(2)
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect();
    let deletes = victims.iter().map(|(name, _)| {
        let pods = pods.clone();
        async move { pods.delete(name, &DeleteParams::default()).await }
    });
    for result in futures::future::join_all(deletes).await {
        result.unwrap();
    }
    let mut isolated = Vec::new();
    for (name, uid) in &victims {
        wait_for(
            &format!("pod {name} gone"),
            Duration::from_secs(60),
            || async {
                pods.get_opt(name)
                    .await
                    .is_ok_and(|p| p.is_none_or(|p| p.uid().as_deref() != Some(uid.as_str())))
            },
        )
        .await
        .unwrap();
        if has_event(&cluster, name, webhook_reason::ISOLATED).await {
            isolated.push(name.clone());
        }
    }
    assert_eq!(
        isolated.len(),
        1,
        "exactly one DELETE fits the budget; isolated: {isolated:?}"
    );
}

/// An eviction whose UID precondition names an earlier pod of the same name is refused
/// by the API server (409) and leaves the live pod alone: the webhook never isolates a
/// pod the caller did not mean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_with_a_stale_uid_precondition_never_isolates_the_live_pod() {
    stale_uid_eviction(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_eviction_with_a_stale_uid_precondition_never_isolates_the_live_pod() {
    stale_uid_eviction(Tier::Real).await;
}

async fn stale_uid_eviction(tier: Tier) {
    let spec = WebSpec {
        replicas: 3,
        min_available: 1,
        ..WebSpec::default()
    };
    let Some((cluster, _webhook)) = setup_on(tier, &spec, Duration::from_secs(30), 10).await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let victim = web_pods(&cluster, &spec).await.remove(0).name_any();
    let body = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": victim, "namespace": "default"},
        "deleteOptions": {"preconditions": {"uid": "uid-of-an-earlier-pod"}}});
    let result = pods
        .create_subresource::<_, serde_json::Value>(
            "eviction",
            &victim,
            &PostParams::default(),
            &body,
        )
        .await;
    assert!(
        matches!(&result, Err(kube::Error::Api(s)) if s.code == 409),
        "{result:?}"
    );
    let live = pods.get(&victim).await.unwrap();
    assert!(!is_draining(&live), "the live pod was isolated");
    assert!(!has_event(&cluster, &victim, webhook_reason::ISOLATED).await);
}

/// While the pods of a first `kubectl drain` wait out their delay, a second `kubectl
/// drain` of the node succeeds without `--force`: the isolated pods still declare a
/// controller (the Deployment), and their evictions are refused with a deregistering 429
/// until the pods are due, which kubectl retries until its eviction deletes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_kubectl_drain_works_while_isolated_pods_wait() {
    second_kubectl_drain(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_a_second_kubectl_drain_works_while_isolated_pods_wait() {
    second_kubectl_drain(Tier::Real).await;
}

async fn second_kubectl_drain(tier: Tier) {
    if !kubectl::available("second_kubectl_drain") {
        return;
    }
    let spec = WebSpec {
        replicas: 4,
        min_available: 1,
        ..WebSpec::default()
    };
    let Some((cluster, _webhook)) = setup_on(tier, &spec, Duration::from_secs(15), 10).await else {
        return;
    };
    let kubeconfig = cluster.admin_kubeconfig().to_path_buf();
    let client = cluster.client();
    let node = first_web_pod_node(&cluster, &spec).await;
    let drain = [
        "drain",
        node.as_str(),
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=90s",
    ];
    let first = tokio::spawn({
        let kubeconfig = kubeconfig.clone();
        let drain: Vec<String> = drain.iter().map(|s| s.to_string()).collect();
        async move {
            let args: Vec<&str> = drain.iter().map(String::as_str).collect();
            kubectl::run_async(&kubeconfig, &args).await.outcome()
        }
    });
    let on_node = || async {
        actions::pods_on(&client, &node)
            .await
            .unwrap()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect::<Vec<Pod>>()
    };
    // Every web pod of the node isolated, and the ReplicaSet has acted on the relabel.
    wait_for("pods on the node isolated", TIMEOUT, || async {
        let pods = on_node().await;
        !pods.is_empty() && pods.iter().all(is_draining)
    })
    .await
    .unwrap();
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
    let isolated = on_node().await;
    for pod in &isolated {
        let controller = pod
            .owner_references()
            .iter()
            .find(|r| r.controller == Some(true))
            .map(|r| r.kind.clone());
        assert_eq!(
            controller.as_deref(),
            Some("Deployment"),
            "{}",
            pod.name_any()
        );
    }
    let due = isolated
        .iter()
        .map(|p| {
            p.annotations()[DELETE_AT_ANNOTATION]
                .parse::<jiff::Timestamp>()
                .unwrap()
        })
        .max()
        .unwrap();
    assert!(jiff::Timestamp::now() < due, "the pods are due already");
    let (ok, text) = kubectl::run_async(&kubeconfig, &drain).await.outcome();
    assert!(ok, "second drain failed:\n{text}");
    assert!(
        jiff::Timestamp::now() >= due,
        "the second drain evicted the pods before {due}:\n{text}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for pod in &isolated {
        let gone = pods
            .get_opt(&pod.name_any())
            .await
            .unwrap()
            .is_none_or(|p| p.uid() != pod.uid() || p.metadata.deletion_timestamp.is_some());
        assert!(gone, "{} still there after the drain", pod.name_any());
    }
    let (ok, text) = first.await.unwrap();
    assert!(ok, "first drain failed:\n{text}");
}

/// Scales Deployment `name` in the default namespace to `replicas`.
async fn scale(cluster: &DataPlane, name: &str, replicas: i32) {
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(cluster.client(), "default")
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

/// Whether the webhook left `pod` to the deferred deleter: isolated without a restore
/// time (a ReplicaSet scale-down the live ReplicaSet backs).
fn left_to_the_deleter(pod: &Pod) -> bool {
    is_draining(pod) && !pod.annotations().contains_key(RESTORE_AT_ANNOTATION)
}

/// A Deployment scaled down: the ReplicaSet controller's DELETE of the pod it picks is
/// refused after the pod is isolated, and at its delete time the deferred deleter evicts
/// it (it has left its PDBs) instead of deleting it, so the pod carries the
/// `DisruptionTarget` condition like any evicted pod; the deleter's own eviction passes
/// the webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaled_down_pod_is_evicted_by_the_deferred_deleter_and_becomes_a_disruption_target() {
    scaled_down_pod_evicted_by_the_deleter(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_a_scaled_down_pod_is_evicted_by_the_deferred_deleter_and_becomes_a_disruption_target()
 {
    scaled_down_pod_evicted_by_the_deleter(Tier::Real).await;
}

async fn scaled_down_pod_evicted_by_the_deleter(tier: Tier) {
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    let Some((cluster, _webhook)) = setup_on(tier, &spec, Duration::from_secs(2), 10).await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    // Every version of every isolated pod until the scaled-down one is gone: the eviction
    // marks it, then deletes it (the simulated kubelet rewrites the conditions while it
    // terminates).
    let config = kube::runtime::watcher::Config::default().labels(DRAINING_LABEL);
    let events = kube::runtime::watcher(pods.clone(), config);
    let mut events = std::pin::pin!(events);
    scale(&cluster, &spec.name, 1).await;
    let mut victim: Option<Pod> = None;
    let mut marked = false;
    let watched = tokio::time::timeout(TIMEOUT, async {
        use futures::StreamExt;
        while let Some(event) = events.next().await {
            match event {
                Ok(
                    kube::runtime::watcher::Event::Apply(p)
                    | kube::runtime::watcher::Event::InitApply(p),
                ) => {
                    let first = victim.get_or_insert_with(|| p.clone());
                    assert_eq!(first.uid(), p.uid(), "one pod scaled down");
                    assert!(left_to_the_deleter(&p), "{:?}", p.annotations());
                    let conditions = p.status.and_then(|s| s.conditions).unwrap_or_default();
                    marked |= conditions
                        .iter()
                        .any(|c| c.type_ == "DisruptionTarget" && c.status == "True");
                }
                Ok(kube::runtime::watcher::Event::Delete(p)) if victim.is_some() => {
                    assert_eq!(victim.as_ref().and_then(ResourceExt::uid), p.uid());
                    return;
                }
                _ => {}
            }
        }
    })
    .await;
    let victim = victim.expect("the scaled-down pod was isolated").name_any();
    assert!(watched.is_ok(), "the deleter never removed {victim}");
    assert!(
        marked,
        "{victim} was removed without the DisruptionTarget condition of an eviction"
    );
    assert!(
        event_arrives(&cluster, &victim, webhook_reason::DELETED).await,
        "{:?}",
        event_reasons(&cluster, "default", &victim).await
    );
}

/// The pods [`isolate_then_stop_webhook`] isolated before it stopped the webhook.
struct Isolated {
    /// Evicted: left to its caller, restored if none comes back.
    evicted: Pod,
    /// Scaled down: left to the deferred deleter.
    scaled_down: Pod,
}

/// Starts a cluster and a webhook told its Deployment is `graceful-drain-webhook`
/// (created with 0 replicas when `installed`), isolates one web pod by an eviction and
/// another by scaling the web Deployment down, then stops the webhook; returns the pods
/// API and the isolated pods.
async fn isolate_then_stop_webhook(installed: bool) -> (Cluster, Api<Pod>, Isolated) {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    let spec = WebSpec {
        replicas: 3,
        min_available: 1,
        ..WebSpec::default()
    };
    let cluster = graceful_drain_sim::setup::start(ClusterConfig::default(), Shutdown::new())
        .await
        .unwrap();
    let extra = ["--deployment", "graceful-drain-webhook"];
    let webhook = start_webhook_with(&cluster, Duration::from_secs(600), 10, &extra).await;
    if installed {
        let mut own = spec.deployment();
        own.metadata.name = Some("graceful-drain-webhook".into());
        own.metadata.namespace = Some("graceful-drain".into());
        if let Some(s) = own.spec.as_mut() {
            s.replicas = Some(0);
        }
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
            cluster.client(),
            "graceful-drain",
        )
        .create(&PostParams::default(), &own)
        .await
        .unwrap();
    }
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), "default");
    wait_for("pdb observed", TIMEOUT, || async {
        pdbs.get("web")
            .await
            .ok()
            .and_then(|p| p.status)
            .is_some_and(|s| s.disruptions_allowed == 2)
    })
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let name = web_pods(&cluster, &spec).await.remove(0).name_any();
    assert!(matches!(
        evict(&cluster, &name).await,
        Evicted::Deregistering(_)
    ));
    let evicted = pods.get(&name).await.unwrap();
    assert!(is_draining(&evicted), "isolated, waiting 600 s");
    assert!(evicted.annotations().contains_key(RESTORE_AT_ANNOTATION));
    // The ReplicaSet has replaced the evicted pod; one of its three goes now.
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
    scale(&cluster, &spec.name, 2).await;
    wait_for("a scaled-down pod isolated", TIMEOUT, || async {
        web_pods(&cluster, &spec)
            .await
            .iter()
            .any(left_to_the_deleter)
    })
    .await
    .unwrap();
    let scaled_down = web_pods(&cluster, &spec)
        .await
        .into_iter()
        .find(left_to_the_deleter)
        .unwrap();
    assert!(scaled_down.metadata.deletion_timestamp.is_none());
    webhook.stop.cancel();
    webhook.stopped().await;
    let isolated = Isolated {
        evicted,
        scaled_down,
    };
    (cluster, pods, isolated)
}

/// `helm uninstall` deletes the webhook's Deployment, then its replicas stop: the deleter
/// sees its Deployment gone at shutdown and acts on every isolated pod before exiting, so
/// none is left out of its Services with nobody to act on it: the pod a scale-down left
/// to it is deleted, the evicted pod its caller never came back for is restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstalling_the_webhook_deletes_scaled_down_pods_and_restores_evicted_ones() {
    let (_cluster, pods, isolated) = isolate_then_stop_webhook(false).await;
    let Isolated {
        evicted,
        scaled_down,
    } = isolated;
    let live = pods.get_opt(&scaled_down.name_any()).await.unwrap();
    assert!(
        live.is_none_or(|p| p.uid() != scaled_down.uid() || p.metadata.deletion_timestamp.is_some()),
        "the scaled-down pod was left behind"
    );
    let back = pods.get(&evicted.name_any()).await.unwrap();
    assert_eq!(back.uid(), evicted.uid(), "the evicted pod was deleted");
    assert!(!is_draining(&back), "{:?}", back.labels());
    assert_eq!(
        back.labels().get("app").map(String::as_str),
        Some("web"),
        "back in its Service: {:?}",
        back.labels()
    );
    assert!(back.labels().contains_key("pod-template-hash"));
    assert!(
        !back
            .annotations()
            .keys()
            .any(|k| k.starts_with("graceful-drain.io/")),
        "{:?}",
        back.annotations()
    );
    assert_eq!(controller_kind(&back).as_deref(), Some("ReplicaSet"));
}

/// A restart (the Deployment still there) leaves isolated pods to the next replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_the_webhook_keeps_isolated_pods_waiting() {
    let (_cluster, pods, isolated) = isolate_then_stop_webhook(true).await;
    for pod in [isolated.evicted, isolated.scaled_down] {
        let live = pods.get(&pod.name_any()).await.unwrap();
        assert_eq!(live.uid(), pod.uid());
        assert!(
            live.metadata.deletion_timestamp.is_none(),
            "deleted early at a restart"
        );
        assert!(is_draining(&live), "restored early at a restart");
    }
}

/// A policy engine refusing every UPDATE of a pod that would add the draining label (the
/// way a Kyverno or Gatekeeper rule on labels would), over HTTPS; returns its URL and CA.
async fn start_relabel_policy(dir: &std::path::Path) -> (String, String, Shutdown) {
    use graceful_drain_webhook::{server, tls};
    let bundle = graceful_drain_core::certs::generate(
        "policy",
        &["localhost".into()],
        &["127.0.0.1".parse().unwrap()],
    )
    .unwrap();
    let paths = graceful_drain_core::certs::write(&bundle, dir).unwrap();
    let resolver = std::sync::Arc::new(tls::ReloadingResolver::new(paths.cert, paths.key));
    resolver.reload().unwrap();
    let config = std::sync::Arc::new(tls::server_config(resolver, None).unwrap());
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(|body: axum::body::Bytes| async move {
            let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let request = &review["request"];
            let relabel = request["object"]["metadata"]["labels"]
                .get(DRAINING_LABEL)
                .is_some();
            let mut response = serde_json::json!({"uid": request["uid"], "allowed": !relabel});
            if relabel {
                response["status"] =
                    serde_json::json!({"code": 403, "message": "policy: pod labels are immutable"});
            }
            axum::Json(serde_json::json!({"apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview", "response": response}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}/",
        listener.local_addr().unwrap().port()
    );
    let stop = Shutdown::new();
    tokio::spawn(server::serve(listener, config, app, stop.clone()));
    (url, bundle.ca_cert, stop)
}

/// Another admission webhook refuses our relabel for good (403): the eviction is let
/// through unchanged — the pod is evicted as it would be without graceful-drain — with a
/// Warning Event on the pod, instead of being answered 429 forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relabel_refused_by_a_policy_engine_lets_the_eviction_through_with_a_warning() {
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    let (cluster, _webhook) = setup(&spec, Duration::from_secs(30), 10).await;
    let dir = tempfile::tempdir().unwrap();
    let (url, ca, _policy) = start_relabel_policy(dir.path()).await;
    let policy: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "label-policy"},
        "webhooks": [{"name": "labels.policy.example", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": {"url": url, "caBundle": base64_of(&ca)},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                       "resources": ["pods"], "scope": "Namespaced"}]}]
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(cluster.client())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let victim = web_pods(&cluster, &spec).await.remove(0).name_any();
    let body = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": victim, "namespace": "default"}});
    let evicted = pods
        .create_subresource::<_, serde_json::Value>(
            "eviction",
            &victim,
            &PostParams::default(),
            &body,
        )
        .await;
    assert!(evicted.is_ok(), "{evicted:?}");
    let live = pods.get_opt(&victim).await.unwrap();
    assert!(
        live.is_none_or(|p| p.metadata.deletion_timestamp.is_some() && !is_draining(&p)),
        "evicted normally"
    );
    assert!(
        event_arrives(&cluster, &victim, webhook_reason::ISOLATION_FAILED).await,
        "{:?}",
        event_reasons(&cluster, "default", &victim).await
    );
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// What an eviction the test expects to be answered either way got.
#[derive(Debug, PartialEq, Eq)]
enum Evicted {
    /// It went through: the pod is being deleted.
    Through,
    /// Refused with our deregistering 429 and this Retry-After (seconds): the pod is
    /// isolated and the caller is to come back at its delete time.
    Deregistering(u32),
}

/// Evicts `name` through the eviction API as the admin (what `kubectl drain` sends);
/// panics unless it goes through or is refused while the pod deregisters.
async fn evict(cluster: &DataPlane, name: &str) -> Evicted {
    let answer = try_evict(cluster, name).await;
    if let Some(retry) = deregistering(&answer) {
        return Evicted::Deregistering(retry);
    }
    answer.unwrap_or_else(|error| panic!("eviction of {name}: {error:?}"));
    Evicted::Through
}

/// The Retry-After (seconds) of `result` if it is our deregistering 429.
fn deregistering(result: &Result<serde_json::Value, kube::Error>) -> Option<u32> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 429 => s
            .details
            .as_ref()
            .filter(|d| d.causes.iter().any(|c| c.reason == DEREGISTERING_CAUSE))
            .map(|d| d.retry_after_seconds),
        _ => None,
    }
}

/// Evicts `name` as the admin every second, as a drain retrying its 429s does, until
/// the eviction goes through (or the pod is gone); panics after `within`.
async fn evict_until_gone(cluster: &DataPlane, name: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match try_evict(cluster, name).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 404 => return,
            Err(kube::Error::Api(s)) if s.code == 429 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error) => panic!("eviction of {name}: {error:?}"),
        }
    }
}

/// How many pods the webhook removed itself (evictions and DELETEs as its own user).
fn webhook_removals(stats: &kube_sim::apiserver::Stats) -> u64 {
    ["pods/eviction", "pods"]
        .iter()
        .zip(["create", "delete"])
        .map(|(resource, verb)| {
            stats
                .by_user_request
                .get(&(WEBHOOK_USER.into(), verb.into(), (*resource).into()))
                .copied()
                .unwrap_or(0)
        })
        .sum()
}

fn controller_kind(pod: &Pod) -> Option<String> {
    pod.owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.kind.clone())
}

/// A StatefulSet pod whose Service selects a key of its own leaves the Service and its
/// load balancer but stays its StatefulSet's (no same-name replacement is attempted
/// while it serves); one whose Service selects only the StatefulSet's key cannot leave
/// the Service without being released, so the eviction goes through unprotected with a
/// Warning Event naming the Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_pods_leave_their_service_but_never_their_statefulset() {
    statefulset_pods_stay_their_statefulsets(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_statefulset_pods_leave_their_service_but_never_their_statefulset() {
    statefulset_pods_stay_their_statefulsets(Tier::Real).await;
}

async fn statefulset_pods_stay_their_statefulsets(tier: Tier) {
    use graceful_drain_sim::scenario::spec::Workload;
    use graceful_drain_sim::scenario::workloads;
    let Some(cluster) = TestCluster::start(tier, ClusterConfig::default())
        .await
        .unwrap()
    else {
        return;
    };
    let _webhook = start_webhook(&cluster, Duration::from_secs(30), 10).await;
    let web = WebSpec {
        replicas: 3,
        min_available: 1,
        ..WebSpec::default()
    };
    workloads::deploy(&cluster, &web, TIMEOUT, Workload::StatefulSet)
        .await
        .unwrap();
    let db = WebSpec {
        name: "db".into(),
        replicas: 3,
        min_available: 1,
        ..WebSpec::default()
    };
    workloads::deploy(&cluster, &db, TIMEOUT, Workload::StatefulSetSharedSelector)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), "default");
    for name in ["web", "db"] {
        wait_for("pdb allows a disruption", TIMEOUT, || async {
            pdbs.get(name)
                .await
                .ok()
                .and_then(|p| p.status)
                .is_some_and(|s| s.disruptions_allowed > 0)
        })
        .await
        .unwrap();
    }

    let before = pods.get("web-1").await.unwrap();
    assert!(matches!(
        evict(&cluster, "web-1").await,
        Evicted::Deregistering(_)
    ));
    let after = pods.get("web-1").await.unwrap();
    assert_eq!(after.uid(), before.uid(), "not deleted: isolated");
    assert!(is_draining(&after));
    let labels = after.labels();
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("web"),
        "the StatefulSet's key stays"
    );
    assert!(
        !labels.contains_key("role"),
        "the Service's own key is removed"
    );
    assert_eq!(
        controller_kind(&after).as_deref(),
        Some("StatefulSet"),
        "never released"
    );
    let service = web.service_key();
    wait_for("web-1 out of its load balancer", TIMEOUT, || async {
        !cluster
            .lbs()
            .registered(&service, Instant::now())
            .contains(&before.uid().unwrap())
    })
    .await
    .unwrap();
    let still = pods.get("web-1").await.unwrap();
    assert_eq!(still.uid(), before.uid(), "no replacement while it serves");
    assert_eq!(controller_kind(&still).as_deref(), Some("StatefulSet"));

    let db0 = pods.get("db-0").await.unwrap();
    assert_eq!(evict(&cluster, "db-0").await, Evicted::Through);
    let gone = pods.get_opt("db-0").await.unwrap();
    assert!(
        gone.is_none_or(|p| p.uid() != db0.uid() || p.metadata.deletion_timestamp.is_some()),
        "the eviction went through"
    );
    assert!(
        event_arrives(&cluster, "db-0", webhook_reason::ISOLATION_FAILED).await,
        "{:?}",
        event_reasons(&cluster, "default", "db-0").await
    );
}

/// A StatefulSet pod behind a PDB on the StatefulSet's own key stays selected by the PDB
/// once isolated, so only its `disruptedPods` entry keeps it counted as disrupted, and the
/// disruption controller drops that entry after its DeletionTimeout (two minutes upstream,
/// 3 s here) although the pod is held longer (a 9 s delay here; delays over two minutes
/// in production). The webhook keeps the entry fresh while it holds the pod, so a drain
/// retrying a second member's eviction is refused by the budget until the first is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_member_stays_disrupted_in_its_pdb_past_the_deletion_timeout() {
    use graceful_drain_sim::scenario::spec::Workload;
    use graceful_drain_sim::scenario::workloads;
    graceful_drain_core::runtime::install_crypto_provider();
    let timeout = Duration::from_secs(3);
    let delay = Duration::from_secs(9);
    let config = ClusterConfig {
        disruption_timeout: timeout,
        ..ClusterConfig::default()
    };
    let cluster = graceful_drain_sim::setup::start(config, Shutdown::new())
        .await
        .unwrap();
    let _webhook =
        start_webhook_with(&cluster, delay, 10, &["--disruption-renew-after", "1s"]).await;
    let web = WebSpec {
        replicas: 3,
        min_available: 2,
        ..WebSpec::default()
    };
    workloads::deploy(&cluster, &web, TIMEOUT, Workload::StatefulSet)
        .await
        .unwrap();
    wait_for("pdb allows one disruption", TIMEOUT, || {
        pdb_allows(&cluster, 1)
    })
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let first = pods.get("web-0").await.unwrap();
    // A drainer marks the node first (Karpenter's taint here; a cordon alone confirms
    // nothing); only then may the deleter remove a pod its PDB still selects (a review's
    // word alone never deletes one).
    let node = first
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap();
    let taint = serde_json::json!({"spec": {"unschedulable": true, "taints": [
        {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}});
    Api::<k8s_openapi::api::core::v1::Node>::all(cluster.client())
        .patch(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(taint),
        )
        .await
        .unwrap();
    let isolated = Instant::now();
    assert!(matches!(
        evict(&cluster, "web-0").await,
        Evicted::Deregistering(_)
    ));
    assert!(
        is_draining(&pods.get("web-0").await.unwrap()),
        "web-0 is held"
    );
    // A drain's retries of the next member, until the first is gone.
    let mut refused = 0;
    loop {
        let live = pods.get_opt("web-0").await.unwrap();
        if live.is_none_or(|p| p.uid() != first.uid() || p.metadata.deletion_timestamp.is_some()) {
            break;
        }
        assert!(isolated.elapsed() < TIMEOUT, "web-0 was never deleted");
        let answer = try_evict(&cluster, "web-1").await;
        match too_many_requests(&answer) {
            Some(_) if deregistering(&answer).is_none() => refused += 1,
            _ => panic!(
                "web-1 was let go while web-0 was still held ({:?} after its isolation): {answer:?}",
                isolated.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let held = isolated.elapsed();
    eprintln!("web-0 held {held:?}; web-1 refused {refused} times meanwhile");
    assert!(
        held > timeout * 2,
        "web-0 was held only {held:?}, not past the {timeout:?} deletion timeout"
    );
    let web1 = pods.get("web-1").await.unwrap();
    assert!(!is_draining(&web1), "web-1 still serves");
}

/// Merge-patches pod `name` in the default namespace as the admin.
async fn patch_pod(cluster: &DataPlane, name: &str, patch: serde_json::Value) {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

/// Evicts `name` in the default namespace as the admin, returning the API's answer.
async fn try_evict(cluster: &DataPlane, name: &str) -> Result<serde_json::Value, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let body = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": "default"}});
    pods.create_subresource("eviction", name, &PostParams::default(), &body)
        .await
}

/// The refusal message of a 429, if `result` is one.
fn too_many_requests(result: &Result<serde_json::Value, kube::Error>) -> Option<&str> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 429 => Some(s.message.as_str()),
        _ => None,
    }
}

/// Whether the live PDB `web` is observed at its generation and allows `allowed`.
async fn pdb_allows(cluster: &DataPlane, allowed: i32) -> bool {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), "default");
    let Ok(pdb) = pdbs.get("web").await else {
        return false;
    };
    let generation = pdb.metadata.generation;
    pdb.status
        .is_some_and(|s| s.observed_generation == generation && s.disruptions_allowed == allowed)
}

/// The same pod (UID), alive and not draining.
fn untouched(before: &Pod, now: Option<Pod>) -> bool {
    now.is_some_and(|p| {
        p.uid() == before.uid() && p.metadata.deletion_timestamp.is_none() && !is_draining(&p)
    })
}

/// A PDB that allowed nothing and allows one disruption moments before the eviction
/// (the webhook's cache may still say exhausted): the eviction is decided on the live
/// PDB, so the pod is isolated (its eviction refused only until it is due), not refused
/// by the budget. The next eviction finds the live budget
/// spent and is refused with 429 by the webhook itself — never let through as a real
/// eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_are_decided_on_the_live_pdb_not_on_a_stale_cache() {
    let spec = WebSpec {
        replicas: 3,
        min_available: 3,
        ..WebSpec::default()
    };
    let (cluster, _webhook) = setup(&spec, Duration::from_secs(30), 10).await;
    wait_for("pdb exhausted", TIMEOUT, || pdb_allows(&cluster, 0))
        .await
        .unwrap();
    let pods = web_pods(&cluster, &spec).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), "default");
    pdbs.patch(
        "web",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"minAvailable": 2}})),
    )
    .await
    .unwrap();
    // The eviction follows the disruption controller's status update at once.
    wait_for("pdb allows one", TIMEOUT, || pdb_allows(&cluster, 1))
        .await
        .unwrap();
    let first = pods[0].name_any();
    let evicted = try_evict(&cluster, &first).await;
    assert!(
        deregistering(&evicted).is_some(),
        "refused on a stale budget: {evicted:?}"
    );
    let live: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let isolated = live.get(&first).await.unwrap();
    assert!(is_draining(&isolated), "evicted pod isolated");
    assert!(
        isolated.metadata.deletion_timestamp.is_none(),
        "still serving"
    );
    assert!(event_arrives(&cluster, &first, webhook_reason::ISOLATED).await);

    // The live budget is spent now: the webhook refuses, changing nothing.
    let second = &pods[1];
    let refused = try_evict(&cluster, &second.name_any()).await;
    let message = too_many_requests(&refused).unwrap_or_else(|| panic!("{refused:?}"));
    assert!(
        message.starts_with("admission webhook \"eviction.graceful-drain.io\" denied")
            && message.contains("disruption budget"),
        "refused by the API server, not by the webhook: {message}"
    );
    assert_eq!(deregistering(&refused), None, "isolated: {refused:?}");
    let now = live.get_opt(&second.name_any()).await.unwrap();
    assert!(untouched(second, now), "the refused pod was touched");
}

/// The API server answers slowly (700 ms per request): the webhook cannot isolate
/// within a 2 s webhook timeout, yet answers every call before the API server's
/// deadline — an eviction is refused with 429 (retry later) instead of timing out and
/// going through as a real eviction, and a DELETE is allowed in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_api_latency_every_call_is_answered_inside_the_deadline() {
    use kube_sim::apiserver::Faults;
    let latency = Duration::from_millis(700);
    let mut config = ClusterConfig::default();
    config.api.faults = Faults {
        latency,
        ..Faults::default()
    };
    let spec = WebSpec {
        replicas: 3,
        min_available: 1,
        ..WebSpec::default()
    };
    let (cluster, _webhook) = setup_with(config, &spec, Duration::from_secs(30), 2, &[]).await;
    // Our own request's latency plus the API server's 2 s deadline for the webhook.
    let bound = latency + Duration::from_secs(2);
    let pods = web_pods(&cluster, &spec).await;
    let live: Api<Pod> = Api::namespaced(cluster.client(), "default");

    let started = Instant::now();
    let refused = try_evict(&cluster, &pods[0].name_any()).await;
    let took = started.elapsed();
    let message = too_many_requests(&refused).unwrap_or_else(|| panic!("{refused:?}"));
    assert!(
        message.contains("within the admission deadline"),
        "{message}"
    );
    assert!(took < bound, "answered after the deadline: {took:?}");
    let now = live.get_opt(&pods[0].name_any()).await.unwrap();
    assert!(
        now.is_some_and(|p| p.uid() == pods[0].uid() && p.metadata.deletion_timestamp.is_none()),
        "the eviction went through"
    );

    let started = Instant::now();
    live.delete(&pods[1].name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(took < bound, "DELETE answered after the deadline: {took:?}");
    let stats = cluster.api().stats();
    assert!(stats.admission_total() >= 2, "{stats:?}");
    assert!(
        stats.admission_failures.is_empty(),
        "a webhook call timed out: {stats:?}"
    );
}

/// Priority and Fairness throttles the webhook's first two relabels of the pod it
/// isolates, and the first read of the PDB whose charge it then refunds: the webhook
/// refunds the charge all the same and settles the eviction again within the review
/// instead of answering a 429 that isolated nothing, so one eviction isolates the pod
/// (and is asked to come back at its delete time). (A 429 that isolated nothing costs
/// the caller its retry pause, 5 s for kubectl, and on the DELETE path lets the pod go
/// unprotected.) The PDB has one disruption to spare: a charge left behind would make
/// the webhook refuse the eviction by the budget instead of isolating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_call_while_isolating_is_retried_within_the_review() {
    use kube_sim::apiserver::{Burst, Faults};
    let mut config = ClusterConfig::default();
    config.api.faults = Faults {
        bursts: vec![
            Burst::new(WEBHOOK_USER, "patch", "pods", 2),
            Burst::new(WEBHOOK_USER, "get", "poddisruptionbudgets", 1),
        ],
        ..Faults::default()
    };
    let spec = WebSpec {
        replicas: 3,
        min_available: 2,
        ..WebSpec::default()
    };
    let (cluster, _webhook) = setup_with(config, &spec, Duration::from_secs(30), 10, &[]).await;
    let pods = web_pods(&cluster, &spec).await;
    let first = pods[0].name_any();
    let answer = try_evict(&cluster, &first).await;
    assert!(
        deregistering(&answer).is_some(),
        "eviction refused without isolating: {answer:?}"
    );
    let live: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let isolated = live.get(&first).await.unwrap();
    assert!(is_draining(&isolated), "evicted pod not isolated");
    assert!(
        isolated.metadata.deletion_timestamp.is_none(),
        "deleted before its delay"
    );
}

/// The body of `GET path` on the admin port (status line included).
async fn admin_get(admin: std::net::SocketAddr, path: &str) -> String {
    let Ok(mut stream) = tokio::net::TcpStream::connect(admin).await else {
        return String::new();
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// While the webhook may not create the deleter's Lease (RBAC without `create leases`),
/// nobody would delete an isolated pod: `/readyz` says so and an eviction is not
/// isolated (it goes through as without graceful-drain). Once the Lease exists, the
/// webhook takes it, becomes ready and isolates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_deleter_lease_the_webhook_is_not_ready_and_isolates_nothing() {
    use kube_sim::apiserver::{Faults, Forbidden};
    graceful_drain_core::runtime::install_crypto_provider();
    let mut config = ClusterConfig::default();
    config.api.faults = Faults {
        forbidden: vec![Forbidden::new(WEBHOOK_USER, "create", "leases")],
        ..Faults::default()
    };
    let cluster = graceful_drain_sim::setup::start(config, Shutdown::new())
        .await
        .unwrap();
    let spec = WebSpec {
        replicas: 3,
        min_available: 1,
        ..WebSpec::default()
    };
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    wait_for("pdb observed", TIMEOUT, || pdb_allows(&cluster, 2))
        .await
        .unwrap();
    let webhook = launch_webhook(&cluster, Duration::from_secs(30), 10, &[]).await;
    // Everything but the deleter is ready: caches listed, certificate loaded.
    let only_deleter = "not ready:\ndeleter: no replica holds the deleter Lease\n";
    wait_for("webhook waiting only for the Lease", TIMEOUT, || async {
        admin_get(webhook.admin, "/readyz")
            .await
            .ends_with(only_deleter)
    })
    .await
    .unwrap();
    register_webhook(&cluster, &webhook, 10).await;
    let pods = web_pods(&cluster, &spec).await;
    let live: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let first = pods[0].name_any();
    assert_eq!(evict(&cluster, &first).await, Evicted::Through);
    let now = live.get_opt(&first).await.unwrap();
    assert!(
        now.is_none_or(|p| p.uid() != pods[0].uid()
            || (p.metadata.deletion_timestamp.is_some() && !is_draining(&p))),
        "isolated with nobody to delete it"
    );
    assert!(!has_event(&cluster, &first, webhook_reason::ISOLATED).await);
    assert!(!ready(webhook.admin).await);

    // The Lease appears (another installation's RBAC, an operator): the webhook takes it.
    let lease: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "graceful-drain-webhook", "namespace": "graceful-drain"},
            "spec": {}}),
    )
    .unwrap();
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        cluster.client(),
        "graceful-drain",
    )
    .create(&PostParams::default(), &lease)
    .await
    .unwrap();
    wait_for("webhook ready with the Lease", TIMEOUT, || {
        ready(webhook.admin)
    })
    .await
    .unwrap();
    let second = pods[1].name_any();
    assert!(matches!(
        evict(&cluster, &second).await,
        Evicted::Deregistering(_)
    ));
    let isolated = live.get(&second).await.unwrap();
    assert!(is_draining(&isolated), "isolated once a deleter exists");
    assert!(isolated.metadata.deletion_timestamp.is_none());
}

/// A pod asking for an hour of deregistration delay (a typo for a minute, say) is kept
/// out of its Services only for `--max-deregistration-delay`: the delete time uses the
/// cap, the eviction is asked to come back then, and a Warning Event
/// `graceful-drain.io/DelayCapped` says so on the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_annotation_above_the_cap_is_cut_to_it_with_a_warning() {
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    let extra = ["--max-deregistration-delay", "20s"];
    let (cluster, _webhook) = setup_with(
        ClusterConfig::default(),
        &spec,
        Duration::from_secs(5),
        10,
        &extra,
    )
    .await;
    let victim = web_pods(&cluster, &spec).await.remove(0).name_any();
    let annotation = serde_json::json!({"metadata": {"annotations":
        {DELAY_ANNOTATION: "1h"}}});
    patch_pod(&cluster, &victim, annotation).await;
    let evicted_at = jiff::Timestamp::now();
    let Evicted::Deregistering(retry) = evict(&cluster, &victim).await else {
        panic!("{victim} evicted at once");
    };
    assert!(
        (15..=21).contains(&retry),
        "asked to come back in {retry} s, not at the 20 s cap"
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let isolated = pods.get(&victim).await.unwrap();
    assert!(is_draining(&isolated));
    let delete_at: jiff::Timestamp = isolated
        .annotations()
        .get(DELETE_AT_ANNOTATION)
        .expect("delete time recorded")
        .parse()
        .unwrap();
    let after = delete_at.duration_since(evicted_at);
    assert!(
        (15..=25).contains(&after.as_secs()),
        "deleted {after:?} after the eviction, not at the 20 s cap"
    );
    assert!(event_arrives(&cluster, &victim, webhook_reason::DELAY_CAPPED).await);
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let capped = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| graceful_drain_webhook::events::names_pod(e, &victim))
        .find(|e| e.reason.as_deref() == Some(webhook_reason::DELAY_CAPPED));
    assert_eq!(
        capped.as_ref().and_then(|e| e.type_.as_deref()),
        Some("Warning"),
        "{:?}",
        event_reasons(&cluster, "default", &victim).await
    );
}

/// With `--keep-label team`, an isolated pod leaves its Service and ReplicaSet (their
/// keys removed) but keeps `team`, so NetworkPolicies and dashboards selecting on it
/// still match; `kubectl get pods -l graceful-drain.io/draining=web` finds the app's
/// isolated pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_labels_stay_on_an_isolated_pod_and_the_draining_label_names_the_app() {
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    let extra = ["--keep-label", "team"];
    let (cluster, _webhook) = setup_with(
        ClusterConfig::default(),
        &spec,
        Duration::from_secs(30),
        10,
        &extra,
    )
    .await;
    let victim = web_pods(&cluster, &spec).await.remove(0).name_any();
    patch_pod(
        &cluster,
        &victim,
        serde_json::json!({"metadata": {"labels": {"team": "payments"}}}),
    )
    .await;
    assert!(matches!(
        evict(&cluster, &victim).await,
        Evicted::Deregistering(_)
    ));
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let isolated = pods.get(&victim).await.unwrap();
    let labels = isolated.labels();
    assert_eq!(
        labels.get("team").map(String::as_str),
        Some("payments"),
        "{labels:?}"
    );
    assert!(
        !labels.contains_key("app") && !labels.contains_key("pod-template-hash"),
        "the Service's and ReplicaSet's keys are removed: {labels:?}"
    );
    assert_eq!(
        labels.get(DRAINING_LABEL).map(String::as_str),
        Some("web"),
        "{labels:?}"
    );
    let listed = pods
        .list(&ListParams::default().labels(&format!("{DRAINING_LABEL}=web")))
        .await
        .unwrap();
    assert_eq!(
        listed
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>(),
        vec![victim]
    );
}

/// The garbage collector deleting a pod, and anyone deleting a pod of a namespace being
/// deleted, is answered at once: nothing is held or isolated, so neither an owner's
/// cascading deletion nor `kubectl delete namespace` waits on graceful-drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_garbage_collector_and_namespace_deletion_pass_straight_through() {
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    // A held DELETE would take about 8 s of the 10 s webhook timeout.
    let (cluster, _webhook) = setup(&spec, Duration::from_secs(30), 10).await;
    let quick = Duration::from_secs(3);
    let gc = cluster
        .api()
        .client(graceful_drain_webhook::decide::GARBAGE_COLLECTOR);
    let victim = web_pods(&cluster, &spec).await.remove(0);
    let started = Instant::now();
    Api::<Pod>::namespaced(gc, "default")
        .delete(&victim.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    assert!(started.elapsed() < quick, "held: {:?}", started.elapsed());
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let now = pods.get_opt(&victim.name_any()).await.unwrap();
    assert!(now.is_none_or(|p| p.uid() != victim.uid() || !is_draining(&p)));
    assert!(!has_event(&cluster, &victim.name_any(), webhook_reason::ISOLATED).await);

    // A namespace being deleted (a finalizer keeps it terminating while its pods go).
    let shop = WebSpec {
        namespace: "shop".into(),
        ..spec.clone()
    };
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": "shop",
        "finalizers": ["example.com/cleanup"]}}))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    cluster.deploy_web(&shop, TIMEOUT).await.unwrap();
    let shop_pods: Api<Pod> = Api::namespaced(cluster.client(), "shop");
    let victim = web_pods(&cluster, &shop).await.remove(0);
    namespaces
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("namespace terminating", TIMEOUT, || async {
        namespaces
            .get("shop")
            .await
            .is_ok_and(|n| n.metadata.deletion_timestamp.is_some())
    })
    .await
    .unwrap();
    let started = Instant::now();
    shop_pods
        .delete(&victim.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    assert!(started.elapsed() < quick, "held: {:?}", started.elapsed());
    let now = shop_pods.get_opt(&victim.name_any()).await.unwrap();
    assert!(now.is_none_or(|p| p.uid() != victim.uid() || !is_draining(&p)));
    let reasons = event_reasons(&cluster, "shop", &victim.name_any()).await;
    assert!(
        !reasons.iter().any(|r| r == webhook_reason::ISOLATED),
        "{reasons:?}"
    );
}

/// A drain evicts every pod of a node at once. The first eviction there opens a watch of
/// the node's pods, and all are decided from it instead of a read of their pod each; the Isolated Events of one ReplicaSet's pods, coming together, become
/// one Event on the ReplicaSet naming them. Every pod is still isolated and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_reads_its_pods_from_the_nodes_watch_and_groups_their_events() {
    let spec = WebSpec {
        replicas: 12,
        min_available: 0,
        ..WebSpec::default()
    };
    let config = ClusterConfig {
        nodes: 2,
        ..ClusterConfig::default()
    };
    let (cluster, _webhook) = setup_with(config, &spec, Duration::from_secs(20), 10, &[]).await;
    let client = cluster.client();
    let node = first_web_pod_node(&cluster, &spec).await;
    actions::cordon(&client, &node, true).await.unwrap();
    let victims: Vec<String> = actions::pods_on(&client, &node)
        .await
        .unwrap()
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(victims.len() >= 4, "pods on {node}: {victims:?}");
    let before = cluster.api().stats();
    // All at once, as kubectl drain sends them: the first opens the node's watch and the
    // others wait for its list instead of reading their pod each.
    let answers = futures::future::join_all(victims.iter().map(|name| evict(&cluster, name))).await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Evicted::Deregistering(_))),
        "{answers:?}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in &victims {
        assert!(
            is_draining(&pods.get(name).await.unwrap()),
            "{name} isolated"
        );
        assert!(
            event_arrives(&cluster, name, webhook_reason::ISOLATED).await,
            "{name}: {:?}",
            event_reasons(&cluster, "default", name).await
        );
    }
    let during = cluster.api().stats().since(&before);
    let count = |verb: &str, resource: &str| {
        during
            .by_user_request
            .get(&(WEBHOOK_USER.into(), verb.into(), resource.into()))
            .copied()
            .unwrap_or(0)
    };
    // Reads only if the node's list took longer than the webhook waits for it.
    assert!(
        count("get", "pods") <= 2,
        "{} pod reads for {} evictions: {:?}",
        count("get", "pods"),
        victims.len(),
        during.breakdown(WEBHOOK_USER)
    );
    assert_eq!(count("patch", "pods"), victims.len() as u64);
    assert!(
        count("create", "events") < victims.len() as u64,
        "{} Events for {} isolated pods of one ReplicaSet",
        count("create", "events"),
        victims.len()
    );
}

/// The first eviction of an exposed pod isolates it and is refused with a 429 carrying
/// the `graceful-drain.io/Deregistering` cause and a Retry-After at its delete time; the
/// pod keeps running until then. The caller's retried eviction once the pod is due goes
/// through and deletes it: the API server's eviction of a caller it authenticated, not
/// the webhook, removes the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_is_deleted_by_its_callers_retry_once_due() {
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    let (cluster, _webhook) = setup(&spec, Duration::from_secs(3), 10).await;
    let stats = cluster.api().stats();
    let victim = web_pods(&cluster, &spec).await.remove(0);
    let name = victim.name_any();
    let first = try_evict(&cluster, &name).await;
    let retry = deregistering(&first).unwrap_or_else(|| panic!("{first:?}"));
    assert!(
        (2..=4).contains(&retry),
        "Retry-After {retry} s for a 3 s delay"
    );
    let message = too_many_requests(&first).unwrap();
    assert!(
        message.contains(&format!("default/{name}")) && message.contains("evict it again"),
        "{message}"
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let isolated = pods.get(&name).await.unwrap();
    assert_eq!(isolated.uid(), victim.uid());
    assert!(is_draining(&isolated));
    assert!(
        isolated.metadata.deletion_timestamp.is_none(),
        "still serving"
    );
    let delete_at: jiff::Timestamp = isolated.annotations()[DELETE_AT_ANNOTATION]
        .parse()
        .unwrap();
    // Asked again before its delete time: still deregistering, nothing deleted.
    let again = try_evict(&cluster, &name).await;
    let sooner = deregistering(&again).unwrap_or_else(|| panic!("{again:?}"));
    assert!(sooner <= retry, "{sooner} s after {retry} s");
    evict_until_gone(&cluster, &name, TIMEOUT).await;
    assert!(
        jiff::Timestamp::now() >= delete_at,
        "evicted before its delete time {delete_at}"
    );
    let now = pods.get_opt(&name).await.unwrap();
    assert!(
        now.is_none_or(|p| p.uid() != victim.uid() || p.metadata.deletion_timestamp.is_some()),
        "the retried eviction did not go through"
    );
    assert_eq!(
        webhook_removals(&cluster.api().stats().since(&stats)),
        0,
        "the webhook removed the pod itself"
    );
}

/// Posts `review` straight to the webhook's `path` over HTTPS, as anyone who can reach
/// its port could, and returns the AdmissionReview it answers.
async fn post_to_webhook(
    webhook: &Webhook,
    path: &str,
    review: &serde_json::Value,
) -> serde_json::Value {
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
    let mut stream = connector.connect(name, tcp).await.unwrap();
    let body = serde_json::to_vec(review).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    let mut answer = Vec::new();
    // The server may close without a TLS close_notify; what was read is the answer.
    let _ = tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// An eviction AdmissionReview forged by someone who can reach the webhook's port (no
/// eviction reached the API server) isolates the pod, but nothing ever deletes it: no
/// eviction comes back for it, and at its restore time the webhook puts it back into its
/// Service and ReplicaSet with a Warning Event `graceful-drain.io/Restored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_eviction_review_deletes_nothing_and_the_pod_goes_back_into_its_service() {
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    let extra = ["--restore-after", "2s"];
    let (cluster, webhook) = setup_with(
        ClusterConfig::default(),
        &spec,
        Duration::from_secs(2),
        10,
        &extra,
    )
    .await;
    let stats = cluster.api().stats();
    let victim = web_pods(&cluster, &spec).await.remove(0);
    let name = victim.name_any();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    // Every version of the pod from now on: the ReplicaSet may scale the restored pod's
    // replacement down at once, so its restored state is watched for, not polled.
    let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = kube::runtime::watcher(pods.clone(), config);
    let mut events = std::pin::pin!(events);
    let forged = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "forged-1",
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction", "name": name, "namespace": "default",
            "operation": "CREATE", "userInfo": {"username": "system:node:elsewhere"},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": name, "namespace": "default"}}}});
    let answer = post_to_webhook(&webhook, "/mutate/eviction?timeout=10s", &forged).await;
    let response = &answer["response"];
    assert_eq!(response["allowed"], false, "{answer}");
    assert_eq!(response["status"]["code"], 429, "{answer}");
    assert_eq!(
        response["status"]["details"]["causes"][0]["reason"],
        DEREGISTERING_CAUSE
    );
    let isolated = pods.get(&name).await.unwrap();
    assert!(is_draining(&isolated), "the forged review isolates");
    let restore_at: jiff::Timestamp = isolated.annotations()[RESTORE_AT_ANNOTATION]
        .parse()
        .unwrap();

    let restored = tokio::time::timeout(TIMEOUT, async {
        use futures::StreamExt;
        use kube::runtime::watcher::Event as Seen;
        let mut was_isolated = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(Seen::Apply(p) | Seen::InitApply(p)) => {
                    assert_eq!(p.uid(), victim.uid(), "{name} was replaced");
                    assert!(
                        p.metadata.deletion_timestamp.is_none(),
                        "{name} is being deleted"
                    );
                    let back = !is_draining(&p)
                        && p.labels().get("app").map(String::as_str) == Some("web")
                        && p.labels().contains_key("pod-template-hash")
                        && !p.annotations().contains_key(RESTORE_AT_ANNOTATION);
                    if back && was_isolated {
                        return p;
                    }
                    was_isolated |= is_draining(&p);
                }
                Ok(kube::runtime::watcher::Event::Delete(_)) => panic!("{name} was deleted"),
                _ => {}
            }
        }
        panic!("the watch of {name} ended")
    })
    .await
    .unwrap_or_else(|_| panic!("{name} was never restored"));
    assert!(
        jiff::Timestamp::now() >= restore_at,
        "restored before its restore time {restore_at}"
    );
    assert_eq!(controller_kind(&restored).as_deref(), Some("ReplicaSet"));
    assert_eq!(
        webhook_removals(&cluster.api().stats().since(&stats)),
        0,
        "the webhook removed a pod"
    );
    assert!(
        event_arrives(&cluster, &name, webhook_reason::RESTORED).await,
        "{:?}",
        event_reasons(&cluster, "default", &name).await
    );
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let warning = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| graceful_drain_webhook::events::names_pod(e, &name))
        .find(|e| e.reason.as_deref() == Some(webhook_reason::RESTORED));
    assert_eq!(
        warning.and_then(|e| e.type_).as_deref(),
        Some("Warning"),
        "{:?}",
        event_reasons(&cluster, "default", &name).await
    );
    // Back behind its load balancer.
    let service = spec.service_key();
    wait_for("back in its load balancer", TIMEOUT, || async {
        cluster
            .lbs()
            .registered(&service, Instant::now())
            .contains(&victim.uid().unwrap())
    })
    .await
    .unwrap();
}

/// A busy EndpointSlice controller (each of its writes lands 4 s late) still lists an
/// isolated pod past its 2 s delete time: the caller's retried eviction is refused while
/// any slice lists the pod, and goes through only once the pod has been out of every
/// slice for its whole delay — the delay counts from the removal, not the isolation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_busy_endpointslice_controller_the_delay_counts_from_the_removal() {
    use futures::StreamExt;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::runtime::{WatchStreamExt, watcher};
    use kube_sim::apiserver::Faults;
    use kube_sim::controllers::users::ENDPOINTSLICE;
    let lag = Duration::from_secs(4);
    let delay = Duration::from_secs(2);
    let mut config = ClusterConfig::default();
    config.api.faults = Faults {
        slow_writers: vec![(ENDPOINTSLICE.to_string(), lag)],
        ..Faults::default()
    };
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    let (cluster, _webhook) = setup_with(config, &spec, delay, 10, &[]).await;
    let name = web_pods(&cluster, &spec).await.remove(0).name_any();
    // From the slices' own watch: `Some(None)` while a slice lists the victim, then
    // `Some(Some(t))` from the moment t none does.
    let left = std::sync::Arc::new(std::sync::Mutex::new(None::<Option<Instant>>));
    let seen = left.clone();
    let watched = name.clone();
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client(), "default");
    let watch = tokio::spawn(async move {
        let lists = |s: &EndpointSlice| {
            s.endpoints.iter().any(|e| {
                e.target_ref.as_ref().and_then(|t| t.name.as_deref()) == Some(watched.as_str())
            })
        };
        let mut listing = std::collections::HashMap::new();
        let mut changes = watcher(slices, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = changes.next().await {
            match event {
                Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                    listing.insert(s.name_any(), lists(&s));
                }
                Ok(watcher::Event::Delete(s)) => {
                    listing.remove(&s.name_any());
                }
                _ => continue,
            }
            let mut seen = seen.lock().unwrap();
            match (listing.values().any(|l| *l), *seen) {
                (true, _) => *seen = Some(None),
                (false, Some(None)) => *seen = Some(Some(Instant::now())),
                _ => {}
            }
        }
    });
    let isolated = Instant::now();
    let first = try_evict(&cluster, &name).await;
    assert!(deregistering(&first).is_some(), "{first:?}");
    let deadline = isolated + TIMEOUT;
    let evicted = loop {
        match try_evict(&cluster, &name).await {
            Ok(_) => break Instant::now(),
            Err(kube::Error::Api(s)) if s.code == 429 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => panic!("eviction of {name}: {error:?}"),
        }
    };
    watch.abort();
    let left = left
        .lock()
        .unwrap()
        .expect("the pod was in a slice")
        .expect("the pod left its slices before its eviction went through");
    assert!(
        left.duration_since(isolated) > delay,
        "the busy controller kept the pod listed past its delete time ({:?} after isolation)",
        left.duration_since(isolated)
    );
    let unlisted_for = evicted.saturating_duration_since(left);
    eprintln!(
        "left its slices {:?} after isolation; evicted {unlisted_for:?} after that",
        left.duration_since(isolated)
    );
    assert!(
        unlisted_for + Duration::from_millis(300) >= delay,
        "evicted {unlisted_for:?} after it left its slices; its delay is {delay:?}"
    );
}

/// The value of the unlabelled metric `name` on the webhook's admin port.
async fn gauge(admin: std::net::SocketAddr, name: &str) -> Option<f64> {
    let text = admin_get(admin, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// How long a broken path may take to show: the next probe (1 s apart here, 30 s by
/// default) plus its call, which fails at once when nothing listens.
const PROTECTION_BOUND: Duration = Duration::from_secs(5);

/// Protection is observed, not assumed: the webhook's probe (a dry-run eviction of a pod
/// that does not exist) comes back from the API server with the webhook's warning, and the
/// deleter Lease and the metric say `active`. Once the webhook configurations point where
/// nothing answers (what a NetworkPolicy that does not admit the control plane, or every
/// replica down, does; with `failurePolicy: Ignore` every eviction then passes unprotected),
/// the Lease, the metric and a Warning Event on the webhook's pod say so within
/// [`PROTECTION_BOUND`]; restored, it is `active` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_the_api_server_stops_calling_says_so() {
    protection_observed(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_a_webhook_the_api_server_stops_calling_says_so() {
    protection_observed(Tier::Real).await;
}

async fn protection_observed(tier: Tier) {
    use graceful_drain_webhook::probe;
    use k8s_openapi::api::coordination::v1::Lease;
    let Some(cluster) = TestCluster::start(tier, ClusterConfig::default())
        .await
        .unwrap()
    else {
        return;
    };
    let webhook = start_webhook_with(
        &cluster,
        Duration::from_secs(5),
        10,
        &["--probe-interval", "1s"],
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(cluster.client(), "graceful-drain");
    let protection = || async {
        leases
            .get_opt(graceful_drain_webhook::lease::DEFAULT_NAME)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.metadata.annotations)
            .and_then(|a| a.get(probe::PROTECTION_ANNOTATION).cloned())
    };
    wait_for("protection active on the Lease", TIMEOUT, || async {
        protection().await.as_deref() == Some("active")
    })
    .await
    .unwrap();
    let active = "graceful_drain_webhook_protection_active";
    assert_eq!(gauge(webhook.admin, active).await, Some(1.0));

    // Point the mutating webhook where nothing listens.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(cluster.client());
    let mut mutating = configurations
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut broken = mutating.remove(0);
    let name = broken.metadata.name.clone().unwrap();
    let original = broken.clone();
    for hook in broken.webhooks.iter_mut().flatten() {
        hook.client_config.url = Some(format!("https://127.0.0.1:{}", free_port().port()));
    }
    configurations
        .replace(&name, &PostParams::default(), &broken)
        .await
        .unwrap();
    let broke = Instant::now();
    wait_for("protection lost on the Lease", PROTECTION_BOUND, || async {
        protection().await.as_deref() == Some("lost")
    })
    .await
    .unwrap();
    eprintln!(
        "protection reported lost {:?} after the path broke",
        broke.elapsed()
    );
    assert_eq!(gauge(webhook.admin, active).await, Some(0.0));
    let events: Api<Event> = Api::namespaced(cluster.client(), "graceful-drain");
    wait_for("a ProtectionLost Warning Event", EVENT_WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some(webhook_reason::PROTECTION_LOST))
    })
    .await
    .unwrap();

    // Fixed: active again.
    let mut fixed = configurations.get(&name).await.unwrap();
    fixed.webhooks = original.webhooks;
    configurations
        .replace(&name, &PostParams::default(), &fixed)
        .await
        .unwrap();
    wait_for("protection active again", PROTECTION_BOUND, || async {
        protection().await.as_deref() == Some("active")
    })
    .await
    .unwrap();
}

/// With kube-apiserver presenting a client certificate to webhooks (an
/// AdmissionConfiguration naming a kubeconfig, docs/install.md "Client certificates") and
/// the webhook requiring one signed by that CA (`--client-ca`), evictions still reach the
/// webhook through the API server, while a review posted straight to the webhook's port —
/// anyone on the pod network forging one — is refused at the TLS handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_with_client_certificates_only_the_api_server_reaches_the_webhook() {
    let Some(cluster) =
        TestCluster::start_with_webhook_client_certificates(ClusterConfig::default())
            .await
            .unwrap()
    else {
        return;
    };
    let ca = cluster.webhook_client_ca().unwrap();
    let ca = ca.to_str().unwrap();
    let webhook =
        start_webhook_with(&cluster, Duration::from_secs(30), 10, &["--client-ca", ca]).await;
    let spec = WebSpec {
        replicas: 3,
        min_available: 1,
        ..WebSpec::default()
    };
    deploy_protected(&cluster, &spec).await;
    let victim = web_pods(&cluster, &spec).await.remove(0);
    let node = victim
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap();
    actions::cordon(&cluster.client(), &node, true)
        .await
        .unwrap();
    // Through the API server: isolated, and the caller asked to come back.
    assert!(
        matches!(
            evict(&cluster, &victim.name_any()).await,
            Evicted::Deregistering(_)
        ),
        "the API server's call did not reach the webhook"
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    assert!(is_draining(&pods.get(&victim.name_any()).await.unwrap()));

    // Straight to the port, without the API server's certificate: no TLS session.
    let forged = forge_eviction_review(webhook.listen, &webhook.ca, &victim.name_any()).await;
    assert!(
        forged.is_err(),
        "a review posted without a client certificate was served: {forged:?}"
    );
}

/// Posts an eviction review of `pod` to the webhook at `addr` over TLS, trusting `ca`
/// for the server and presenting no client certificate: the answer's status, or why none
/// came.
async fn forge_eviction_review(
    addr: std::net::SocketAddr,
    ca: &str,
    pod: &str,
) -> Result<u16, String> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "forged", "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "eviction",
            "name": pod, "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:tenant:viewer"},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": "default"}}}});
    let request = http::Request::post("/mutate/eviction")
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(review.to_string())))
        .unwrap();
    let answer = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = answer.status().as_u16();
    let _ = answer.into_body().collect().await;
    Ok(status)
}
