//! A minimal garbage collector, as
//! `system:serviceaccount:kube-system:generic-garbage-collector`: deletes pods whose
//! controlling ReplicaSet, StatefulSet, DaemonSet or Job is gone and ReplicaSets whose
//! controlling Deployment is gone (background cascading deletion, what `kubectl delete`
//! and `helm uninstall` rely on; upstream's pkg/controller/garbagecollector does this for
//! any owner reference, these are the ones our workloads use). An owner
//! missing from the cache is confirmed with a GET first, so a cache lag never deletes.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::{
    Reconciler, Result, Watches, api_err, controller_of, ns_name, ready, run_passes, status_code,
};
use tokio_util::sync::CancellationToken;

/// Whether the owner `(name, uid)` of a dependent in `ns` is really gone.
async fn owner_gone<O>(client: &kube::Client, ns: &str, name: &str, uid: &str) -> Result<bool>
where
    O: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    O::DynamicType: Default,
{
    let api: Api<O> = Api::namespaced(client.clone(), ns);
    let found = api
        .get_opt(name)
        .await
        .map_err(api_err("get owner", format!("{ns}/{name}")))?;
    Ok(found.is_none_or(|o| o.uid().as_deref() != Some(uid)))
}

async fn collect<D, O>(
    client: &kube::Client,
    dependents: &[Arc<D>],
    owners: &Store<O>,
    kind: &str,
) -> Result<()>
where
    D: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    D::DynamicType: Default,
    O: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    O::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let owner_uids: Vec<String> = owners.state().iter().filter_map(|o| o.uid()).collect();
    for dep in dependents {
        let Some(owner) = controller_of(&**dep).filter(|o| o.kind == kind) else {
            continue;
        };
        if dep.meta().deletion_timestamp.is_some() || owner_uids.contains(&owner.uid) {
            continue;
        }
        let (ns, name) = ns_name(&**dep);
        if !owner_gone::<O>(client, &ns, &owner.name, &owner.uid).await? {
            continue;
        }
        let api: Api<D> = Api::namespaced(client.clone(), &ns);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: dep.uid(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match api.delete(&name, &dp).await {
            Err(e) if !matches!(status_code(&e), Some(404 | 409)) => {
                return Err(api_err("collect", format!("{ns}/{name}"))(e));
            }
            _ => tracing::debug!(object = %format!("{ns}/{name}"), "collected orphan"),
        }
    }
    Ok(())
}

/// The collector's caches of owners and dependents.
struct Collector {
    client: kube::Client,
    deployments: Store<Deployment>,
    sets: Store<ReplicaSet>,
    pods: Store<Pod>,
    statefulsets: Store<StatefulSet>,
    daemonsets: Store<DaemonSet>,
    jobs: Store<Job>,
}

impl Reconciler for Collector {
    /// Collects what lost its owner; a failure is retried at the next pass, which only a
    /// change or the resync brings.
    async fn pass(&mut self) -> Option<Instant> {
        let client = &self.client;
        let sets = self.sets.state();
        let collected =
            collect::<ReplicaSet, Deployment>(client, &sets, &self.deployments, "Deployment");
        if let Err(error) = collected.await {
            tracing::info!(%error, "garbage collection failed; will retry");
        }
        let pods = self.pods.state();
        let passes = [
            collect::<Pod, ReplicaSet>(client, &pods, &self.sets, "ReplicaSet").await,
            collect::<Pod, StatefulSet>(client, &pods, &self.statefulsets, "StatefulSet").await,
            collect::<Pod, DaemonSet>(client, &pods, &self.daemonsets, "DaemonSet").await,
            collect::<Pod, Job>(client, &pods, &self.jobs, "Job").await,
        ];
        for error in passes.into_iter().filter_map(Result::err) {
            tracing::info!(%error, "garbage collection failed; will retry");
        }
        None
    }
}

/// Runs the garbage collector until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) -> Result<()> {
    let watches = Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let deployments = watches.all::<Deployment>();
    let sets = watches.all::<ReplicaSet>();
    let pods = watches.all::<Pod>();
    let statefulsets = watches.all::<StatefulSet>();
    let daemonsets = watches.all::<DaemonSet>();
    let jobs = watches.all::<Job>();
    if !(ready(&deployments, &shutdown).await
        && ready(&sets, &shutdown).await
        && ready(&pods, &shutdown).await
        && ready(&statefulsets, &shutdown).await
        && ready(&daemonsets, &shutdown).await
        && ready(&jobs, &shutdown).await)
    {
        return Ok(());
    }
    let collector = Collector {
        client,
        deployments,
        sets,
        pods,
        statefulsets,
        daemonsets,
        jobs,
    };
    run_passes(collector, &wake, &shutdown).await
}
