//! Builders for the Kubernetes objects that the simulated cluster's scenarios, unit tests
//! and integration tests need, so no module writes its own `fn pod()`. They live with the
//! simulator because its scenarios build workloads from them at run time; the test support
//! crate (`graceful-drain-testing`) re-exports them beside its scripted mock.
//!
//! Each builder starts from a constructor ([`pod`], [`node`], [`pdb`], [`replica_set`],
//! [`stateful_set`], [`daemon_set`], [`job`])
//! and is refined by chaining methods of an extension trait on the k8s-openapi type itself,
//! so a chain is the object, with no `build()`:
//!
//! ```
//! use kube_sim::fixtures::{PodFixture, pod};
//!
//! let p = pod("web-1").ns("shop").label("app", "web").on_node("n1").ready().owned_by_rs("web");
//! assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("n1"));
//! ```
//!
//! Any object becomes the JSON a scripted answer or the simulated API server takes with
//! [`to_json`].
//!
//! Method names avoid those of `kube::ResourceExt` (`labels`, `namespace`, …), so both
//! traits can be in scope.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, ReplicaSet, ReplicaSetSpec,
    RollingUpdateDaemonSet, RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodCondition,
    PodSpec, PodStatus, PodTemplateSpec, Taint, Toleration, Volume,
};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

/// `pairs` as a label map.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `obj` as JSON (`apiVersion` and `kind` included), for scripted answers and raw requests.
pub fn to_json(obj: &impl serde::Serialize) -> Value {
    // Kubernetes objects always serialise; `Null` would only hide a bug in a test.
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

/// A pod `default/<name>` with uid `<name>-uid` and nothing else: no spec, no status.
pub fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            uid: Some(format!("{name}-uid")),
            ..meta(name)
        },
        ..Pod::default()
    }
}

/// Refinements of a [`Pod`]; see [`pod`].
pub trait PodFixture: Sized {
    /// Moves the pod to namespace `ns`.
    fn ns(self, ns: &str) -> Self;
    /// Sets the uid.
    fn with_uid(self, uid: &str) -> Self;
    /// Sets `metadata.resourceVersion`.
    fn at_version(self, rv: &str) -> Self;
    /// Adds the label `key=value`.
    fn label(self, key: &str, value: &str) -> Self;
    /// Adds every label of `pairs`.
    fn with_labels(self, pairs: &[(&str, &str)]) -> Self;
    /// Adds the annotation `key=value`.
    fn annotate(self, key: &str, value: &str) -> Self;
    /// Sets `metadata.creationTimestamp`.
    fn created_at(self, at: jiff::Timestamp) -> Self;
    /// Marks the pod as being deleted since `at`, with the given grace period.
    fn deleting(self, at: jiff::Timestamp, grace_seconds: Option<i64>) -> Self;
    /// Makes `kind`/`name` (uid `<name>-uid`) the pod's controller.
    fn owned_by(self, kind: &str, name: &str) -> Self;
    /// Makes ReplicaSet `name` (uid `<name>-uid`) the pod's controller.
    fn owned_by_rs(self, name: &str) -> Self;
    /// Makes the ReplicaSet with uid `uid` the pod's controller.
    fn owned_by_rs_uid(self, uid: &str) -> Self;
    /// Binds the pod to `node`.
    fn on_node(self, node: &str) -> Self;
    /// Sets `spec.nodeSelector`.
    fn node_selector(self, pairs: &[(&str, &str)]) -> Self;
    /// Adds tolerations.
    fn tolerate(self, tolerations: Vec<Toleration>) -> Self;
    /// Adds an `emptyDir` volume.
    fn empty_dir(self) -> Self;
    /// Gives the pod one container `app`.
    fn container(self, image: &str) -> Self;
    /// Sets `spec.terminationGracePeriodSeconds` (0: a deleted pod is gone at once).
    fn grace_period(self, seconds: i64) -> Self;
    /// Sets `status.phase`.
    fn phase(self, phase: &str) -> Self;
    /// `status.phase: Running`.
    fn running(self) -> Self;
    /// Sets `status.podIP`.
    fn ip(self, ip: &str) -> Self;
    /// Ready condition True.
    fn ready(self) -> Self;
    /// Ready condition True or False.
    fn ready_is(self, ready: bool) -> Self;
}

