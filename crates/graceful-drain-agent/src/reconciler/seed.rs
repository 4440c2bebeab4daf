//! The seed-group bridge: LifecycleEvents written in the seed group `lifecycle.k8s.io` (the
//! SLM seeds' YAML, and events left by earlier releases of graceful-drain) are carried over
//! to `lifecycle.graceful-drain.io`, where the reconciler drives them, and their progress
//! is copied back.
//!
//! For a seed event bound to this node the bridge creates a *mirror* in our group with
//! the same name and spec, labelled [`SEED_MIRROR_LABEL`] and annotated with the seed
//! event's UID. The bridge's finalizer [`SEED_BRIDGE_FINALIZER`] on the mirror keeps it
//! until its outcome is copied back; the same finalizer on the seed event keeps that
//! until its mirror is cancelled when a user deletes it. Once the mirror ends, the seed event gets
//! its terminal status and is deleted, as the reconciler deletes a finished event, so
//! applying the same seed YAML again runs the transition again.
//!
//! The bridge runs only where the API server serves `lifecycleevents` in the seed group
//! (discovery). Where Kubernetes' own EvictionRequest API owns the group, a seed CRD is
//! Established but never served: the bridge says so once, as an error naming the fix.
//!
//! Every decision is [`plan`], a pure function of the seed event and its mirror; the loop
//! only applies its steps. A step that fails is retried on the next pass (a watch event or
//! the tick), and every write is guarded by a UID or resourceVersion.

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use graceful_drain_core::labels::{
    CLAIM_FINALIZER, LIFECYCLE_MESSAGE_ANNOTATION, MIRROR_UID_ANNOTATION, SEED_BRIDGE_FINALIZER,
    SEED_MIRROR_LABEL, SEED_UID_ANNOTATION,
};
use graceful_drain_core::lifecycle::crds::SEED_GROUP;
use graceful_drain_core::lifecycle::{
    ClaimStatus, LifecycleEvent, LifecycleEventSpec, LifecycleEventStatus,
};
use graceful_drain_core::runtime::Shutdown;

/// Version of the seed group the bridge reads.
pub const SEED_VERSION: &str = "v1alpha1";
/// Claim finalizer earlier releases put on the events they drove in the seed group.
pub const SEED_CLAIM_FINALIZER: &str = "lifecycle.k8s.io/claim-protection";
/// Name of the seed-group event CRD (what an operator installs, and what is shadowed when
/// Kubernetes serves the group itself).
pub const SEED_EVENT_CRD: &str = "lifecycleevents.lifecycle.k8s.io";
/// How often the bridge asks discovery again while the seed group is not served (the
/// seed CRDs may be installed later).
const DISCOVERY_PERIOD: Duration = Duration::from_secs(60);

/// The seed group's LifecycleEvent resource.
pub fn seed_resource() -> ApiResource {
    ApiResource {
        group: SEED_GROUP.into(),
        version: SEED_VERSION.into(),
        api_version: format!("{SEED_GROUP}/{SEED_VERSION}"),
        kind: "LifecycleEvent".into(),
        plural: "lifecycleevents".into(),
    }
}

/// What the API server serves in the seed group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// LifecycleEvents are served there (seed CRDs installed, group free).
    Events,
    /// The group is served without LifecycleEvents: Kubernetes' own API owns it.
    Upstream,
    /// Nothing is served in the group.
    Nothing,
}

/// Asks discovery what the seed group serves.
pub async fn discover(client: &kube::Client) -> Result<Served, kube::Error> {
    match client
        .list_api_group_resources(&format!("{SEED_GROUP}/{SEED_VERSION}"))
        .await
    {
        Ok(list) if list.resources.iter().any(|r| r.name == "lifecycleevents") => {
            Ok(Served::Events)
        }
        Ok(_) => Ok(Served::Upstream),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Served::Nothing),
        Err(e) => Err(e),
    }
}

