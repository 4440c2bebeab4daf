//! The simulated Deployment controller, as
//! `system:serviceaccount:kube-system:deployment-controller`.
//!
//! Each Deployment owns ReplicaSets named `<deployment>-<pod-template-hash>`; the one
//! whose hash matches the current template is the new one. A rolling update scales the
//! new ReplicaSet up within `replicas + maxSurge` and the old ones down while at least
//! `replicas - maxUnavailable` pods stay available (the upstream arithmetic); Recreate
//! scales the old ones to zero first. Scale changes are updates carrying the cached
//! resourceVersion, so a stale cache conflicts instead of undoing a newer decision.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use super::{
    Error, Reconciler, Result, Watches, Workers, api_err, controller_of, ns_name, ready,
    run_passes, scaled, status_code,
};
use tokio_util::sync::CancellationToken;

/// Label (on ReplicaSets, their selectors and pods) naming the template version.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// Annotation carrying the rollout revision of a ReplicaSet.
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";

/// The hash of a pod template: FNV-1a over its JSON, rendered with the alphabet the
/// upstream controller uses for names (no vowels, no look-alike digits).
pub fn template_hash(template: &PodTemplateSpec) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let json = serde_json::to_vec(template).unwrap_or_default();
    let mut hash: u32 = 0x811c_9dc5;
    for byte in json {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let mut out = String::new();
    while hash > 0 || out.is_empty() {
        out.push(char::from(ALPHABET[(hash % 27) as usize]));
        hash /= 27;
    }
    out
}

/// The scale-relevant view of one ReplicaSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RsView {
    /// The ReplicaSet's name.
    pub name: String,
    /// spec.replicas
    pub spec: i32,
    /// status.replicas
    pub current: i32,
    /// status.availableReplicas
    pub available: i32,
}

/// Target replica counts of a rolling update step: the new ReplicaSet's and each old
/// one's (oldest first), given `max_surge` and `max_unavailable` already resolved.
pub fn rolling_targets(
    replicas: i32,
    max_surge: i32,
    max_unavailable: i32,
    new: &RsView,
    old: &[RsView],
) -> (i32, Vec<i32>) {
    let old_spec: i32 = old.iter().map(|r| r.spec).sum();
    let new_target = if new.spec >= replicas {
        replicas
    } else {
        let total = new.spec + old_spec;
        let room = (replicas + max_surge - total).max(0);
        new.spec + room.min(replicas - new.spec)
    };
    let mut targets: Vec<i32> = old.iter().map(|r| r.spec).collect();
    let min_available = replicas - max_unavailable;
    let new_unavailable = (new_target - new.available).max(0);
    let mut budget = new_target + old_spec - min_available - new_unavailable;
    if budget <= 0 {
        return (new_target, targets);
    }
    // First, old pods that are not available anyway.
    for (i, rs) in old.iter().enumerate() {
        let unhealthy = (targets[i] - rs.available).max(0).min(budget);
        targets[i] -= unhealthy;
        budget -= unhealthy;
    }
    // Then available old pods, as long as enough stay available overall.
    let available: i32 = new.available + old.iter().map(|r| r.available).sum::<i32>();
    let mut scale_down = (available - min_available).max(0);
    for target in targets.iter_mut() {
        let step = (*target).min(scale_down);
        *target -= step;
        scale_down -= step;
    }
    (new_target, targets)
}

/// Target counts of a Recreate step: old to zero first, the new one once they are gone.
pub fn recreate_targets(replicas: i32, old: &[RsView]) -> (i32, Vec<i32>) {
    let old_gone = old.iter().all(|r| r.current == 0);
    (if old_gone { replicas } else { 0 }, vec![0; old.len()])
}

/// Target replica counts of the new and old ReplicaSets under the Deployment's strategy.
fn targets(spec: &DeploymentSpec, new: &RsView, old: &[RsView]) -> Result<(i32, Vec<i32>)> {
    let replicas = spec.replicas.unwrap_or(1);
    if spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate") {
        return Ok(recreate_targets(replicas, old));
    }
    let rolling = spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref());
    let surge = scaled(
        rolling.and_then(|r| r.max_surge.as_ref()),
        replicas,
        "25%",
        true,
    )?;
    let mut unavailable = scaled(
        rolling.and_then(|r| r.max_unavailable.as_ref()),
        replicas,
        "25%",
        false,
    )?;
    if surge == 0 && unavailable == 0 {
        // Upstream: both zero would never progress, so one pod may be unavailable.
        unavailable = 1;
    }
    Ok(rolling_targets(replicas, surge, unavailable, new, old))
}

