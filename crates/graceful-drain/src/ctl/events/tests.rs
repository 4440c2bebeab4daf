//! The tolerant listing against the scripted mock API: a list holding one malformed
//! LifecycleEvent yields the others and names the bad one, and `drain` goes on beside it.

use graceful_drain_testing::fixtures::mock::{self, Scenario, Step};
use graceful_drain_testing::fixtures::{node, to_json};
use http::Method;
use serde_json::{Value, json};

use super::*;
use crate::ctl::{Request, execute};

const GROUP: &str = "/apis/lifecycle.graceful-drain.io/v1alpha1";
const EVENTS: &str = "/apis/lifecycle.graceful-drain.io/v1alpha1/lifecycleevents";

/// A LifecycleEvent as the API server stores it; `spec` is taken as given.
fn event(name: &str, spec: Value, claim: Option<&str>) -> Value {
    let mut event = json!({"apiVersion": "lifecycle.graceful-drain.io/v1alpha1",
        "kind": "LifecycleEvent", "metadata": {"name": name, "resourceVersion": "7"},
        "spec": spec});
    if let Some(claim) = claim {
        event["status"] = json!({"claimStatus": claim});
    }
    event
}

fn good(name: &str, node: &str) -> Value {
    event(
        name,
        json!({"transitionName": "graceful-drain", "bindingNode": node}),
        None,
    )
}

/// One event without `bindingNode`, as an older schema or `kubectl apply` of a CRD without
/// `required` lets through, and one with a number for it.
fn malformed() -> [Value; 2] {
    [
        event("broken", json!({"transitionName": "graceful-drain"}), None),
        event(
            "typo",
            json!({"transitionName": "graceful-drain", "bindingNode": 7}),
            None,
        ),
    ]
}

fn list_of(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "lifecycle.graceful-drain.io/v1alpha1", "kind": kind,
        "metadata": {"resourceVersion": "9"}, "items": items})
}

/// What the API server holds, in the order `drain` asks for it.
enum Cluster {
    /// The node exists.
    NodeExists(&'static str),
    /// The CRDs are installed and the drain transition exists.
    TransitionExists,
    /// The LifecycleEvents.
    EventsAre(Vec<Value>),
    /// The create of an event succeeds under this generated name.
    EventCreated(&'static str),
}

impl Scenario for Cluster {
    fn steps(self) -> Vec<Step> {
        let transition = json!({"apiVersion": "lifecycle.graceful-drain.io/v1alpha1",
            "kind": "LifecycleTransition", "metadata": {"name": "graceful-drain"},
            "spec": {"start": "drain-started", "end": "drain-complete", "allNodes": true,
                     "driver": "graceful-drain.io"}});
        match self {
            Cluster::NodeExists(name) => vec![Step::new(
                Method::GET,
                format!("/api/v1/nodes/{name}"),
                200,
                to_json(&node(name)),
            )],
            Cluster::TransitionExists => vec![
                Step::new(
                    Method::GET,
                    format!("{GROUP}/lifecycletransitions"),
                    200,
                    list_of("LifecycleTransitionList", vec![transition.clone()]),
                ),
                Step::new(
                    Method::GET,
                    format!("{GROUP}/lifecycletransitions/graceful-drain"),
                    200,
                    transition,
                ),
            ],
            Cluster::EventsAre(items) => vec![Step::new(
                Method::GET,
                EVENTS,
                200,
                list_of("LifecycleEventList", items),
            )],
            Cluster::EventCreated(name) => {
                vec![Step::new(Method::POST, EVENTS, 201, good(name, "w1"))]
            }
        }
    }
}

#[tokio::test]
async fn a_malformed_event_is_named_and_skipped_and_the_others_are_listed() {
    let (client, mut api) = mock::client();
    let task = tokio::spawn(async move { list(&client).await });
    let [broken, typo] = malformed();
    let items = vec![good("a", "w1"), broken, good("b", "w2"), typo];
    mock::play(&mut api, [Cluster::EventsAre(items)]).await;
    let listed = task.await.unwrap().unwrap();

    let names: Vec<String> = listed.events.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(listed.events[1].spec.binding_node, "w2");
    let lines: Vec<String> = listed.skipped.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "skipping LifecycleEvent broken: missing field `bindingNode`",
            "skipping LifecycleEvent typo: invalid type: integer `7`, expected a string",
        ]
    );
}

#[tokio::test]
async fn drain_creates_its_event_beside_a_malformed_one() {
    let (client, mut api) = mock::client();
    let request = Request {
        verb: "drain",
        node: "w1".into(),
        transition: "graceful-drain".into(),
        wait: false,
        timeout: None,
        claim_timeout: None,
        poll: std::time::Duration::from_secs(1),
    };
    let task = tokio::spawn(async move {
        let shutdown = graceful_drain_core::runtime::Shutdown::new();
        execute(&client, &request, &shutdown).await
    });
    let [broken, _] = malformed();
    // An earlier drain of the node that finished does not count as running.
    let done = event(
        "w1-drain-old",
        json!({"transitionName": "graceful-drain", "bindingNode": "w1"}),
        Some("Succeeded"),
    );
    let seen = mock::play(
        &mut api,
        [
            Cluster::NodeExists("w1"),
            Cluster::TransitionExists,
            Cluster::EventsAre(vec![broken, done]),
            Cluster::EventCreated("w1-drain-x7k2p"),
        ],
    )
    .await;
    assert_eq!(task.await.unwrap().unwrap(), "w1-drain-x7k2p");
    let create = seen.last().unwrap();
    assert_eq!(
        create.body["spec"],
        json!({"transitionName": "graceful-drain", "bindingNode": "w1"})
    );
    assert_eq!(create.body["metadata"]["generateName"], "w1-drain-");
}