fn pod_spec(pod: &mut Pod) -> &mut PodSpec {
    pod.spec.get_or_insert_with(PodSpec::default)
}

fn pod_status(pod: &mut Pod) -> &mut PodStatus {
    pod.status.get_or_insert_with(PodStatus::default)
}

impl PodFixture for Pod {
    fn ns(mut self, ns: &str) -> Self {
        self.metadata.namespace = Some(ns.into());
        self
    }
    fn with_uid(mut self, uid: &str) -> Self {
        self.metadata.uid = Some(uid.into());
        self
    }
    fn at_version(mut self, rv: &str) -> Self {
        self.metadata.resource_version = Some(rv.into());
        self
    }
    fn label(mut self, key: &str, value: &str) -> Self {
        let map = self.metadata.labels.get_or_insert_with(BTreeMap::new);
        map.insert(key.into(), value.into());
        self
    }
    fn with_labels(mut self, pairs: &[(&str, &str)]) -> Self {
        let map = self.metadata.labels.get_or_insert_with(BTreeMap::new);
        map.extend(labels(pairs));
        self
    }
    fn annotate(mut self, key: &str, value: &str) -> Self {
        let map = self.metadata.annotations.get_or_insert_with(BTreeMap::new);
        map.insert(key.into(), value.into());
        self
    }
    fn created_at(mut self, at: jiff::Timestamp) -> Self {
        self.metadata.creation_timestamp = Some(Time(at));
        self
    }
    fn deleting(mut self, at: jiff::Timestamp, grace_seconds: Option<i64>) -> Self {
        self.metadata.deletion_timestamp = Some(Time(at));
        self.metadata.deletion_grace_period_seconds = grace_seconds;
        self
    }
    fn owned_by(mut self, kind: &str, name: &str) -> Self {
        let api_version = match kind {
            "Job" => "batch/v1",
            "ReplicationController" => "v1",
            _ => "apps/v1",
        };
        self.metadata.owner_references = Some(vec![OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        self
    }
    fn owned_by_rs(self, name: &str) -> Self {
        self.owned_by("ReplicaSet", name)
    }
    fn owned_by_rs_uid(mut self, uid: &str) -> Self {
        self.metadata.owner_references = Some(vec![OwnerReference {
            uid: uid.into(),
            controller: Some(true),
            kind: "ReplicaSet".into(),
            ..OwnerReference::default()
        }]);
        self
    }
    fn on_node(mut self, node: &str) -> Self {
        pod_spec(&mut self).node_name = Some(node.into());
        self
    }
    fn node_selector(mut self, pairs: &[(&str, &str)]) -> Self {
        pod_spec(&mut self).node_selector = Some(labels(pairs));
        self
    }
    fn tolerate(mut self, tolerations: Vec<Toleration>) -> Self {
        pod_spec(&mut self)
            .tolerations
            .get_or_insert_with(Vec::new)
            .extend(tolerations);
        self
    }
    fn empty_dir(mut self) -> Self {
        pod_spec(&mut self)
            .volumes
            .get_or_insert_with(Vec::new)
            .push(Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
        self
    }
    fn container(mut self, image: &str) -> Self {
        pod_spec(&mut self).containers = vec![Container {
            name: "app".into(),
            image: Some(image.into()),
            ..Container::default()
        }];
        self
    }
    fn grace_period(mut self, seconds: i64) -> Self {
        pod_spec(&mut self).termination_grace_period_seconds = Some(seconds);
        self
    }
    fn phase(mut self, phase: &str) -> Self {
        pod_status(&mut self).phase = Some(phase.into());
        self
    }
    fn running(self) -> Self {
        self.phase("Running")
    }
    fn ip(mut self, ip: &str) -> Self {
        pod_status(&mut self).pod_ip = Some(ip.into());
        self
    }
    fn ready(self) -> Self {
        self.ready_is(true)
    }
    fn ready_is(mut self, ready: bool) -> Self {
        let conditions = pod_status(&mut self)
            .conditions
            .get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "Ready");
        conditions.push(PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..PodCondition::default()
        });
        self
    }
}

/// A node `<name>` with no spec and no status.
pub fn node(name: &str) -> Node {
    Node {
        metadata: meta(name),
        ..Node::default()
    }
}

/// Refinements of a [`Node`]; see [`node`].
pub trait NodeFixture: Sized {
    /// Adds every label of `pairs` (an empty slice still sets an empty map).
    fn with_labels(self, pairs: &[(&str, &str)]) -> Self;
    /// Sets `spec.unschedulable`.
    fn unschedulable_is(self, cordoned: bool) -> Self;
    /// Sets `spec.taints`.
    fn taints(self, taints: Vec<Taint>) -> Self;
    /// Ready condition True or False.
    fn ready_is(self, ready: bool) -> Self;
}

impl NodeFixture for Node {
    fn with_labels(mut self, pairs: &[(&str, &str)]) -> Self {
        let map = self.metadata.labels.get_or_insert_with(BTreeMap::new);
        map.extend(labels(pairs));
        self
    }
    fn unschedulable_is(mut self, cordoned: bool) -> Self {
        self.spec
            .get_or_insert_with(NodeSpec::default)
            .unschedulable = Some(cordoned);
        self
    }
    fn taints(mut self, taints: Vec<Taint>) -> Self {
        self.spec.get_or_insert_with(NodeSpec::default).taints = Some(taints);
        self
    }
    fn ready_is(mut self, ready: bool) -> Self {
        let status = self.status.get_or_insert_with(NodeStatus::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "Ready");
        conditions.push(NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..NodeCondition::default()
        });
        self
    }
}

