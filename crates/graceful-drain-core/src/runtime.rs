//! Process runtime shared by every subcommand: logging, the single shutdown signal,
//! and owned tasks.
//!
//! Every long-lived task is started through [`spawn_owned`], which names it, runs it in
//! a tracing span, and turns an early error or a panic into a process-wide shutdown, so
//! no task dies unnoticed.

use std::future::Future;

use futures::FutureExt;
use tokio::task::JoinHandle;
pub use tokio_util::sync::CancellationToken as Shutdown;
use tracing::Instrument;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Installs the tracing subscriber, writing to stderr. The filter comes from `RUST_LOG`,
/// defaulting to `info` for our crate and `warn` for dependencies. Safe to call more than
/// once (tests).
pub fn init_tracing(format: LogFormat) {
    // Colour codes only for a person at a terminal: a log written to a file or a pipe (a
    // container runtime, Loki, Elasticsearch) gets plain text, or JSON on request. NO_COLOR
    // turns them off at a terminal too.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    install_subscriber(format, ansi, std::io::stderr);
}

/// [`init_tracing`] into `file` instead of stderr, without colour codes: `simulate` keeps
/// its components' logs apart from the table and progress lines a person reads.
pub fn init_tracing_to_file(format: LogFormat, file: std::fs::File) {
    install_subscriber(format, false, std::sync::Arc::new(file));
}

fn install_subscriber<W>(format: LogFormat, ansi: bool, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    // A directive's target matches by prefix, so `graceful_drain` covers every crate of ours
    // (graceful_drain_core, _webhook, _agent, _sim) and nothing else.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,graceful_drain=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Installs the ring crypto provider as the process default for rustls. Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A shutdown token cancelled on SIGINT or SIGTERM.
pub fn shutdown_on_signal() -> Shutdown {
    let token = Shutdown::new();
    let child = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received");
        child.cancel();
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Spawns a named task that belongs to the process: it runs inside a span named after
/// it, and if it returns an error or panics, `shutdown` is cancelled so the whole process
/// stops instead of limping on without it. A task returning `Ok` after shutdown began is
/// the normal way to finish.
pub fn spawn_owned<F, E>(name: &'static str, shutdown: Shutdown, fut: F) -> JoinHandle<()>
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let span = tracing::info_span!("task", task = name);
    tokio::spawn(
        async move {
            match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
                Ok(Ok(())) => {
                    if !shutdown.is_cancelled() {
                        tracing::debug!("task finished");
                    }
                }
                Ok(Err(error)) => {
                    tracing::error!(error = %format_args!("{error:#}"), "task failed; shutting down");
                    shutdown.cancel();
                }
                Err(_) => {
                    tracing::error!("task panicked; shutting down");
                    shutdown.cancel();
                }
            }
        }
        .instrument(span),
    )
}