/// The parts of a seed event [`plan`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedView {
    /// The seed event's UID; its mirror carries it in [`SEED_UID_ANNOTATION`].
    pub uid: String,
    /// `status.claimStatus`, `Pending` when unset or unknown.
    pub claim: ClaimStatus,
    /// The seed event is being deleted (a user cancelled it).
    pub deleting: bool,
    /// Carries [`SEED_BRIDGE_FINALIZER`].
    pub held: bool,
    /// [`MIRROR_UID_ANNOTATION`]: the mirror this event had.
    pub mirror_uid: Option<String>,
}

/// The parts of an object of our group with the seed event's name that [`plan`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorView {
    /// The object's UID (what [`Step::Record`] writes on the seed event).
    pub uid: String,
    /// [`SEED_UID_ANNOTATION`]; `None` on an event of our group nobody mirrored.
    pub of_seed: Option<String>,
    /// `status.claimStatus`, `Pending` when unset.
    pub claim: ClaimStatus,
    /// The object is being deleted.
    pub deleting: bool,
    /// Carries the reconciler's claim finalizer.
    pub claimed: bool,
    /// Carries [`SEED_BRIDGE_FINALIZER`].
    pub held: bool,
    /// Its status differs from the seed event's.
    pub status_differs: bool,
}

impl MirrorView {
    /// The reconciler is done with it: concluded, or cancelled and released.
    fn done(&self) -> bool {
        self.claim.is_terminal() || (self.deleting && !self.claimed)
    }
}

/// One step of the bridge for one seed event, applied in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Put [`SEED_BRIDGE_FINALIZER`] on the seed event, before its mirror exists.
    Hold,
    /// Create the mirror.
    CreateMirror,
    /// Record the mirror's UID on the seed event.
    Record,
    /// Copy the mirror's status (and message) to the seed event.
    CopyStatus,
    /// Remove [`SEED_BRIDGE_FINALIZER`] from the mirror: its outcome is on the seed event.
    ReleaseMirror,
    /// Delete the mirror: the seed event is being deleted (the reconciler cancels it).
    CancelMirror,
    /// Remove our and the old claim finalizer from the seed event and delete it.
    Finish,
    /// An event of our group with this name exists and is not this seed event's mirror.
    Clash,
    /// The mirror is gone, or ended without an outcome: conclude the seed event Failed.
    Lost,
}

/// What the bridge does next for `seed`, given the object of our group with its name.
pub fn plan(seed: &SeedView, ours: Option<&MirrorView>) -> Vec<Step> {
    let mirror = ours.filter(|m| m.of_seed.as_deref() == Some(seed.uid.as_str()));
    if ours.is_some() && mirror.is_none() {
        // Someone else's event of our group: never touched. A seed event being deleted or
        // finished is let go; a live one waits until the name is free.
        return if seed.deleting || seed.claim.is_terminal() {
            vec![Step::Finish]
        } else {
            vec![Step::Clash]
        };
    }
    let release = |m: &MirrorView| m.held.then_some(Step::ReleaseMirror);
    if seed.deleting {
        return match mirror {
            None => vec![Step::Finish],
            Some(m) if m.done() => release(m).into_iter().chain([Step::Finish]).collect(),
            Some(m) if !m.deleting => vec![Step::CancelMirror],
            // The reconciler is stopping the driver; its release comes back as a change.
            Some(_) => vec![],
        };
    }
    if seed.claim.is_terminal() {
        return match mirror {
            Some(m) => release(m).into_iter().chain([Step::Finish]).collect(),
            None => vec![Step::Finish],
        };
    }
    match mirror {
        None if seed.mirror_uid.is_some() => vec![Step::Lost],
        None if seed.held => vec![Step::CreateMirror],
        None => vec![Step::Hold, Step::CreateMirror],
        Some(m) => {
            let mut steps = Vec::new();
            if seed.mirror_uid.as_deref() != Some(m.uid.as_str()) {
                steps.push(Step::Record);
            }
            if m.done() && !m.claim.is_terminal() {
                steps.push(Step::Lost);
            } else if m.status_differs {
                steps.push(Step::CopyStatus);
            }
            if m.done() {
                steps.extend(release(m));
                if m.claim.is_terminal() {
                    steps.push(Step::Finish);
                }
            }
            steps
        }
    }
}

fn claim_of(status: Option<&Value>) -> ClaimStatus {
    status
        .and_then(|s| s.get("claimStatus"))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or(ClaimStatus::Pending)
}

