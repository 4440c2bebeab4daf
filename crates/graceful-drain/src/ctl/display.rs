//! Live progress output: an indicatif spinner rewriting one status line when stderr is a
//! terminal, plain timestamped lines on stdout (printed only when the status changes)
//! otherwise, so logs and CI output stay readable.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Spinner redraw period: smooth enough for a person, cheap for the terminal.
const SPINNER_TICK: Duration = Duration::from_millis(120);

/// Where progress goes.
pub enum Display {
    /// One status line on stderr, redrawn in place, with notes printed above it.
    Spinner(ProgressBar),
    /// Timestamped lines on stdout.
    Plain {
        /// The status line printed last, so an unchanged status is not printed again.
        last: String,
    },
}

impl Display {
    /// A spinner on a terminal, plain lines otherwise.
    pub fn detect() -> Self {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed}] {wide_msg}") {
                bar.set_style(style);
            }
            bar.enable_steady_tick(SPINNER_TICK);
            Self::Spinner(bar)
        } else {
            Self::plain()
        }
    }

    /// Plain lines regardless of the terminal.
    pub fn plain() -> Self {
        Self::Plain {
            last: String::new(),
        }
    }

    /// Shows the current status; `elapsed` is added to plain lines.
    pub fn status(&mut self, line: &str, elapsed: Duration) {
        match self {
            Self::Spinner(bar) => bar.set_message(line.to_string()),
            Self::Plain { last } => {
                if last != line {
                    println!("[{}] {line}", format_elapsed(elapsed));
                    *last = line.to_string();
                }
            }
        }
    }

    /// Prints a line that stays (a node Event, for instance).
    pub fn note(&mut self, line: &str) {
        match self {
            Self::Spinner(bar) => bar.println(line),
            Self::Plain { .. } => println!("{line}"),
        }
    }

    /// Removes the spinner before the final message.
    pub fn finish(&mut self) {
        if let Self::Spinner(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// `1h2m3s`, `4m5s`, `6s`: whole seconds, largest units first.
pub fn format_elapsed(elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_reads_like_kubectl() {
        assert_eq!(format_elapsed(Duration::from_millis(900)), "0s");
        assert_eq!(format_elapsed(Duration::from_secs(65)), "1m5s");
        assert_eq!(format_elapsed(Duration::from_secs(3725)), "1h2m5s");
    }
}
