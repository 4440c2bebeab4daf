//! Starting the node agent in tests: its flags, and waiting on its in-memory state.

use std::path::Path;
use std::time::Duration;

use graceful_drain_agent::Args;
use serde_json::Value;

use graceful_drain_testing::sim_api::{NODE, SimApi};
use graceful_drain_testing::kubelet::DEADLINE;

/// The agent's arguments for node `n1`, its sockets under `dir`, the lifecycle reconciler
/// off unless `flags` name it, then `flags`.
pub fn args(dir: &Path, flags: &[&str]) -> Args {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }
    let plugins = dir.join("plugins");
    let registry = dir.join("plugins_registry");
    let mut argv: Vec<String> = [
        "node-agent",
        "--node-name",
        NODE,
        "--admin-listen",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(["--plugins-dir".into(), plugins.display().to_string()]);
    argv.extend(["--registry-dir".into(), registry.display().to_string()]);
    if !flags.contains(&"--lifecycle-reconciler") {
        argv.extend(["--lifecycle-reconciler".into(), "off".into()]);
    }
    argv.extend(flags.iter().map(|s| s.to_string()));
    Cli::try_parse_from(argv).unwrap().args
}

/// Waits until `check` (agent state no API request announces) holds, within [`DEADLINE`].
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
