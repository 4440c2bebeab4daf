//! Listing LifecycleEvents so that one malformed object hides only itself.
//!
//! kube's typed list deserializes the whole answer at once: one event without
//! `spec.bindingNode` (written under an older schema, or by hand through a CRD without
//! `required`) fails it for every event, after kube logs the whole answer at WARN. So
//! [`list`] asks for the events as [`DynamicObject`]s, which any object with metadata
//! parses as, and [`parse`] converts each one on its own: the good ones are kept and each
//! bad one is named in a [`Skipped`] that prints as one short line.

use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use serde::Serialize;

use graceful_drain_core::lifecycle::LifecycleEvent;

/// The events that parsed, and the ones that did not.
#[derive(Clone, Debug, Default)]
pub struct Listed {
    /// The events, in the API server's order.
    pub events: Vec<LifecycleEvent>,
    /// The objects that are not LifecycleEvents of our schema, each with why.
    pub skipped: Vec<Skipped>,
}

/// A LifecycleEvent left out because it does not parse.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Its name (`namespace/name` if it had a namespace).
    pub name: String,
    /// What is wrong with it, such as ``missing field `bindingNode` ``.
    pub reason: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "skipping LifecycleEvent {}: {}", self.name, self.reason)
    }
}

/// Lists every LifecycleEvent; an object that does not parse is skipped, not fatal.
/// The errors are the API call's (a 404 means the CRDs are not installed).
pub async fn list(client: &kube::Client) -> kube::Result<Listed> {
    let resource = ApiResource::erase::<LifecycleEvent>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let list = api.list(&ListParams::default()).await?;
    Ok(parse(list.items))
}

/// Converts each object on its own.
pub fn parse(items: Vec<DynamicObject>) -> Listed {
    let mut listed = Listed::default();
    for item in items {
        let name = match item.namespace() {
            Some(ns) => format!("{ns}/{}", item.name_any()),
            None => item.name_any(),
        };
        let parsed = serde_json::to_value(item).and_then(serde_json::from_value);
        match parsed {
            Ok(event) => listed.events.push(event),
            Err(error) => listed.skipped.push(Skipped {
                name,
                reason: error.to_string(),
            }),
        }
    }
    listed
}

#[cfg(test)]
mod tests;
