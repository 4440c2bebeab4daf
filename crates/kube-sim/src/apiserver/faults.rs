//! Fault injection: the ways a real API server under load misbehaves, so tests show
//! that our clients cope. Every fault is off by default.
//!
//! * Throttling as API Priority and Fairness does it (staging/src/k8s.io/apiserver/pkg/
//!   server/filters/priority-and-fairness.go): a share of resource requests is answered
//!   429 `TooManyRequests` with `Retry-After`. Requests of `system:masters` are exempt,
//!   like upstream's mandatory `exempt` FlowSchema.
//! * Added latency before every resource request is served.
//! * A burst of 429s: the next few requests of one user with one verb on one resource
//!   throttled, so a test can show exactly which call a client must survive.
//! * Watch streams cut with an ERROR event carrying a 410 Gone Status (what a client sees
//!   when etcd compacted past its resourceVersion), which forces a relist.
//! * A verb on a resource refused to one user with 403 `Forbidden`, worded as RBAC words
//!   it (`forbiddenMessage` in staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
//!   responsewriters/errors.go): a component deployed without a permission it needs.
//! * Every request of one user left unanswered until the server shuts down: a client cut
//!   off from the API server (a network partition, a stuck load balancer).
//!
//! The request passes them in upstream's filter order: the hang (the network) first, then
//! the latency, Priority and Fairness, then authorization.
//!
//! Random choices come from one generator seeded by [`Faults::seed`], so a run with the
//! same requests in the same order takes the same faults.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::request::{Target, UserInfo};
use super::status::ApiError;
use tokio_util::sync::CancellationToken;

/// Faults the simulated API server injects.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// Share (0.0–1.0) of resource requests answered 429 TooManyRequests.
    pub throttle_share: f64,
    /// `Retry-After` seconds of a throttled request.
    pub throttle_retry_after: u64,
    /// Added before every resource request is served.
    pub latency: Duration,
    /// Cut every watch stream with a 410 Gone ERROR event after about this long
    /// (between half and one and a half times it).
    pub watch_gone_after: Option<Duration>,
    /// Requests refused with 403 Forbidden, as RBAC refuses a verb no role grants.
    pub forbidden: Vec<Forbidden>,
    /// The first `times` requests matching each rule are answered 429 (with the
    /// `throttle_retry_after`), whatever `throttle_share` draws.
    pub bursts: Vec<Burst>,
    /// Users whose requests are never answered (until the server shuts down).
    pub hung_users: Vec<String>,
    /// Users whose writes (create, update, patch, delete) each wait this long before
    /// they are served: a busy controller (an EndpointSlice controller behind on its
    /// queue, a client throttled by Priority and Fairness) whose changes land late.
    pub slow_writers: Vec<(String, Duration)>,
    /// Seed of the random choices.
    pub seed: u64,
}

/// A verb on a resource that one user may not use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forbidden {
    /// The user name (the bearer token).
    pub user: String,
    /// The verb as RBAC names it: `get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`.
    pub verb: String,
    /// The resource, with its subresource if any: `nodes`, `nodes/status`, `pods/eviction`.
    pub resource: String,
}

/// The first `times` requests of `user` with `verb` on `resource` are throttled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Burst {
    /// The requests it applies to (user, RBAC verb, resource with its subresource).
    pub rule: Forbidden,
    /// How many of them are throttled.
    pub times: u32,
}

impl Burst {
    /// Throttles the next `times` requests of `user` with `verb` on `resource`.
    pub fn new(user: &str, verb: &str, resource: &str, times: u32) -> Self {
        Self {
            rule: Forbidden::new(user, verb, resource),
            times,
        }
    }
}

impl Forbidden {
    fn matches(&self, user: &UserInfo, verb: &str, resource: &str) -> bool {
        self.user == user.username && self.verb == verb && self.resource == resource
    }

    /// `user` may not `verb` the `resource`.
    pub fn new(user: &str, verb: &str, resource: &str) -> Self {
        Self {
            user: user.into(),
            verb: verb.into(),
            resource: resource.into(),
        }
    }
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            throttle_share: 0.0,
            // Priority and Fairness answers rejected requests with `Retry-After: 1`.
            throttle_retry_after: 1,
            latency: Duration::ZERO,
            watch_gone_after: None,
            forbidden: Vec::new(),
            bursts: Vec::new(),
            hung_users: Vec::new(),
            slow_writers: Vec::new(),
            seed: 0,
        }
    }
}

/// The faults of one running API server, with their random generator.
pub(crate) struct Injector {
    faults: Faults,
    rng: Mutex<StdRng>,
    /// Requests each burst still throttles.
    burst_left: Mutex<Vec<u32>>,
    /// Ends the hang of hung users' requests.
    shutdown: CancellationToken,
}

