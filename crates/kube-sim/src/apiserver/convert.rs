//! Two API versions over one storage: `events.k8s.io/v1` Events are stored as core
//! `v1` Events (as upstream does), so an event recorded through either API shows up in
//! both — `kubectl get events` and `kubectl describe` read core/v1, kube-runtime's
//! recorder writes events.k8s.io/v1.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// (core/v1 field, events.k8s.io/v1 field).
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("related", "related"),
    ("message", "note"),
    ("reason", "reason"),
    ("type", "type"),
    ("action", "action"),
    ("reportingComponent", "reportingController"),
    ("reportingInstance", "reportingInstance"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// How a served version relates to its storage form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum View {
    /// Stored as served.
    Native,
    /// events.k8s.io/v1 over core/v1 storage.
    EventsV1,
}

fn remap(obj: &Value, api_version: &str, from_core: bool) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    out.insert("kind".into(), Value::String("Event".into()));
    if let Some(meta) = obj.get("metadata") {
        out.insert("metadata".into(), meta.clone());
    }
    for (core, v1) in EVENT_FIELDS {
        let (src, dst) = if from_core { (core, v1) } else { (v1, core) };
        if let Some(value) = obj.get(*src).filter(|v| !v.is_null()) {
            out.insert((*dst).to_string(), value.clone());
        }
    }
    Value::Object(out)
}

impl View {
    /// The stored form of an object written through this view.
    pub(crate) fn to_storage(self, obj: Value) -> Value {
        match self {
            Self::Native => obj,
            Self::EventsV1 => remap(&obj, "v1", false),
        }
    }

    /// The served form of a stored object.
    pub(crate) fn served_ref(self, obj: &Value) -> Cow<'_, Value> {
        match self {
            Self::Native => Cow::Borrowed(obj),
            Self::EventsV1 => Cow::Owned(remap(obj, "events.k8s.io/v1", true)),
        }
    }

    /// [`View::served_ref`] for an owned object.
    pub(crate) fn served(self, obj: Value) -> Value {
        match self {
            Self::Native => obj,
            Self::EventsV1 => remap(&obj, "events.k8s.io/v1", true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_round_trip_between_versions() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
                        "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reason": "Isolated",
                        "reportingController": "graceful-drain", "type": "Normal"});
        let core = View::EventsV1.to_storage(v1.clone());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hi");
        assert_eq!(core["reportingComponent"], "graceful-drain");
        assert_eq!(View::EventsV1.served(core), v1);
    }
}
