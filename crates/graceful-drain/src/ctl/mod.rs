//! `graceful-drain drain | uncordon | status`: create LifecycleEvents and follow them.
//!
//! `drain` and `uncordon` check that the node and the transition exist, create a
//! LifecycleEvent bound to the node (or follow one already running for it), then
//! [`follow`] it live until it ends: Succeeded exits 0; Failed, SlaExpired or the
//! `--timeout` exit non-zero naming what blocked the drain. `status` reports the
//! webhook's protection, isolated pods, node agents, events and the nodes' transition
//! conditions as text, JSON or YAML ([`mod@status`]). All three find the cluster as
//! kubectl does ([`connect`]) and list LifecycleEvents so that one malformed object is
//! named and skipped, not fatal for the others ([`events`]).

pub mod connect;
pub mod display;
pub mod events;
pub mod follow;
pub mod status;

use std::time::Duration;

use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, ResourceExt};

use graceful_drain_core::lifecycle::{
    ClaimStatus, DRAIN_TRANSITION, LifecycleEvent, LifecycleEventSpec, LifecycleTransition,
    MAINTENANCE_TRANSITION,
};

/// How often the node's conditions and Events are re-read while following.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Exit codes of `drain` and `uncordon` (documented in docs/lifecycle.md).
pub mod exit {
    /// Any other failure: no credentials, an API error, a missing node or transition.
    pub const ERROR: u8 = 1;
    /// A usage error (what clap exits with for a bad flag).
    pub const USAGE: u8 = 2;
    /// The LifecycleEvent ended Failed.
    pub const FAILED: u8 = 3;
    /// The LifecycleEvent ended SlaExpired.
    pub const SLA_EXPIRED: u8 = 4;
    /// `--timeout` or `--claim-timeout` passed first; the event may continue server-side.
    pub const TIMED_OUT: u8 = 5;
    /// Interrupted by a signal; the event continues server-side.
    pub const INTERRUPTED: u8 = 130;
}

