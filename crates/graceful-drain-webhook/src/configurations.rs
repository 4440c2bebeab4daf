//! The MutatingWebhookConfiguration and ValidatingWebhookConfiguration that register the
//! webhook, built in one place so the chart, the simulator, the tests and the docs agree.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use graceful_drain_core::labels::OPT_OUT_LABEL;

/// Path of the mutating (eviction) endpoint.
pub const EVICTION_PATH: &str = "/mutate/eviction";
/// Path of the validating (delete) endpoint.
pub const DELETE_PATH: &str = "/validate/delete";

/// Where the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A base URL such as `https://127.0.0.1:9443` (the paths are appended).
    Url(String),
    /// A Service in the cluster.
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
        /// Service port; `None` lets the API server use its default, 443.
        port: Option<i32>,
    },
}

/// Inputs of [`webhook_configurations`].
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigurationsSpec {
    /// Name of both configuration objects (e.g. the Helm release's full name).
    pub name: String,
    /// Where the API server sends the reviews of both webhooks.
    pub target: Target,
    /// PEM CA bundle that signed the serving certificate (empty when cert-manager's CA
    /// injector fills it in).
    pub ca_bundle: Option<String>,
    /// `timeoutSeconds` of both webhooks (1..=30); the server reads the same value.
    pub timeout_seconds: i32,
    /// `Ignore` (default: a webhook outage never blocks drains) or `Fail`.
    pub failure_policy: String,
    /// Defaults to "namespace not labelled with the opt-out label".
    pub namespace_selector: Option<LabelSelector>,
    /// Defaults to "pod not labelled with the opt-out label".
    pub object_selector: Option<LabelSelector>,
    /// Extra labels on both objects.
    pub labels: BTreeMap<String, String>,
}

impl Default for ConfigurationsSpec {
    fn default() -> Self {
        ConfigurationsSpec {
            name: "graceful-drain".into(),
            target: Target::Service {
                namespace: "graceful-drain".into(),
                name: "graceful-drain-webhook".into(),
                port: Some(443),
            },
            ca_bundle: None,
            timeout_seconds: 10,
            failure_policy: "Ignore".into(),
            namespace_selector: None,
            object_selector: None,
            labels: BTreeMap::new(),
        }
    }
}

/// `graceful-drain.io/exclude NotIn [true]`: everything not opted out.
pub fn not_opted_out() -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: OPT_OUT_LABEL.into(),
            operator: "NotIn".into(),
            values: Some(vec!["true".into()]),
        }]),
        match_labels: None,
    }
}

fn client_config(spec: &ConfigurationsSpec, path: &str) -> WebhookClientConfig {
    let ca_bundle = spec
        .ca_bundle
        .as_ref()
        .map(|pem| ByteString(pem.as_bytes().to_vec()));
    match &spec.target {
        Target::Url(base) => WebhookClientConfig {
            url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            ca_bundle,
            service: None,
        },
        Target::Service {
            namespace,
            name,
            port,
        } => WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path.into()),
                port: *port,
            }),
            ca_bundle,
            url: None,
        },
    }
}

fn rule(operation: &str, resource: &str) -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(vec![operation.into()]),
        resources: Some(vec![resource.into()]),
        scope: Some("Namespaced".into()),
    }]
}

fn meta(spec: &ConfigurationsSpec) -> ObjectMeta {
    ObjectMeta {
        name: Some(spec.name.clone()),
        labels: Some(spec.labels.clone()).filter(|l| !l.is_empty()),
        ..ObjectMeta::default()
    }
}