/// A PodDisruptionBudget `default/<name>` with no spec and no status.
pub fn pdb(name: &str) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            ..meta(name)
        },
        ..PodDisruptionBudget::default()
    }
}

/// Refinements of a [`PodDisruptionBudget`]; see [`pdb`].
pub trait PdbFixture: Sized {
    /// Moves the budget to namespace `ns`.
    fn ns(self, ns: &str) -> Self;
    /// Sets `metadata.resourceVersion`.
    fn at_version(self, rv: &str) -> Self;
    /// Sets `metadata.generation`.
    fn generation(self, generation: i64) -> Self;
    /// Selects pods carrying every label of `pairs` (matchLabels).
    fn selecting(self, pairs: &[(&str, &str)]) -> Self;
    /// Sets `spec.minAvailable` to a count.
    fn min_available(self, count: i32) -> Self;
    /// Sets `status.disruptedPods`: pod name and the Unix second it was disrupted at.
    fn disrupted(self, pods: &[(&str, i64)]) -> Self;
    /// Sets the status counts `currentHealthy`, `desiredHealthy` and `expectedPods`.
    fn healthy(self, current: i32, desired: i32, expected: i32) -> Self;
    /// Sets `status.disruptionsAllowed`, as the disruption controller computed it for the
    /// budget's current generation (`observedGeneration` follows `metadata.generation`).
    fn allowing(self, disruptions: i32) -> Self;
}

fn pdb_spec(pdb: &mut PodDisruptionBudget) -> &mut PodDisruptionBudgetSpec {
    pdb.spec
        .get_or_insert_with(PodDisruptionBudgetSpec::default)
}

impl PdbFixture for PodDisruptionBudget {
    fn ns(mut self, ns: &str) -> Self {
        self.metadata.namespace = Some(ns.into());
        self
    }
    fn at_version(mut self, rv: &str) -> Self {
        self.metadata.resource_version = Some(rv.into());
        self
    }
    fn generation(mut self, generation: i64) -> Self {
        self.metadata.generation = Some(generation);
        self
    }
    fn selecting(mut self, pairs: &[(&str, &str)]) -> Self {
        pdb_spec(&mut self).selector = Some(LabelSelector {
            match_labels: Some(labels(pairs)),
            ..LabelSelector::default()
        });
        self
    }
    fn min_available(mut self, count: i32) -> Self {
        pdb_spec(&mut self).min_available = Some(IntOrString::Int(count));
        self
    }
    fn disrupted(mut self, pods: &[(&str, i64)]) -> Self {
        let status = self
            .status
            .get_or_insert_with(PodDisruptionBudgetStatus::default);
        status.disrupted_pods = Some(
            pods.iter()
                .filter_map(|(name, second)| {
                    let at = jiff::Timestamp::from_second(*second).ok()?;
                    Some((name.to_string(), Time(at)))
                })
                .collect(),
        );
        self
    }
    fn healthy(mut self, current: i32, desired: i32, expected: i32) -> Self {
        let status = self
            .status
            .get_or_insert_with(PodDisruptionBudgetStatus::default);
        status.current_healthy = current;
        status.desired_healthy = desired;
        status.expected_pods = expected;
        self
    }
    fn allowing(mut self, disruptions: i32) -> Self {
        let generation = self.metadata.generation;
        let status = self
            .status
            .get_or_insert_with(PodDisruptionBudgetStatus::default);
        status.disruptions_allowed = disruptions;
        status.observed_generation = generation;
        self
    }
}

