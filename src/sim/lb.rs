//! The load-balancer model: one load balancer per `LoadBalancer` Service, whose targets
//! follow the ready endpoints of the Service's EndpointSlices with lags, like a cloud
//! load balancer in IP-target mode.
//!
//! A ready endpoint becomes a target `registration_lag` after it is first seen ready.
//! An endpoint that stops being ready (or leaves the slice) keeps receiving new requests
//! for `deregistration_lag` (an ALB was seen routing to draining targets for 15–19 s),
//! then is dropped. The state is pure ([`LoadBalancers::sync`], [`LoadBalancers::route`]);
//! [`run`] feeds it from a watch on Services and EndpointSlices.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::watcher;

use super::traffic::timeline::{EventKind, Timeline};
use crate::runtime::Shutdown;

/// Label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Lags of the simulated load balancers.
#[derive(Clone, Copy, Debug)]
pub struct LbConfig {
    /// From "ready in the slice" to "receives requests".
    pub registration_lag: Duration,
    /// From "not ready / gone from the slice" to "receives no new requests".
    pub deregistration_lag: Duration,
}

#[derive(Debug)]
struct Target {
    pod: String,
    seen_ready: Instant,
    removed: Option<Instant>,
}

#[derive(Debug, Default)]
struct Balancer {
    /// Targets by pod UID.
    targets: BTreeMap<String, Target>,
    next: usize,
}

/// Every simulated load balancer, keyed by Service (`ns/name`). Cheap to clone.
#[derive(Clone, Debug)]
pub struct LoadBalancers {
    cfg: LbConfig,
    timeline: Timeline,
    inner: Arc<Mutex<HashMap<String, Balancer>>>,
}

/// A ready endpoint: pod UID and `ns/name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyEndpoint {
    pub uid: String,
    pub pod: String,
}

