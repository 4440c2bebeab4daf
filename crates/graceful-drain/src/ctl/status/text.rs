//! `-o text`: the [`Report`] as lines and kubectl-style tables, in the report's order —
//! each release first, its protection at its top, since that says whether any of the rest
//! is protected at all; with several releases, a line saying so above them.

use super::release::Release;
use super::report::{
    Condition, DeleterLease, EventRow, HookRow, IsolatedPod, LifecycleApi, NodeAgent, NodeRow,
    Protection, ReleaseReport, RemovedBy, Report, Section,
};

/// The whole report as text.
pub fn text(report: &Report) -> String {
    let releases: Vec<&ReleaseReport> = std::iter::once(&report.release)
        .chain(&report.other_releases)
        .collect();
    let mut parts = Vec::new();
    if releases.len() > 1 {
        parts.push(several_line(&releases));
    }
    for r in releases {
        parts.push(
            release_line(&r.release)
                + &section("Protection", &r.protection, protection_line)
                + &section("Deleter Lease", &r.deleter_lease, deleter_line),
        );
        parts.push(section("Node agents", &r.agents, |a| agents_table(a)));
    }
    parts.push(section("Isolated pods", &report.isolated_pods, |p| {
        isolated_table(p)
    }));
    let mut events = section("LifecycleEvents", &report.lifecycle_events, |e| {
        events_table(e)
    });
    for skipped in &report.skipped_lifecycle_events {
        events.push_str(&format!("warning: {skipped}\n"));
    }
    parts.push(events);
    parts.push(section("Nodes", &report.nodes, |n| nodes_table(n)));
    if !report.hooks.is_empty() {
        parts.push(hooks_table(&report.hooks));
    }
    parts.push(apis_table(&report.lifecycle_apis));
    parts.join("\n")
}

/// `2 graceful-drain releases: a in namespace x, b in namespace y; …`.
pub fn several_line(releases: &[&ReleaseReport]) -> String {
    let names: Vec<String> = releases.iter().map(|r| r.release.describe()).collect();
    format!(
        "{} graceful-drain releases: {}; each is shown below (pick one with --release NAME \
         or --namespace NS)\n",
        releases.len(),
        names.join(", ")
    )
}

/// `Release x in namespace y: webhook deployment/…, node agents daemonset/…`, or where
/// nothing carries the chart's labels, what is shown instead.
pub fn release_line(r: &Release) -> String {
    if let Some(note) = &r.note {
        return format!(
            "Release: none found ({note}); showing namespace {}\n",
            r.namespace
        );
    }
    let webhook = match &r.webhook {
        Some(d) => format!("webhook deployment/{d}"),
        None => "no webhook Deployment".into(),
    };
    let agent = match &r.agent {
        Some(ds) => format!("node agents daemonset/{ds}"),
        None => "no node-agent DaemonSet".into(),
    };
    format!("Release {}: {webhook}, {agent}\n", r.describe())
}

fn section<T>(title: &str, section: &Section<T>, show: impl Fn(&T) -> String) -> String {
    match section {
        Section::Available(value) => show(value),
        Section::Unavailable { unavailable } => format!("{title}: unavailable ({unavailable})\n"),
    }
}

/// `Protection: active (checked 12s ago, verified 12s ago)`, with the last failure.
pub fn protection_line(p: &Protection) -> String {
    let mut details = Vec::new();
    if let Some(reason) = &p.reason {
        details.push(reason.clone());
    }
    if let Some(age) = &p.checked_age {
        details.push(format!("checked {age} ago"));
    }
    match &p.verified_age {
        Some(age) => details.push(format!("verified {age} ago")),
        None if p.checked_at.is_some() => details.push("never verified".into()),
        None => {}
    }
    let mut line = format!("Protection: {}", p.state);
    if !details.is_empty() {
        line.push_str(&format!(" ({})", details.join(", ")));
    }
    if let Some(message) = &p.message {
        line.push_str(&format!(": {message}"));
    }
    line + "\n"
}

/// `Deleter Lease ns/name: held by X (renewed 1s ago, expires in 14s)`.
pub fn deleter_line(d: &DeleterLease) -> String {
    let holder = match &d.holder {
        Some(holder) => format!("held by {holder}"),
        None => "not held: no deferred deleter runs".into(),
    };
    let mut details = Vec::new();
    if let Some(age) = &d.renewed_age {
        details.push(format!("renewed {age} ago"));
    }
    if d.holder.is_some() {
        details.push(if d.expired { "EXPIRED" } else { "live" }.to_string());
    }
    let details = if details.is_empty() {
        String::new()
    } else {
        format!(" ({})", details.join(", "))
    };
    format!("Deleter Lease {}: {holder}{details}\n", d.lease)
}

