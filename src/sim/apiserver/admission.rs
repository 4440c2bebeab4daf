//! Admission webhooks (placeholder while the core is built).

use serde_json::Value;

use super::Ctx;
use super::handler::{Target, UserInfo};
use super::status::ApiResult;

/// The admission operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum Operation {
    Create,
    Update,
    Delete,
}

/// What a write looks like to admission.
pub(crate) struct Attributes<'a> {
    pub target: &'a Target,
    pub user: &'a UserInfo,
    pub operation: Operation,
    pub name: String,
    pub object: Option<Value>,
    pub old_object: Option<Value>,
    pub options: Value,
    pub dry_run: bool,
    /// (group, version, kind) of the request body when it differs from the resource's.
    pub kind: Option<(String, String, String)>,
}

/// The outcome of admission.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    /// The object after mutation, when a webhook changed it.
    pub object: Option<Value>,
    /// A webhook turned the request into a dry run.
    pub dry_run: bool,
}

/// Runs mutating then validating webhooks.
pub(crate) async fn admit(_ctx: &Ctx, _attrs: Attributes<'_>) -> ApiResult<Admitted> {
    Ok(Admitted::default())
}
