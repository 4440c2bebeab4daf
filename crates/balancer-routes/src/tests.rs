//! The whole question over real HTTP(S): a [`Lister`] asks a balancer served in-process on
//! 127.0.0.1 (hyper, an ephemeral port), answering the recorded answers of
//! `tests/fixtures/` or failing as balancers fail: an HTTP 500, an answer past the bound,
//! no answer at all. Nothing dials beyond loopback; nothing sleeps.

use std::convert::Infallible;
use std::error::Error as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::HeaderMap;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use crate::haproxy::CsvError;
use crate::json::JsonError;
use crate::{BalancerConfig, Error, Lister, MAX_ANSWER_BYTES, Routes, Source};

const HAPROXY: &str = include_str!("../tests/fixtures/haproxy-2.6-stats.csv");
const ENVOY: &str = include_str!("../tests/fixtures/envoy-clusters.json");
const TRAEFIK: &str = include_str!("../tests/fixtures/traefik-http-services.json");

type Answer = Response<BoxBody<Bytes, Infallible>>;
type Respond = Arc<dyn Fn(&Request<Incoming>) -> Answer + Send + Sync>;

/// A request as the balancer saw it.
#[derive(Debug)]
struct Seen {
    path_and_query: String,
    headers: HeaderMap,
}

/// A balancer on 127.0.0.1, stopped (with its connections) when dropped.
struct Balancer {
    address: SocketAddr,
    seen: mpsc::UnboundedReceiver<Seen>,
    task: JoinHandle<()>,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Balancer {
    async fn serve(respond: impl Fn(&Request<Incoming>) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (tell, seen) = mpsc::unbounded_channel();
        let respond: Respond = Arc::new(respond);
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (respond, tell) = (respond.clone(), tell.clone());
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let seen = Seen {
                        path_and_query: request.uri().path_and_query().unwrap().to_string(),
                        headers: request.headers().clone(),
                    };
                    let _ = tell.send(seen);
                    let answer = respond(&request);
                    async move { Ok::<_, Infallible>(answer) }
                });
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            address,
            seen,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }
}

fn ok(body: &'static str) -> Answer {
    Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed())
}

fn status(status: StatusCode) -> Answer {
    let mut answer = ok("");
    *answer.status_mut() = status;
    answer
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// `error` and its causes, `a: b: c`, as graceful-drain prints errors.
fn chain(error: &Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(&format!(": {next}"));
        cause = next.source();
    }
    text
}

fn haproxy(url: String, backend: Option<&str>) -> BalancerConfig {
    BalancerConfig::new(Source::HaProxy {
        url,
        backend: backend.map(str::to_string),
    })
}

fn generic(url: String, pointer: &str, address: &str, port: Option<&str>) -> BalancerConfig {
    BalancerConfig::new(Source::Generic {
        url,
        pointer: pointer.into(),
        address_field: Some(address.into()),
        port_field: port.map(str::to_string),
    })
}

async fn ask(config: &BalancerConfig) -> Result<Routes, Error> {
    Lister::new(config).unwrap().routes().await
}

#[tokio::test]
async fn haproxy_s_stats_page_is_asked_for_csv_and_its_routing_servers_listed() {
    let mut balancer = Balancer::serve(|request| match request.uri().path() {
        "/stats;csv" => ok(HAPROXY),
        _ => status(StatusCode::NOT_FOUND),
    })
    .await;
    let config = haproxy(balancer.url("/stats"), Some("be_web"));

    let routes = ask(&config).await.unwrap();

    assert!(routes.routes_to(ip("10.42.1.17"), Some(8080)));
    assert!(routes.routes_to(ip("10.42.1.18"), Some(8080)));
    assert_eq!(
        routes.len(),
        2,
        "the MAINT (resolution) slots route nowhere"
    );
    let seen = balancer.seen.recv().await.unwrap();
    assert_eq!(seen.path_and_query, "/stats;csv");
    assert!(seen.headers.get("authorization").is_none());
}

#[tokio::test]
async fn envoy_s_admin_clusters_are_read_over_http() {
    let balancer = Balancer::serve(|request| match request.uri().query() {
        Some("format=json") => ok(ENVOY),
        _ => ok("cluster_statuses: not json\n"),
    })
    .await;
    let config = generic(
        balancer.url("/clusters?format=json"),
        "/cluster_statuses/*/host_statuses",
        "/address/socket_address/address",
        Some("/address/socket_address/port_value"),
    );

    let routes = ask(&config).await.unwrap();

    assert!(routes.routes_to(ip("10.42.2.6"), Some(9000)));
    assert!(!routes.routes_to(ip("10.42.2.6"), Some(8080)));
    assert!(!routes.routes_to(ip("10.42.9.9"), None));
}

