//! The command line: global options, subcommand dispatch and the process exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use graceful_drain_core::runtime::{self, LogFormat};

pub mod completion;
pub mod docs;

/// Zero-5xx node drains and rollouts for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "graceful-drain", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "GRACEFUL_DRAIN_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the admission webhook (HTTPS) with the deferred deleter and the admin port.
    Webhook(graceful_drain_webhook::Args),
    /// Run the node agent: kubelet SLM plugin, drain engine, optional lifecycle reconciler.
    NodeAgent(graceful_drain_agent::Args),
    /// Drain a node through a LifecycleEvent and follow it until it ends.
    Drain(crate::ctl::DrainArgs),
    /// Return a drained node to service (the maintenance-complete transition).
    Uncordon(crate::ctl::UncordonArgs),
    /// Show each release's protection and agents, isolated pods, LifecycleEvents, nodes.
    Status(crate::ctl::StatusArgs),
    #[cfg(feature = "sim")]
    /// Run the simulated cluster: the default scenario, or `--serve` to keep it up.
    Simulate(graceful_drain_sim::Args),
    /// Print the lifecycle.graceful-drain.io CustomResourceDefinitions as YAML.
    Crds(graceful_drain_core::lifecycle::crds::Args),
    /// Generate a local CA and webhook serving certificate.
    Certs(graceful_drain_core::certs::Args),
    /// Print the shell completion script (bash, zsh, fish, powershell, elvish).
    Completion(completion::Args),
    /// Print the command-line reference (docs/cli.md) as Markdown.
    #[command(hide = true)]
    CliDocs(docs::Args),
}

/// Parses the command line, runs the subcommand on a multi-threaded runtime and maps
/// the outcome to an exit code. Errors print with their cause chain, each cause once.
pub fn main() -> ExitCode {
    runtime::install_crypto_provider();
    let mut cli = Cli::parse();
    if let Err(error) = init_logging(&mut cli) {
        eprintln!("error: {error:#}");
        return ExitCode::FAILURE;
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("error: start async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "error: {}",
                graceful_drain_core::error::chain(error.as_ref())
            );
            // `drain` and `uncordon` tell Failed, SlaExpired and a timeout apart.
            let code = error
                .downcast_ref::<crate::ctl::Error>()
                .map_or(crate::ctl::exit::ERROR, crate::ctl::Error::exit_code);
            ExitCode::from(code)
        }
    }
}

/// Installs the tracing subscriber: on stderr, except for `simulate`, whose components
/// log to a file unless `--verbose` (`graceful_drain_sim::console`).
fn init_logging(cli: &mut Cli) -> anyhow::Result<()> {
    match &mut cli.command {
        #[cfg(feature = "sim")]
        Command::Simulate(args) => graceful_drain_sim::console::init_logging(args, cli.log_format),
        _ => {
            runtime::init_tracing(cli.log_format);
            Ok(())
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    let shutdown = runtime::shutdown_on_signal();
    match command {
        Command::Webhook(args) => graceful_drain_webhook::run(args, shutdown).await,
        Command::NodeAgent(args) => graceful_drain_agent::run(args, shutdown).await,
        Command::Drain(args) => crate::ctl::drain(args, shutdown).await,
        Command::Uncordon(args) => crate::ctl::uncordon(args, shutdown).await,
        Command::Status(args) => crate::ctl::status(args, shutdown).await,
        #[cfg(feature = "sim")]
        Command::Simulate(args) => graceful_drain_sim::run(args, shutdown).await,
        Command::Crds(args) => graceful_drain_core::lifecycle::crds::run(args, shutdown).await,
        Command::Certs(args) => graceful_drain_core::certs::run(args, shutdown).await,
        Command::Completion(args) => completion::run(args, shutdown).await,
        Command::CliDocs(args) => docs::run(args, shutdown).await,
    }
}
