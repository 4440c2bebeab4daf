//! Bulk loading: objects stored directly, without an HTTP round trip, admission or
//! managed fields, for benchmarks that need a large cluster in seconds.
//!
//! Each object goes through the create path's storage half: the body is prepared like
//! a request's (typed round trip, defaults, validation), the name is checked and the
//! uid, creationTimestamp and generation are set, the store assigns the resourceVersion
//! and records an ADDED event. Unlike a create, the status the caller sends is kept: a
//! loaded cluster is one its controllers and kubelets have already caught up with. A
//! loaded CustomResourceDefinition serves nothing; create those through the API.

use serde_json::Value;

use super::ApiServer;
use super::meta::meta_str;
use super::request::Target;
use super::write::{Fields, init_metadata, prepare_body, prepare_for_create};

/// Why a bulk load stopped.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The resource is not served (`group_version` is `v1` or `group/version`).
    #[error("load {group_version}/{plural}: resource not served")]
    NotServed {
        /// The group/version asked for, as given to [`ApiServer::load`].
        group_version: String,
        /// The resource's plural name, as given.
        plural: String,
    },
    /// The server refused an object as it would refuse its create.
    #[error("load {plural} {namespace}/{name}: {message}")]
    Refused {
        /// The resource's plural name.
        plural: String,
        /// The namespace the object's metadata names (empty for cluster-scoped objects).
        namespace: String,
        /// The name the object's metadata gives (empty when it only had `generateName`).
        name: String,
        /// The reason, as the create path words it.
        message: String,
    },
}

impl ApiServer {
    /// Stores `objects` of resource `group_version`/`plural` (e.g. `"apps/v1"`,
    /// `"deployments"`) in order, each in the namespace its metadata names, and returns
    /// their uids in the same order. Namespaces must exist (or be loaded first). No
    /// webhook is called and no controller runs unless one watches.
    pub fn load(
        &self,
        group_version: &str,
        plural: &str,
        objects: impl IntoIterator<Item = Value>,
    ) -> Result<Vec<String>, LoadError> {
        let (group, version) = group_version.split_once('/').unwrap_or(("", group_version));
        let def = self
            .ctx
            .registry
            .find(group, version, plural)
            .ok_or_else(|| LoadError::NotServed {
                group_version: group_version.to_string(),
                plural: plural.to_string(),
            })?;
        let mut uids = Vec::new();
        for object in objects {
            let namespace = meta_str(&object, "namespace").to_string();
            let given_name = meta_str(&object, "name").to_string();
            let refused = |message: String| LoadError::Refused {
                plural: plural.to_string(),
                namespace: namespace.clone(),
                name: given_name.clone(),
                message,
            };
            let target = Target {
                def: def.clone(),
                namespace: namespace.clone(),
                name: None,
                sub: None,
            };
            let mut obj =
                prepare_body(&def, object, Fields::Ignore).map_err(|e| refused(e.to_string()))?;
            let status = obj.get("status").filter(|s| !s.is_null()).cloned();
            init_metadata(&self.ctx, &target, &mut obj).map_err(|e| refused(e.to_string()))?;
            prepare_for_create(&def, &mut obj);
            if let (Some(status), Some(map)) = (status, obj.as_object_mut()) {
                map.insert("status".into(), status);
            }
            let name = meta_str(&obj, "name").to_string();
            let key = def.key(&namespace, &name);
            let stored = self
                .ctx
                .store
                .create(&def.table(), &key, def.view.to_storage(obj))
                .map_err(|e| refused(format!("{e:?}")))?;
            uids.push(meta_str(&stored, "uid").to_string());
        }
        Ok(uids)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::Config;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn loaded_objects_read_back_like_created_ones_with_their_status() {
        let server = ApiServer::start(Config::default(), CancellationToken::new())
            .await
            .unwrap();
        let pod = json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "app"}]},
            "status": {"phase": "Running"}});
        let uids = server.load("v1", "pods", [pod]).unwrap();
        let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(server.client("admin"), "default");
        let stored = api.get("p").await.unwrap();
        assert_eq!(stored.metadata.uid.as_deref(), Some(uids[0].as_str()));
        assert!(stored.metadata.resource_version.is_some());
        assert!(stored.metadata.creation_timestamp.is_some());
        assert_eq!(stored.status.unwrap().phase.as_deref(), Some("Running"));
        let missing = json!({"metadata": {"name": "q", "namespace": "nowhere"},
            "spec": {"containers": [{"name": "app", "image": "app"}]}});
        assert!(matches!(
            server.load("v1", "pods", [missing]),
            Err(LoadError::Refused { .. })
        ));
    }
}
