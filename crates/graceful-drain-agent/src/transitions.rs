//! The LifecycleTransitions this driver offers, published (create-or-update) at start:
//! `graceful-drain` (`drain-started` → `drain-complete`) and
//! `graceful-maintenance-complete` (`uncordoning` → `maintenance-complete`), both for
//! `allNodes` and naming our driver. Create-or-update is a get followed by a create or a
//! resourceVersion-guarded replace, which every API server (and our simulator) supports.

use std::time::Duration;

use kube::api::{Api, PostParams};

use super::node::API_TIMEOUT;
use graceful_drain_core::lifecycle::{
    DRAIN_COMPLETE, DRAIN_STARTED, LifecycleTransition, LifecycleTransitionSpec,
    MAINTENANCE_COMPLETE, UNCORDONING,
};

/// Errors while publishing a transition.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed the call.
    #[error("publish LifecycleTransition {name}")]
    Api {
        /// The LifecycleTransition being published.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The publication, all its attempts together, did not finish within the API timeout
    /// (30 s).
    #[error("publish LifecycleTransition {name}: timed out")]
    Timeout {
        /// The LifecycleTransition being published.
        name: String,
    },
    /// The API server does not serve the resource at all (a 404 on the collection): the
    /// CRDs are not installed, or another API owns the group and they are Established but
    /// never served.
    #[error(
        "publish LifecycleTransition {name}: the API server does not serve lifecycletransitions.lifecycle.graceful-drain.io/v1alpha1 — install the CRDs (graceful-drain crds | kubectl apply -f -); `graceful-drain status` shows which lifecycle APIs the cluster serves"
    )]
    NotServed {
        /// The LifecycleTransition being published.
        name: String,
    },
    /// RBAC forbids the call (403).
    #[error(
        "publish LifecycleTransition {name}: forbidden — the node agent's ServiceAccount needs get, create and update on lifecycletransitions.lifecycle.graceful-drain.io (the chart's agent ClusterRole)"
    )]
    Forbidden {
        /// The LifecycleTransition being published.
        name: String,
        /// The API server's 403.
        #[source]
        source: kube::Error,
    },
    /// Other writers kept changing the object between our read and our write.
    #[error(
        "publish LifecycleTransition {name}: changed by others {PUBLISH_ATTEMPTS} times in a row"
    )]
    Contended {
        /// The LifecycleTransition being published.
        name: String,
    },
}

/// Reads and writes of one publication before it gives up to the caller's retry: every
/// agent of a cluster races once at start, so a few rounds settle it.
const PUBLISH_ATTEMPTS: usize = 5;

/// A duration the way Go prints it (`15m0s`, `1h0m0s`, `45s`), the format of `spec.sla`.
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// The two transitions, named `drain` and `maintenance`.
pub fn transitions(
    drain: &str,
    maintenance: &str,
    driver: &str,
    sla: Duration,
) -> Vec<LifecycleTransition> {
    let make = |name: &str, start: &str, end: &str| {
        LifecycleTransition::new(
            name,
            LifecycleTransitionSpec {
                start: start.into(),
                end: end.into(),
                all_nodes: Some(true),
                sla: Some(go_duration(sla)),
                driver: driver.into(),
                ..LifecycleTransitionSpec::default()
            },
        )
    };
    vec![
        make(drain, DRAIN_STARTED, DRAIN_COMPLETE),
        make(maintenance, UNCORDONING, MAINTENANCE_COMPLETE),
    ]
}

/// A refusal, with RBAC's told apart.
fn classify(name: &str, source: kube::Error) -> Error {
    match source {
        kube::Error::Api(ref s) if s.code == 403 => Error::Forbidden {
            name: name.to_string(),
            source,
        },
        source => Error::Api {
            name: name.to_string(),
            source,
        },
    }
}

impl Error {
    /// Whether an operator must act (install the CRDs, fix RBAC): retrying alone cannot
    /// succeed.
    pub fn needs_operator(&self) -> bool {
        matches!(self, Error::NotServed { .. } | Error::Forbidden { .. })
    }
}

