//! The real `kubectl` (`$GRACEFUL_DRAIN_KUBECTL`, else the one on `PATH`: v1.32 at
//! `/usr/bin/kubectl` on the development machine and in CI) against the simulated API
//! server: get, create, apply (twice, to take the patch path), delete, cordon, uncordon
//! and drain, with a stand-in kubelet that removes terminating pods. Without a kubectl the
//! tests are skipped, saying so (in CI they fail).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube_sim::apiserver::{ApiServer, Config};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

/// The kubectl to run, or `None` (the test is skipped, saying why; in CI it fails).
fn kubectl_binary(test: &str) -> Option<PathBuf> {
    let found = match std::env::var_os("GRACEFUL_DRAIN_KUBECTL") {
        Some(path) => Some(PathBuf::from(path)).filter(|p| p.is_file()),
        None => std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("kubectl"))
                .find(|p| p.is_file())
        }),
    };
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: CI must provide kubectl ($GRACEFUL_DRAIN_KUBECTL or PATH)"
        );
        eprintln!("skipped {test}: no kubectl ($GRACEFUL_DRAIN_KUBECTL or PATH)");
    }
    found
}

impl Kubectl {
    /// Runs kubectl with `args`; returns (success, stdout + stderr).
    async fn run(&self, args: &[&str]) -> (bool, String) {
        self.run_with_editor(args, None).await
    }

    /// Runs kubectl with `args` and, when given, `KUBE_EDITOR` (for `kubectl edit`).
    async fn run_with_editor(&self, args: &[&str], editor: Option<&str>) -> (bool, String) {
        let mut command = tokio::process::Command::new(&self.binary);
        if let Some(editor) = editor {
            command.env("KUBE_EDITOR", editor);
        }
        let output = command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .output()
            .await
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{text}");
        text
    }
}

