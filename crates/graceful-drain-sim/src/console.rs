//! What `simulate` shows a person: where the components' logs go, a line as each phase
//! of the default run starts and ends, and the end of the logs when a run fails.
//!
//! The components (webhook, node agents, the simulated cluster) log through `tracing`.
//! Unless `--verbose` is given, a run that prints a table sends those logs to a file it
//! names at start ([`init_logging`]), so stderr carries progress and stdout the table and
//! verdict. `--serve` keeps logging to stderr as the other subcommands do.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use graceful_drain_core::runtime::{self, LogFormat};

use crate::Args;
use crate::scenario::Progress;

/// Lines of the components' log printed on stderr when a run fails.
const FAILURE_TAIL_LINES: usize = 40;

/// Installs the tracing subscriber of `simulate`: stderr with `--verbose` (and for
/// `--serve` or `--list-scenarios` without `--log-file`), otherwise `args.log_file` or a
/// `simulate.log` in a new temporary directory. Sets `args.log_file` to the file used and
/// names it on stderr. `RUST_LOG` chooses what is logged either way.
pub fn init_logging(args: &mut Args, format: LogFormat) -> anyhow::Result<()> {
    let quiet_by_default = !(args.serve || args.list_scenarios);
    if args.verbose || (args.log_file.is_none() && !quiet_by_default) {
        runtime::init_tracing(format);
        args.log_file = None;
        return Ok(());
    }
    let path = match args.log_file.clone() {
        Some(path) => path,
        None => default_log_file()?,
    };
    let file = File::create(&path).with_context(|| format!("create {}", path.display()))?;
    runtime::init_tracing_to_file(format, file);
    eprintln!("component logs: {}", path.display());
    args.log_file = Some(path);
    Ok(())
}

/// `simulate.log` in a directory of its own under the temporary directory, kept after
/// the run so it can be read.
fn default_log_file() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("graceful-drain-simulate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir.join("simulate.log"))
}

/// One line on stderr as a phase of the default run starts or ends.
pub fn report(progress: Progress<'_>) {
    match progress {
        Progress::Started {
            scenario,
            protection,
        } => eprintln!("running {scenario} {}…", protection.phrase()),
        Progress::Finished(row) => {
            let phase = format!("{} {}", row.scenario, row.protection.phrase());
            match &row.result {
                Ok(m) => eprintln!(
                    "{phase}: done in {:.1}s, {} 5xx of {} requests",
                    m.duration.as_secs_f64(),
                    m.errors_5xx,
                    m.requests
                ),
                Err(e) => eprintln!("{phase}: failed: {e}"),
            }
        }
        Progress::Stopping => eprintln!("stopping the webhook and the node agents…"),
    }
}

/// After a failed run: the last lines of the components' log on stderr, so a CI log
/// shows them without the file.
pub fn print_log_tail(path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(FAILURE_TAIL_LINES)..];
    if tail.is_empty() {
        return;
    }
    eprintln!("last lines of the component logs ({}):", path.display());
    for line in tail {
        eprintln!("  {line}");
    }
}
