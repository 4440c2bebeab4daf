//! The node agent's command line as the benchmarks start it in-process.

use std::path::Path;

use graceful_drain_agent as agent;
use graceful_drain_sim::command::AgentCommand;

/// An agent for `node` with its plugin sockets under `dir`, its admin port on any free
/// loopback port and no lifecycle reconciler (the benchmark drives SLM Start/End itself).
pub fn args(dir: &Path, node: &str) -> agent::Args {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: agent::Args,
    }
    let command = AgentCommand::new(node, dir).reconciler("off");
    Cli::try_parse_from(command.argv()).unwrap().args
}