/// Stands in for the kubelets: pods marked for deletion are removed with grace 0.
fn kubelet_stand_in(api: &ApiServer, shutdown: CancellationToken) {
    let client = api.client("system:node:n1");
    let pods: Api<Pod> = Api::all(client.clone());
    tokio::spawn(async move {
        let watch = kube::runtime::watcher(pods, kube::runtime::watcher::Config::default());
        let mut objects = Box::pin(kube::runtime::WatchStreamExt::applied_objects(watch));
        loop {
            let pod = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = objects.try_next() => match next { Ok(Some(pod)) => pod, _ => continue },
            };
            if pod.metadata.deletion_timestamp.is_none() {
                continue;
            }
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let name = pod.metadata.name.clone().unwrap_or_default();
            let _ = api
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await;
        }
    });
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  labels: {app: web}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web, uid: 6b1f7c9e-0000-4000-8000-000000000001, controller: true}]
spec: {nodeName: n1, containers: [{name: app, image: web}]}
---
apiVersion: v1
kind: Pod
metadata: {name: bare, labels: {app: bare}}
spec:
  nodeName: n1
  containers: [{name: app, image: web, volumeMounts: [{name: scratch, mountPath: /tmp}]}]
  volumes: [{name: scratch, emptyDir: {}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: agent-n1
  labels: {app: agent}
  ownerReferences: [{apiVersion: apps/v1, kind: DaemonSet, name: agent, uid: 6b1f7c9e-0000-4000-8000-000000000002, controller: true}]
spec: {nodeName: n1, containers: [{name: agent, image: agent}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-2, labels: {app: web}}
spec: {nodeName: n2, containers: [{name: app, image: web}]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: agent, image: agent}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: api}
spec:
  replicas: 1
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec: {containers: [{name: api, image: api}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: web}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubectl_gets_creates_applies_cordons_and_drains() {
    let Some(binary) = kubectl_binary("real_kubectl_gets_creates_applies_cordons_and_drains")
    else {
        return;
    };
    let shutdown = CancellationToken::new();
    let api = ApiServer::start(Config::default(), shutdown.clone())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, "admin").unwrap();
    let kubectl = Kubectl {
        binary,
        kubeconfig,
        cache: dir.path().join("cache"),
    };
    let client = api.client("admin");
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    kubelet_stand_in(&api, shutdown.clone());

    let cluster = write(dir.path(), "cluster.yaml", CLUSTER);
    kubectl.ok(&["create", "-f", &cluster]).await;
    assert_eq!(pods.list(&Default::default()).await.unwrap().items.len(), 4);
    // kubectl asks for strict field validation: a misspelled field is refused.
    let typo = write(
        dir.path(),
        "typo.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: typo}\nspec: {nodeNmae: n1, containers: [{name: a, image: b}]}\n",
    );
    let (ok, refused) = kubectl.run(&["create", "-f", &typo]).await;
    assert!(
        !ok && refused.contains("unknown field \"spec.nodeNmae\""),
        "{refused}"
    );
    assert!(pods.get_opt("typo").await.unwrap().is_none());
    let listed = kubectl.ok(&["get", "nodes"]).await;
    assert!(listed.contains("n1") && listed.contains("n2"), "{listed}");
    // Server-side Tables give kubectl its usual columns.
    let table = kubectl.ok(&["get", "pods", "-o", "wide"]).await;
    let web_row = table
        .lines()
        .find(|l| l.starts_with("web-1 "))
        .unwrap_or_default();
    assert!(
        table.starts_with("NAME") && table.contains("STATUS"),
        "{table}"
    );
    assert!(
        web_row.contains("Pending") && web_row.contains("n1"),
        "{table}"
    );
    let wide = kubectl.ok(&["get", "pods", "-o", "name"]).await;
    assert!(wide.contains("pod/web-1"), "{wide}");

    // apply twice: create, then a strategic-merge patch from the last-applied state.
    let cm = |value: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings}}\ndata: {{mode: {value}, keep: \"yes\"}}\n"
        )
    };
    let settings = write(dir.path(), "cm.yaml", &cm("one"));
    kubectl.ok(&["apply", "-f", &settings]).await;
    write(dir.path(), "cm.yaml", &cm("two"));
    let applied = kubectl.ok(&["apply", "-f", &settings]).await;
    assert!(applied.contains("configured"), "{applied}");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let settings_cm = configmaps.get("settings").await.unwrap();
    assert_eq!(settings_cm.data.as_ref().unwrap()["mode"], "two");
    assert!(
        settings_cm
            .metadata
            .annotations
            .unwrap()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration")
    );
    assert!(api.stats().count("patch", "configmaps") >= 1);
    kubectl.ok(&["delete", "configmap", "settings"]).await;
    assert!(configmaps.get_opt("settings").await.unwrap().is_none());

    // kubectl scale goes through the scale subresource.
    kubectl
        .ok(&["scale", "deployment", "api", "--replicas=3"])
        .await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "default");
    assert_eq!(
        deployments.get("api").await.unwrap().spec.unwrap().replicas,
        Some(3)
    );

    kubectl.ok(&["cordon", "n2"]).await;
    assert_eq!(
        nodes.get("n2").await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );
    let n2 = kubectl.ok(&["get", "node", "n2"]).await;
    assert!(n2.contains("NotReady,SchedulingDisabled"), "{n2}");
    kubectl.ok(&["uncordon", "n2"]).await;
    assert_ne!(
        nodes.get("n2").await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );

    // The PDB allows one disruption once "observed" (no disruption controller here).
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let status = json!({"status": {"observedGeneration": 1, "disruptionsAllowed": 1,
                                   "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}});
    pdbs.patch_status("web", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    // Running, ready pods are the ones a budget protects (pending ones skip it).
    let running = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    for name in ["web-1", "web-2"] {
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(running.clone()),
        )
        .await
        .unwrap();
    }

    let drained = kubectl
        .ok(&[
            "drain",
            "n1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
            "--timeout",
            "20s",
        ])
        .await;
    assert!(drained.contains("node/n1 drained"), "{drained}");
    assert_eq!(
        nodes.get("n1").await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );
    let left: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert_eq!(left, vec!["agent-n1", "web-2"]);
    let pdb_status = pdbs.get("web").await.unwrap().status.unwrap();
    assert_eq!(pdb_status.disruptions_allowed, 0);
    assert!(pdb_status.disrupted_pods.unwrap().contains_key("web-1"));
    let stats = api.stats();
    assert_eq!(stats.count("create", "pods/eviction"), 2);
}

/// A fresh API server and a kubectl bound to it; `None` without a kubectl (`test` is
/// skipped).
async fn kubectl_against_a_fresh_server(
    test: &str,
) -> Option<(ApiServer, Kubectl, tempfile::TempDir, CancellationToken)> {
    let binary = kubectl_binary(test)?;
    let shutdown = CancellationToken::new();
    let api = ApiServer::start(Config::default(), shutdown.clone())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, "admin").unwrap();
    let kubectl = Kubectl {
        binary,
        kubeconfig,
        cache: dir.path().join("cache"),
    };
    Some((api, kubectl, dir, shutdown))
}

/// `kubectl create <kind>` sends protobuf bodies (`k8s\0` + runtime.Unknown); the
/// server decodes them to the JSON it stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_subcommands_send_protobuf_the_server_decodes() {
    let Some((api, kubectl, _dir, _shutdown)) = kubectl_against_a_fresh_server(
        "kubectl_create_subcommands_send_protobuf_the_server_decodes",
    )
    .await
    else {
        return;
    };
    kubectl.ok(&["create", "namespace", "team-a"]).await;
    kubectl
        .ok(&[
            "-n",
            "team-a",
            "create",
            "configmap",
            "conf",
            "--from-literal=a=b",
        ])
        .await;
    kubectl
        .ok(&[
            "-n",
            "team-a",
            "create",
            "secret",
            "generic",
            "pw",
            "--from-literal=p=q",
        ])
        .await;
    kubectl
        .ok(&[
            "-n",
            "team-a",
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--port=80",
            "--replicas=2",
        ])
        .await;
    let client = api.client("admin");
    let ns: k8s_openapi::api::core::v1::Namespace =
        Api::all(client.clone()).get("team-a").await.unwrap();
    assert_eq!(
        ns.metadata.labels.unwrap()["kubernetes.io/metadata.name"],
        "team-a"
    );
    let cm: ConfigMap = Api::namespaced(client.clone(), "team-a")
        .get("conf")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["a"], "b");
    let secret: k8s_openapi::api::core::v1::Secret = Api::namespaced(client.clone(), "team-a")
        .get("pw")
        .await
        .unwrap();
    assert_eq!(secret.data.unwrap()["p"].0, b"q");
    let deploy: k8s_openapi::api::apps::v1::Deployment = Api::namespaced(client.clone(), "team-a")
        .get("web")
        .await
        .unwrap();
    let spec = deploy.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let container = &spec.template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx"));
    assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 80);
    // What kubectl create wrote is recorded as its Update.
    let managers: Vec<String> = deploy
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["kubectl-create"]);
    kubectl
        .ok(&["-n", "team-a", "delete", "deployment", "web"])
        .await;
}