/// A ReplicaSet `default/<name>` with uid `<name>-uid` and an empty selector.
pub fn replica_set(name: &str) -> ReplicaSet {
    ReplicaSet {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            uid: Some(format!("{name}-uid")),
            ..meta(name)
        },
        spec: Some(ReplicaSetSpec::default()),
        status: None,
    }
}

/// Refinements of a [`ReplicaSet`]; see [`replica_set`].
pub trait ReplicaSetFixture: Sized {
    /// Moves the ReplicaSet to namespace `ns`.
    fn ns(self, ns: &str) -> Self;
    /// Sets the uid.
    fn with_uid(self, uid: &str) -> Self;
    /// Sets `spec.replicas`.
    fn replicas(self, replicas: i32) -> Self;
    /// Selects (and labels its template with) every label of `pairs`.
    fn selecting(self, pairs: &[(&str, &str)]) -> Self;
}

impl ReplicaSetFixture for ReplicaSet {
    fn ns(mut self, ns: &str) -> Self {
        self.metadata.namespace = Some(ns.into());
        self
    }
    fn with_uid(mut self, uid: &str) -> Self {
        self.metadata.uid = Some(uid.into());
        self
    }
    fn replicas(mut self, replicas: i32) -> Self {
        self.spec
            .get_or_insert_with(ReplicaSetSpec::default)
            .replicas = Some(replicas);
        self
    }
    fn selecting(mut self, pairs: &[(&str, &str)]) -> Self {
        let spec = self.spec.get_or_insert_with(ReplicaSetSpec::default);
        spec.selector = LabelSelector {
            match_labels: Some(labels(pairs)),
            ..LabelSelector::default()
        };
        let template = spec.template.get_or_insert_with(PodTemplateSpec::default);
        let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
        meta.labels = Some(labels(pairs));
        self
    }
}

/// Sets `labels` as `selector.matchLabels` and as the template's labels.
fn select(selector: &mut LabelSelector, template: &mut PodTemplateSpec, pairs: &[(&str, &str)]) {
    *selector = LabelSelector {
        match_labels: Some(labels(pairs)),
        ..LabelSelector::default()
    };
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels = Some(labels(pairs));
}

/// Gives `template` one container `app` running `image`.
fn template_container(template: &mut PodTemplateSpec, image: &str) {
    template
        .spec
        .get_or_insert_with(PodSpec::default)
        .containers = vec![Container {
        name: "app".into(),
        image: Some(image.into()),
        ..Container::default()
    }];
}

/// A StatefulSet `default/<name>` with uid `<name>-uid`, generation 1, an empty selector
/// and the API server's defaults: 1 replica, OrderedReady, RollingUpdate with partition 0.
pub fn stateful_set(name: &str) -> StatefulSet {
    StatefulSet {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            uid: Some(format!("{name}-uid")),
            generation: Some(1),
            ..meta(name)
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            pod_management_policy: Some("OrderedReady".into()),
            service_name: Some(name.into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(0),
                    ..RollingUpdateStatefulSetStrategy::default()
                }),
            }),
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}

/// Refinements of a [`StatefulSet`]; see [`stateful_set`].
pub trait StatefulSetFixture: Sized {
    /// Moves the StatefulSet to namespace `ns`.
    fn ns(self, ns: &str) -> Self;
    /// Sets the uid.
    fn with_uid(self, uid: &str) -> Self;
    /// Sets `spec.replicas`.
    fn replicas(self, replicas: i32) -> Self;
    /// Selects (and labels its template with) every label of `pairs`.
    fn selecting(self, pairs: &[(&str, &str)]) -> Self;
    /// `podManagementPolicy: Parallel`.
    fn parallel(self) -> Self;
    /// Sets the rolling update's `partition`.
    fn partition(self, partition: i32) -> Self;
    /// Gives the template one container `app` running `image`.
    fn container(self, image: &str) -> Self;
}

