//! How errors are printed: an error and its causes on one line, `a: b: c`, each cause once.
//!
//! Our error enums follow one convention: a variant's message says what failed and on which
//! object, and never embeds its cause; the cause is the `#[source]` field. Printing the
//! chain is then the printer's job — the CLI's final message, Node conditions and log lines
//! all go through [`chain`]. Some libraries do embed their cause in their own message
//! (kube's kubeconfig errors, for one); [`chain`] skips a cause whose text the message
//! before it already ends with, so it still appears once.

use std::error::Error;
use std::fmt;

/// Displays `error` followed by its causes, separated by `: `.
pub fn chain<'a>(error: &'a (dyn Error + 'static)) -> Chain<'a> {
    Chain(error)
}

/// The [`Display`](fmt::Display) of an error with its causes; see [`chain`].
#[derive(Clone, Copy)]
pub struct Chain<'a>(&'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut previous = self.0.to_string();
        f.write_str(&previous)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            if !previous.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            previous = text;
            cause = error.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("read kubeconfig {path}")]
    struct Ours {
        path: &'static str,
        #[source]
        source: Embedding,
    }

    /// A library error that repeats its cause in its own message.
    #[derive(Debug, thiserror::Error)]
    #[error("failed to read: {source}")]
    struct Embedding {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn every_cause_is_printed_once() {
        let error = Ours {
            path: "/nonexistent",
            source: Embedding {
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            },
        };
        assert_eq!(
            chain(&error).to_string(),
            "read kubeconfig /nonexistent: failed to read: no such file"
        );
    }

    #[test]
    fn an_error_without_cause_is_its_message() {
        let error = std::io::Error::other("boom");
        assert_eq!(chain(&error).to_string(), "boom");
    }
}