#[tokio::test]
async fn traefik_s_last_page_is_read_and_one_of_several_refused() {
    let traefik = |next: &'static str| {
        move |_: &Request<Incoming>| {
            let mut answer = ok(TRAEFIK);
            answer
                .headers_mut()
                .insert("x-next-page", next.parse().unwrap());
            answer
        }
    };
    let last = Balancer::serve(traefik("1")).await;
    let config = generic(
        last.url("/api/http/services"),
        "/*/loadBalancer/servers",
        "url",
        None,
    );
    let routes = ask(&config).await.unwrap();
    assert!(routes.routes_to(ip("10.42.1.31"), Some(8080)));

    let first = Balancer::serve(traefik("2")).await;
    let config = generic(
        first.url("/api/http/services"),
        "/*/loadBalancer/servers",
        "url",
        None,
    );
    let error = ask(&config).await.unwrap_err();
    assert!(
        matches!(&error, Error::Paginated { next, .. } if next == "2"),
        "{error}"
    );
}

#[tokio::test]
async fn an_http_500_is_an_error_naming_the_url_and_the_status() {
    let balancer = Balancer::serve(|_| status(StatusCode::INTERNAL_SERVER_ERROR)).await;
    let config = haproxy(balancer.url("/stats"), None);

    let error = ask(&config).await.unwrap_err();

    assert!(matches!(error, Error::Status { status, .. } if status == 500));
    assert_eq!(
        chain(&error),
        format!(
            "balancer {}: answered HTTP 500 Internal Server Error",
            balancer.url("/stats;csv")
        )
    );
}

#[tokio::test]
async fn an_answer_declared_larger_than_the_bound_is_refused() {
    let balancer = Balancer::serve(|_| {
        let body = Bytes::from(vec![b'#'; MAX_ANSWER_BYTES + 1]);
        Response::new(Full::new(body).boxed())
    })
    .await;
    let config = haproxy(balancer.url("/stats"), None);

    let error = ask(&config).await.unwrap_err();

    assert!(
        matches!(
            error,
            Error::TooLarge {
                limit: MAX_ANSWER_BYTES,
                ..
            }
        ),
        "{error}"
    );
    assert!(chain(&error).contains(&balancer.url("/stats;csv")));
}

/// A chunked body that never ends, as a balancer gone wrong might send.
struct Endless;

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            &[b'['; 64 * 1024],
        )))))
    }
}

#[tokio::test]
async fn an_answer_that_never_ends_is_cut_at_the_bound() {
    let balancer = Balancer::serve(|_| Response::new(Endless.boxed())).await;
    let config = generic(balancer.url("/clusters"), "", "address", None);

    let error = ask(&config).await.unwrap_err();

    assert!(matches!(error, Error::TooLarge { .. }), "{error}");
}

#[tokio::test]
async fn a_balancer_that_accepts_and_never_answers_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/stats", listener.local_addr().unwrap());
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            held.push(stream);
        }
    });
    let mut config = haproxy(url.clone(), None);
    config.timeout = Duration::from_millis(100);

    let error = ask(&config).await.unwrap_err();
    silent.abort();

    assert!(matches!(error, Error::Timeout { .. }), "{error}");
    assert_eq!(
        chain(&error),
        format!("balancer {url};csv: no answer within 100ms")
    );
}

#[tokio::test]
async fn the_bearer_token_is_sent_and_read_again_for_every_question() {
    let mut balancer = Balancer::serve(|_| ok(HAPROXY)).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let mut config = haproxy(balancer.url("/stats"), None);
    config.token_file = Some(token.clone());
    let lister = Lister::new(&config).unwrap();

    lister.routes().await.unwrap();
    std::fs::write(&token, "rotated-token").unwrap();
    lister.routes().await.unwrap();

    let authorization = |seen: Seen| seen.headers["authorization"].to_str().unwrap().to_string();
    assert_eq!(
        authorization(balancer.seen.recv().await.unwrap()),
        "Bearer first-token"
    );
    assert_eq!(
        authorization(balancer.seen.recv().await.unwrap()),
        "Bearer rotated-token"
    );
}

#[tokio::test]
async fn an_unreadable_or_empty_token_file_is_an_error_naming_it() {
    let balancer = Balancer::serve(|_| ok(HAPROXY)).await;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();

    for (path, cause) in [(&missing, "No such file"), (&empty, "the file is empty")] {
        let mut config = haproxy(balancer.url("/stats"), None);
        config.token_file = Some(path.clone());
        let error = ask(&config).await.unwrap_err();
        let text = chain(&error);
        assert!(matches!(error, Error::Token { .. }), "{text}");
        assert!(
            text.contains(&path.display().to_string()) && text.contains(cause),
            "{text}"
        );
    }
}

