//! A child process of ours whose output goes to a log file: killed when its value is
//! dropped (`kill_on_drop`), its early exit noticed, its log's last lines read into error
//! messages. CoreDNS and HAProxy each run as one.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use tokio::process::Command;

/// How many lines of a log an error message carries.
pub(crate) const TAIL_LINES: usize = 30;

/// A running child process and its log.
#[derive(Debug)]
pub(crate) struct Child {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Child {
    /// Runs `binary` with `args`, stdout and stderr appended to `log` (created).
    pub(crate) fn spawn(binary: &Path, args: &[String], log: &Path) -> std::io::Result<Child> {
        let out = File::options().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let child = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Child {
            child,
            log: log.to_path_buf(),
        })
    }

    /// How the process ended, when it has.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The log file.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// The last [`TAIL_LINES`] lines of the log.
    pub(crate) fn log_tail(&self) -> String {
        tail(&self.log, TAIL_LINES)
    }
}

/// The last `lines` lines of the file at `path`, or why it could not be read.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("({} unreadable: {e})", path.display()),
    }
}