fn sts_spec(set: &mut StatefulSet) -> &mut StatefulSetSpec {
    set.spec.get_or_insert_with(StatefulSetSpec::default)
}

impl StatefulSetFixture for StatefulSet {
    fn ns(mut self, ns: &str) -> Self {
        self.metadata.namespace = Some(ns.into());
        self
    }
    fn with_uid(mut self, uid: &str) -> Self {
        self.metadata.uid = Some(uid.into());
        self
    }
    fn replicas(mut self, replicas: i32) -> Self {
        sts_spec(&mut self).replicas = Some(replicas);
        self
    }
    fn selecting(mut self, pairs: &[(&str, &str)]) -> Self {
        let spec = sts_spec(&mut self);
        select(&mut spec.selector, &mut spec.template, pairs);
        self
    }
    fn parallel(mut self) -> Self {
        sts_spec(&mut self).pod_management_policy = Some("Parallel".into());
        self
    }
    fn partition(mut self, partition: i32) -> Self {
        let strategy = sts_spec(&mut self)
            .update_strategy
            .get_or_insert_with(StatefulSetUpdateStrategy::default);
        strategy.type_ = Some("RollingUpdate".into());
        strategy
            .rolling_update
            .get_or_insert_with(RollingUpdateStatefulSetStrategy::default)
            .partition = Some(partition);
        self
    }
    fn container(mut self, image: &str) -> Self {
        template_container(&mut sts_spec(&mut self).template, image);
        self
    }
}

/// A DaemonSet `default/<name>` with uid `<name>-uid`, generation 1, an empty selector
/// and the API server's default strategy: RollingUpdate, maxUnavailable 1, maxSurge 0.
pub fn daemon_set(name: &str) -> DaemonSet {
    DaemonSet {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            uid: Some(format!("{name}-uid")),
            generation: Some(1),
            ..meta(name)
        },
        spec: Some(DaemonSetSpec {
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::Int(1)),
                    max_surge: Some(IntOrString::Int(0)),
                }),
            }),
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

/// Refinements of a [`DaemonSet`]; see [`daemon_set`].
pub trait DaemonSetFixture: Sized {
    /// Moves the DaemonSet to namespace `ns`.
    fn ns(self, ns: &str) -> Self;
    /// Sets the uid.
    fn with_uid(self, uid: &str) -> Self;
    /// Selects (and labels its template with) every label of `pairs`.
    fn selecting(self, pairs: &[(&str, &str)]) -> Self;
    /// Sets the template's `nodeSelector`.
    fn node_selector(self, pairs: &[(&str, &str)]) -> Self;
    /// Sets the rolling update's `maxUnavailable` and `maxSurge`.
    fn rolling(self, max_unavailable: IntOrString, max_surge: IntOrString) -> Self;
    /// Gives the template one container `app` running `image`.
    fn container(self, image: &str) -> Self;
}

fn ds_spec(set: &mut DaemonSet) -> &mut DaemonSetSpec {
    set.spec.get_or_insert_with(DaemonSetSpec::default)
}

impl DaemonSetFixture for DaemonSet {
    fn ns(mut self, ns: &str) -> Self {
        self.metadata.namespace = Some(ns.into());
        self
    }
    fn with_uid(mut self, uid: &str) -> Self {
        self.metadata.uid = Some(uid.into());
        self
    }
    fn selecting(mut self, pairs: &[(&str, &str)]) -> Self {
        let spec = ds_spec(&mut self);
        select(&mut spec.selector, &mut spec.template, pairs);
        self
    }
    fn node_selector(mut self, pairs: &[(&str, &str)]) -> Self {
        ds_spec(&mut self)
            .template
            .spec
            .get_or_insert_with(PodSpec::default)
            .node_selector = Some(labels(pairs));
        self
    }
    fn rolling(mut self, max_unavailable: IntOrString, max_surge: IntOrString) -> Self {
        ds_spec(&mut self).update_strategy = Some(DaemonSetUpdateStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDaemonSet {
                max_unavailable: Some(max_unavailable),
                max_surge: Some(max_surge),
            }),
        });
        self
    }
    fn container(mut self, image: &str) -> Self {
        template_container(&mut ds_spec(&mut self).template, image);
        self
    }
}

