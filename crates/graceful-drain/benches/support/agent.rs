//! The node agent's command line as the benchmarks start it in-process.

use std::path::Path;

use graceful_drain_agent as agent;

/// An agent for `node` with its plugin sockets under `dir`, its admin port on any free
/// loopback port and no lifecycle reconciler (the benchmark drives SLM Start/End itself).
pub fn args(dir: &Path, node: &str) -> agent::Args {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: agent::Args,
    }
    let (plugins, registry) = (dir.join("plugins"), dir.join("registry"));
    Cli::try_parse_from([
        "node-agent",
        "--node-name",
        node,
        "--admin-listen",
        "127.0.0.1:0",
        "--lifecycle-reconciler",
        "off",
        "--plugins-dir",
        plugins.to_str().unwrap(),
        "--registry-dir",
        registry.to_str().unwrap(),
    ])
    .unwrap()
    .args
}
