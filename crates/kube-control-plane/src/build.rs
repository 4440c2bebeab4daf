//! Building etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and KWOK
//! from the Go module proxy into a cache folder keyed by version. kubectl comes with them
//! (the same module, the same build) so that a machine with Go but no kubectl of its own
//! has one ([`crate::kubectl`]).
//!
//! Kubernetes is built through a wrapper module that requires `k8s.io/kubernetes` and
//! replaces each of its staging modules (the `=> ./staging/src/…` lines of its go.mod,
//! which a module consumer cannot follow) with the published `v0.<minor>.<patch>` of that
//! module. etcd is built from `go.etcd.io/etcd/server/v3`, whose root package is the etcd
//! binary. KWOK (`sigs.k8s.io/kwok/cmd/kwok`, [`KWOK_VERSION`]) plays the nodes' kubelets:
//! heartbeats, pod start, readiness and exit, as stages the data plane writes. All are
//! built with `CGO_ENABLED=0` and `-trimpath`, so the Go build cache
//! (which outlives the clone) makes a second build a matter of linking.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result, Versions};

/// The Kubernetes binaries the control plane runs, and the kubectl its users run.
pub const KUBE_BINARIES: [&str; 4] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];

/// The KWOK release that plays the real tier's kubelets.
pub const KWOK_VERSION: &str = "v0.8.0";

/// Where the binaries of `versions` live once built.
pub fn bin_dir(versions: &Versions) -> PathBuf {
    crate::cache_dir()
        .join("control-plane")
        .join(format!("{}-etcd-{}", versions.kubernetes, versions.etcd))
        .join("bin")
}

/// True when every binary of `versions` is in its cache folder.
pub fn is_built(versions: &Versions) -> bool {
    let bin = bin_dir(versions);
    KUBE_BINARIES
        .iter()
        .chain(["etcd", "kwok"].iter())
        .all(|b| bin.join(b).is_file())
}

/// The cached KWOK binary of the default [`Versions`], when it is built.
pub fn kwok_binary() -> Option<PathBuf> {
    let path = bin_dir(&Versions::default()).join("kwok");
    path.is_file().then_some(path)
}

/// Builds the binaries of `versions` unless they are already cached; returns their folder.
/// `say` receives one line per step, for a person watching a build of several minutes.
pub fn build(versions: &Versions, say: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let bin = bin_dir(versions);
    if is_built(versions) {
        say(&format!(
            "control plane {versions} already built in {}",
            bin.display()
        ));
        return Ok(bin);
    }
    go_version()?;
    let work = bin.with_file_name("src");
    fs::create_dir_all(&bin).map_err(|e| Error::io(&bin, e))?;
    if !KUBE_BINARIES.iter().all(|b| bin.join(b).is_file()) {
        say(&format!(
            "building kube-apiserver, kube-controller-manager, kube-scheduler and kubectl {} (about 9 minutes cold on 2 cores)",
            versions.kubernetes
        ));
        build_kubernetes(versions, &work.join("kubernetes"), &bin)?;
    }
    if !bin.join("etcd").is_file() {
        say(&format!("building etcd {}", versions.etcd));
        build_etcd(versions, &work.join("etcd"), &bin)?;
    }
    if !bin.join("kwok").is_file() {
        say(&format!(
            "building kwok {KWOK_VERSION} (about a minute cold)"
        ));
        build_kwok(&work.join("kwok"), &bin)?;
    }
    say(&format!(
        "control plane {versions} built in {}",
        bin.display()
    ));
    Ok(bin)
}

