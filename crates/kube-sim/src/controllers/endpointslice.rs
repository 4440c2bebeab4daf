//! The simulated EndpointSlice controller, as
//! `system:serviceaccount:kube-system:endpointslice-controller`.
//!
//! The slices of a Service with a selector are labelled `kubernetes.io/service-name` and
//! `endpointslice.kubernetes.io/managed-by`, and hold an endpoint per pod matching the
//! selector that has an IP, with conditions `ready` (Ready and not terminating), `serving`
//! (Ready) and `terminating`, and a `targetRef` to the pod — at most
//! [`MAX_ENDPOINTS_PER_SLICE`] (100, kube-controller-manager's `--max-endpoints-per-slice`
//! default) a slice. As upstream's reconciler does (staging/src/k8s.io/endpointslice/
//! reconciler.go, `reconcileByPortMapping`), an endpoint stays in the slice it is in: a
//! pass drops the endpoints no longer wanted and updates the changed ones in place, puts
//! new endpoints into slices with room (those it updates anyway first), and creates a
//! slice only when none has room; a slice left empty is deleted, except one kept as the
//! placeholder of a Service with no endpoint. The first slice is named
//! `<service>-<5 characters of its UID>`, later ones get `-2`, `-3`… (upstream generates
//! names; only their uniqueness matters). Slices of Services that are gone are deleted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use super::{
    Reconciler, Result, Watches, api_err, by_namespace, labels_of, map_selector_matches, ns_name,
    pod_finished, pod_ready, ready, run_passes, status_code,
};
use crate::lb::SERVICE_NAME_LABEL;
use tokio_util::sync::CancellationToken;

/// Label naming the controller that manages a slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Our value of [`MANAGED_BY_LABEL`] (the upstream controller's).
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

/// The name of the slice of `svc`.
pub fn slice_name(svc: &Service) -> String {
    let uid = svc.uid().unwrap_or_default();
    let suffix: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(5)
        .collect();
    format!("{}-{}", svc.name_any(), suffix.to_lowercase())
}

fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
}

fn port_for(target: Option<&IntOrString>, port: i32, pods: &[&Pod]) -> Option<i32> {
    match target {
        None => Some(port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => pods.iter().find_map(|p| {
            p.spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|cp| cp.name.as_deref() == Some(name.as_str()))
                .map(|cp| cp.container_port)
        }),
    }
}