#[tokio::test]
async fn answers_in_the_wrong_format_are_errors_saying_so() {
    let balancer = Balancer::serve(|_| ok("<html><body>Statistics Report</body></html>")).await;

    let error = ask(&haproxy(balancer.url("/stats"), None))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            Error::Csv {
                source: CsvError::NoHeader,
                ..
            }
        ),
        "{error}"
    );
    let error = ask(&generic(balancer.url("/"), "/a", "b", None))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NotJson { .. }), "{error}");
}

#[tokio::test]
async fn a_pointer_that_matches_nothing_is_an_error_not_an_empty_answer() {
    let balancer = Balancer::serve(|_| ok(ENVOY)).await;
    let config = generic(
        balancer.url("/clusters?format=json"),
        "/clusters/*/hosts",
        "address",
        None,
    );

    let error = ask(&config).await.unwrap_err();

    assert!(
        matches!(
            &error,
            Error::Json {
                source: JsonError::NoMatch(_),
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(
        chain(&error),
        format!(
            "balancer {}: answer does not list servers as configured: \
             the path \"/clusters/*/hosts\" matches nothing in the answer",
            balancer.url("/clusters?format=json")
        )
    );
}

#[tokio::test]
async fn a_balancer_that_is_not_listening_is_a_request_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/stats", listener.local_addr().unwrap());
    drop(listener);

    let error = ask(&haproxy(url, None)).await.unwrap_err();

    assert!(matches!(error, Error::Request { .. }), "{error}");
}

/// A CA, and a certificate for 127.0.0.1 signed by it: (CA PEM, server TLS config).
fn pki(name: &str) -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, name);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::default();
    leaf.subject_alt_names = vec![SanType::IpAddress(ip("127.0.0.1"))];
    let cert = leaf.signed_by(&key, &Issuer::new(ca, &ca_key)).unwrap();
    let key = rustls_pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key.into())
        .unwrap();
    (ca_cert.pem(), Arc::new(config))
}

/// Serves `body` over TLS on 127.0.0.1 for every connection; returns the URL.
async fn serve_tls(
    config: Arc<rustls::ServerConfig>,
    body: &'static str,
) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/stats", listener.local_addr().unwrap());
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            connections.spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(
                        move |_| async move { Ok::<_, Infallible>(ok(body)) },
                    );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, task)
}

#[tokio::test]
async fn https_is_trusted_through_the_ca_file_read_again_for_every_question() {
    let (ca_pem, server) = pki("balancer CA");
    let (url, task) = serve_tls(server, HAPROXY).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let mut config = haproxy(url, Some("be_api"));
    config.ca_file = Some(ca_file.clone());
    let lister = Lister::new(&config).unwrap();

    let routes = lister.routes().await.unwrap();
    assert!(routes.routes_to(ip("fd00:10:42::9"), Some(9000)));

    let (other_ca, _) = pki("another CA");
    std::fs::write(&ca_file, other_ca).unwrap();
    let error = lister.routes().await.unwrap_err();
    task.abort();
    assert!(matches!(error, Error::Request { .. }), "{}", chain(&error));
}

#[test]
fn a_ca_file_without_certificates_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, "not a certificate\n").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut config = haproxy("https://127.0.0.1:1/stats".into(), None);
    config.ca_file = Some(ca_file.clone());

    let error = runtime.block_on(ask(&config)).unwrap_err();

    assert!(matches!(error, Error::Tls { .. }), "{error}");
    assert!(
        chain(&error).contains(&ca_file.display().to_string()),
        "{}",
        chain(&error)
    );
}

