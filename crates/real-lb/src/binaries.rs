//! Where the CoreDNS and HAProxy binaries are: an environment variable names each, else the
//! place `.ci/balancers.sh` puts it. Nothing here downloads or builds; a missing binary is an
//! [`Error`] that says where it was looked for and which command provides it.

use std::path::{Path, PathBuf};

/// The variable naming a CoreDNS binary.
pub const COREDNS_VAR: &str = "GRACEFUL_DRAIN_COREDNS";
/// The variable naming an HAProxy binary.
pub const HAPROXY_VAR: &str = "GRACEFUL_DRAIN_HAPROXY";
/// Where Debian's `haproxy` package installs it, for a PATH without `/usr/sbin`.
const DEBIAN_HAPROXY: &str = "/usr/sbin/haproxy";
/// What provides both binaries.
const PROVIDER: &str = "bash .ci/balancers.sh";

/// A binary that is not where it was looked for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The variable names a path that is no file.
    #[error("${var} names {}, which is not a file", path.display())]
    NotAFile {
        /// The variable.
        var: &'static str,
        /// What it names.
        path: PathBuf,
    },
    /// The binary is nowhere it was looked for.
    #[error("no {tool}: looked at {looked}; `{PROVIDER}` {how}")]
    Missing {
        /// `coredns` or `haproxy`.
        tool: &'static str,
        /// The places looked at, in order.
        looked: String,
        /// What the provider does for this tool.
        how: &'static str,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The CoreDNS to run: `$GRACEFUL_DRAIN_COREDNS`, else `tools/coredns` in graceful-drain's
/// cache ([`kube_control_plane::cache_dir`]: `$GRACEFUL_DRAIN_CACHE`, else
/// `$XDG_CACHE_HOME/graceful-drain`, else `~/.cache/graceful-drain`), where
/// `.ci/balancers.sh` builds v1.15.0.
pub fn coredns() -> Result<PathBuf> {
    if let Some(path) = from_var(COREDNS_VAR)? {
        return Ok(path);
    }
    let cached = kube_control_plane::cache_dir()
        .join("tools")
        .join("coredns");
    if cached.is_file() {
        return Ok(cached);
    }
    Err(Error::Missing {
        tool: "coredns",
        looked: format!("${COREDNS_VAR} and {}", cached.display()),
        how: "builds CoreDNS v1.15.0 there from the Go module proxy (about 2 minutes once)",
    })
}

/// The HAProxy to run: `$GRACEFUL_DRAIN_HAPROXY`, else the first `haproxy` on `PATH`, else
/// Debian's `/usr/sbin/haproxy`.
pub fn haproxy() -> Result<PathBuf> {
    if let Some(path) = from_var(HAPROXY_VAR)? {
        return Ok(path);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("haproxy"))
            .find(|path| path.is_file())
    });
    if let Some(path) = on_path {
        return Ok(path);
    }
    if Path::new(DEBIAN_HAPROXY).is_file() {
        return Ok(PathBuf::from(DEBIAN_HAPROXY));
    }
    Err(Error::Missing {
        tool: "haproxy",
        looked: format!("${HAPROXY_VAR}, PATH and {DEBIAN_HAPROXY}"),
        how: "installs Debian's haproxy package (apt-get)",
    })
}

/// The path `var` names, when it is set and not empty.
fn from_var(var: &'static str) -> Result<Option<PathBuf>> {
    let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let path = PathBuf::from(value);
    if path.is_file() {
        Ok(Some(path))
    } else {
        Err(Error::NotAFile { var, path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_where_it_was_looked_for_and_the_command_that_provides_it() {
        let error = Error::Missing {
            tool: "coredns",
            looked: "$GRACEFUL_DRAIN_COREDNS and /cache/tools/coredns".into(),
            how: "builds it",
        };
        assert_eq!(
            error.to_string(),
            "no coredns: looked at $GRACEFUL_DRAIN_COREDNS and /cache/tools/coredns; \
             `bash .ci/balancers.sh` builds it"
        );
    }
}