/// The isolated pods, or a line saying there are none.
pub fn isolated_table(pods: &[IsolatedPod]) -> String {
    if pods.is_empty() {
        return "No isolated pods.\n".into();
    }
    let mut table =
        vec![["ISOLATED POD", "NODE", "DELETE AT", "DELETE", "REMOVED BY"].map(String::from)];
    for p in pods {
        let mut removed_by = match (p.removed_by, &p.restore_at, &p.restore_in) {
            (RemovedBy::Caller, Some(at), Some(when)) => {
                format!("caller (else restored at {at}, {when})")
            }
            (RemovedBy::Caller, _, _) => "caller".into(),
            (RemovedBy::Deleter, _, _) => "deleter".into(),
        };
        if p.terminating {
            removed_by.push_str(", terminating");
        }
        table.push([
            format!("{}/{}", p.namespace, p.name),
            p.node.clone().unwrap_or_else(|| "-".into()),
            p.delete_at.map_or("-".into(), |t| t.to_string()),
            p.delete_in.clone().unwrap_or_else(|| "-".into()),
            removed_by,
        ]);
    }
    format_table(&table)
}

/// One row per node with its agent pod and the node's LifecycleTransition reason. Rows
/// start with the agent pod (`none` where a node has none), so the only row that starts
/// with a node's name is its row of the Nodes table.
pub fn agents_table(agents: &[NodeAgent]) -> String {
    if agents.is_empty() {
        return "No nodes and no node agents.\n".into();
    }
    let mut table = vec![["AGENT", "NODE", "READY", "LIFECYCLETRANSITION"].map(String::from)];
    for a in agents {
        table.push([
            a.pod.clone().unwrap_or_else(|| "none".into()),
            a.node.clone().unwrap_or_else(|| "<unscheduled>".into()),
            match a.ready {
                None => "-",
                Some(true) => "yes",
                Some(false) => "no",
            }
            .into(),
            a.lifecycle_transition.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    format_table(&table)
}

/// Which lifecycle APIs discovery lists, with their resources.
pub fn apis_table(apis: &[LifecycleApi]) -> String {
    let mut table = vec![["API", "SERVED", "RESOURCES", "NOTE"].map(String::from)];
    for a in apis {
        table.push([
            a.group_version.clone(),
            if a.served { "yes" } else { "no" }.into(),
            a.resources.join(","),
            a.note.clone(),
        ]);
    }
    format_table(&table)
}

/// The last run of each maintenance hook.
pub fn hooks_table(hooks: &[HookRow]) -> String {
    let mut table =
        vec![["NODE", "HOOK", "AT", "EVENT", "STATE", "AGE", "MESSAGE"].map(String::from)];
    for h in hooks {
        table.push([
            h.node.clone(),
            h.hook.clone(),
            h.at.clone(),
            h.event.clone(),
            h.state.clone(),
            h.age.clone(),
            h.message.clone(),
        ]);
    }
    format_table(&table)
}

/// The events table, or a line saying there are none.
pub fn events_table(events: &[EventRow]) -> String {
    if events.is_empty() {
        return "No lifecycleevents.\n".to_string();
    }
    let mut table = vec![["NAME", "TRANSITION", "NODE", "STATUS", "AGE"].map(String::from)];
    for e in events {
        table.push([
            e.name.clone(),
            e.transition.clone(),
            e.node.clone(),
            e.status.clone(),
            e.age.clone().unwrap_or_else(|| "<unknown>".into()),
        ]);
    }
    format_table(&table)
}

/// The nodes table: reason of each lifecycle condition, `-` when absent.
pub fn nodes_table(nodes: &[NodeRow]) -> String {
    use graceful_drain_core::labels::node_condition::{DRAIN_IN_PROGRESS, DRAINED};
    use graceful_drain_core::lifecycle::TRANSITION_CONDITION;
    let mut table = vec![
        [
            "NODE",
            TRANSITION_CONDITION,
            DRAIN_IN_PROGRESS,
            DRAINED,
            "SCHEDULABLE",
        ]
        .map(String::from),
    ];
    let reason = |c: &Option<Condition>| match c {
        None => "-".to_string(),
        Some(c) if c.status == "True" => c.reason.clone(),
        Some(c) => format!("{} ({})", c.reason, c.status),
    };
    for n in nodes {
        table.push([
            n.name.clone(),
            reason(&n.lifecycle_transition),
            reason(&n.drain_in_progress),
            reason(&n.drained),
            if n.schedulable {
                "yes"
            } else {
                "no (cordoned)"
            }
            .to_string(),
        ]);
    }
    format_table(&table)
}

fn format_table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}