/// Errors of the CLI.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No cluster credentials, or unusable ones.
    #[error(transparent)]
    Connect(#[from] connect::Error),
    /// `--release` names no release `status` can find.
    #[error(
        "no graceful-drain release {release} {place} (no Deployment or DaemonSet labelled \
         {selector}); `helm list -A` lists the releases"
    )]
    ReleaseNotFound {
        /// The `--release` asked for.
        release: String,
        /// `in namespace NS` or `in any namespace`.
        place: String,
        /// The label selector searched with.
        selector: String,
    },
    /// The node does not exist.
    #[error("node {node} not found")]
    NodeNotFound {
        /// The node named on the command line.
        node: String,
    },
    /// The lifecycle.graceful-drain.io CRDs are not installed.
    #[error(
        "lifecycle.graceful-drain.io CRDs not installed (no lifecycletransitions resource); \
         run: graceful-drain crds | kubectl apply -f -"
    )]
    CrdsMissing,
    /// The transition does not exist.
    #[error(
        "lifecycletransition {name} not found: is the graceful-drain node agent running? \
         (it publishes its transitions when it starts)"
    )]
    TransitionNotFound {
        /// The `--transition` asked for.
        name: String,
    },
    /// An API call failed.
    #[error("{what}")]
    Kube {
        /// The call and its object, such as `get node n1`.
        what: String,
        /// The API server's or the client's error.
        #[source]
        source: kube::Error,
    },
    /// The event ended without success.
    #[error("{verb} of node {node} ended {status} after {elapsed}: {reason}")]
    Ended {
        /// `drain` or `uncordon`.
        verb: &'static str,
        /// The node.
        node: String,
        /// `Failed`, `SlaExpired`, or `deleted` when the event vanished unfinished.
        status: String,
        /// Time followed, such as `4m5s`.
        elapsed: String,
        /// The reconciler's message and what still blocked the node, or `no reason
        /// recorded`.
        reason: String,
    },
    /// `--timeout` or `--claim-timeout` passed first.
    #[error(
        "{verb} of node {node} not finished after {elapsed} (lifecycleevent {event} is \
         {status}; it continues server-side): {reason}"
    )]
    TimedOut {
        /// `drain` or `uncordon`.
        verb: &'static str,
        /// The node.
        node: String,
        /// Name of the LifecycleEvent, which is left in place.
        event: String,
        /// Its claim status when the follower gave up (`Pending` if none was seen).
        status: String,
        /// Time followed, such as `10m0s`.
        elapsed: String,
        /// Why it is not done: what blocks it on the node, the last node Event, or that no
        /// reconciler claimed it; after `--timeout`, also the last Warning on the node and,
        /// for a drain, the pods left.
        reason: String,
    },
    /// Interrupted by a signal.
    #[error(
        "interrupted; lifecycleevent {event} continues server-side \
         (cancel it with: kubectl delete lifecycleevent {event})"
    )]
    Interrupted {
        /// Name of the LifecycleEvent, which is left in place.
        event: String,
    },
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The process exit code this error maps to (see [`exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Ended { status, .. } if status == "SlaExpired" => exit::SLA_EXPIRED,
            Self::Ended { .. } => exit::FAILED,
            Self::TimedOut { .. } => exit::TIMED_OUT,
            Self::Interrupted { .. } => exit::INTERRUPTED,
            _ => exit::ERROR,
        }
    }

    fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            what: what.into(),
            source,
        }
    }
}

/// Arguments of `graceful-drain drain`.
#[derive(Clone, Debug, clap::Args)]
pub struct DrainArgs {
    /// Node to drain.
    pub node: String,
    /// Follow the drain until it ends (the default); `--wait=false` only creates the event.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,
    /// Give up following after this long (e.g. `10m`); the drain continues server-side.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// How long the event may stay unclaimed.
    #[command(flatten)]
    pub claim: ClaimArgs,
    /// The drain LifecycleTransition (the node agent's `--drain-transition`).
    #[arg(long, default_value = DRAIN_TRANSITION, env = "GRACEFUL_DRAIN_DRAIN_TRANSITION")]
    pub transition: String,
    /// Which cluster to talk to.
    #[command(flatten)]
    pub connect: connect::ConnectArgs,
}

/// How long a new event may stay unclaimed.
#[derive(Clone, Debug, clap::Args)]
pub struct ClaimArgs {
    /// Give up when no reconciler has claimed the event after this long (no node agent on
    /// the node, or a kubelet without SLM and no lifecycle reconciler); `0s` waits forever.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration, env = "GRACEFUL_DRAIN_CLAIM_TIMEOUT")]
    pub claim_timeout: Duration,
}

impl ClaimArgs {
    fn limit(&self) -> Option<Duration> {
        (!self.claim_timeout.is_zero()).then_some(self.claim_timeout)
    }
}

/// Arguments of `graceful-drain uncordon`.
#[derive(Clone, Debug, clap::Args)]
pub struct UncordonArgs {
    /// Node to return to service.
    pub node: String,
    /// Follow until the node is back in service (the default); `--wait=false` only creates the event.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,
    /// Give up following after this long; the transition continues server-side.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// How long the event may stay unclaimed.
    #[command(flatten)]
    pub claim: ClaimArgs,
    /// The maintenance-complete LifecycleTransition (the node agent's
    /// `--maintenance-transition`).
    #[arg(long, default_value = MAINTENANCE_TRANSITION, env = "GRACEFUL_DRAIN_MAINTENANCE_TRANSITION")]
    pub transition: String,
    /// Which cluster to talk to.
    #[command(flatten)]
    pub connect: connect::ConnectArgs,
}

/// Arguments of `graceful-drain status`.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    /// Only this node.
    pub node: Option<String>,
    /// How to print the report.
    #[arg(short, long, value_enum, default_value_t = status::Output::Text)]
    pub output: status::Output,
    /// Look for the install only in this namespace (default: every namespace; where no
    /// release carries the chart's labels, the webhook's Lease and the node agents are
    /// looked for in `graceful-drain`).
    #[arg(short, long, env = "GRACEFUL_DRAIN_NAMESPACE")]
    pub namespace: Option<String>,
    /// Only the Helm release of this name (its `app.kubernetes.io/instance` label).
    #[arg(long, value_name = "NAME", env = "GRACEFUL_DRAIN_RELEASE")]
    pub release: Option<String>,
    /// Which cluster to talk to.
    #[command(flatten)]
    pub connect: connect::ConnectArgs,
}

/// One `drain` or `uncordon` request.
#[derive(Clone, Debug)]
pub struct Request {
    /// `drain` or `uncordon`, for messages and the event name.
    pub verb: &'static str,
    /// The node the event is bound to.
    pub node: String,
    /// The LifecycleTransition to run; it must exist.
    pub transition: String,
    /// Follow the event to its end; `false` returns once it is created or found.
    pub wait: bool,
    /// Give up following after this long (the event continues); `None` waits forever.
    pub timeout: Option<Duration>,
    /// Give up when the event is still unclaimed after this long; `None` waits forever.
    pub claim_timeout: Option<Duration>,
    /// How often node conditions are re-read while following.
    pub poll: Duration,
}

/// Runs `drain`.
pub async fn drain(
    args: DrainArgs,
    shutdown: graceful_drain_core::runtime::Shutdown,
) -> anyhow::Result<()> {
    let client = args.connect.client().await.map_err(Error::Connect)?;
    let request = Request {
        verb: "drain",
        node: args.node,
        transition: args.transition,
        wait: args.wait,
        timeout: args.timeout,
        claim_timeout: args.claim.limit(),
        poll: POLL_INTERVAL,
    };
    execute(&client, &request, &shutdown).await?;
    Ok(())
}

/// Runs `uncordon`.
pub async fn uncordon(
    args: UncordonArgs,
    shutdown: graceful_drain_core::runtime::Shutdown,
) -> anyhow::Result<()> {
    let client = args.connect.client().await.map_err(Error::Connect)?;
    let request = Request {
        verb: "uncordon",
        node: args.node,
        transition: args.transition,
        wait: args.wait,
        timeout: args.timeout,
        claim_timeout: args.claim.limit(),
        poll: POLL_INTERVAL,
    };
    execute(&client, &request, &shutdown).await?;
    Ok(())
}

/// Runs `status`.
pub async fn status(
    args: StatusArgs,
    _shutdown: graceful_drain_core::runtime::Shutdown,
) -> anyhow::Result<()> {
    let StatusArgs {
        node,
        output,
        namespace,
        release,
        connect,
    } = args;
    let client = connect.client().await.map_err(Error::Connect)?;
    let scope = status::Scope { namespace, release };
    let fetched = status::fetch(&client, &scope, node.as_deref()).await?;
    let report = status::report::report(&fetched, jiff::Timestamp::now());
    print!("{}", status::format(&report, output)?);
    Ok(())
}

/// Checks, creates (or joins) the event and, with `wait`, follows it to its end.
/// Returns the event's name.
pub async fn execute(
    client: &kube::Client,
    request: &Request,
    shutdown: &graceful_drain_core::runtime::Shutdown,
) -> Result<String> {
    let transition = preflight(client, request).await?;
    let event = match running_event(client, request).await? {
        Some(event) => {
            println!(
                "lifecycleevent/{} already runs {} on node {}; following it",
                event.name_any(),
                request.transition,
                request.node
            );
            event
        }
        None => {
            let event = create_event(client, request).await?;
            println!("lifecycleevent/{} created", event.name_any());
            event
        }
    };
    let name = event.name_any();
    if !request.wait {
        return Ok(name);
    }
    follow::follow(client, request, &transition, event, shutdown).await?;
    Ok(name)
}

/// The node and the transition must exist; a 404 on the resource itself means the CRDs
/// are not installed.
async fn preflight(client: &kube::Client, request: &Request) -> Result<LifecycleTransition> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = &request.node;
    match nodes.get_opt(node).await {
        Ok(Some(_)) => {}
        Ok(None) => return Err(Error::NodeNotFound { node: node.clone() }),
        Err(e) => return Err(Error::kube(format!("get node {node}"), e)),
    }
    let transitions: Api<LifecycleTransition> = Api::all(client.clone());
    match transitions.list(&ListParams::default().limit(1)).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Err(Error::CrdsMissing),
        Err(e) => return Err(Error::kube("list lifecycletransitions", e)),
    }
    let name = &request.transition;
    match transitions.get_opt(name).await {
        Ok(Some(t)) => Ok(t),
        Ok(None) => Err(Error::TransitionNotFound { name: name.clone() }),
        Err(e) => Err(Error::kube(format!("get lifecycletransition {name}"), e)),
    }
}

/// An unfinished event for the same node and transition, if one exists: following it
/// beats queueing a duplicate behind it. An event that does not parse is skipped with one
/// warning line naming it.
async fn running_event(client: &kube::Client, request: &Request) -> Result<Option<LifecycleEvent>> {
    let listed = match events::list(client).await {
        Ok(listed) => listed,
        Err(kube::Error::Api(s)) if s.code == 404 => return Err(Error::CrdsMissing),
        Err(e) => return Err(Error::kube("list lifecycleevents", e)),
    };
    for skipped in &listed.skipped {
        tracing::warn!("{skipped}");
    }
    Ok(listed.events.into_iter().find(|e| {
        let claim = e.status.as_ref().and_then(|s| s.claim_status);
        e.spec.binding_node == request.node
            && e.spec.transition_name == request.transition
            && e.metadata.deletion_timestamp.is_none()
            && !claim.is_some_and(ClaimStatus::is_terminal)
    }))
}

async fn create_event(client: &kube::Client, request: &Request) -> Result<LifecycleEvent> {
    let events: Api<LifecycleEvent> = Api::all(client.clone());
    let mut event = LifecycleEvent::new(
        "",
        LifecycleEventSpec {
            transition_name: request.transition.clone(),
            binding_node: request.node.clone(),
        },
    );
    event.metadata = ObjectMeta {
        generate_name: Some(format!("{}-{}-", request.node, request.verb)),
        ..ObjectMeta::default()
    };
    match events.create(&PostParams::default(), &event).await {
        Ok(event) => Ok(event),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::CrdsMissing),
        Err(e) => Err(Error::kube(
            format!("create lifecycleevent for node {}", request.node),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        drain: DrainArgs,
    }

    #[test]
    fn wait_is_the_default_and_takes_an_explicit_false() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap().drain;
        let d = parse(&["x", "worker-1"]);
        assert!(d.wait);
        assert_eq!(d.timeout, None);
        let d = parse(&["x", "--wait", "worker-1", "--timeout", "90s"]);
        assert!(d.wait);
        assert_eq!(d.node, "worker-1");
        assert_eq!(d.timeout, Some(Duration::from_secs(90)));
        assert!(!parse(&["x", "worker-1", "--wait=false"]).wait);
        assert!(Cli::try_parse_from(["x", "worker-1", "--timeout", "soon"]).is_err());
        assert_eq!(d.claim.limit(), Some(Duration::from_secs(120)));
        assert_eq!(
            parse(&["x", "n", "--claim-timeout", "0s"]).claim.limit(),
            None
        );
    }

    #[test]
    fn the_transition_follows_the_agents_configuration() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap().drain;
        assert_eq!(parse(&["x", "n"]).transition, DRAIN_TRANSITION);
        assert_eq!(
            parse(&["x", "n", "--transition", "site-drain"]).transition,
            "site-drain"
        );
    }

    #[test]
    fn each_way_a_drain_ends_has_its_exit_code() {
        let ended = |status: &str| Error::Ended {
            verb: "drain",
            node: "n".into(),
            status: status.into(),
            elapsed: "1s".into(),
            reason: "r".into(),
        };
        let timed_out = Error::TimedOut {
            verb: "drain",
            node: "n".into(),
            event: "e".into(),
            status: "Pending".into(),
            elapsed: "2m".into(),
            reason: "never claimed".into(),
        };
        let codes = [
            ended("Failed").exit_code(),
            ended("SlaExpired").exit_code(),
            timed_out.exit_code(),
            Error::Interrupted { event: "e".into() }.exit_code(),
            Error::NodeNotFound { node: "n".into() }.exit_code(),
        ];
        assert_eq!(
            codes,
            [
                exit::FAILED,
                exit::SLA_EXPIRED,
                exit::TIMED_OUT,
                exit::INTERRUPTED,
                exit::ERROR
            ]
        );
        let distinct: std::collections::BTreeSet<u8> =
            codes.into_iter().chain([exit::USAGE]).collect();
        assert_eq!(distinct.len(), 6);
    }
}
