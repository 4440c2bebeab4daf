//! `pods/eviction` (placeholder while the core is built).

use std::sync::Arc;

use http::StatusCode;
use serde_json::Value;

use super::Ctx;
use super::handler::{Req, Target};
use super::status::{ApiError, ApiResult};

pub(crate) async fn evict(
    _ctx: &Arc<Ctx>,
    _target: &Target,
    _req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    Err(ApiError::internal("not yet"))
}
