//! Object metadata every verb reads and stamps: the timestamps the server writes, a
//! `metadata` field as text, the `metadata` map itself, and the 400 for an object
//! without one.

use serde_json::{Map, Value, json};

use super::status::ApiError;

pub(crate) fn now() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

pub(crate) fn in_seconds(secs: i64) -> String {
    let now = jiff::Timestamp::now().as_second().saturating_add(secs);
    jiff::Timestamp::from_second(now)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| self::now())
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The metadata map of an object, created when missing (`None` only for non-objects).
pub(crate) fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let root = obj.as_object_mut()?;
    let meta = root.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut()
}

pub(crate) fn no_metadata() -> ApiError {
    ApiError::bad_request("the object has no metadata")
}