/// Creates `wanted`, or replaces its spec if it exists with a different one.
pub async fn publish(client: &kube::Client, wanted: &LifecycleTransition) -> Result<(), Error> {
    let name = wanted.metadata.name.clone().unwrap_or_default();
    let api: Api<LifecycleTransition> = Api::all(client.clone());
    // Every node agent publishes the same transitions at start: whoever loses the race to
    // create (409 AlreadyExists) or to replace (409 Conflict) reads again and finds the
    // object in place, so a cluster of agents creates each transition once, quietly.
    let call = async {
        for _ in 0..PUBLISH_ATTEMPTS {
            let read = api.get_opt(&name).await;
            let outcome = match read.map_err(|e| classify(&name, e))? {
                None => api
                    .create(&PostParams::default(), wanted)
                    .await
                    .map(|_| "created LifecycleTransition"),
                Some(existing) if existing.spec == wanted.spec => return Ok(()),
                Some(mut existing) => {
                    existing.spec = wanted.spec.clone();
                    api.replace(&name, &PostParams::default(), &existing)
                        .await
                        .map(|_| "updated LifecycleTransition")
                }
            };
            match outcome {
                Ok(what) => {
                    tracing::info!(transition = %name, "{what}");
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                // The object was not there (get) and its collection is not either.
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(Error::NotServed { name: name.clone() });
                }
                Err(source) => return Err(classify(&name, source)),
            }
        }
        Err(Error::Contended { name: name.clone() })
    };
    tokio::time::timeout(API_TIMEOUT, call)
        .await
        .map_err(|_| Error::Timeout { name: name.clone() })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use Scenario::*;
    use graceful_drain_testing::fixtures::mock::{self, Step};
    use http::Method;
    use serde_json::{Value, json};

    const TRANSITIONS: &str = "/apis/lifecycle.graceful-drain.io/v1alpha1/lifecycletransitions";

    /// What the API server does with LifecycleTransitions, in the order the agent asks.
    enum Scenario {
        /// The `GET` of transition `name` answers 404 NotFound: nobody created it yet.
        TransitionMissing(String),
        /// The `POST` creating a transition answers 409 AlreadyExists: another agent was first.
        CreatedByAnother,
        /// The `GET` of the transition answers it (it names itself).
        TransitionIs(Value),
        /// Our group is not served: the `GET` of transition `name` and the `POST` creating
        /// it both get the API server's bare 404.
        GroupNotServed(&'static str),
    }

    impl mock::Scenario for Scenario {
        fn steps(self) -> Vec<Step> {
            match self {
                TransitionMissing(name) => {
                    let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not found"});
                    vec![read(&name, 404, not_found)]
                }
                CreatedByAnother => {
                    let exists = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "AlreadyExists", "code": 409, "message": "already exists"});
                    vec![Step::new(Method::POST, TRANSITIONS, 409, exists)]
                }
                TransitionIs(theirs) => {
                    let name = theirs["metadata"]["name"].as_str().unwrap().to_string();
                    vec![read(&name, 200, theirs)]
                }
                GroupNotServed(name) => {
                    let bare = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "details": {},
                        "message": "the server could not find the requested resource"});
                    let create = Step::new(Method::POST, TRANSITIONS, 404, bare.clone());
                    vec![read(name, 404, bare), create]
                }
            }
        }
    }

    /// The `GET` of transition `name`, answered `status` with `reply`.
    fn read(name: &str, status: u16, reply: Value) -> Step {
        Step::new(Method::GET, format!("{TRANSITIONS}/{name}"), status, reply)
    }

    /// Two agents start at once: both read no transition, the other creates it first; ours
    /// gets 409 AlreadyExists, reads it again, finds the same spec and is done — no error,
    /// no second write.
    #[tokio::test]
    async fn losing_the_race_to_create_a_transition_is_not_an_error() {
        let (client, mut api) = mock::client();
        let wanted = transitions("d", "m", "graceful-drain.io", Duration::from_secs(900))
            .into_iter()
            .next()
            .unwrap();
        let name = wanted.metadata.name.clone().unwrap();
        let published = wanted.clone();
        let task = tokio::spawn(async move { publish(&client, &published).await });
        let mut theirs = serde_json::to_value(&wanted).unwrap();
        theirs["metadata"]["resourceVersion"] = "7".into();
        let scenarios = [
            TransitionMissing(name),
            CreatedByAnother,
            TransitionIs(theirs),
        ];
        mock::play(&mut api, scenarios).await;
        task.await.unwrap().unwrap();
    }

    /// On a cluster that does not serve our group (CRDs missing, or Established but never
    /// served because another API took the group), the create answers the API server's
    /// bare 404: one clear error naming the fix, not an endless generic retry.
    #[tokio::test]
    async fn an_unserved_lifecycle_api_is_one_clear_error() {
        let (client, mut api) = mock::client();
        let wanted = transitions("d", "m", "graceful-drain.io", Duration::from_secs(900))
            .into_iter()
            .next()
            .unwrap();
        let task = tokio::spawn(async move { publish(&client, &wanted).await });
        mock::play(&mut api, [GroupNotServed("d")]).await;
        let error = task.await.unwrap().unwrap_err();
        assert!(error.needs_operator());
        assert!(
            error
                .to_string()
                .contains("graceful-drain crds | kubectl apply -f -"),
            "{error}"
        );
    }

    #[test]
    fn sla_is_printed_like_go() {
        assert_eq!(go_duration(Duration::from_secs(900)), "15m0s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_secs(45)), "45s");
        assert_eq!(go_duration(Duration::from_secs(5430)), "1h30m30s");
    }

    #[test]
    fn transitions_apply_to_all_nodes_with_our_driver() {
        let ts = transitions("d", "m", "graceful-drain.io", Duration::from_secs(900));
        let json = serde_json::to_value(&ts).unwrap();
        assert_eq!(
            json[0]["apiVersion"],
            "lifecycle.graceful-drain.io/v1alpha1"
        );
        assert_eq!(json[0]["kind"], "LifecycleTransition");
        assert_eq!(
            json[0]["spec"],
            serde_json::json!({"start": "drain-started", "end": "drain-complete",
                "allNodes": true, "sla": "15m0s", "driver": "graceful-drain.io"})
        );
        assert_eq!(json[1]["metadata"]["name"], "m");
        assert_eq!(json[1]["spec"]["start"], "uncordoning");
        assert_eq!(json[1]["spec"]["end"], "maintenance-complete");
    }
}
