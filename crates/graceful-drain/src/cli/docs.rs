//! `graceful-drain cli-docs` (hidden): renders the command-line reference, `docs/cli.md`,
//! from the clap definitions, so the reference cannot drift from the binary.
//!
//! The walk reads each [`clap::Command`] after `build()` (which fills in usages and
//! propagates global options) and prints one section per visible subcommand: its
//! arguments, then its options under their help heading (the connection flags of `drain`,
//! `uncordon` and `status` under "Connection options"). A global option is listed once,
//! under the command that defines it: at the top for the binary's own, in a subcommand's
//! section for one a subcommand defines (`--kubeconfig` of `webhook`). Environment
//! variables are listed by name only, never with the value of the machine that generated
//! the file, so the output is the same everywhere. `.ci/checks/docs.sh` fails when the
//! committed file differs from what this prints.

use std::fmt::Write as _;

use clap::{Arg, ArgAction, CommandFactory};

/// Arguments of `graceful-drain cli-docs`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {}

/// Prints the reference to stdout.
pub async fn run(
    _args: Args,
    _shutdown: graceful_drain_core::runtime::Shutdown,
) -> anyhow::Result<()> {
    print!("{}", markdown());
    Ok(())
}

/// The command-line reference of this build as Markdown.
pub fn markdown() -> String {
    let mut cli = super::Cli::command();
    cli.build();
    let mut out = String::new();
    let name = cli.get_name().to_owned();
    let _ = writeln!(out, "# `{name}` command-line reference");
    out.push_str(
        "\nGenerated from the clap definitions by `cargo run -q --features sim -- cli-docs > docs/cli.md`; \
         do not edit by hand\n(`.ci/checks/docs.sh` fails when this file is stale). \
         `simulate` exists only in builds\nwith the `sim` feature; the shipped image \
         is built without it.\n",
    );
    let inherited: Vec<String> = cli
        .get_arguments()
        .filter(|arg| arg.is_global_set())
        .map(|arg| arg.get_id().to_string())
        .collect();
    command_section(&mut out, &cli, 2, None);
    for sub in visible_subcommands(&cli) {
        command_section(&mut out, sub, 2, Some(&inherited));
    }
    out
}

fn visible_subcommands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands()
        .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
}

/// One command's section, without the global options it `inherited` from the commands
/// above it; the binary's own section (`None`) lists its global options as such.
fn command_section(
    out: &mut String,
    cmd: &clap::Command,
    level: usize,
    inherited: Option<&[String]>,
) {
    let top = inherited.is_none();
    let inherited = inherited.unwrap_or_default();
    let title = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    let _ = writeln!(out, "\n{} `{title}`\n", "#".repeat(level));
    if let Some(about) = cmd.get_long_about().or_else(|| cmd.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim_end());
    }
    let usage = cmd.clone().render_usage().to_string();
    let _ = writeln!(out, "```text\n{}\n```", usage.trim_end());
    let subs: Vec<_> = visible_subcommands(cmd).collect();
    if level == 2 && !subs.is_empty() {
        out.push_str("\nSubcommands:\n\n");
        for sub in &subs {
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            let _ = writeln!(out, "* `{}`: {about}", sub.get_name());
        }
    }
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version"))
        .filter(|arg| !inherited.iter().any(|id| id == arg.get_id().as_str()))
        .collect();
    let (positionals, options): (Vec<&Arg>, Vec<&Arg>) =
        args.into_iter().partition(|arg| arg.is_positional());
    arg_list(out, "Arguments", &positionals);
    let plain = if top { "Global options" } else { "Options" };
    let mut headings: Vec<Option<&str>> = Vec::new();
    for arg in &options {
        if !headings.contains(&arg.get_help_heading()) {
            headings.push(arg.get_help_heading());
        }
    }
    for heading in headings {
        let under: Vec<&Arg> = options
            .iter()
            .copied()
            .filter(|arg| arg.get_help_heading() == heading)
            .collect();
        arg_list(out, heading.unwrap_or(plain), &under);
    }
    if level > 2 {
        return;
    }
    for sub in subs.iter().filter(|sub| sub.has_subcommands()) {
        let mut deeper = inherited.to_vec();
        deeper.extend(
            sub.get_arguments()
                .filter(|arg| arg.is_global_set())
                .map(|arg| arg.get_id().to_string()),
        );
        for nested in visible_subcommands(sub) {
            command_section(out, nested, level + 1, Some(&deeper));
        }
    }
}