/// The view of a seed event.
pub fn seed_view(seed: &DynamicObject) -> SeedView {
    SeedView {
        uid: seed.uid().unwrap_or_default(),
        claim: claim_of(seed.data.get("status")),
        deleting: seed.metadata.deletion_timestamp.is_some(),
        held: seed.finalizers().iter().any(|f| f == SEED_BRIDGE_FINALIZER),
        mirror_uid: seed.annotations().get(MIRROR_UID_ANNOTATION).cloned(),
    }
}

/// The status a mirror would copy to a seed event (what [`Step::CopyStatus`] writes).
fn copied_status(mirror: &LifecycleEvent) -> Value {
    serde_json::to_value(mirror.status.clone().unwrap_or_default()).unwrap_or(Value::Null)
}

/// The view of `ours`, the object of our group named like `seed`.
pub fn mirror_view(ours: &LifecycleEvent, seed: &DynamicObject) -> MirrorView {
    let seed_status = seed.data.get("status").cloned().unwrap_or(json!({}));
    MirrorView {
        uid: ours.uid().unwrap_or_default(),
        of_seed: ours.annotations().get(SEED_UID_ANNOTATION).cloned(),
        claim: ours
            .status
            .as_ref()
            .and_then(|s| s.claim_status)
            .unwrap_or(ClaimStatus::Pending),
        deleting: ours.metadata.deletion_timestamp.is_some(),
        claimed: ours.finalizers().iter().any(|f| f == CLAIM_FINALIZER),
        held: ours.finalizers().iter().any(|f| f == SEED_BRIDGE_FINALIZER),
        status_differs: copied_status(ours) != seed_status,
    }
}

/// The mirror of `seed` for `spec`: same name and spec, labelled, annotated with the
/// seed event's UID and held by the bridge.
pub fn mirror_of(seed: &DynamicObject, spec: LifecycleEventSpec) -> LifecycleEvent {
    let mut mirror = LifecycleEvent::new(&seed.name_any(), spec);
    mirror.metadata.labels = Some(BTreeMap::from([(SEED_MIRROR_LABEL.into(), "true".into())]));
    mirror.metadata.annotations = Some(BTreeMap::from([(
        SEED_UID_ANNOTATION.into(),
        seed.uid().unwrap_or_default(),
    )]));
    mirror.metadata.finalizers = Some(vec![SEED_BRIDGE_FINALIZER.into()]);
    mirror
}

/// The node a seed event is bound to.
fn binding_node(seed: &DynamicObject) -> Option<&str> {
    seed.data
        .pointer("/spec/bindingNode")
        .and_then(Value::as_str)
}

/// Errors of one bridge step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call on the seed event or its mirror failed.
    #[error("{what} lifecycleevents.{SEED_GROUP} {name}")]
    Api {
        /// The step that failed, as a verb (`hold`, `create mirror of`, `copy status to`).
        what: &'static str,
        /// The seed event's name (its mirror has the same one).
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The seed event's spec cannot be read as ours, so no mirror can be created.
    #[error("lifecycleevents.{SEED_GROUP} {name}: spec is not a LifecycleEvent spec")]
    Spec {
        /// The seed event's name.
        name: String,
        /// Why the spec does not deserialize.
        #[source]
        source: serde_json::Error,
    },
}

fn api_error(what: &'static str, name: &str) -> impl FnOnce(kube::Error) -> Error {
    let name = name.to_string();
    move |source| Error::Api { what, name, source }
}

/// The bridge of one node.
pub struct Bridge {
    node: String,
    seeds: Api<DynamicObject>,
    ours: Api<LifecycleEvent>,
    /// Names whose clash was already reported (said once, not every pass).
    clashes: HashSet<String>,
}

impl Bridge {
    /// A bridge for the seed events bound to `node`; it makes no request until a pass.
    pub fn new(client: &kube::Client, node: &str) -> Self {
        Self {
            node: node.into(),
            seeds: Api::all_with(client.clone(), &seed_resource()),
            ours: Api::all(client.clone()),
            clashes: HashSet::new(),
        }
    }

