//! `kubectl` against a test cluster's kubeconfig, the way a user types it. The binary is
//! `$GRACEFUL_DRAIN_KUBECTL`, else the one on `PATH` (`/usr/bin/kubectl` on the
//! development machine and in CI), else the one built with the real control plane
//! ([`kube_control_plane::kubectl`]). A test that needs one asks [`available`] first: on a
//! machine with none it is skipped, saying why (in CI it fails).

use std::path::Path;
use std::process::Output;

/// What one kubectl command printed, and whether it succeeded.
#[derive(Debug)]
pub struct Ran {
    /// Whether kubectl exited with status 0.
    pub ok: bool,
    /// What it printed on standard output.
    pub stdout: String,
    /// What it printed on standard error.
    pub stderr: String,
}

impl Ran {
    fn of(output: Output) -> Ran {
        Ran {
            ok: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Whether it succeeded, and [`Ran::text`].
    pub fn outcome(self) -> (bool, String) {
        let text = self.text();
        (self.ok, text)
    }

    /// Standard output then standard error, as a terminal would show them.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Whether a kubectl can be run; when not, says that `test` is skipped and why. In CI
/// (`CI` set) a missing kubectl fails the test instead.
pub fn available(test: &str) -> bool {
    if kube_control_plane::kubectl().is_some() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: CI must provide kubectl: none found ({})",
        kube_control_plane::KUBECTL_WHERE
    );
    eprintln!(
        "skipped {test}: no kubectl ({})",
        kube_control_plane::KUBECTL_WHERE
    );
    false
}

fn command(kubeconfig: &Path, args: &[&str]) -> std::process::Command {
    let kubectl = kube_control_plane::kubectl()
        .unwrap_or_else(|| panic!("no kubectl ({})", kube_control_plane::KUBECTL_WHERE));
    let mut command = std::process::Command::new(kubectl);
    command.arg("--kubeconfig").arg(kubeconfig).args(args);
    command
}

/// Runs `kubectl --kubeconfig <kubeconfig> <args>` and waits for it. Blocks the thread:
/// on a current-thread runtime that serves the cluster, use [`run_async`].
pub fn run(kubeconfig: &Path, args: &[&str]) -> Ran {
    let output = command(kubeconfig, args)
        .output()
        .unwrap_or_else(|e| panic!("run kubectl {}: {e}", args.join(" ")));
    Ran::of(output)
}

/// [`run`] without blocking the runtime's thread.
pub async fn run_async(kubeconfig: &Path, args: &[&str]) -> Ran {
    let output = tokio::process::Command::from(command(kubeconfig, args))
        .output()
        .await
        .unwrap_or_else(|e| panic!("run kubectl {}: {e}", args.join(" ")));
    Ran::of(output)
}

/// [`run`], which must succeed; its standard output.
pub fn stdout(kubeconfig: &Path, args: &[&str]) -> String {
    let ran = run(kubeconfig, args);
    assert!(ran.ok, "kubectl {}: {}", args.join(" "), ran.text());
    ran.stdout
}
