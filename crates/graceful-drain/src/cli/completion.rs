//! `graceful-drain completion SHELL`: the shell completion script of this build, generated
//! by clap_complete from the same clap definitions as the binary, so it cannot drift.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

/// Arguments of `graceful-drain completion`.
#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "Load it for the current shell, e.g.:\n  \
    bash: source <(graceful-drain completion bash)\n  \
    zsh:  source <(graceful-drain completion zsh)\n  \
    fish: graceful-drain completion fish | source")]
pub struct Args {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Prints the script to stdout.
pub async fn run(
    args: Args,
    _shutdown: graceful_drain_core::runtime::Shutdown,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(&script(args.shell))?;
    out.flush()?;
    Ok(())
}

/// The completion script for `shell`.
pub fn script(shell: Shell) -> Vec<u8> {
    let mut cli = super::Cli::command();
    let name = cli.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cli, name, &mut script);
    script
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::*;

    #[test]
    fn every_shell_gets_a_script_that_completes_the_subcommands() {
        for shell in Shell::value_variants() {
            let script = String::from_utf8(script(*shell)).unwrap();
            assert!(script.contains("graceful-drain"), "{shell}: {script}");
            for word in ["drain", "uncordon", "status"] {
                assert!(script.contains(word), "{shell} lacks {word}");
            }
            // fish names a long option `-l kubeconfig`; the other shells spell it out.
            let flag = match shell {
                Shell::Fish => "-l kubeconfig",
                _ => "--kubeconfig",
            };
            assert!(script.contains(flag), "{shell} lacks {flag}");
        }
    }

    #[test]
    fn the_shell_is_a_named_argument() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from(["graceful-drain", "completion", "zsh"]).unwrap();
        assert!(matches!(
            cli.command,
            crate::cli::Command::Completion(Args { shell: Shell::Zsh })
        ));
        assert!(crate::cli::Cli::try_parse_from(["graceful-drain", "completion", "tcsh"]).is_err());
    }
}