const SSA_CONFIG: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  labels: {team: a}
data: {mode: fast, level: "1"}
"#;

/// `kubectl apply --server-side`: create-if-absent, managedFields with operation Apply,
/// merges with other managers' fields, conflicts (409) naming the other manager, and
/// `--force-conflicts` taking the field over; fields dropped from the configuration go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_tracks_managers_and_reports_conflicts() {
    let Some((api, kubectl, dir, _shutdown)) = kubectl_against_a_fresh_server(
        "kubectl_server_side_apply_tracks_managers_and_reports_conflicts",
    )
    .await
    else {
        return;
    };
    let configmaps: Api<ConfigMap> = Api::namespaced(api.client("admin"), "default");
    let file = write(dir.path(), "cm.yaml", SSA_CONFIG);
    let out = kubectl.ok(&["apply", "--server-side", "-f", &file]).await;
    assert!(out.contains("serverside-applied"), "{out}");
    let cm = configmaps.get("settings").await.unwrap();
    let entries = cm.metadata.managed_fields.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].manager.as_deref(), Some("kubectl"));
    assert_eq!(entries[0].operation.as_deref(), Some("Apply"));

    // Another manager's edit of an owned field: the next apply conflicts with it.
    kubectl
        .ok(&["label", "--overwrite", "configmap", "settings", "team=b"])
        .await;
    kubectl
        .ok(&[
            "patch",
            "configmap",
            "settings",
            "-p",
            r#"{"data":{"extra":"x"}}"#,
        ])
        .await;
    let (ok, out) = kubectl.run(&["apply", "--server-side", "-f", &file]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("Apply failed with 1 conflict: conflict with \"kubectl-label\" using v1: .metadata.labels.team"),
        "{out}"
    );
    kubectl
        .ok(&["apply", "--server-side", "--force-conflicts", "-f", &file])
        .await;
    let cm = configmaps.get("settings").await.unwrap();
    assert_eq!(cm.metadata.labels.unwrap()["team"], "a");
    // The patch's field belongs to kubectl-patch and survives the apply.
    assert_eq!(cm.data.as_ref().unwrap()["extra"], "x");

    // A field removed from the configuration is removed from the object.
    let smaller = write(
        dir.path(),
        "cm2.yaml",
        &SSA_CONFIG.replace(", level: \"1\"", ""),
    );
    kubectl
        .ok(&["apply", "--server-side", "-f", &smaller])
        .await;
    let data = configmaps.get("settings").await.unwrap().data.unwrap();
    assert!(!data.contains_key("level"), "{data:?}");
    assert_eq!(data["mode"], "fast");
    kubectl.ok(&["delete", "-f", &smaller]).await;
}