/// A Job `default/<name>` with uid `<name>-uid`, generation 1, one completion at a time
/// (`completions` and `parallelism` 1, `backoffLimit` 6, as the API server defaults them)
/// and a template with `restartPolicy: Never`, as Jobs require.
pub fn job(name: &str) -> Job {
    Job {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            uid: Some(format!("{name}-uid")),
            generation: Some(1),
            ..meta(name)
        },
        spec: Some(JobSpec {
            completions: Some(1),
            parallelism: Some(1),
            backoff_limit: Some(6),
            completion_mode: Some("NonIndexed".into()),
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// A `podFailurePolicy` rule: `action` when the pod has condition `type_` True.
pub fn on_pod_condition(action: &str, type_: &str) -> PodFailurePolicyRule {
    PodFailurePolicyRule {
        action: action.into(),
        on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
            type_: type_.into(),
            status: "True".into(),
        }]),
        on_exit_codes: None,
    }
}

/// A `podFailurePolicy` rule: `action` when a container exited with a code `operator`
/// (`In` or `NotIn`) `values`.
pub fn on_exit_codes(action: &str, operator: &str, values: &[i32]) -> PodFailurePolicyRule {
    PodFailurePolicyRule {
        action: action.into(),
        on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
            container_name: None,
            operator: operator.into(),
            values: values.to_vec(),
        }),
        on_pod_conditions: None,
    }
}

/// Refinements of a [`Job`]; see [`job`].
pub trait JobFixture: Sized {
    /// Moves the Job to namespace `ns`.
    fn ns(self, ns: &str) -> Self;
    /// Sets `spec.completions` (`None`: a work-queue Job).
    fn completions(self, completions: Option<i32>) -> Self;
    /// Sets `spec.parallelism`.
    fn parallelism(self, parallelism: i32) -> Self;
    /// Sets `spec.backoffLimit`.
    fn backoff_limit(self, limit: i32) -> Self;
    /// Appends a rule to `spec.podFailurePolicy`.
    fn failure_rule(self, rule: PodFailurePolicyRule) -> Self;
    /// Labels the template with every label of `pairs`.
    fn template_labels(self, pairs: &[(&str, &str)]) -> Self;
    /// Annotates the template with `key=value`.
    fn template_annotation(self, key: &str, value: &str) -> Self;
    /// Gives the template one container `app` running `image`.
    fn container(self, image: &str) -> Self;
}

fn job_spec(job: &mut Job) -> &mut JobSpec {
    job.spec.get_or_insert_with(JobSpec::default)
}

fn job_template_meta(job: &mut Job) -> &mut ObjectMeta {
    job_spec(job)
        .template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
}

impl JobFixture for Job {
    fn ns(mut self, ns: &str) -> Self {
        self.metadata.namespace = Some(ns.into());
        self
    }
    fn completions(mut self, completions: Option<i32>) -> Self {
        job_spec(&mut self).completions = completions;
        self
    }
    fn parallelism(mut self, parallelism: i32) -> Self {
        job_spec(&mut self).parallelism = Some(parallelism);
        self
    }
    fn backoff_limit(mut self, limit: i32) -> Self {
        job_spec(&mut self).backoff_limit = Some(limit);
        self
    }
    fn failure_rule(mut self, rule: PodFailurePolicyRule) -> Self {
        job_spec(&mut self)
            .pod_failure_policy
            .get_or_insert_with(PodFailurePolicy::default)
            .rules
            .push(rule);
        self
    }
    fn template_labels(mut self, pairs: &[(&str, &str)]) -> Self {
        job_template_meta(&mut self)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .extend(labels(pairs));
        self
    }
    fn template_annotation(mut self, key: &str, value: &str) -> Self {
        job_template_meta(&mut self)
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }
    fn container(mut self, image: &str) -> Self {
        template_container(&mut job_spec(&mut self).template, image);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_builds_the_pod_it_reads_as() {
        let p = pod("web-1")
            .ns("shop")
            .label("app", "web")
            .on_node("n1")
            .running()
            .ready()
            .owned_by_rs("web");
        assert_eq!(p.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(p.metadata.labels, Some(labels(&[("app", "web")])));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ReplicaSet", "web-uid")
        );
        let status = p.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.conditions.unwrap()[0].status, "True");
    }
}