    /// One pass over the seed events bound to this node and the mirrors of this node.
    pub async fn pass(
        &mut self,
        seeds: &[std::sync::Arc<DynamicObject>],
        mirrors: &[std::sync::Arc<LifecycleEvent>],
    ) -> Result<(), Error> {
        let mut first_error = None;
        let mut names = HashSet::new();
        let node = self.node.clone();
        for seed in seeds
            .iter()
            .filter(|s| binding_node(s) == Some(node.as_str()))
        {
            names.insert(seed.name_any());
            let ours = match self.ours.get_opt(&seed.name_any()).await {
                Ok(ours) => ours,
                Err(e) => {
                    first_error.get_or_insert(api_error("read mirror of", &seed.name_any())(e));
                    continue;
                }
            };
            if let Err(e) = self.step(seed, ours.as_ref()).await {
                tracing::warn!(error = %graceful_drain_core::error::chain(&e), "seed-group bridge");
                first_error.get_or_insert(e);
            }
        }
        // A mirror whose seed event is gone (deleted past our finalizer): cancelled, and
        // let go once the reconciler is done with it.
        for mirror in mirrors
            .iter()
            .filter(|m| m.spec.binding_node == self.node && !names.contains(&m.name_any()))
        {
            if let Err(e) = self.orphan(mirror).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn step(
        &mut self,
        seed: &DynamicObject,
        ours: Option<&LifecycleEvent>,
    ) -> Result<(), Error> {
        let name = seed.name_any();
        let view = seed_view(seed);
        let mirror = ours.map(|o| mirror_view(o, seed));
        for step in plan(&view, mirror.as_ref()) {
            tracing::debug!(event = %name, ?step, "seed-group bridge");
            match step {
                Step::Hold => self.hold(seed).await?,
                Step::CreateMirror => self.create_mirror(seed).await?,
                Step::Record => {
                    let uid = ours.and_then(|o| o.uid()).unwrap_or_default();
                    let patch = json!({"metadata": {"annotations": {MIRROR_UID_ANNOTATION: uid}}});
                    self.seeds
                        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .map_err(api_error("record mirror on", &name))?;
                }
                Step::CopyStatus => {
                    if let Some(o) = ours {
                        self.copy_status(&name, o).await?;
                    }
                }
                Step::ReleaseMirror => {
                    if let Some(o) = ours {
                        self.release_mirror(o).await?;
                    }
                }
                Step::CancelMirror => {
                    tracing::info!(event = %name, "seed event deleted; cancelling its mirror");
                    self.delete_ours(&name, ours.and_then(|o| o.uid())).await?;
                }
                Step::Finish => self.finish(seed).await?,
                Step::Clash => {
                    if self.clashes.insert(name.clone()) {
                        tracing::error!(
                            event = %name,
                            "lifecycleevent {name} in {SEED_GROUP} waits: a lifecycleevent of the same name exists in lifecycle.graceful-drain.io that it does not own; delete or rename one of them"
                        );
                    }
                }
                Step::Lost => self.lost(seed).await?,
            }
        }
        Ok(())
    }

    /// Fails a seed event whose mirror is gone before it ended. Both writes are guarded by
    /// the seed's resourceVersion: a view older than the status this bridge copied from the
    /// mirror just before the mirror went (released, then deleted) would otherwise turn a
    /// finished event into a failed one. A stale view waits for the watch's next pass.
    async fn lost(&self, seed: &DynamicObject) -> Result<(), Error> {
        let name = seed.name_any();
        let message = "its lifecycle.graceful-drain.io mirror was deleted before it ended; apply the event again to run the transition";
        let annotations = json!({"metadata": {
            "annotations": {LIFECYCLE_MESSAGE_ANNOTATION: message},
            "resourceVersion": seed.resource_version(),
        }});
        let annotated = match self
            .seeds
            .patch(&name, &PatchParams::default(), &Patch::Merge(annotations))
            .await
        {
            Ok(annotated) => annotated,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(event = %name, "mirror gone, but the seed changed meanwhile; next pass");
                return Ok(());
            }
            Err(e) => return Err(api_error("annotate", &name)(e)),
        };
        tracing::warn!(event = %name, message);
        let status = json!({
            "metadata": {"resourceVersion": annotated.resource_version()},
            "status": {"claimStatus": ClaimStatus::Failed},
        });
        match self
            .seeds
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(api_error("conclude", &name)(e)),
        }
    }

