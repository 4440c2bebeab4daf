//! What graceful-drain ships, as every cluster of ours registers it: the chart rendered
//! into `deploy/graceful-drain.yaml` (release `graceful-drain` in namespace
//! `graceful-drain`, default values; `.ci/checks/chart.sh` fails when that file and the
//! chart disagree), read here and changed only where a test cluster must differ from a
//! user's. The webhook configurations call the webhook at a loopback `url` with the test's
//! CA in `caBundle`, where the chart names its Service and cert-manager injects the CA
//! (kube-apiserver here must never dial a ClusterIP); a test may set the one chart value
//! it varies, `webhook.timeoutSeconds`. Everything else — selectors, `matchConditions`,
//! `failurePolicy`, `sideEffects`, rules, RBAC, admission policies — is the chart's, byte
//! for byte. `.ci/checks/shipped.sh` renders the chart with Helm, asks the
//! `tested-objects` binary for [`tested_objects`], and fails on any other difference.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use serde_json::Value;

use super::Error;

/// The chart's default render, as `deploy/graceful-drain.yaml` holds it.
pub const MANIFESTS: &str = include_str!("../../../../deploy/graceful-drain.yaml");
/// Where [`MANIFESTS`] come from, for messages.
pub const FILE: &str = "deploy/graceful-drain.yaml";
/// Annotation by which cert-manager's CA injector fills in `caBundle`; a test cluster
/// has no cert-manager and sets the bundle itself.
const INJECT_CA: &str = "cert-manager.io/inject-ca-from";

/// The kinds that say what the components' ServiceAccounts may do and what the API server
/// enforces on top: RBAC, the ValidatingAdmissionPolicies and the webhook's FlowSchema.
pub const ACCESS_KINDS: [&str; 8] = [
    "FlowSchema",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// The chart values a test may set, with the chart's defaults in [`Default`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Values {
    /// `webhook.timeoutSeconds`: both configurations' `timeoutSeconds`, which the server
    /// reads too.
    pub timeout_seconds: u32,
}

impl Default for Values {
    fn default() -> Self {
        Values {
            timeout_seconds: 10,
        }
    }
}

/// Every object of the chart's default render (YAML documents that are objects).
pub fn objects() -> Result<Vec<Value>, Error> {
    parse(MANIFESTS, FILE)
}

/// Parses the YAML documents of `yaml` (named `file` in errors), keeping the objects.
pub fn parse(yaml: &str, file: &str) -> Result<Vec<Value>, Error> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).map_err(|e| Error::Component {
        name: "chart".into(),
        reason: format!("{file}: {e}"),
    })?;
    Ok(docs.into_iter().filter(Value::is_object).collect())
}

/// The chart's RBAC, admission policies and FlowSchema ([`ACCESS_KINDS`]), unchanged.
pub fn access_objects() -> Result<Vec<Value>, Error> {
    Ok(objects()?
        .into_iter()
        .filter(|d| ACCESS_KINDS.iter().any(|k| d["kind"] == *k))
        .collect())
}

fn one_of_kind(docs: &[Value], kind: &str) -> Result<Value, Error> {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    match (found.next(), found.next()) {
        (Some(doc), None) => Ok(doc.clone()),
        _ => Err(Error::Component {
            name: "chart".into(),
            reason: format!("{FILE}: expected exactly one {kind}"),
        }),
    }
}

/// Points one configuration (as JSON) at `base_url` + each webhook's service path,
/// trusting `ca_pem`, with `values` applied; the cert-manager annotation goes.
fn for_test_cluster(mut doc: Value, base_url: &str, ca_pem: &str, values: &Values) -> Value {
    if let Some(annotations) = doc["metadata"]
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(INJECT_CA);
        if annotations.is_empty() {
            doc["metadata"]
                .as_object_mut()
                .map(|m| m.remove("annotations"));
        }
    }
    let base = base_url.trim_end_matches('/');
    for hook in doc["webhooks"].as_array_mut().into_iter().flatten() {
        let path = hook["clientConfig"]["service"]["path"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let config = WebhookClientConfig {
            url: Some(format!("{base}{path}")),
            ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
            service: None,
        };
        hook["clientConfig"] = serde_json::to_value(config).unwrap_or_default();
        hook["timeoutSeconds"] = Value::from(values.timeout_seconds);
    }
    doc
}

