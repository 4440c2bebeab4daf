//! Protection observed, not assumed. With `failurePolicy: Ignore` every eviction and
//! DELETE passes unprotected, in silence, whenever the API server cannot reach the webhook
//! (a NetworkPolicy that does not admit the control plane, a wrong caBundle, every replica
//! down). So each replica asks the API server, every [`ProbeArgs::probe_interval`], for a
//! dry-run eviction of a pod that does not exist, [`PROBE_POD_PREFIX`]…, in a namespace
//! the webhook covers. The API server runs mutating admission before it looks the pod up,
//! so a reachable webhook is called (with `dryRun`, which our `NoneOnDryRun` side effects
//! allow) and answers with the warning [`SEEN_WARNING`]; the API server hands that back
//! as a `Warning` header of its 404 (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
//! create.go admits before `Create`; filters/warning.go writes the header). Any replica
//! may answer, so the probe checks the path the API server really uses.
//!
//! The outcome is exported (`protection_active`, `protection_verified_timestamp_seconds`),
//! written by the deleter Lease's holder into the Lease's annotations for
//! `graceful-drain status` (see [`Shared`]), and a change to lost is a Warning Event on
//! this replica's pod, whatever its readiness.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;

use super::metrics::Metrics;
use graceful_drain_core::labels::webhook_reason;
use graceful_drain_core::runtime::Shutdown;

/// Name prefix of the pods the probe evicts: none exists (a name no controller makes).
pub const PROBE_POD_PREFIX: &str = "graceful-drain-probe-";
/// The warning the webhook returns for a probe's review.
pub const SEEN_WARNING: &str = "graceful-drain.io/probe: reached the graceful-drain webhook";

/// Annotations of the deleter Lease that carry the probe's outcome (the vocabulary is
/// core's, which `graceful-drain status` reads).
pub use graceful_drain_core::labels::{
    PROTECTION_ANNOTATION, PROTECTION_CHECKED_AT_ANNOTATION as CHECKED_AT_ANNOTATION,
    PROTECTION_MESSAGE_ANNOTATION as MESSAGE_ANNOTATION,
    PROTECTION_VERIFIED_AT_ANNOTATION as VERIFIED_AT_ANNOTATION,
};

/// How the probe runs.
#[derive(Clone, Debug, clap::Args)]
pub struct ProbeArgs {
    /// How often to check that the API server calls the webhook (0s: never).
    #[arg(long, env = "GRACEFUL_DRAIN_PROBE_INTERVAL", default_value = "30s",
          value_parser = humantime::parse_duration)]
    pub probe_interval: Duration,
    /// A namespace the webhook configurations cover, where the probe's dry-run eviction
    /// is asked for (it names a pod that does not exist, and changes nothing).
    #[arg(
        long,
        env = "GRACEFUL_DRAIN_PROBE_NAMESPACE",
        default_value = "default"
    )]
    pub probe_namespace: String,
}

/// What the probe found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Protection {
    /// No probe has finished yet.
    #[default]
    Unknown,
    /// The last probe reached the webhook.
    Active,
    /// The last probe did not reach the webhook; why.
    Lost(String),
}

impl Protection {
    /// The value of [`PROTECTION_ANNOTATION`].
    pub fn as_str(&self) -> &'static str {
        use graceful_drain_core::labels::protection;
        match self {
            Protection::Unknown => protection::UNKNOWN,
            Protection::Active => protection::ACTIVE,
            Protection::Lost(_) => protection::LOST,
        }
    }
}

/// The probe's latest outcome, shared with the Lease elector, which publishes it.
#[derive(Debug, Default)]
pub struct Shared(Mutex<State>);

/// The latest outcome and when.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// What the last probe found.
    pub protection: Protection,
    /// When the last probe ran.
    pub checked_at: Option<Timestamp>,
    /// When a probe last reached the webhook.
    pub verified_at: Option<Timestamp>,
}

impl Shared {
    /// The latest outcome.
    pub fn get(&self) -> State {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records `protection` found at `now`; returns the outcome before it.
    fn set(&self, protection: Protection, now: Timestamp) -> Protection {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if protection == Protection::Active {
            state.verified_at = Some(now);
        }
        state.checked_at = Some(now);
        std::mem::replace(&mut state.protection, protection)
    }

    /// The Lease annotations that carry the outcome.
    pub fn annotations(&self) -> Vec<(&'static str, String)> {
        let state = self.get();
        let mut out = vec![(PROTECTION_ANNOTATION, state.protection.as_str().to_string())];
        if let Some(at) = state.checked_at {
            out.push((CHECKED_AT_ANNOTATION, at.to_string()));
        }
        if let Some(at) = state.verified_at {
            out.push((VERIFIED_AT_ANNOTATION, at.to_string()));
        }
        if let Protection::Lost(why) = &state.protection {
            out.push((MESSAGE_ANNOTATION, why.clone()));
        }
        out
    }
}

/// Whether an admission request is the probe's: a dry-run eviction of a probe pod.
pub fn is_probe(name: &str, dry_run: bool) -> bool {
    dry_run && name.starts_with(PROBE_POD_PREFIX)
}

/// What one probe's answer says: the webhook's warning among the answer's `Warning`
/// headers, whatever the status (404: the pod does not exist, as intended).
pub fn judge(status: http::StatusCode, warnings: &[String]) -> Protection {
    if warnings.iter().any(|w| w.contains(SEEN_WARNING)) {
        return Protection::Active;
    }
    Protection::Lost(format!(
        "the API server answered a dry-run eviction with {status} without calling the webhook: \
         check the webhook configurations' service and caBundle, the NetworkPolicy and that a replica is ready"
    ))
}

/// The texts of the `Warning` headers of an answer (`299 - "text"`).
fn warnings(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all(http::header::WARNING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| {
            let text = v.splitn(3, ' ').nth(2).unwrap_or(v);
            text.trim_matches('"').replace("\\\"", "\"")
        })
        .collect()
}

/// One probe: the dry-run eviction and what its answer says. A failed call (the API
/// server unreachable) says nothing about the webhook: `None`.
pub async fn probe_once(client: &kube::Client, namespace: &str) -> Option<Protection> {
    let name = format!("{PROBE_POD_PREFIX}{}", uuid::Uuid::new_v4().simple());
    let body = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace}});
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{namespace}/pods/{name}/eviction?dryRun=All"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(body.to_string().into_bytes())
    .ok()?;
    match client.send(request.map(kube::client::Body::from)).await {
        Ok(answer) => Some(judge(answer.status(), &warnings(answer.headers()))),
        Err(error) => {
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), "protection probe: the API server did not answer");
            None
        }
    }
}