/// The fenced blocks of `lang` in a file's `//!` head, in order.
fn doc_blocks(file: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in file.lines().filter_map(|line| line.strip_prefix("//!")) {
        let line = line.strip_prefix(' ').unwrap_or(line);
        match (&mut open, line.trim_end()) {
            (None, fence) if fence == format!("```{lang}") => open = Some(String::new()),
            (Some(_), "```") => blocks.extend(open.take()),
            (Some(block), text) => block.push_str(&format!("{text}\n")),
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn the_documented_configurations_are_accepted() {
    let blocks = [include_str!("lib.rs"), include_str!("config.rs")]
        .iter()
        .flat_map(|file| doc_blocks(file, "yaml"))
        .collect::<Vec<_>>();
    assert_eq!(blocks.len(), 4);
    for yaml in blocks {
        let config: BalancerConfig = serde_saphyr::from_str(&yaml).unwrap();
        Lister::new(&config).unwrap_or_else(|e| panic!("{yaml}: {}", chain(&e)));
    }
}

#[test]
fn the_documented_envoy_and_traefik_examples_find_their_pod() {
    let lib = include_str!("lib.rs");
    let (answers, configs) = (doc_blocks(lib, "json"), doc_blocks(lib, "yaml"));
    assert_eq!((answers.len(), configs.len()), (2, 3));
    // The first YAML is HAProxy's; each JSON answer comes with the YAML after it.
    for (answer, yaml) in answers.iter().zip(&configs[1..]) {
        let config: BalancerConfig = serde_saphyr::from_str(yaml).unwrap();
        let Source::Generic {
            pointer,
            address_field,
            port_field,
            ..
        } = config.source
        else {
            panic!("{yaml} is not generic");
        };
        let field = |text: Option<String>| text.map(|t| crate::json::Field::parse(&t).unwrap());
        let spec = crate::json::JsonSpec {
            path: crate::json::Path::parse(&pointer).unwrap(),
            address_field: field(address_field),
            port_field: field(port_field),
        };
        let routes = spec.routes(&serde_json::from_str(answer).unwrap()).unwrap();
        assert!(routes.routes_to(ip("10.42.1.17"), Some(8080)), "{answer}");
    }
}

#[test]
fn a_configuration_in_full_is_read() {
    let config: BalancerConfig = serde_saphyr::from_str(
        "source:\n  generic:\n    url: http://traefik:8080/api/rawdata\n    \
         pointer: /services/*/loadBalancer/servers\n    addressField: url\n\
         tokenFile: /var/run/secrets/balancer/token\ncaFile: /etc/balancer/ca.crt\ntimeout: 500ms\n",
    )
    .unwrap();
    assert_eq!(
        config,
        BalancerConfig {
            source: Source::Generic {
                url: "http://traefik:8080/api/rawdata".into(),
                pointer: "/services/*/loadBalancer/servers".into(),
                address_field: Some("url".into()),
                port_field: None,
            },
            token_file: Some("/var/run/secrets/balancer/token".into()),
            ca_file: Some("/etc/balancer/ca.crt".into()),
            timeout: Duration::from_millis(500),
        }
    );
    let defaults: BalancerConfig =
        serde_saphyr::from_str("source:\n  haproxy:\n    url: http://h/stats\n").unwrap();
    assert_eq!(defaults, haproxy("http://h/stats".into(), None));
    assert_eq!(defaults.timeout, crate::DEFAULT_TIMEOUT);
}

#[test]
fn misspelt_or_malformed_configurations_are_refused() {
    for yaml in [
        "source:\n  haproxy:\n    url: http://h/stats\n    backnd: be_web\n",
        "source:\n  haproxy:\n    url: http://h/stats\ntokenfile: /t\n",
        "source:\n  nginx:\n    url: http://h/\n",
        "source:\n  haproxy:\n    url: http://h/stats\ntimeout: soon\n",
    ] {
        assert!(
            serde_saphyr::from_str::<BalancerConfig>(yaml).is_err(),
            "{yaml}"
        );
    }
}

#[test]
fn unusable_urls_pointers_and_timeouts_are_refused_before_asking() {
    let refused = |config: BalancerConfig| match Lister::new(&config) {
        Ok(_) => panic!("{config:?} accepted"),
        Err(error) => chain(&error),
    };
    assert!(refused(haproxy("haproxy:8404/stats".into(), None)).contains("not a URL"));
    assert!(refused(haproxy("ftp://h/stats".into(), None)).contains("not http://"));
    assert!(refused(haproxy("http://admin:pw@h/stats".into(), None)).contains("tokenFile"));
    let mut ca_over_http = haproxy("http://h/stats".into(), None);
    ca_over_http.ca_file = Some("/ca.crt".into());
    assert!(refused(ca_over_http).contains("not https://"));
    let mut zero = haproxy("http://h/stats".into(), None);
    zero.timeout = Duration::ZERO;
    assert!(refused(zero).contains("timeout is zero"));
    let text = refused(generic("http://h/".into(), "cluster_statuses/*", "a", None));
    assert!(
        text.starts_with("balancer http://h/: ") && text.contains("JSON pointer"),
        "{text}"
    );
}

#[test]
fn csv_is_asked_for_once() {
    let lister = Lister::new(&haproxy("http://h:8404/stats;csv;norefresh".into(), None)).unwrap();
    assert_eq!(lister.url(), "http://h:8404/stats;csv;norefresh");
    let lister = Lister::new(&haproxy("http://h:8404/haproxy?stats".into(), None)).unwrap();
    assert_eq!(lister.url(), "http://h:8404/haproxy?stats;csv");
}

/// A [`Lister`] can be shared between tasks and its question run on any worker thread;
/// this fails to compile otherwise.
#[allow(dead_code)]
fn a_question_can_run_on_a_multi_threaded_runtime(lister: &Lister) -> impl Send + '_ {
    fn shared<T: Send + Sync>() {}
    shared::<Lister>();
    lister.routes()
}
