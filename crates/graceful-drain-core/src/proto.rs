//! Generated gRPC code for the SLM plugin API and the kubelet plugin registration API
//! (see `proto/`). Field numbers are wire facts from docs/design.md §3.

/// `k8s.io.kubelet.pkg.apis.slm.v1alpha1`: the SLMPlugin service.
pub mod slm {
    #![allow(clippy::all, clippy::too_many_lines, missing_docs)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.slm.v1alpha1");
}

/// `pluginregistration`: the kubelet plugin watcher's Registration service.
pub mod registration {
    #![allow(clippy::all, clippy::too_many_lines, missing_docs)]
    tonic::include_proto!("pluginregistration");
}

/// Plugin type a lifecycle driver registers with.
pub const SLM_PLUGIN_TYPE: &str = "SLMPlugin";
/// The only SLM API version we serve.
pub const SLM_SUPPORTED_VERSION: &str = "v1alpha1.SLMPlugin";