impl Injector {
    pub(crate) fn new(faults: Faults, shutdown: CancellationToken) -> Self {
        let rng = Mutex::new(StdRng::seed_from_u64(faults.seed));
        let burst_left = Mutex::new(faults.bursts.iter().map(|b| b.times).collect());
        Self {
            faults,
            rng,
            burst_left,
            shutdown,
        }
    }

    fn draw<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        let mut rng = match self.rng.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut rng)
    }

    /// Hangs a hung user's request, applies the latency, then decides whether this
    /// request (`verb` on `target`) is throttled or forbidden.
    pub(crate) async fn before_request(
        &self,
        user: &UserInfo,
        verb: &str,
        target: &Target,
    ) -> Option<ApiError> {
        if self.faults.hung_users.contains(&user.username) {
            self.shutdown.cancelled().await;
            return Some(ApiError::new(
                503,
                "ServiceUnavailable",
                "apiserver is shutting down",
            ));
        }
        if !self.faults.latency.is_zero() {
            tokio::time::sleep(self.faults.latency).await;
        }
        let write = matches!(verb, "create" | "update" | "patch" | "delete");
        if let Some((_, delay)) = self
            .faults
            .slow_writers
            .iter()
            .find(|(u, _)| write && *u == user.username)
        {
            tokio::time::sleep(*delay).await;
        }
        self.throttle(user, verb, target)
            .or_else(|| self.forbid(user, verb, target))
    }

    /// Whether a burst still throttles this request (and counts it).
    fn in_burst(&self, user: &UserInfo, verb: &str, target: &Target) -> bool {
        if self.faults.bursts.is_empty() {
            return false;
        }
        let resource = target.resource_label();
        let mut left = match self.burst_left.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let rules = self.faults.bursts.iter().zip(left.iter_mut());
        for (burst, left) in rules {
            if *left > 0 && burst.rule.matches(user, verb, &resource) {
                *left -= 1;
                return true;
            }
        }
        false
    }

    fn throttle(&self, user: &UserInfo, verb: &str, target: &Target) -> Option<ApiError> {
        if !self.in_burst(user, verb, target) {
            let share = self.faults.throttle_share.clamp(0.0, 1.0);
            if share <= 0.0 || user.groups.iter().any(|g| g == "system:masters") {
                return None;
            }
            if !self.draw(|rng| rng.random_bool(share)) {
                return None;
            }
        }
        let retry = self.faults.throttle_retry_after;
        Some(
            ApiError::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
            .with_retry(retry),
        )
    }

    /// 403 as `NewForbidden(resource, name, forbiddenMessage(attributes))` renders it.
    fn forbid(&self, user: &UserInfo, verb: &str, target: &Target) -> Option<ApiError> {
        let resource = target.resource_label();
        self.faults
            .forbidden
            .iter()
            .find(|f| f.matches(user, verb, &resource))?;
        let def = &target.def;
        let scope = if target.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", target.namespace)
        };
        let why = format!(
            "User {:?} cannot {verb} resource {resource:?} in API group {:?} {scope}",
            user.username, def.group
        );
        let qualified = if def.group.is_empty() {
            def.plural.clone()
        } else {
            format!("{}.{}", def.plural, def.group)
        };
        let name = target.name.as_deref().unwrap_or_default();
        let message = if name.is_empty() {
            format!("{qualified} is forbidden: {why}")
        } else {
            format!("{qualified} {name:?} is forbidden: {why}")
        };
        Some(ApiError::new(403, "Forbidden", message).with_details(&def.group, &def.plural, name))
    }

    /// When a new watch stream is to be cut with 410 Gone, if ever.
    pub(crate) fn watch_cut(&self) -> Option<Duration> {
        let after = self.faults.watch_gone_after?;
        let factor = self.draw(|rng| rng.random_range(0.5..1.5));
        Some(after.mul_f64(factor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::Registry;

    fn user(name: &str) -> UserInfo {
        UserInfo::from_token(Some(name))
    }

    fn with_faults(faults: Faults) -> Injector {
        Injector::new(faults, CancellationToken::new())
    }

    /// `plural` (core group) in `namespace`, named `name`, with subresource `sub`.
    fn target(plural: &str, namespace: &str, name: &str, sub: Option<&str>) -> Target {
        Target {
            def: Registry::default().find("", "v1", plural).unwrap(),
            namespace: namespace.into(),
            name: Some(name.into()).filter(|n: &String| !n.is_empty()),
            sub: sub.map(String::from),
        }
    }

    #[tokio::test]
    async fn throttling_is_reproducible_with_a_seed_and_spares_cluster_admins() {
        let faults = Faults {
            throttle_share: 0.5,
            seed: 7,
            ..Faults::default()
        };
        let sa = user("system:serviceaccount:default:app");
        let pods = target("pods", "default", "", None);
        let mut runs = Vec::new();
        for _ in 0..2 {
            let injector = with_faults(faults.clone());
            let mut pattern = Vec::new();
            for _ in 0..64 {
                pattern.push(injector.before_request(&sa, "list", &pods).await.is_some());
            }
            runs.push(pattern);
        }
        assert_eq!(runs[0], runs[1]);
        let throttled = runs[0].iter().filter(|t| **t).count();
        assert!((16..=48).contains(&throttled), "{throttled} of 64");
        let injector = with_faults(faults);
        for _ in 0..16 {
            let admin = user("admin");
            assert!(
                injector
                    .before_request(&admin, "list", &pods)
                    .await
                    .is_none()
            );
        }
        let error = with_faults(Faults {
            throttle_share: 1.0,
            ..Faults::default()
        })
        .before_request(&sa, "list", &pods)
        .await
        .unwrap();
        assert_eq!((error.code, error.retry_after), (429, Some(1)));
    }

    #[tokio::test]
    async fn a_forbidden_verb_is_refused_to_its_user_only_in_rbac_words() {
        let agent = "system:serviceaccount:graceful-drain:node-agent";
        let injector = with_faults(Faults {
            forbidden: vec![
                Forbidden::new(agent, "patch", "nodes"),
                Forbidden::new(agent, "create", "pods/eviction"),
            ],
            ..Faults::default()
        });
        let node = target("nodes", "", "n1", None);
        let error = injector
            .before_request(&user(agent), "patch", &node)
            .await
            .unwrap();
        assert_eq!((error.code, error.reason.as_str()), (403, "Forbidden"));
        assert_eq!(
            error.message,
            "nodes \"n1\" is forbidden: User \"system:serviceaccount:graceful-drain:node-agent\" \
             cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
        );
        let eviction = target("pods", "shop", "web-1", Some("eviction"));
        let error = injector
            .before_request(&user(agent), "create", &eviction)
            .await
            .unwrap();
        assert!(
            error.message.ends_with(
                "cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"shop\""
            ),
            "{}",
            error.message
        );
        // Other verbs, other resources (a subresource is one) and other users pass.
        let status = target("nodes", "", "n1", Some("status"));
        for (who, verb, t) in [
            (agent, "get", &node),
            (agent, "patch", &status),
            ("admin", "patch", &node),
            ("system:node:n1", "patch", &node),
        ] {
            assert!(
                injector.before_request(&user(who), verb, t).await.is_none(),
                "{who} {verb}"
            );
        }
    }

    #[tokio::test]
    async fn a_burst_throttles_the_next_matching_requests_only() {
        let webhook = "system:serviceaccount:graceful-drain:webhook";
        let injector = with_faults(Faults {
            bursts: vec![Burst::new(webhook, "get", "poddisruptionbudgets", 2)],
            ..Faults::default()
        });
        let pdb = Target {
            def: Registry::default()
                .find("policy", "v1", "poddisruptionbudgets")
                .unwrap(),
            namespace: "shop".into(),
            name: Some("web".into()),
            sub: None,
        };
        let pods = target("pods", "shop", "web-0", None);
        // Other verbs, resources and users are not counted against the burst.
        assert!(
            injector
                .before_request(&user(webhook), "list", &pdb)
                .await
                .is_none()
        );
        assert!(
            injector
                .before_request(&user(webhook), "get", &pods)
                .await
                .is_none()
        );
        assert!(
            injector
                .before_request(&user("admin"), "get", &pdb)
                .await
                .is_none()
        );
        let mut answers = Vec::new();
        for _ in 0..4 {
            let answer = injector.before_request(&user(webhook), "get", &pdb).await;
            answers.push(answer.map(|e| (e.code, e.retry_after)));
        }
        assert_eq!(
            answers,
            [Some((429, Some(1))), Some((429, Some(1))), None, None]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_users_requests_wait_for_the_shutdown_and_others_pass() {
        let shutdown = CancellationToken::new();
        let injector = Injector::new(
            Faults {
                hung_users: vec!["agent".into()],
                ..Faults::default()
            },
            shutdown.clone(),
        );
        let node = target("nodes", "", "n1", None);
        assert!(
            injector
                .before_request(&user("admin"), "get", &node)
                .await
                .is_none()
        );
        let hung = user("agent");
        let request = injector.before_request(&hung, "get", &node);
        tokio::pin!(request);
        // An hour of (paused, auto-advanced) time passes without an answer.
        let waited = tokio::time::timeout(Duration::from_secs(3600), &mut request).await;
        assert!(waited.is_err(), "answered while hung");
        shutdown.cancel();
        let error = request.await.unwrap();
        assert_eq!(error.code, 503);
    }
}
