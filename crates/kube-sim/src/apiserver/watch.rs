//! `?watch=true`: newline-delimited watch events from the store's change feed.
//!
//! A watch resumes after the given resourceVersion (replaying kept history) or, without
//! one, starts with synthetic ADDED events for every current object. Selectors are
//! applied to both the old and the new state, so an object that stops matching is seen
//! as DELETED and one that starts matching as ADDED, like upstream. A resourceVersion
//! older than the kept history yields a single ERROR event carrying a 410 Status, and
//! so does a stream an injected fault cuts.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast::{self, error::RecvError};

use super::Ctx;
use super::request::{Filter, Req, Target, filter_of, prefix_of, stream_response};
use super::resources::ResourceDef;
use super::status::ApiError;
use super::store::{Change, EventType, Scope};
use super::table;

/// Upper bound of a watch's life when the client sets no `timeoutSeconds` (upstream
/// picks 30–60 minutes at random; clients reconnect either way).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

struct Plan {
    def: Arc<ResourceDef>,
    prefix: String,
    filter: Filter,
    bookmarks: bool,
    timeout: Duration,
    /// Wrap objects in one-row Tables (with full objects when `Some(true)`).
    table: Option<bool>,
    /// When an injected fault ends this watch with 410 Gone.
    cut: Option<Duration>,
}

/// One watch event line, `{"type":…,"object":…}`, serialised straight from `object` (a
/// `json!` of it would deep-copy the object for every watcher of every change).
fn line(kind: &str, object: &Value) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"type\":");
    // Writing JSON into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, kind);
    out.extend_from_slice(b",\"object\":");
    let _ = serde_json::to_writer(&mut out, object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn bookmark(def: &ResourceDef, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": metadata}),
    )
}

impl Plan {
    fn in_scope(&self, obj: &Value) -> bool {
        if self.prefix.is_empty() {
            return true;
        }
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        self.prefix.strip_suffix('/') == Some(ns)
    }

    fn matches(&self, obj: &Value) -> bool {
        self.in_scope(obj) && self.filter.matches(obj)
    }

    /// The event a watcher with this plan sees for a change, if any.
    fn project(&self, change: &Change) -> Option<Bytes> {
        if change.table != self.def.table() {
            return None;
        }
        let view = self.def.view;
        let object = view.served_ref(&change.object);
        let now = self.matches(&object);
        let before = change
            .old
            .as_ref()
            .is_some_and(|o| self.matches(&view.served_ref(o)));
        let kind = match (change.kind, before, now) {
            (EventType::Added, _, true) => EventType::Added,
            (EventType::Deleted, true, _) => EventType::Deleted,
            (EventType::Modified, true, true) => EventType::Modified,
            (EventType::Modified, false, true) => EventType::Added,
            (EventType::Modified, true, false) => EventType::Deleted,
            _ => return None,
        };
        Some(self.event(kind.as_str(), &object))
    }

    /// A watch line for an object, as a Table row when the client asked for Tables.
    fn event(&self, kind: &str, object: &Value) -> Bytes {
        match self.table {
            None => line(kind, object),
            Some(full) => {
                let rv = object
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(Value::Null);
                let metadata = json!({"resourceVersion": rv});
                let wrapped = table::table(&self.def, std::slice::from_ref(object), metadata, full);
                line(kind, &wrapped)
            }
        }
    }
}

/// Answers a watch request.
pub(crate) fn watch(ctx: Arc<Ctx>, target: &Target, req: &Req) -> Response {
    let filter = match filter_of(target, req) {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let plan = Plan {
        def: target.def.clone(),
        prefix: prefix_of(target),
        filter,
        bookmarks: req.flag("allowWatchBookmarks"),
        timeout,
        table: req.table(),
        cut: ctx.faults.watch_cut(),
    };
    let table = plan.def.table();
    let since = req.param("resourceVersion").unwrap_or("0");
    let initial = req.flag("sendInitialEvents");
    let mut first: Vec<Bytes> = Vec::new();
    let (live, start_rv) = if since == "0" || initial {
        let scope = Scope {
            prefix: &plan.prefix,
            node: plan.filter.node(),
        };
        let (items, rv, live) = ctx.store.snapshot_and_subscribe(&table, scope, |obj| {
            let served = plan.def.view.served_ref(obj);
            plan.matches(&served).then(|| plan.event("ADDED", &served))
        });
        first.extend(items);
        if initial {
            first.push(bookmark(&plan.def, rv, true));
        }
        (live, rv)
    } else {
        let Ok(rv) = since.parse::<u64>() else {
            return ApiError::bad_request(format!("invalid resourceVersion {since:?}"))
                .into_response();
        };
        match ctx.store.subscribe(&table, rv) {
            Some(sub) => {
                first.extend(sub.replay.iter().filter_map(|c| plan.project(c)));
                let last = sub.replay.last().map_or(rv, |c| c.rv);
                (sub.live, last)
            }
            None => {
                let status = ApiError::gone(format!(
                    "too old resource version: {rv} ({})",
                    ctx.store.current_rv()
                ))
                .to_status();
                return stream_response(Body::from(line("ERROR", &status)));
            }
        }
    };
    let stream = event_stream(ctx, plan, first, live, start_rv);
    stream_response(Body::from_stream(stream))
}

fn event_stream(
    ctx: Arc<Ctx>,
    plan: Plan,
    first: Vec<Bytes>,
    mut live: broadcast::Receiver<Arc<Change>>,
    start_rv: u64,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    async_stream::stream! {
        for item in first {
            yield Ok(item);
        }
        let deadline = tokio::time::sleep(plan.timeout);
        tokio::pin!(deadline);
        let cut = tokio::time::sleep(plan.cut.unwrap_or(plan.timeout));
        tokio::pin!(cut);
        let mut ticker = tokio::time::interval(ctx.config.bookmark_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_rv = start_rv;
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                _ = &mut cut, if plan.cut.is_some() => {
                    // What a watcher sees when storage compacted past its position:
                    // one ERROR event with a 410 Status, after which it must relist.
                    let status = ApiError::gone(
                        "The resourceVersion for the provided watch is too old.",
                    )
                    .to_status();
                    yield Ok(line("ERROR", &status));
                    break;
                }
                _ = ctx.shutdown.cancelled() => break,
                _ = ticker.tick(), if plan.bookmarks => {
                    yield Ok(bookmark(&plan.def, last_rv, false));
                }
                change = live.recv() => match change {
                    Ok(change) => {
                        if change.rv <= last_rv {
                            continue;
                        }
                        // The feed is ordered, so every change consumed advances the
                        // bookmark position, whatever its table.
                        last_rv = change.rv;
                        if let Some(item) = plan.project(&change) {
                            yield Ok(item);
                        }
                    }
                    // A watcher that fell behind is closed; it resumes from its last
                    // resourceVersion like after any disconnect.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => break,
                },
            }
        }
    }
}
