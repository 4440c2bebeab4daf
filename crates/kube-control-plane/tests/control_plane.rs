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
        webhook_client_certificate: false,
    })
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let kubectl = kube_control_plane::kubectl().expect(kube_control_plane::KUBECTL_WHERE);
    let out = Command::new(kubectl)
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

/// A component restarted mid-run comes back with the same command line: kube-apiserver
/// serves what etcd kept, with a new process; an unknown component is refused by name;
/// and `down` afterwards stops the new processes too.
#[test]
fn a_restarted_component_comes_back_and_down_still_stops_everything() {
    let Some(options) = options(false) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cp = kube_control_plane::up(dir.path(), &options).unwrap();
    let kc = cp.admin_kubeconfig();
    let (ok, created) = kubectl(&kc, &["create", "namespace", "kept"]);
    assert!(ok, "{created}");
    // kube-controller-manager exits if the API server goes away while it starts its
    // controllers (a kubelet would restart it): restart once they run, as the real tier does.
    let (ok, running_controllers) = kubectl(
        &kc,
        &[
            "wait",
            "--for=create",
            "serviceaccount/default",
            "-n",
            "kept",
            "--timeout=60s",
        ],
    );
    assert!(ok, "{running_controllers}");
    let before = pids(dir.path());
    cp.restart("kube-apiserver").unwrap();
    cp.restart("kube-controller-manager").unwrap();
    let after = pids(dir.path());
    assert_eq!(after.len(), 4);
    assert_eq!(after[0], before[0], "etcd kept running");
    assert_ne!(after[1], before[1], "a new kube-apiserver");
    assert_ne!(after[2], before[2], "a new kube-controller-manager");
    assert!(!running(before[1]) && !running(before[2]));
    let (ok, namespace) = kubectl(&kc, &["get", "namespace", "kept", "-o", "name"]);
    assert!(ok && namespace.contains("namespace/kept"), "{namespace}");
    let log = std::fs::read_to_string(cp.log("kube-apiserver")).unwrap();
    assert!(!log.is_empty(), "the log is continued, not lost");
    let refused = cp.restart("kube-proxy").unwrap_err().to_string();
    assert!(refused.contains("kube-proxy"), "{refused}");
    let dir_path = cp.detach();
    kube_control_plane::down(&dir_path).unwrap();
    for pid in after {
        assert!(!running(pid), "pid {pid} still running after down");
    }
}
