//! `graceful-drain`: one binary, several subcommands. See `graceful_drain::cli`.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

fn main() -> std::process::ExitCode {
    graceful_drain::cli::main()
}