/// The chart's two webhook configurations, calling the webhook at `base_url` (such as
/// `https://127.0.0.1:9443`; each webhook's path is appended) and trusting `ca_pem`.
pub fn webhook_configurations(
    base_url: &str,
    ca_pem: &str,
    values: &Values,
) -> Result<(MutatingWebhookConfiguration, ValidatingWebhookConfiguration), Error> {
    let docs = objects()?;
    let typed = |kind: &str| -> Result<Value, Error> {
        let doc = one_of_kind(&docs, kind)?;
        Ok(for_test_cluster(doc, base_url, ca_pem, values))
    };
    let invalid = |e: serde_json::Error| Error::Component {
        name: "chart".into(),
        reason: format!("{FILE}: webhook configuration: {e}"),
    };
    let mutating =
        serde_json::from_value(typed("MutatingWebhookConfiguration")?).map_err(invalid)?;
    let validating =
        serde_json::from_value(typed("ValidatingWebhookConfiguration")?).map_err(invalid)?;
    Ok((mutating, validating))
}

/// The name both configurations carry (the chart's `graceful-drain.webhook.name`).
pub fn configurations_name() -> Result<String, Error> {
    let doc = one_of_kind(&objects()?, "MutatingWebhookConfiguration")?;
    Ok(doc["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Every object a cluster of ours registers from the chart, as it registers it: the two
/// configurations of [`webhook_configurations`] and [`access_objects`]. What
/// `.ci/checks/shipped.sh` compares with the chart's render.
pub fn tested_objects(base_url: &str, ca_pem: &str, values: &Values) -> Result<Vec<Value>, Error> {
    let (mutating, validating) = webhook_configurations(base_url, ca_pem, values)?;
    let encode = |e: serde_json::Error| Error::Component {
        name: "chart".into(),
        reason: format!("encode a webhook configuration: {e}"),
    };
    // k8s-openapi writes apiVersion and kind.
    let mut out = vec![
        serde_json::to_value(&mutating).map_err(encode)?,
        serde_json::to_value(&validating).map_err(encode)?,
    ];
    out.extend(access_objects()?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_configurations_differ_from_the_charts_only_in_where_they_call() {
        let values = Values { timeout_seconds: 7 };
        let (mutating, validating) =
            webhook_configurations("https://127.0.0.1:9443/", "CA", &values).unwrap();
        let m = &mutating.webhooks.as_ref().unwrap()[0];
        let v = &validating.webhooks.as_ref().unwrap()[0];
        assert_eq!(
            m.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/mutate/eviction")
        );
        assert_eq!(
            v.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/validate/delete")
        );
        assert!(m.client_config.service.is_none());
        assert_eq!(m.timeout_seconds, Some(7));
        assert_eq!(v.timeout_seconds, Some(7));
        // The chart's own conditions and selectors come along.
        let conditions = m.match_conditions.as_ref().unwrap();
        assert!(
            conditions[0]
                .expression
                .contains("system:serviceaccount:graceful-drain:graceful-drain-webhook")
        );
        assert_eq!(v.match_conditions, m.match_conditions);
        let names = &m.namespace_selector.as_ref().unwrap().match_expressions;
        assert!(
            names
                .iter()
                .flatten()
                .any(|e| e.key == "kubernetes.io/metadata.name")
        );
        assert!(
            !mutating
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(INJECT_CA)
        );
    }

    #[test]
    fn access_objects_are_the_charts_rbac_and_policies() {
        let kinds: Vec<String> = access_objects()
            .unwrap()
            .iter()
            .map(|d| d["kind"].as_str().unwrap().to_string())
            .collect();
        for kind in ["ClusterRole", "RoleBinding", "ValidatingAdmissionPolicy"] {
            assert!(kinds.iter().any(|k| k == kind), "{kind} missing: {kinds:?}");
        }
        assert!(!kinds.iter().any(|k| k == "Deployment"));
    }
}