impl LoadBalancers {
    /// No load balancers yet.
    pub fn new(cfg: LbConfig, timeline: Timeline) -> Self {
        Self {
            cfg,
            timeline,
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Balancer>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Updates the targets of `service` from its ready endpoints as seen at `now`.
    pub fn sync(&self, service: &str, ready: &[ReadyEndpoint], now: Instant) {
        let cfg = self.cfg;
        let mut all = self.lock();
        let lb = all.entry(service.to_string()).or_default();
        for ep in ready {
            let revive = lb.targets.get(&ep.uid).map(|t| match t.removed {
                None => true,
                Some(removed) => now < removed + cfg.deregistration_lag,
            });
            match revive {
                Some(true) => {
                    if let Some(t) = lb.targets.get_mut(&ep.uid) {
                        t.removed = None;
                    }
                }
                Some(false) | None => {
                    let target = Target {
                        pod: ep.pod.clone(),
                        seen_ready: now,
                        removed: None,
                    };
                    lb.targets.insert(ep.uid.clone(), target);
                    let at = now + cfg.registration_lag;
                    self.timeline.record_at(at, EventKind::Registered, &ep.pod);
                }
            }
        }
        let ready_uids: std::collections::HashSet<&str> =
            ready.iter().map(|e| e.uid.as_str()).collect();
        lb.targets.retain(|uid, t| {
            if t.removed.is_some() || ready_uids.contains(uid.as_str()) {
                return t.removed.is_none_or(|r| now < r + cfg.deregistration_lag);
            }
            self.timeline
                .record_at(now, EventKind::RemovedFromSlice, &t.pod);
            if t.seen_ready + cfg.registration_lag > now {
                // Never registered: the load balancer simply never routes to it.
                return false;
            }
            t.removed = Some(now);
            let at = now + cfg.deregistration_lag;
            self.timeline.record_at(at, EventKind::Deregistered, &t.pod);
            true
        });
    }

    /// Pod UIDs `service` routes new requests to at `now`, in a stable order.
    pub fn routable(&self, service: &str, now: Instant) -> Vec<String> {
        let cfg = self.cfg;
        self.lock()
            .get(service)
            .map(|lb| {
                lb.targets
                    .iter()
                    .filter(|(_, t)| routable(t, cfg, now))
                    .map(|(uid, _)| uid.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Pod UIDs registered in `service` at `now` and still in its slices (routable and
    /// not being deregistered).
    pub fn registered(&self, service: &str, now: Instant) -> Vec<String> {
        let cfg = self.cfg;
        self.lock()
            .get(service)
            .map(|lb| {
                lb.targets
                    .iter()
                    .filter(|(_, t)| t.removed.is_none() && routable(t, cfg, now))
                    .map(|(uid, _)| uid.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Picks the target of the next request to `service` (round robin), if any:
    /// `(pod UID, ns/name)`.
    pub fn route(&self, service: &str, now: Instant) -> Option<(String, String)> {
        let cfg = self.cfg;
        let mut all = self.lock();
        let lb = all.get_mut(service)?;
        let live: Vec<(&String, &Target)> = lb
            .targets
            .iter()
            .filter(|(_, t)| routable(t, cfg, now))
            .collect();
        if live.is_empty() {
            return None;
        }
        let (uid, target) = live[lb.next % live.len()];
        let pick = (uid.clone(), target.pod.clone());
        lb.next = lb.next.wrapping_add(1);
        Some(pick)
    }
}

fn routable(t: &Target, cfg: LbConfig, now: Instant) -> bool {
    t.seen_ready + cfg.registration_lag <= now
        && t.removed.is_none_or(|r| now < r + cfg.deregistration_lag)
}

/// The ready endpoints of one Service's slices.
pub fn ready_endpoints<'a>(slices: impl Iterator<Item = &'a EndpointSlice>) -> Vec<ReadyEndpoint> {
    let mut out = Vec::new();
    for slice in slices {
        for ep in &slice.endpoints {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready) == Some(true);
            let Some(target) = ep.target_ref.as_ref().filter(|_| ready) else {
                continue;
            };
            let (Some(uid), Some(name)) = (&target.uid, &target.name) else {
                continue;
            };
            let ns = target.namespace.clone().unwrap_or_default();
            out.push(ReadyEndpoint {
                uid: uid.clone(),
                pod: format!("{ns}/{name}"),
            });
        }
    }
    out
}

/// Gives a LoadBalancer Service its external hostname (`<name>.<ns>.lb.sim`), as a
/// cloud controller does once the load balancer exists. Returns whether it is set.
async fn publish_ingress(client: &kube::Client, svc: &Service) -> bool {
    let has_ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    if has_ingress {
        return true;
    }
    let (ns, name) = super::controllers::ns_name(svc);
    let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"hostname": format!("{name}.{ns}.lb.sim")}]}}});
    let api: Api<Service> = Api::namespaced(client.clone(), &ns);
    match api
        .patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => true,
        Err(error) => {
            tracing::debug!(service = %format!("{ns}/{name}"), %error, "publish load balancer hostname failed");
            false
        }
    }
}

/// Feeds `lbs` from watches on Services and EndpointSlices (as the cloud controller
/// would) until `shutdown`. A timer also runs `sync`, so deregistrations expire.
pub async fn run(
    client: kube::Client,
    lbs: LoadBalancers,
    shutdown: Shutdown,
) -> Result<(), super::controllers::Error> {
    let watches = super::controllers::Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let services = watches.all::<Service>();
    let slices =
        watches.matching::<EndpointSlice>(watcher::Config::default().labels(SERVICE_NAME_LABEL));
    // Expired deregistrations are dropped on the next sync; half a second keeps the
    // target map small without mattering to routing (routing checks the time itself).
    let tick = Duration::from_millis(500);
    let mut published = std::collections::HashSet::new();
    loop {
        let now = Instant::now();
        for svc in services.state() {
            if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer") {
                continue;
            }
            let (ns, name) = super::controllers::ns_name(&*svc);
            let mine = slices.state();
            let mine = mine.iter().map(|s| &**s).filter(|s| {
                s.metadata.namespace.as_deref() == Some(ns.as_str())
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SERVICE_NAME_LABEL))
                        == Some(&name)
            });
            let key = format!("{ns}/{name}");
            lbs.sync(&key, &ready_endpoints(mine), now);
            if !published.contains(&key) && publish_ingress(&client, &svc).await {
                published.insert(key);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LbConfig {
        LbConfig {
            registration_lag: Duration::from_secs(2),
            deregistration_lag: Duration::from_secs(10),
        }
    }

    fn ep(uid: &str) -> ReadyEndpoint {
        ReadyEndpoint {
            uid: uid.into(),
            pod: format!("ns/{uid}"),
        }
    }

    #[test]
    fn targets_follow_endpoints_with_lags() {
        let lbs = LoadBalancers::new(cfg(), Timeline::new());
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        lbs.sync("ns/web", &[ep("a"), ep("b")], t0);
        assert!(lbs.routable("ns/web", s(1)).is_empty(), "still registering");
        assert_eq!(lbs.routable("ns/web", s(2)), vec!["a", "b"]);
        lbs.sync("ns/web", &[ep("b")], s(3));
        // `a` left the slice but still gets new requests for the deregistration lag.
        assert_eq!(lbs.routable("ns/web", s(12)), vec!["a", "b"]);
        assert_eq!(lbs.registered("ns/web", s(12)), vec!["b"]);
        assert_eq!(lbs.routable("ns/web", s(13)), vec!["b"]);
        lbs.sync("ns/web", &[ep("b")], s(14));
        assert_eq!(
            lbs.route("ns/web", s(14)),
            Some(("b".into(), "ns/b".into()))
        );
        assert_eq!(lbs.route("ns/other", s(14)), None);
    }

    #[test]
    fn round_robin_and_unregistered_removal() {
        let lbs = LoadBalancers::new(cfg(), Timeline::new());
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        lbs.sync("x", &[ep("a"), ep("b")], t0);
        let picks: Vec<_> = (0..4)
            .filter_map(|_| lbs.route("x", s(3)).map(|r| r.0))
            .collect();
        assert_eq!(picks, vec!["a", "b", "a", "b"]);
        lbs.sync("x", &[ep("a"), ep("b"), ep("c")], s(4));
        // `c` leaves before it was ever registered: it never receives traffic.
        lbs.sync("x", &[ep("a"), ep("b")], s(5));
        assert_eq!(lbs.routable("x", s(7)), vec!["a", "b"]);
    }
}