/// `kubectl edit` reads the object, runs the editor on it and sends the difference as a
/// strategic-merge patch (a JSON merge patch for a custom resource), as
/// staging/src/k8s.io/kubectl/pkg/cmd/util/editor/editoptions.go does; an edit that
/// breaks validation is refused and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_edit_patches_what_the_editor_changed() {
    let Some((api, kubectl, dir, _shutdown)) =
        kubectl_against_a_fresh_server("kubectl_edit_patches_what_the_editor_changed").await
    else {
        return;
    };
    kubectl
        .ok(&["create", "configmap", "conf", "--from-literal=mode=blue"])
        .await;
    let pdb = write(
        dir.path(),
        "pdb.yaml",
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: default\nspec:\n  minAvailable: 2\n  selector:\n    matchLabels:\n      app: web\n",
    );
    kubectl.ok(&["apply", "-f", &pdb]).await;

    let edit = |expr: &str| format!("sed -i -e '{expr}'");
    let (ok, out) = kubectl
        .run_with_editor(
            &["edit", "configmap", "conf"],
            Some(&edit("s/mode: blue/mode: green/")),
        )
        .await;
    assert!(ok, "{out}");
    let (ok, out) = kubectl
        .run_with_editor(
            &["edit", "pdb", "web"],
            Some(&edit("s/minAvailable: 2/minAvailable: 3/")),
        )
        .await;
    assert!(ok, "{out}");
    let client = api.client("admin");
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let data = cms.get("conf").await.unwrap().data.unwrap_or_default();
    assert_eq!(data.get("mode").map(String::as_str), Some("green"));
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client);
    let spec = pdbs.get("web").await.unwrap().spec.unwrap();
    assert_eq!(
        spec.min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(3))
    );

    // Both minAvailable and maxUnavailable: refused like upstream's PDB validation.
    let (ok, out) = kubectl
        .run_with_editor(
            &["edit", "pdb", "web"],
            Some(&edit(
                "s/^  minAvailable: 3/  minAvailable: 3\\n  maxUnavailable: 1/",
            )),
        )
        .await;
    assert!(!ok, "an invalid edit must fail: {out}");
    assert!(out.contains("\"web\" is invalid"), "{out}");
    let spec = pdbs.get("web").await.unwrap().spec.unwrap();
    assert_eq!(spec.max_unavailable, None, "nothing changed");
}

/// `kubectl auth whoami` posts a SelfSubjectReview.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_whoami_reads_a_self_subject_review() {
    let Some((_api, kubectl, _dir, _shutdown)) =
        kubectl_against_a_fresh_server("kubectl_auth_whoami_reads_a_self_subject_review").await
    else {
        return;
    };
    let out = kubectl.ok(&["auth", "whoami", "-o", "json"]).await;
    let review: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(review["kind"], "SelfSubjectReview");
    assert!(
        review["status"]["userInfo"]["username"].is_string(),
        "{out}"
    );
}

/// `kubectl get` prints upstream's columns (pkg/printers/internalversion/printers.go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_prints_upstreams_columns() {
    let Some((_api, kubectl, dir, _shutdown)) =
        kubectl_against_a_fresh_server("kubectl_get_prints_upstreams_columns").await
    else {
        return;
    };
    let objects = r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec: {minAvailable: 2, selector: {matchLabels: {app: web}}}
---
apiVersion: v1
kind: Secret
metadata: {name: pw}
type: Opaque
stringData: {a: b}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: conf}
data: {a: b, c: d}
"#;
    let file = write(dir.path(), "objects.yaml", objects);
    kubectl.ok(&["create", "-f", &file]).await;
    let header = |text: &str| {
        text.lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let pdb = kubectl.ok(&["get", "pdb"]).await;
    assert_eq!(
        header(&pdb),
        "NAME MIN AVAILABLE MAX UNAVAILABLE ALLOWED DISRUPTIONS AGE"
    );
    assert!(pdb.contains("N/A"), "{pdb}");
    assert_eq!(
        header(&kubectl.ok(&["get", "secret", "pw"]).await),
        "NAME TYPE DATA AGE"
    );
    let cm = kubectl.ok(&["get", "configmap", "conf"]).await;
    assert_eq!(header(&cm), "NAME DATA AGE");
    assert!(
        cm.lines().nth(1).unwrap().split_whitespace().nth(1) == Some("2"),
        "{cm}"
    );
    assert_eq!(header(&kubectl.ok(&["get", "ns"]).await), "NAME STATUS AGE");
}
