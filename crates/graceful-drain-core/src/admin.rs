//! The plain-HTTP admin port every long-running subcommand serves: `/livez`, `/readyz`
//! and `/metrics` (Prometheus text format from a `prometheus-client` registry).
//!
//! Readiness is a set of named checks; each component marks its own check ready or not
//! ready with a reason, and `/readyz` is 200 only when every check is ready, listing the
//! failing ones otherwise (like the API server's `/readyz?verbose`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::runtime::Shutdown;

/// Errors of the admin server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The admin address could not be bound.
    #[error("bind admin port {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding or reading back the bound address failed.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an I/O error.
    #[error("serve admin port")]
    Serve(#[source] std::io::Error),
}

/// Named readiness checks. Cloning shares the same set.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    /// Each check's reason for not being ready; `None` once it is ready.
    checks: Arc<Mutex<BTreeMap<&'static str, Option<String>>>>,
}

impl Readiness {
    /// Registers a check that starts out not ready with `reason`.
    pub fn register(&self, name: &'static str, reason: impl Into<String>) {
        self.set(name, Some(reason.into()));
    }

    /// Marks `name` ready.
    pub fn ready(&self, name: &'static str) {
        self.set(name, None);
    }

    /// Marks `name` not ready with `reason`.
    pub fn not_ready(&self, name: &'static str, reason: impl Into<String>) {
        self.set(name, Some(reason.into()));
    }

    fn set(&self, name: &'static str, not_ready: Option<String>) {
        let mut checks = self.checks.lock().unwrap_or_else(|e| e.into_inner());
        checks.insert(name, not_ready);
    }

    /// `Ok` when every check is ready, otherwise the failing checks, one `name: reason` each.
    pub fn status(&self) -> Result<(), Vec<String>> {
        let checks = self.checks.lock().unwrap_or_else(|e| e.into_inner());
        let failing: Vec<String> = checks
            .iter()
            .filter_map(|(name, reason)| reason.as_ref().map(|r| format!("{name}: {r}")))
            .collect();
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing)
        }
    }
}

#[derive(Clone)]
struct AdminState {
    readiness: Readiness,
    registry: Arc<Registry>,
}

/// The admin router, exposed for in-process tests.
pub fn router(readiness: Readiness, registry: Arc<Registry>) -> axum::Router {
    axum::Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AdminState {
            readiness,
            registry,
        })
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.readiness.status() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(failing) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready:\n{}\n", failing.join("\n")),
        ),
    }
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encode metrics: {error}\n"),
        )
            .into_response(),
    }
}

/// Binds `addr` and serves the admin router until `shutdown`. Returns the bound address
/// (useful with port 0) and the serving future.
pub async fn bind(
    addr: SocketAddr,
    readiness: Readiness,
    registry: Arc<Registry>,
    shutdown: Shutdown,
) -> Result<
    (
        SocketAddr,
        impl std::future::Future<Output = Result<(), Error>>,
    ),
    Error,
> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    let app = router(readiness, registry);
    let serve = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(Error::Serve)
    };
    Ok((local, serve))
}
