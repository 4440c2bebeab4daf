//! `graceful-drain`: one binary, several subcommands. See `graceful_drain::cli`.

fn main() -> std::process::ExitCode {
    graceful_drain::cli::main()
}
