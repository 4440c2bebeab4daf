//! Starting the node agent in tests: its flags, and waiting on its in-memory state.

use std::path::Path;

use graceful_drain_agent::Args;
use serde_json::Value;

use graceful_drain_e2e::sim_api::{NODE, SimApi};
use graceful_drain_sim::command::AgentCommand;

/// The agent's arguments for node `n1`, its sockets under `dir`, the lifecycle reconciler
/// off unless `flags` name it, then `flags`.
pub fn args(dir: &Path, flags: &[&str]) -> Args {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }
    let mut command = AgentCommand::new(NODE, dir);
    if !flags.contains(&"--lifecycle-reconciler") {
        command = command.reconciler("off");
    }
    Cli::try_parse_from(command.with(flags).argv())
        .unwrap()
        .args
}

/// Node `n1` as JSON.
pub async fn node_json(api: &SimApi) -> Value {
    serde_json::to_value(api.node().await).unwrap()
}

/// The condition `type_` of a Node as JSON (`null` when absent).
pub fn condition(node: &Value, type_: &str) -> Value {
    node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or(Value::Null)
}