    /// Our finalizer on the seed event, guarded by its resourceVersion.
    async fn hold(&self, seed: &DynamicObject) -> Result<(), Error> {
        let name = seed.name_any();
        let mut finalizers = seed.finalizers().to_vec();
        finalizers.push(SEED_BRIDGE_FINALIZER.into());
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": seed.resource_version()}});
        self.seeds
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(api_error("hold", &name))?;
        Ok(())
    }

    async fn create_mirror(&self, seed: &DynamicObject) -> Result<(), Error> {
        let name = seed.name_any();
        let spec: LifecycleEventSpec = serde_json::from_value(
            seed.data.get("spec").cloned().unwrap_or(Value::Null),
        )
        .map_err(|source| Error::Spec {
            name: name.clone(),
            source,
        })?;
        tracing::info!(event = %name, transition = %spec.transition_name, "carrying a seed-group event over to lifecycle.graceful-drain.io");
        match self
            .ours
            .create(&PostParams::default(), &mirror_of(seed, spec))
            .await
        {
            Ok(_) => Ok(()),
            // Created by an earlier pass (or the name is taken: the next pass sees a clash).
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(api_error("create mirror of", &name)(e)),
        }
    }

    async fn copy_status(&self, name: &str, mirror: &LifecycleEvent) -> Result<(), Error> {
        if let Some(message) = mirror.annotations().get(LIFECYCLE_MESSAGE_ANNOTATION) {
            let patch =
                json!({"metadata": {"annotations": {LIFECYCLE_MESSAGE_ANNOTATION: message}}});
            self.seeds
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map_err(api_error("annotate", name))?;
        }
        let status: LifecycleEventStatus = mirror.status.clone().unwrap_or_default();
        let patch = json!({"status": status});
        self.seeds
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(api_error("copy status to", name))?;
        Ok(())
    }

    async fn release_mirror(&self, mirror: &LifecycleEvent) -> Result<(), Error> {
        let name = mirror.name_any();
        let finalizers: Vec<&String> = mirror
            .finalizers()
            .iter()
            .filter(|f| *f != SEED_BRIDGE_FINALIZER)
            .collect();
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": mirror.resource_version()}});
        match self
            .ours
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            // Our view was stale: the watch brings the newer object and another pass.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(event = %name, "release mirror: changed meanwhile; next pass");
                Ok(())
            }
            Err(e) => Err(api_error("release mirror", &name)(e)),
        }
    }

    async fn delete_ours(&self, name: &str, uid: Option<String>) -> Result<(), Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.ours.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(e) => Err(api_error("cancel mirror", name)(e)),
        }
    }

    /// Lets the seed event go: our finalizer and an earlier release's claim finalizer
    /// off, then deleted (UID-guarded), as the reconciler deletes a finished event.
    async fn finish(&self, seed: &DynamicObject) -> Result<(), Error> {
        let name = seed.name_any();
        let ours = [SEED_BRIDGE_FINALIZER, SEED_CLAIM_FINALIZER];
        if seed.finalizers().iter().any(|f| ours.contains(&f.as_str())) {
            let kept: Vec<&String> = seed
                .finalizers()
                .iter()
                .filter(|f| !ours.contains(&f.as_str()))
                .collect();
            let patch = json!({"metadata": {"finalizers": kept, "resourceVersion": seed.resource_version()}});
            match self
                .seeds
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                // Our view was stale: the watch brings the newer object and another pass.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tracing::debug!(event = %name, "release seed event: changed meanwhile; next pass");
                    return Ok(());
                }
                Err(e) => return Err(api_error("release", &name)(e)),
            }
        }
        if seed.metadata.deletion_timestamp.is_none() {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: seed.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self.seeds.delete(&name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(api_error("delete", &name)(e)),
            }
        }
        tracing::info!(event = %name, status = ?seed_view(seed).claim, "seed-group event finished");
        Ok(())
    }

    /// A mirror whose seed event no longer exists.
    async fn orphan(&self, mirror: &LifecycleEvent) -> Result<(), Error> {
        let view = MirrorView {
            uid: String::new(),
            of_seed: None,
            claim: mirror
                .status
                .as_ref()
                .and_then(|s| s.claim_status)
                .unwrap_or(ClaimStatus::Pending),
            deleting: mirror.metadata.deletion_timestamp.is_some(),
            claimed: mirror.finalizers().iter().any(|f| f == CLAIM_FINALIZER),
            held: mirror
                .finalizers()
                .iter()
                .any(|f| f == SEED_BRIDGE_FINALIZER),
            status_differs: false,
        };
        if view.done() {
            if view.held {
                self.release_mirror(mirror).await?;
            }
        } else if !view.deleting {
            self.delete_ours(&mirror.name_any(), mirror.uid()).await?;
        }
        Ok(())
    }
}

