//! What operators feed to their log pipelines: a component's log written to a pipe carries
//! no terminal colour codes, and `--log-format json` gives one JSON object per line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

/// Bound for the webhook's first lines (it logs them within milliseconds of starting).
const TIMEOUT: Duration = Duration::from_secs(30);

/// A kubeconfig naming a loopback port nothing listens on: the webhook's first API call
/// fails at once and it logs a warning saying so.
fn closed_kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n\
         current-context: c\n",
    )
    .unwrap();
    path
}

/// The webhook's stderr lines up to and including its SelfSubjectReview warning.
async fn first_lines(extra: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_graceful-drain-e2e"))
        .args([
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--kubeconfig")
        .arg(closed_kubeconfig(dir.path()))
        .args(extra)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    tokio::time::timeout(TIMEOUT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let done = line.contains("SelfSubjectReview failed");
            seen.push(line);
            if done {
                return;
            }
        }
        panic!("the webhook exited before its warning: {seen:?}");
    })
    .await
    .expect("the webhook logs its warning in time");
    seen
}

#[tokio::test]
async fn a_log_written_to_a_pipe_has_no_colour_codes() {
    let lines = first_lines(&[]).await;
    let warning = lines
        .iter()
        .find(|l| l.contains("SelfSubjectReview failed"))
        .unwrap();
    assert!(warning.contains(" WARN "), "{warning}");
    for line in &lines {
        assert!(
            !line.contains('\u{1b}'),
            "terminal escape codes in a piped log: {line:?}"
        );
    }
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let lines = first_lines(&["--log-format", "json"]).await;
    for line in &lines {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            entry["level"].is_string() && entry["timestamp"].is_string(),
            "{line}"
        );
    }
    assert!(lines.iter().any(|l| l.contains("\"WARN\"")), "{lines:?}");
}