fn go_version() -> Result<String> {
    let out = Command::new("go")
        .arg("version")
        .output()
        .map_err(|_| Error::GoMissing)?;
    if !out.status.success() {
        return Err(Error::GoMissing);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The `major.minor.patch` of a `vX.Y.Z` tag, as the staging modules' `v0.Y.Z`.
fn staging_version(kubernetes: &str) -> Result<String> {
    let rest = kubernetes
        .strip_prefix("v1.")
        .ok_or_else(|| Error::BadVersion(kubernetes.to_string()))?;
    Ok(format!("v0.{rest}"))
}

fn build_kubernetes(versions: &Versions, work: &Path, bin: &Path) -> Result<()> {
    let k8s = &versions.kubernetes;
    fs::create_dir_all(work).map_err(|e| Error::io(work, e))?;
    // The staging modules are read from k8s.io/kubernetes' own go.mod.
    let mod_file = go(
        work,
        &[
            "mod",
            "download",
            "-json",
            &format!("k8s.io/kubernetes@{k8s}"),
        ],
    )?;
    let upstream_mod = json_field(&mod_file, "GoMod").ok_or_else(|| {
        Error::Go(format!(
            "no GoMod in `go mod download k8s.io/kubernetes@{k8s}`"
        ))
    })?;
    let upstream =
        fs::read_to_string(&upstream_mod).map_err(|e| Error::io(Path::new(&upstream_mod), e))?;
    let staging = staging_version(k8s)?;
    let mut go_mod = format!(
        "module graceful-drain.local/control-plane\n\ngo {}\n\nrequire k8s.io/kubernetes {k8s}\n\n",
        go_directive(&upstream)
    );
    for module in upstream.lines().filter_map(|l| {
        let (left, right) = l.trim().split_once("=>")?;
        right
            .trim()
            .starts_with("./staging/")
            .then(|| left.trim().to_string())
    }) {
        go_mod.push_str(&format!("replace {module} => {module} {staging}\n"));
    }
    write(work, "go.mod", &go_mod)?;
    write(
        work,
        "tools.go",
        "//go:build tools\n\npackage tools\n\nimport (\n\t_ \"k8s.io/kubernetes/cmd/kube-apiserver\"\n\t_ \"k8s.io/kubernetes/cmd/kube-controller-manager\"\n\t_ \"k8s.io/kubernetes/cmd/kube-scheduler\"\n\t_ \"k8s.io/kubernetes/cmd/kubectl\"\n)\n",
    )?;
    go(work, &["mod", "tidy"])?;
    let minor = k8s.split('.').nth(1).unwrap_or_default();
    let ldflags = format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={k8s} -X k8s.io/component-base/version.gitMajor=1 \
         -X k8s.io/component-base/version.gitMinor={minor} -X k8s.io/component-base/version.gitTreeState=clean \
         -X k8s.io/client-go/pkg/version.gitVersion={k8s}"
    );
    let out = format!("{}/", bin.display());
    let mut args = vec!["build", "-trimpath", "-ldflags", &ldflags, "-o", &out];
    let packages: Vec<String> = KUBE_BINARIES
        .iter()
        .map(|b| format!("k8s.io/kubernetes/cmd/{b}"))
        .collect();
    args.extend(packages.iter().map(String::as_str));
    go(work, &args)?;
    Ok(())
}

fn build_etcd(versions: &Versions, work: &Path, bin: &Path) -> Result<()> {
    let module = "go.etcd.io/etcd/server/v3";
    build_main(work, bin, "etcd", (module, &versions.etcd), module, "etcd")
}

fn build_kwok(work: &Path, bin: &Path) -> Result<()> {
    let module = ("sigs.k8s.io/kwok", KWOK_VERSION);
    build_main(
        work,
        bin,
        "kwok",
        module,
        "sigs.k8s.io/kwok/cmd/kwok",
        "kwok",
    )
}

/// Builds the main package `package` of `module` (path, version) into `bin/out` through a
/// wrapper module `graceful-drain.local/<name>` in `work` that requires it.
fn build_main(
    work: &Path,
    bin: &Path,
    name: &str,
    (module, version): (&str, &str),
    package: &str,
    out: &str,
) -> Result<()> {
    fs::create_dir_all(work).map_err(|e| Error::io(work, e))?;
    write(
        work,
        "go.mod",
        &format!("module graceful-drain.local/{name}\n\ngo 1.26.0\n\nrequire {module} {version}\n"),
    )?;
    write(
        work,
        "tools.go",
        &format!("//go:build tools\n\npackage tools\n\nimport _ \"{package}\"\n"),
    )?;
    go(work, &["mod", "tidy"])?;
    let out = bin.join(out);
    go(
        work,
        &[
            "build",
            "-trimpath",
            "-ldflags",
            "-s -w",
            "-o",
            &out.display().to_string(),
            package,
        ],
    )?;
    Ok(())
}

/// The `go` directive of an upstream go.mod (so the wrapper asks for the same language).
fn go_directive(go_mod: &str) -> String {
    go_mod
        .lines()
        .find_map(|l| l.strip_prefix("go ").map(|v| v.trim().to_string()))
        .unwrap_or_else(|| "1.26.0".to_string())
}

fn json_field(json: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\":");
    let rest = &json[json.find(&key)? + key.len()..];
    let start = rest.find('"')? + 1;
    let end = rest[start..].find('"')? + start;
    Some(rest[start..end].to_string())
}

fn write(dir: &Path, name: &str, contents: &str) -> Result<()> {
    let path = dir.join(name);
    fs::write(&path, contents).map_err(|e| Error::io(&path, e))
}

/// Runs `go ARGS` in `dir` with cgo off; the error carries the command's stderr.
fn go(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("go")
        .args(args)
        .current_dir(dir)
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::GoMissing,
            _ => Error::io(dir, e),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
        return Err(Error::Go(format!(
            "`go {}` in {} failed:\n{}",
            args.join(" "),
            dir.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_take_the_v0_version_of_the_release() {
        assert_eq!(staging_version("v1.37.2").unwrap(), "v0.37.2");
        assert!(matches!(
            staging_version("1.37.2"),
            Err(Error::BadVersion(_))
        ));
    }

    #[test]
    fn the_go_directive_is_read_from_the_upstream_go_mod() {
        assert_eq!(
            go_directive("module k8s.io/kubernetes\n\ngo 1.26.0\n"),
            "1.26.0"
        );
    }

    #[test]
    fn the_downloaded_go_mod_path_is_read_from_go_mod_download() {
        let json = "{\n\t\"Path\": \"k8s.io/kubernetes\",\n\t\"GoMod\": \"/c/k.mod\",\n}";
        assert_eq!(json_field(json, "GoMod").as_deref(), Some("/c/k.mod"));
        assert_eq!(json_field(json, "Zip"), None);
    }
}