fn arg_list(out: &mut String, heading: &str, args: &[&Arg]) {
    if args.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n{heading}:\n");
    for arg in args {
        let _ = write!(out, "* `{}`", arg_synopsis(arg));
        if let Some(help) = arg.get_long_help().or_else(|| arg.get_help()) {
            let help = help.to_string();
            let _ = write!(out, ": {}", help.trim_end().replace('\n', "\n  "));
        }
        for fact in arg_facts(arg) {
            let _ = write!(out, " [{fact}]");
        }
        out.push('\n');
    }
}

fn arg_synopsis(arg: &Arg) -> String {
    let values = value_names(arg);
    if arg.is_positional() {
        return values;
    }
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    let mut synopsis = names.join(", ");
    if takes_value(arg) {
        synopsis.push(' ');
        synopsis.push_str(&values);
    }
    synopsis
}

fn takes_value(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Set | ArgAction::Append)
}

fn value_names(arg: &Arg) -> String {
    let names: Vec<String> = match arg.get_value_names() {
        Some(names) => names.iter().map(|name| format!("<{name}>")).collect(),
        None => vec![format!("<{}>", arg.get_id().as_str().to_uppercase())],
    };
    let mut rendered = names.join(" ");
    if matches!(arg.get_action(), ArgAction::Append) {
        rendered.push_str("...");
    }
    rendered
}

fn arg_facts(arg: &Arg) -> Vec<String> {
    let mut facts = Vec::new();
    if arg.is_required_set() {
        facts.push("required".to_owned());
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|value| value.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && takes_value(arg) {
        facts.push(format!("default: `{}`", defaults.join(",")));
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| format!("`{}`", value.get_name()))
        .collect();
    if !possible.is_empty() && takes_value(arg) {
        facts.push(format!("values: {}", possible.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        facts.push(format!("env: `{}`", env.to_string_lossy()));
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_subcommand_has_a_section() {
        let doc = markdown();
        for name in [
            "webhook",
            "node-agent",
            "drain",
            "uncordon",
            "status",
            "crds",
            "certs",
        ] {
            assert!(
                doc.contains(&format!("## `graceful-drain {name}`")),
                "no section for {name}"
            );
        }
        assert!(
            !doc.contains("## `graceful-drain cli-docs`"),
            "the hidden generator is documented"
        );
    }

    #[test]
    fn the_commands_that_talk_to_a_cluster_list_their_connection_flags() {
        let doc = markdown();
        for name in ["drain", "uncordon", "status"] {
            let start = doc
                .find(&format!("## `graceful-drain {name}`"))
                .unwrap_or_else(|| panic!("no section for {name}"));
            let section = &doc[start..];
            let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
            let connection = section
                .find("Connection options:")
                .unwrap_or_else(|| panic!("{name}: {section}"));
            for flag in [
                "--kubeconfig <FILE>",
                "--context <NAME>",
                "--cluster <NAME>",
                "--user <NAME>",
            ] {
                let at = section
                    .find(flag)
                    .unwrap_or_else(|| panic!("{name} lacks {flag}"));
                assert!(
                    at > connection,
                    "{name}: {flag} not under Connection options"
                );
            }
        }
        // A subcommand's own global flags are listed in its section.
        let webhook = doc.find("## `graceful-drain webhook`").unwrap();
        let node_agent = doc.find("## `graceful-drain node-agent`").unwrap();
        assert!(doc[webhook..node_agent].contains("`--kubeconfig <FILE>`"));
    }

    #[test]
    fn environment_values_never_leak_into_the_reference() {
        let doc = markdown();
        assert!(doc.contains("[env: `GRACEFUL_DRAIN_LOG_FORMAT`]"));
        assert!(!doc.contains("GRACEFUL_DRAIN_LOG_FORMAT="));
    }
}