fn view(rs: &ReplicaSet) -> RsView {
    let status = rs.status.as_ref();
    RsView {
        name: rs.name_any(),
        spec: rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
        current: status.map_or(0, |s| s.replicas),
        available: status.and_then(|s| s.available_replicas).unwrap_or(0),
    }
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION_ANNOTATION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

struct Sync {
    client: kube::Client,
    deploy: Arc<Deployment>,
    owned: Vec<Arc<ReplicaSet>>,
}

impl Sync {
    fn object(&self) -> String {
        let (ns, name) = ns_name(&*self.deploy);
        format!("deployment {ns}/{name}")
    }

    fn new_replicaset(&self, hash: &str, replicas: i32) -> Result<ReplicaSet> {
        let d = &*self.deploy;
        let spec = d.spec.as_ref().ok_or_else(|| Error::Invalid {
            object: self.object(),
            reason: "no spec".into(),
        })?;
        let mut template = spec.template.clone();
        let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.into());
        let mut selector: LabelSelector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.into());
        let next_revision = self.owned.iter().map(|r| revision(r)).max().unwrap_or(0) + 1;
        Ok(ReplicaSet {
            metadata: ObjectMeta {
                name: Some(format!("{}-{hash}", d.name_any())),
                namespace: d.namespace(),
                labels: meta.labels.clone(),
                annotations: Some(
                    [(REVISION_ANNOTATION.to_string(), next_revision.to_string())].into(),
                ),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    name: d.name_any(),
                    uid: d.uid().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        })
    }

    async fn scale(&self, api: &Api<ReplicaSet>, rs: &ReplicaSet, replicas: i32) -> Result<()> {
        let mut updated = rs.clone();
        if let Some(spec) = updated.spec.as_mut() {
            spec.replicas = Some(replicas);
        }
        let object = format!(
            "replicaset {}/{}",
            rs.namespace().unwrap_or_default(),
            rs.name_any()
        );
        api.replace(&rs.name_any(), &PostParams::default(), &updated)
            .await
            .map_err(api_err("scale", object))?;
        Ok(())
    }

    async fn run(self) -> Result<()> {
        let (ns, _) = ns_name(&*self.deploy);
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let spec = self.deploy.spec.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1);
        let hash = template_hash(&spec.template);
        let mut old: Vec<&Arc<ReplicaSet>> = Vec::new();
        let mut new = None;
        for rs in &self.owned {
            if rs.labels().get(POD_TEMPLATE_HASH) == Some(&hash) {
                new = Some(rs)
            } else {
                old.push(rs)
            }
        }
        old.sort_by_key(|r| r.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let old_views: Vec<RsView> = old.iter().map(|r| view(r)).collect();
        let new_view = new.map_or(
            RsView {
                name: String::new(),
                spec: 0,
                current: 0,
                available: 0,
            },
            |r| view(r),
        );
        let (new_target, old_targets) = targets(&spec, &new_view, &old_views)?;
        match new {
            None => {
                let rs = self.new_replicaset(&hash, new_target)?;
                match api.create(&PostParams::default(), &rs).await {
                    Err(e) if status_code(&e) != Some(409) => {
                        return Err(api_err("create replicaset for", self.object())(e));
                    }
                    _ => {}
                }
            }
            Some(rs) if new_view.spec != new_target => self.scale(&api, rs, new_target).await?,
            Some(_) => {}
        }
        for (rs, target) in old.iter().zip(old_targets) {
            if view(rs).spec != target {
                self.scale(&api, rs, target).await?;
            }
        }
        self.update_status(replicas, new, &old).await
    }

    async fn update_status(
        &self,
        replicas: i32,
        new: Option<&Arc<ReplicaSet>>,
        old: &[&Arc<ReplicaSet>],
    ) -> Result<()> {
        let all: Vec<RsView> = new.iter().chain(old.iter()).map(|r| view(r)).collect();
        let ready_sum: i32 = new
            .iter()
            .chain(old.iter())
            .map(|r| {
                r.status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0)
            })
            .sum();
        let current: i32 = all.iter().map(|r| r.current).sum();
        let available: i32 = all.iter().map(|r| r.available).sum();
        let updated = new.map_or(0, |r| view(r).current);
        let complete = updated == replicas && current == replicas && available == replicas;
        let status = serde_json::json!({
            "observedGeneration": self.deploy.metadata.generation.unwrap_or(0),
            "replicas": current,
            "updatedReplicas": updated,
            "readyReplicas": ready_sum,
            "availableReplicas": available,
            "unavailableReplicas": (replicas - available).max(0),
        });
        let have = self.deploy.status.as_ref().map(|s| {
            serde_json::json!({
                "observedGeneration": s.observed_generation.unwrap_or(0),
                "replicas": s.replicas.unwrap_or(0),
                "updatedReplicas": s.updated_replicas.unwrap_or(0),
                "readyReplicas": s.ready_replicas.unwrap_or(0),
                "availableReplicas": s.available_replicas.unwrap_or(0),
                "unavailableReplicas": s.unavailable_replicas.unwrap_or(0),
            })
        });
        if have.as_ref() == Some(&status) {
            return Ok(());
        }
        let now = jiff::Timestamp::now().to_string();
        let mut status = status;
        status["conditions"] = serde_json::json!([
            {"type": "Available", "status": if available >= replicas.min(1) { "True" } else { "False" },
             "reason": "MinimumReplicasAvailable", "lastUpdateTime": now, "lastTransitionTime": now},
            {"type": "Progressing", "status": "True",
             "reason": if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
             "lastUpdateTime": now, "lastTransitionTime": now},
        ]);
        let (ns, name) = ns_name(&*self.deploy);
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .map_err(api_err("update status of", self.object()))?;
        Ok(())
    }
}