/// Where a lost protection is reported as a Warning Event: this replica's pod.
#[derive(Clone)]
pub struct Reporter {
    /// Posts the Event.
    pub ctx: super::isolate::Context,
    /// This replica's pod, `namespace/name`.
    pub pod: Option<(String, String)>,
}

/// Probes every `args.probe_interval` until `shutdown`.
pub async fn run(
    client: kube::Client,
    args: ProbeArgs,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    reporter: Reporter,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    if args.probe_interval.is_zero() {
        return Ok(());
    }
    // The first probe after one interval: a replica still starting (not serving yet, or
    // the only one) must not report a loss.
    let start = tokio::time::Instant::now() + args.probe_interval;
    let mut tick = tokio::time::interval_at(start, args.probe_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return Ok(()),
        }
        let Some(found) = probe_once(&client, &args.probe_namespace).await else {
            continue;
        };
        let now = Timestamp::now();
        metrics
            .protection_active
            .set(i64::from(found == Protection::Active));
        if found == Protection::Active {
            metrics
                .protection_verified
                .set(now.as_millisecond() as f64 / 1000.0);
        }
        let before = shared.set(found.clone(), now);
        if let Protection::Lost(why) = &found
            && before != found
        {
            tracing::error!(%why, "protection lost: evictions and deletes pass unprotected");
            report_lost(&reporter, why, now).await;
        } else if found == Protection::Active && matches!(before, Protection::Lost(_)) {
            tracing::info!("protection back: the API server calls the webhook again");
        }
    }
}

async fn report_lost(reporter: &Reporter, why: &str, now: Timestamp) {
    let Some((namespace, name)) = &reporter.pod else {
        return;
    };
    let pod = super::decide::PodFacts {
        namespace: namespace.clone(),
        name: name.clone(),
        ..super::decide::PodFacts::default()
    };
    let message = format!(
        "Evictions and deletes pass unprotected: {why} (failurePolicy Ignore lets them through)"
    );
    super::isolate::record_event(
        &reporter.ctx,
        &pod,
        super::isolate::Severity::Warning,
        webhook_reason::PROTECTION_LOST,
        &message,
        now,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhooks_warning_in_the_answer_is_what_proves_protection() {
        let seen = vec![format!("{SEEN_WARNING} (replica w-1)")];
        assert_eq!(
            judge(http::StatusCode::NOT_FOUND, &seen),
            Protection::Active
        );
        let lost = judge(http::StatusCode::NOT_FOUND, &[]);
        assert!(
            matches!(&lost, Protection::Lost(why) if why.contains("404")),
            "{lost:?}"
        );
    }

    #[test]
    fn warning_headers_are_read_as_the_api_server_writes_them() {
        let mut headers = http::HeaderMap::new();
        let value = format!("299 - \"{SEEN_WARNING} (replica w-1)\"");
        headers.append(http::header::WARNING, value.parse().unwrap());
        headers.append(http::header::WARNING, "299 - \"other\"".parse().unwrap());
        let read = warnings(&headers);
        assert_eq!(read.len(), 2);
        assert!(read[0].starts_with(SEEN_WARNING), "{read:?}");
    }

    #[test]
    fn only_dry_run_evictions_of_probe_pods_are_probes() {
        assert!(is_probe("graceful-drain-probe-abc", true));
        assert!(!is_probe("graceful-drain-probe-abc", false));
        assert!(!is_probe("web-1", true));
    }

    #[test]
    fn the_lease_annotations_say_what_the_last_probe_found() {
        let shared = Shared::default();
        assert_eq!(
            shared.annotations(),
            vec![(PROTECTION_ANNOTATION, "unknown".into())]
        );
        let t1: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-01T00:00:30Z".parse().unwrap();
        shared.set(Protection::Active, t1);
        shared.set(Protection::Lost("no call".into()), t2);
        let annotations = shared.annotations();
        assert!(annotations.contains(&(PROTECTION_ANNOTATION, "lost".into())));
        assert!(annotations.contains(&(VERIFIED_AT_ANNOTATION, t1.to_string())));
        assert!(annotations.contains(&(CHECKED_AT_ANNOTATION, t2.to_string())));
        assert!(annotations.contains(&(MESSAGE_ANNOTATION, "no call".into())));
    }
}
