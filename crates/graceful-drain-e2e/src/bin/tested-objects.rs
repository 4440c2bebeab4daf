//! Prints, as one JSON array, every object that the suites and the real tier's rows
//! register from the chart — the webhook configurations as they point them at a loopback
//! webhook, the RBAC and the admission policies — for `.ci/checks/shipped.sh`, which
//! compares them with the chart rendered by Helm.
//!
//! `tested-objects [--timeout-seconds N]`: N is the chart value `webhook.timeoutSeconds`
//! the check renders with (default: the chart's).

use std::process::ExitCode;

use graceful_drain_sim::scenario::shipped;

/// The loopback address the suites' configurations name (the port is any).
const BASE_URL: &str = "https://127.0.0.1:9443";
/// A CA bundle stands where the test's own would; the check ignores its bytes.
const CA: &str = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut values = shipped::Values::default();
    match args.as_slice() {
        [] => {}
        [flag, n] if flag == "--timeout-seconds" => match n.parse() {
            Ok(n) => values.timeout_seconds = n,
            Err(e) => {
                eprintln!("tested-objects: --timeout-seconds {n}: {e}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: tested-objects [--timeout-seconds N]");
            return ExitCode::from(2);
        }
    }
    let objects = match shipped::tested_objects(BASE_URL, CA, &values) {
        Ok(objects) => objects,
        Err(e) => {
            eprintln!("tested-objects: {e}");
            return ExitCode::FAILURE;
        }
    };
    match serde_json::to_string_pretty(&objects) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tested-objects: encode: {e}");
            ExitCode::FAILURE
        }
    }
}
