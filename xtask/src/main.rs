//! `cargo xtask`: developer tasks that are not part of the product.
//!
//! * `control-plane build` — build etcd, kube-apiserver, kube-controller-manager and
//!   kube-scheduler from the Go module proxy into the cache (once per version);
//! * `control-plane up DIR` — start them on loopback, print the admin kubeconfig;
//! * `control-plane down DIR` — stop them, kube-apiserver before etcd.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kube_control_plane::{Options, Versions};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "graceful-drain's developer tasks")]
enum Cmd {
    /// A real Kubernetes control plane on loopback (the real test tier).
    #[command(subcommand)]
    ControlPlane(ControlPlane),
}

#[derive(Subcommand)]
enum ControlPlane {
    /// Build the binaries into the cache (a no-op when they are there); print their folder.
    Build(VersionArgs),
    /// Start a control plane in DIR and print its admin kubeconfig's path.
    Up {
        /// Folder for certificates, kubeconfigs, etcd data, logs and pids.
        dir: PathBuf,
        #[command(flatten)]
        versions: VersionArgs,
        /// Leave lifecycle.k8s.io/v1alpha1 (EvictionRequest, KEP-4563) and its feature gate off.
        #[arg(long)]
        no_eviction_request_api: bool,
        /// Present a client certificate to admission webhooks (an AdmissionConfiguration
        /// naming a kubeconfig); the CA to give a webhook's `--client-ca` is
        /// DIR/pki/webhook-client-ca.crt.
        #[arg(long)]
        webhook_client_certificates: bool,
    },
    /// Stop the control plane started in DIR.
    Down {
        /// The folder given to `up`.
        dir: PathBuf,
    },
    /// Print the binaries' folder, building nothing (exit 1 when they are not built).
    Path(VersionArgs),
}

#[derive(clap::Args)]
struct VersionArgs {
    /// Kubernetes release (k8s.io/kubernetes module version).
    #[arg(long, default_value = kube_control_plane::KUBERNETES_VERSION)]
    kubernetes: String,
    /// etcd release (go.etcd.io/etcd/server/v3 module version).
    #[arg(long, default_value = kube_control_plane::ETCD_VERSION)]
    etcd: String,
}

impl VersionArgs {
    fn versions(&self) -> Versions {
        Versions {
            kubernetes: self.kubernetes.clone(),
            etcd: self.etcd.clone(),
        }
    }
}

fn main() -> anyhow::Result<()> {
    match Cmd::parse() {
        Cmd::ControlPlane(ControlPlane::Build(v)) => {
            let started = std::time::Instant::now();
            let bin =
                kube_control_plane::build::build(&v.versions(), &mut |line| eprintln!("{line}"))?;
            eprintln!("took {:.1?}", started.elapsed());
            println!("{}", bin.display());
        }
        Cmd::ControlPlane(ControlPlane::Path(v)) => {
            let versions = v.versions();
            anyhow::ensure!(
                kube_control_plane::is_built(&versions),
                "{versions} is not built: run `cargo xtask control-plane build`"
            );
            println!("{}", kube_control_plane::bin_dir(&versions).display());
        }
        Cmd::ControlPlane(ControlPlane::Up {
            dir,
            versions,
            no_eviction_request_api,
            webhook_client_certificates,
        }) => {
            let bin = kube_control_plane::build::build(&versions.versions(), &mut |line| {
                eprintln!("{line}")
            })?;
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            let dir = dir
                .canonicalize()
                .with_context(|| format!("resolve {}", dir.display()))?;
            let options = Options {
                bin,
                eviction_request_api: !no_eviction_request_api,
                apiserver_flags: Vec::new(),
                webhook_client_certificate: webhook_client_certificates,
            };
            let started = std::time::Instant::now();
            let cp = kube_control_plane::up(&dir, &options)?;
            let kubeconfig = cp.admin_kubeconfig();
            cp.detach();
            eprintln!(
                "control plane up in {:.1?}; logs in {}; stop it with `cargo xtask control-plane down {}`",
                started.elapsed(),
                dir.join("logs").display(),
                dir.display()
            );
            println!("{}", kubeconfig.display());
        }
        Cmd::ControlPlane(ControlPlane::Down { dir }) => {
            kube_control_plane::down(&dir)?;
            eprintln!("control plane in {} stopped", dir.display());
        }
    }
    Ok(())
}
