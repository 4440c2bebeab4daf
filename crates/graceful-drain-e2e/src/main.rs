//! The product's command line built with the simulated cluster, for the suites that run
//! `graceful-drain` as a process (the crate's documentation).

fn main() -> std::process::ExitCode {
    graceful_drain::cli::main()
}