/// The endpoint of one pod: ready = Ready and not terminating; serving = Ready.
fn endpoint(pod: &Pod, ns: &str) -> Endpoint {
    let serving = pod_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    Endpoint {
        addresses: pod_ip(pod).into_iter().collect(),
        conditions: Some(EndpointConditions {
            ready: Some(serving && !terminating),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            name: Some(pod.name_any()),
            namespace: Some(ns.to_string()),
            uid: pod.uid(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The slice's ports: each Service port with its targetPort resolved on the pods.
fn ports(spec: &ServiceSpec, members: &[&Pod]) -> Vec<EndpointPort> {
    spec.ports
        .iter()
        .flatten()
        .filter_map(|sp| {
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port_for(sp.target_port.as_ref(), sp.port, members)?),
                protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

/// Most endpoints in one slice.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// The slices `svc` should have, given the pods of its namespace and its slices as they
/// are (`None` without selector); see the module documentation.
pub fn desired_slices(
    svc: &Service,
    pods: &[Arc<Pod>],
    existing: &[&EndpointSlice],
) -> Option<Vec<EndpointSlice>> {
    let template = desired_slice(svc, pods)?;
    let uid_of = |e: &Endpoint| {
        e.target_ref
            .as_ref()
            .and_then(|r| r.uid.clone())
            .unwrap_or_default()
    };
    let mut wanted: Vec<(String, Endpoint)> = template
        .endpoints
        .iter()
        .map(|e| (uid_of(e), e.clone()))
        .collect();
    let mut mine: Vec<&EndpointSlice> = existing
        .iter()
        .copied()
        .filter(|s| s.metadata.namespace == template.metadata.namespace)
        .filter(|s| {
            s.metadata.owner_references.as_ref().is_some_and(|o| {
                o.iter()
                    .any(|o| Some(&o.uid) == svc.metadata.uid.as_ref() && o.kind == "Service")
            })
        })
        .collect();
    mine.sort_by_key(|s| slice_order(s.metadata.name.as_deref().unwrap_or_default()));
    // 1. Each existing slice keeps the endpoints still wanted, updated.
    let mut slices: Vec<(String, Vec<Endpoint>, bool)> = mine
        .iter()
        .map(|slice| {
            let mut kept = Vec::new();
            for endpoint in &slice.endpoints {
                let uid = uid_of(endpoint);
                if let Some(at) = wanted.iter().position(|(u, _)| *u == uid) {
                    kept.push(wanted.remove(at).1);
                }
            }
            let changed = kept != slice.endpoints;
            let name = slice.metadata.name.clone().unwrap_or_default();
            (name, kept, changed)
        })
        .collect();
    // 2. New endpoints fill slices with room, those changing anyway first.
    let mut order: Vec<usize> = (0..slices.len()).collect();
    order.sort_by_key(|&i| !slices[i].2);
    for i in order {
        let room = MAX_ENDPOINTS_PER_SLICE.saturating_sub(slices[i].1.len());
        let take = room.min(wanted.len());
        slices[i].1.extend(wanted.drain(..take).map(|(_, e)| e));
    }
    // 3. Then new slices.
    let base = template.metadata.name.clone().unwrap_or_default();
    let mut n = 1;
    while !wanted.is_empty() {
        let name = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        n += 1;
        if slices.iter().any(|(have, _, _)| *have == name) {
            continue;
        }
        let take = MAX_ENDPOINTS_PER_SLICE.min(wanted.len());
        slices.push((name, wanted.drain(..take).map(|(_, e)| e).collect(), true));
    }
    // Empty slices go, but a Service keeps one slice (upstream's placeholder).
    let mut out: Vec<EndpointSlice> = slices
        .into_iter()
        .filter(|(_, endpoints, _)| !endpoints.is_empty())
        .map(|(name, endpoints, _)| {
            let mut slice = template.clone();
            slice.metadata.name = Some(name);
            slice.endpoints = endpoints;
            slice
        })
        .collect();
    if out.is_empty() {
        let mut placeholder = template;
        if let Some(first) = mine.first() {
            placeholder.metadata.name = first.metadata.name.clone();
        }
        out.push(placeholder);
    }
    Some(out)
}

/// Sorts `<base>`, `<base>-2`, `<base>-10` in creation order.
fn slice_order(name: &str) -> (usize, String) {
    let n = name
        .rsplit_once('-')
        .and_then(|(_, n)| n.parse::<usize>().ok())
        .unwrap_or(1);
    (n, name.to_string())
}

/// The single slice holding every endpoint of `svc` (`None` without selector): the
/// template [`desired_slices`] splits.
pub fn desired_slice(svc: &Service, pods: &[Arc<Pod>]) -> Option<EndpointSlice> {
    let spec = svc.spec.as_ref()?;
    let selector = spec.selector.as_ref().filter(|s| !s.is_empty())?;
    let (ns, name) = ns_name(svc);
    let mut members: Vec<&Pod> = pods
        .iter()
        .map(|p| &**p)
        .filter(|p| {
            !pod_finished(p)
                && pod_ip(p).is_some()
                && map_selector_matches(Some(selector), &labels_of(*p))
        })
        .collect();
    members.sort_by_key(|p| p.name_any());
    let labels: BTreeMap<String, String> = [
        (SERVICE_NAME_LABEL.to_string(), name.clone()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ]
    .into();
    Some(EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: members.iter().map(|p| endpoint(p, &ns)).collect(),
        ports: Some(ports(spec, &members)),
        metadata: ObjectMeta {
            name: Some(slice_name(svc)),
            namespace: Some(ns),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name,
                uid: svc.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
    })
}

fn same_content(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    a.endpoints == b.endpoints && a.ports == b.ports && a.metadata.labels == b.metadata.labels
}

struct Controller {
    client: kube::Client,
    services: Store<Service>,
    pods: Store<Pod>,
    slices: Store<EndpointSlice>,
    /// The slices as we last wrote them: fresher than the cache right after a write.
    written: std::collections::HashMap<(Option<String>, Option<String>), EndpointSlice>,
}

/// The fresher of two versions of one slice (resourceVersions are numbers here, as in
/// etcd; anything else prefers the cache).
fn fresher<'a>(
    cached: Option<&'a EndpointSlice>,
    written: Option<&'a EndpointSlice>,
) -> Option<&'a EndpointSlice> {
    let rv = |s: &EndpointSlice| {
        s.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (cached, written) {
        (Some(c), Some(w)) if rv(w) > rv(c) => Some(w),
        (Some(c), _) => Some(c),
        (None, _) => None,
    }
}

impl Reconciler for Controller {
    async fn pass(&mut self) -> Option<Instant> {
        let by_ns = by_namespace(&self.pods.state());
        let slices = self.slices.state();
        // The slices as they are: the cache, or what this controller wrote since if fresher.
        let mut current: Vec<EndpointSlice> = slices
            .iter()
            .map(|cached| {
                let id = (
                    cached.metadata.namespace.clone(),
                    cached.metadata.name.clone(),
                );
                fresher(Some(&**cached), self.written.get(&id))
                    .cloned()
                    .unwrap_or_else(|| (**cached).clone())
            })
            .collect();
        for (id, written) in &self.written {
            let known = current
                .iter()
                .any(|s| s.metadata.namespace == id.0 && s.metadata.name == id.1);
            if !known {
                current.push(written.clone());
            }
        }
        let mut wanted = Vec::new();
        for svc in self.services.state() {
            let pods = by_ns
                .get(&svc.namespace().unwrap_or_default())
                .cloned()
                .unwrap_or_default();
            let existing: Vec<&EndpointSlice> = current.iter().collect();
            let Some(wants) = desired_slices(&svc, &pods, &existing) else {
                continue;
            };
            for want in wants {
                let id = (want.metadata.namespace.clone(), want.metadata.name.clone());
                wanted.push(id.clone());
                let have = current
                    .iter()
                    .find(|s| s.metadata.namespace == id.0 && s.metadata.name == id.1)
                    .cloned();
                match self.write(have.as_ref(), want).await {
                    Ok(Some(written)) => {
                        self.written.insert(id, written);
                    }
                    Ok(None) => {}
                    Err(error) => {
                        // Retried next pass from the cache (a slice deleted behind our
                        // back is created again rather than updated forever).
                        self.written.remove(&id);
                        tracing::debug!(%error, "endpointslice write failed; will retry");
                    }
                }
            }
        }
        let gone: Vec<EndpointSlice> = current
            .into_iter()
            .filter(|s| !wanted.contains(&(s.metadata.namespace.clone(), s.metadata.name.clone())))
            .collect();
        for slice in &gone {
            let id = (
                slice.metadata.namespace.clone(),
                slice.metadata.name.clone(),
            );
            self.written.remove(&id);
            let (ns, name) = ns_name(slice);
            let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
            if let Err(error) = api.delete(&name, &DeleteParams::default()).await
                && status_code(&error) != Some(404)
            {
                tracing::info!(slice = %format!("{ns}/{name}"), %error, "delete endpointslice failed");
            }
        }
        None
    }
}

impl Controller {
    /// Creates or updates the slice; returns what was written, if anything.
    async fn write(
        &self,
        have: Option<&EndpointSlice>,
        mut want: EndpointSlice,
    ) -> Result<Option<EndpointSlice>> {
        let ns = want.metadata.namespace.clone().unwrap_or_default();
        let name = want.metadata.name.clone().unwrap_or_default();
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        let object = format!("endpointslice {ns}/{name}");
        match have {
            Some(have) if same_content(have, &want) => Ok(None),
            Some(have) => {
                want.metadata.resource_version = have.metadata.resource_version.clone();
                let written = api
                    .replace(&name, &PostParams::default(), &want)
                    .await
                    .map_err(api_err("update", object))?;
                Ok(Some(written))
            }
            None => match api.create(&PostParams::default(), &want).await {
                Ok(written) => Ok(Some(written)),
                Err(e) if status_code(&e) != Some(409) => Err(api_err("create", object)(e)),
                Err(_) => Ok(None),
            },
        }
    }
}

/// Runs the EndpointSlice controller until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) -> Result<()> {
    let watches = Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let services = watches.all::<Service>();
    let pods = watches.all::<Pod>();
    let managed = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let slices = watches.matching::<EndpointSlice>(managed);
    if !(ready(&services, &shutdown).await
        && ready(&pods, &shutdown).await
        && ready(&slices, &shutdown).await)
    {
        return Ok(());
    }
    let ctl = Controller {
        client,
        services,
        pods,
        slices,
        written: Default::default(),
    };
    run_passes(ctl, &wake, &shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, PodFixture};
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn svc() -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("ABCDEF-123".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                selector: Some([("app".to_string(), "web".to_string())].into()),
                ports: Some(vec![ServicePort {
                    port: 80,
                    target_port: Some(IntOrString::Int(8080)),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn pod(name: &str, app: &str, ready: bool, deleting: bool) -> Arc<Pod> {
        let pod = fixtures::pod(name)
            .ns("ns")
            .label("app", app)
            .on_node("n1")
            .ip(&format!("10.0.0.{}", name.len()))
            .ready_is(ready);
        Arc::new(if deleting {
            pod.deleting(jiff::Timestamp::UNIX_EPOCH, None)
        } else {
            pod
        })
    }

    #[test]
    fn slice_lists_matching_pods_with_conditions() {
        let pods = vec![
            pod("a", "web", true, false),
            pod("bb", "web", true, true),
            pod("ccc", "web", false, false),
            pod("d", "other", true, false),
        ];
        let slice = desired_slice(&svc(), &pods).unwrap();
        assert_eq!(slice.metadata.name.as_deref(), Some("web-abcde"));
        let got: Vec<_> = slice
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.clone().unwrap();
                (
                    e.target_ref.as_ref().unwrap().name.clone().unwrap(),
                    c.ready.unwrap(),
                    c.serving.unwrap(),
                    c.terminating.unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), true, true, false),
                ("bb".into(), false, true, true),
                ("ccc".into(), false, false, false)
            ]
        );
        assert_eq!(slice.ports.unwrap()[0].port, Some(8080));
        assert_eq!(
            slice.endpoints[0]
                .target_ref
                .as_ref()
                .unwrap()
                .uid
                .as_deref(),
            Some("a-uid")
        );
    }

    fn many(from: usize, to: usize) -> Vec<Arc<Pod>> {
        (from..to)
            .map(|i| {
                Arc::new(
                    fixtures::pod(&format!("p{i:04}"))
                        .ns("ns")
                        .label("app", "web")
                        .on_node("n1")
                        .ip(&format!("10.0.{}.{}", i / 250, i % 250))
                        .ready_is(true),
                )
            })
            .collect()
    }

    fn names_and_sizes(slices: &[EndpointSlice]) -> Vec<(String, usize)> {
        slices
            .iter()
            .map(|s| (s.metadata.name.clone().unwrap(), s.endpoints.len()))
            .collect()
    }

    fn owned(mut slices: Vec<EndpointSlice>) -> Vec<EndpointSlice> {
        for s in &mut slices {
            s.metadata.owner_references.as_mut().unwrap()[0].uid = "ABCDEF-123".into();
        }
        slices
    }

    fn pods_in(slice: &EndpointSlice) -> Vec<String> {
        slice
            .endpoints
            .iter()
            .map(|e| e.target_ref.as_ref().unwrap().name.clone().unwrap())
            .collect()
    }

    #[test]
    fn endpoints_are_split_at_100_a_slice_and_stay_where_they_are() {
        let first = desired_slices(&svc(), &many(0, 250), &[]).unwrap();
        assert_eq!(
            names_and_sizes(&first),
            [
                ("web-abcde".into(), 100),
                ("web-abcde-2".into(), 100),
                ("web-abcde-3".into(), 50)
            ]
        );
        let first = owned(first);
        let existing: Vec<&EndpointSlice> = first.iter().collect();
        // Ten pods of the second slice go, twenty new ones come: the new ones fill the
        // slice that changes anyway, then the one with room; nobody else moves.
        let mut pods = many(0, 110);
        pods.extend(many(120, 250));
        pods.extend(many(300, 320));
        let next = desired_slices(&svc(), &pods, &existing).unwrap();
        assert_eq!(
            names_and_sizes(&next),
            [
                ("web-abcde".into(), 100),
                ("web-abcde-2".into(), 100),
                ("web-abcde-3".into(), 60)
            ]
        );
        assert_eq!(pods_in(&next[0]), pods_in(&first[0]), "untouched slice");
        let second = pods_in(&next[1]);
        let stayed: Vec<String> = pods_in(&first[1])
            .into_iter()
            .filter(|p| !("p0110".."p0120").contains(&p.as_str()))
            .collect();
        assert_eq!(second[..90], stayed[..]);
        assert!(
            second[90..].iter().all(|p| p.as_str() >= "p0300"),
            "{second:?}"
        );
        assert_eq!(pods_in(&next[2])[..50], pods_in(&first[2])[..]);
        // Every pod gone: the first slice stays, empty, as the placeholder.
        let none = desired_slices(&svc(), &[], &existing).unwrap();
        assert_eq!(names_and_sizes(&none), [("web-abcde".into(), 0)]);
        // Another Service's slices are not ours.
        let mut other = svc();
        other.metadata.uid = Some("OTHER".into());
        let theirs = desired_slices(&other, &many(0, 5), &existing).unwrap();
        assert_eq!(names_and_sizes(&theirs), [("web-other".into(), 5)]);
    }

    #[test]
    fn services_without_selector_get_no_slice() {
        let mut s = svc();
        s.spec.as_mut().unwrap().selector = None;
        assert!(desired_slice(&s, &[]).is_none());
    }
}
