//! The real control plane as a user of `cargo xtask control-plane up` meets it: a v1.37
//! server, RBAC enforced, unauthenticated requests refused, the EvictionRequest API served
//! or not as asked, and nothing left running after `down`.
//!
//! Needs the binaries in the cache (`cargo xtask control-plane build`; `.ci/run` builds
//! them). Without them the test says so and passes locally, and fails in CI.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use kube_control_plane::{Options, Versions};

fn options(eviction_request_api: bool) -> Option<Options> {
    let versions = Versions::default();
    if !kube_control_plane::is_built(&versions) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must build the control plane first: cargo xtask control-plane build"
        );
        eprintln!("skipped: {versions} is not built (cargo xtask control-plane build)");
        return None;
    }
    Some(Options {
        bin: kube_control_plane::bin_dir(&versions),
        eviction_request_api,
        apiserver_flags: Vec::new(),
    })
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' ')?.1.parse().ok())
        .collect()
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

#[test]
fn up_serves_kubernetes_1_37_with_rbac_and_the_eviction_request_api_and_down_stops_everything() {
    let Some(options) = options(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cp = kube_control_plane::up(dir.path(), &options).unwrap();
    let kc = cp.admin_kubeconfig();
    let started = pids(dir.path());
    assert_eq!(
        started.len(),
        4,
        "etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
    );

    let (ok, version) = kubectl(&kc, &["version", "-o", "json"]);
    assert!(ok, "{version}");
    assert!(version.contains("\"gitVersion\": \"v1.37."), "{version}");

    let (ok, resources) = kubectl(&kc, &["api-resources", "--api-group", "lifecycle.k8s.io"]);
    assert!(ok && resources.contains("evictionrequests"), "{resources}");

    // A client without credentials is refused (no anonymous access).
    let server = std::fs::read_to_string(&kc).unwrap();
    let url = server
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_string();
    let anonymous = Command::new("curl")
        .args([
            "--silent",
            "--insecure",
            "--output",
            "/dev/null",
            "--write-out",
            "%{http_code}",
        ])
        .arg(format!("{url}/api"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&anonymous.stdout),
        "401",
        "an anonymous GET /api"
    );

    // RBAC is enforced: a user with no binding may not list pods.
    let (ok, denied) = kubectl(&kc, &["get", "pods", "--as", "nobody"]);
    assert!(!ok && denied.contains("forbidden"), "{denied}");

    // The controllers run: the namespace controller's ServiceAccounts appear.
    let (ok, accounts) = kubectl(
        &kc,
        &[
            "wait",
            "--for=create",
            "serviceaccount/default",
            "-n",
            "default",
            "--timeout=60s",
        ],
    );
    assert!(ok, "{accounts}");

    let dir_path = cp.detach();
    kube_control_plane::down(&dir_path).unwrap();
    for pid in started {
        assert!(!running(pid), "pid {pid} still running after down");
    }
    assert!(!dir_path.join("pids").exists());
}

#[test]
fn the_eviction_request_api_can_be_left_off() {
    let Some(options) = options(false) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cp = kube_control_plane::up(dir.path(), &options).unwrap();
    let (ok, resources) = kubectl(&cp.admin_kubeconfig(), &["api-resources"]);
    assert!(ok, "{resources}");
    assert!(!resources.contains("evictionrequests"), "{resources}");
    assert!(resources.contains("pods"), "{resources}");
}