/// The two configurations: CREATE pods/eviction (mutating) and DELETE pods (validating).
pub fn webhook_configurations(
    spec: &ConfigurationsSpec,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let namespace_selector = Some(
        spec.namespace_selector
            .clone()
            .unwrap_or_else(not_opted_out),
    );
    let object_selector = Some(spec.object_selector.clone().unwrap_or_else(not_opted_out));
    let mutating = MutatingWebhook {
        name: "eviction.graceful-drain.io".into(),
        admission_review_versions: vec!["v1".into()],
        client_config: client_config(spec, EVICTION_PATH),
        failure_policy: Some(spec.failure_policy.clone()),
        match_policy: Some("Equivalent".into()),
        namespace_selector: namespace_selector.clone(),
        object_selector: object_selector.clone(),
        reinvocation_policy: Some("Never".into()),
        rules: Some(rule("CREATE", "pods/eviction")),
        side_effects: "NoneOnDryRun".into(),
        timeout_seconds: Some(spec.timeout_seconds),
        ..MutatingWebhook::default()
    };
    let validating = ValidatingWebhook {
        name: "delete.graceful-drain.io".into(),
        admission_review_versions: vec!["v1".into()],
        client_config: client_config(spec, DELETE_PATH),
        failure_policy: Some(spec.failure_policy.clone()),
        match_policy: Some("Equivalent".into()),
        namespace_selector,
        object_selector,
        rules: Some(rule("DELETE", "pods")),
        side_effects: "NoneOnDryRun".into(),
        timeout_seconds: Some(spec.timeout_seconds),
        ..ValidatingWebhook::default()
    };
    (
        MutatingWebhookConfiguration {
            metadata: meta(spec),
            webhooks: Some(vec![mutating]),
        },
        ValidatingWebhookConfiguration {
            metadata: meta(spec),
            webhooks: Some(vec![validating]),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_configurations_route_each_operation_to_its_path() {
        let spec = ConfigurationsSpec {
            target: Target::Url("https://127.0.0.1:9443/".into()),
            ca_bundle: Some("-----BEGIN CERTIFICATE-----\n".into()),
            timeout_seconds: 7,
            ..ConfigurationsSpec::default()
        };
        let (mutating, validating) = webhook_configurations(&spec);
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
        let m_rule = &m.rules.as_ref().unwrap()[0];
        assert_eq!(
            m_rule.operations.as_deref(),
            Some(&["CREATE".to_string()][..])
        );
        assert_eq!(
            m_rule.resources.as_deref(),
            Some(&["pods/eviction".to_string()][..])
        );
        let v_rule = &v.rules.as_ref().unwrap()[0];
        assert_eq!(
            v_rule.operations.as_deref(),
            Some(&["DELETE".to_string()][..])
        );
        assert_eq!(v_rule.resources.as_deref(), Some(&["pods".to_string()][..]));
        for (timeout, policy, side, ca) in [
            (
                m.timeout_seconds,
                &m.failure_policy,
                &m.side_effects,
                &m.client_config.ca_bundle,
            ),
            (
                v.timeout_seconds,
                &v.failure_policy,
                &v.side_effects,
                &v.client_config.ca_bundle,
            ),
        ] {
            assert_eq!(timeout, Some(7));
            assert_eq!(policy.as_deref(), Some("Ignore"));
            assert_eq!(side, "NoneOnDryRun");
            assert_eq!(
                ca.as_ref().map(|b| b.0.as_slice()),
                Some(&b"-----BEGIN CERTIFICATE-----\n"[..])
            );
        }
        let selector = m.namespace_selector.as_ref().unwrap();
        let expr = &selector.match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (expr.key.as_str(), expr.operator.as_str()),
            (OPT_OUT_LABEL, "NotIn")
        );
    }

    #[test]
    fn service_configurations_name_the_service_and_paths() {
        let (mutating, validating) = webhook_configurations(&ConfigurationsSpec::default());
        assert_eq!(mutating.metadata.name.as_deref(), Some("graceful-drain"));
        let svc = mutating.webhooks.unwrap()[0]
            .client_config
            .service
            .clone()
            .unwrap();
        assert_eq!(
            (svc.namespace.as_str(), svc.name.as_str()),
            ("graceful-drain", "graceful-drain-webhook")
        );
        assert_eq!(svc.path.as_deref(), Some(EVICTION_PATH));
        assert_eq!(svc.port, Some(443));
        let svc = validating.webhooks.unwrap()[0]
            .client_config
            .service
            .clone()
            .unwrap();
        assert_eq!(svc.path.as_deref(), Some(DELETE_PATH));
    }
}
