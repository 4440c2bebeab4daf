//! HAProxy's statistics as a balancer's admin API would give them about pods: what the
//! webhook's confirmed release (`--balancer-config`, balancer-routes' HAProxy source) asks.
//!
//! HAProxy here routes to the pods' loopback twins (see [`crate::pod_network`]), so its
//! statistics name `127.64.0.2:port` where the webhook knows the pod as `10.64.0.2`. The
//! relay answers every GET with the `show stat` CSV of the HAProxy it currently points at
//! ([`StatsRelay::point_at`]), each server's `addr` turned back into its pod address
//! ([`to_pod`]) and every other field untouched; pointed at none, it answers 503, which
//! the webhook treats as a balancer it cannot ask (every pod keeps its whole delay). One
//! relay, at one address, can so serve a webhook configured once while each phase of a
//! run brings its own HAProxy.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::task::JoinHandle;

use crate::haproxy::show_stat;
use crate::pod_network::to_pod;

/// Which HAProxy the relay asks: the path of its stats socket.
type Target = Arc<Mutex<Option<PathBuf>>>;

/// The relay, stopped when dropped.
#[derive(Debug)]
pub struct StatsRelay {
    addr: SocketAddr,
    target: Target,
    task: JoinHandle<()>,
}

impl StatsRelay {
    /// Serves on `127.0.0.1:<free port>`, pointed at no HAProxy yet.
    pub async fn start() -> std::io::Result<StatsRelay> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let target = Target::default();
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(target.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "stats relay stopped");
            }
        });
        Ok(StatsRelay { addr, target, task })
    }

    /// The statistics page's URL, as a balancer configuration names it (`stats uri`).
    pub fn url(&self) -> String {
        format!("http://{}/stats", self.addr)
    }

    /// Asks the HAProxy whose stats socket is `socket` from now on; none: answer 503.
    pub fn point_at(&self, socket: Option<PathBuf>) {
        *self.target.lock().unwrap_or_else(PoisonError::into_inner) = socket;
    }
}

impl Drop for StatsRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(target): State<Target>) -> Response {
    let socket = target
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let Some(socket) = socket else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no HAProxy to ask now\n").into_response();
    };
    match show_stat(&socket).await {
        Ok(csv) => (
            [(header::CONTENT_TYPE, "text/csv")],
            with_pod_addresses(&csv),
        )
            .into_response(),
        Err(e) => (StatusCode::BAD_GATEWAY, format!("{e}\n")).into_response(),
    }
}

/// `csv` (HAProxy's `show stat`, whose fields hold no comma) with every `addr` that is a
/// pod's loopback twin written as the pod's address, port kept.
pub fn with_pod_addresses(csv: &str) -> String {
    let mut lines = csv.lines();
    let Some(header) = lines.next() else {
        return String::new();
    };
    let column = header
        .trim_start_matches('#')
        .trim()
        .split(',')
        .position(|name| name == "addr");
    let mut out = format!("{header}\n");
    for line in lines {
        let mut fields: Vec<String> = line.split(',').map(str::to_string).collect();
        if let Some(field) = column.and_then(|i| fields.get_mut(i))
            && let Ok(addr) = field.parse::<SocketAddr>()
            && let SocketAddr::V4(v4) = addr
            && let Some(pod) = to_pod(*v4.ip())
        {
            *field = SocketAddr::new(pod.into(), v4.port()).to_string();
        }
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twins_become_pod_addresses_and_nothing_else_changes() {
        let csv = "# pxname,svname,status,addr,hrsp_5xx\n\
                   app,pod1,UP,127.64.0.2:31000,0\n\
                   app,pod2,MAINT (resolution),,0\n\
                   app,pod3,UP,192.0.2.7:8080,1\n\
                   app,BACKEND,UP,,1\n";
        assert_eq!(
            with_pod_addresses(csv),
            "# pxname,svname,status,addr,hrsp_5xx\n\
             app,pod1,UP,10.64.0.2:31000,0\n\
             app,pod2,MAINT (resolution),,0\n\
             app,pod3,UP,192.0.2.7:8080,1\n\
             app,BACKEND,UP,,1\n"
        );
        // The result reads as balancer-routes reads HAProxy's own page.
        let routes =
            balancer_routes::haproxy::parse_stats(&with_pod_addresses(csv), Some("app")).unwrap();
        assert!(routes.routes_to("10.64.0.2".parse().unwrap(), None));
        assert!(!routes.routes_to("127.64.0.2".parse().unwrap(), None));
    }

    #[tokio::test]
    async fn pointed_at_nothing_it_answers_503() {
        let relay = StatsRelay::start().await.unwrap();
        let url: hyper::Uri = relay.url().parse().unwrap();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let answer = client.get(url).await.unwrap();
        assert_eq!(answer.status(), 503);
    }
}