/// Says once, as an error naming the fix, that seed-group events cannot work here: the
/// seed CRD is installed but Kubernetes' own API owns the group, so it is never served.
async fn report_shadowed(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if let Ok(Some(_)) = crds.get_opt(SEED_EVENT_CRD).await {
        tracing::error!(
            "CustomResourceDefinition {SEED_EVENT_CRD} is installed but never served: Kubernetes serves its own {SEED_GROUP} API (EvictionRequest) on this cluster. LifecycleEvents written there are not driven; write them in lifecycle.graceful-drain.io/v1alpha1 (deploy/examples/drain-event.yaml)"
        );
    }
}

/// Runs the bridge of `node` until `shutdown`: discovery first (asked again every
/// minute while the group serves no LifecycleEvents), then watches of the seed events and
/// of our mirrors, a pass after each change and at every `tick`.
pub async fn run(client: kube::Client, node: String, tick: Duration, shutdown: Shutdown) {
    let mut said_shadowed = false;
    loop {
        match discover(&client).await {
            Ok(Served::Events) => break,
            Ok(Served::Upstream) if !said_shadowed => {
                said_shadowed = true;
                report_shadowed(&client).await;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(error = %graceful_drain_core::error::chain(&error), "discover {SEED_GROUP}");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(DISCOVERY_PERIOD) => {}
        }
    }
    tracing::info!(%node, "{SEED_GROUP} serves LifecycleEvents: the seed-group bridge carries them over to lifecycle.graceful-drain.io");
    let mut bridge = Bridge::new(&client, &node);
    let seed_writer = reflector::store::Writer::<DynamicObject>::new(seed_resource());
    let seed_store = seed_writer.as_reader();
    let seed_watch = watcher(bridge.seeds.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(seed_writer);
    let (mirror_store, mirror_writer) = reflector::store::<LifecycleEvent>();
    let mirror_config = watcher::Config::default().labels(&format!("{SEED_MIRROR_LABEL}=true"));
    let mirror_watch = watcher(bridge.ours.clone(), mirror_config)
        .default_backoff()
        .reflect(mirror_writer);
    let mut changes = futures::stream::select(
        seed_watch.map(|r| r.map(|_| ()).map_err(|e| e.to_string())),
        mirror_watch.map(|r| r.map(|_| ()).map_err(|e| e.to_string())),
    )
    .boxed();
    let mut tick = tokio::time::interval(tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            change = changes.next() => match change {
                None => return,
                Some(Err(error)) => {
                    tracing::warn!(%error, "seed-group bridge watch failed; retrying");
                    continue;
                }
                Some(Ok(())) => {}
            },
        }
        if !ready(&seed_store) || !ready(&mirror_store) {
            continue;
        }
        let (seeds, mirrors) = (seed_store.state(), mirror_store.state());
        let pass = bridge.pass(&seeds, &mirrors);
        tokio::select! {
            () = shutdown.cancelled() => return,
            outcome = pass => if let Err(error) = outcome {
                tracing::warn!(error = %graceful_drain_core::error::chain(&error), "seed-group bridge pass; retrying");
            },
        }
    }
}

fn ready<K: kube::Resource + Clone + 'static>(store: &Store<K>) -> bool
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    use futures::FutureExt;
    store.wait_until_ready().now_or_never().is_some()
}

#[cfg(test)]
mod tests;