struct Controller {
    client: kube::Client,
    deployments: Store<Deployment>,
    sets: Store<ReplicaSet>,
    workers: Workers,
}

impl Reconciler for Controller {
    async fn pass(&mut self) -> Option<Instant> {
        let sets = self.sets.state();
        for deploy in self.deployments.state() {
            let uid = deploy.uid().unwrap_or_default();
            if deploy.metadata.deletion_timestamp.is_some() || self.workers.busy(&uid) {
                continue;
            }
            let owned: Vec<Arc<ReplicaSet>> = sets
                .iter()
                .filter(|rs| controller_of(&***rs).is_some_and(|o| o.uid == uid))
                .cloned()
                .collect();
            let sync = Sync {
                client: self.client.clone(),
                deploy,
                owned,
            };
            self.workers.spawn(uid, sync.run());
        }
        None
    }
}

/// Runs the Deployment controller until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) -> Result<()> {
    let watches = Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let deployments = watches.all::<Deployment>();
    let sets = watches.all::<ReplicaSet>();
    if !(ready(&deployments, &shutdown).await && ready(&sets, &shutdown).await) {
        return Ok(());
    }
    let ctl = Controller {
        client,
        deployments,
        sets,
        workers: Workers::new(wake.clone()),
    };
    run_passes(ctl, &wake, &shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rs(spec: i32, available: i32) -> RsView {
        RsView {
            name: String::new(),
            spec,
            current: spec,
            available,
        }
    }

    #[test]
    fn rolling_update_respects_surge_and_unavailability() {
        // 4 replicas, surge 1, unavailable 0: start of a rollout.
        let (new, old) = rolling_targets(4, 1, 0, &rs(0, 0), &[rs(4, 4)]);
        assert_eq!((new, old.clone()), (1, vec![4]));
        // The new pod is available: one old pod may go.
        let (new, old) = rolling_targets(4, 1, 0, &rs(1, 1), &[rs(4, 4)]);
        assert_eq!((new, old), (1, vec![3]));
        // Then the new RS may surge again.
        let (new, old) = rolling_targets(4, 1, 0, &rs(1, 1), &[rs(3, 3)]);
        assert_eq!((new, old), (2, vec![3]));
        // Not yet available: nothing more goes.
        let (new, old) = rolling_targets(4, 1, 0, &rs(2, 1), &[rs(3, 3)]);
        assert_eq!((new, old), (2, vec![3]));
    }

    #[test]
    fn unavailable_old_pods_go_first_and_scaling_without_rollout() {
        let (new, old) = rolling_targets(4, 1, 1, &rs(1, 0), &[rs(4, 2)]);
        assert_eq!(new, 1);
        assert_eq!(
            old,
            vec![3],
            "one unavailable old pod goes: the budget allows one"
        );
        assert_eq!(rolling_targets(6, 2, 1, &rs(4, 4), &[]), (6, vec![]));
        assert_eq!(rolling_targets(2, 1, 0, &rs(4, 4), &[]), (2, vec![]));
        assert_eq!(recreate_targets(3, &[rs(3, 3)]), (0, vec![0]));
        assert_eq!(
            recreate_targets(
                3,
                &[RsView {
                    name: String::new(),
                    spec: 0,
                    current: 0,
                    available: 0
                }]
            ),
            (3, vec![0])
        );
    }

    #[test]
    fn template_hash_tracks_the_template() {
        let mut t = PodTemplateSpec::default();
        let a = template_hash(&t);
        assert_eq!(a, template_hash(&t));
        t.metadata = Some(ObjectMeta {
            annotations: Some([("x".to_string(), "1".to_string())].into()),
            ..Default::default()
        });
        assert_ne!(a, template_hash(&t));
        assert!(a.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
    }
}
