//! # balancer-routes
//!
//! Asks a load balancer which server addresses it routes to now.
//!
//! graceful-drain holds a pod that is leaving for a configured delay, so that load
//! balancers stop routing to it before it is deleted. Where a balancer can be asked, the
//! delay may end as soon as the balancer no longer routes to the pod's address; this
//! crate is that question. It owns the configuration of one balancer
//! ([`BalancerConfig`]), the bounded HTTP GET that asks it ([`Lister::routes`]), the
//! reading of the answer ([`haproxy`] for HAProxy's statistics CSV, [`json`] for any JSON
//! admin API), and the answer itself ([`Routes::routes_to`]). Deciding what to do with
//! the answer is the caller's.
//!
//! Every doubt errs towards "still routes": a server in an unknown state counts as
//! routing, and an answer that cannot be read is an [`Error`], never an empty
//! [`Routes`]. The worst a wrong answer can then do is keep the full delay.
//!
//! ## Sources
//!
//! * **HAProxy** ([`Source::HaProxy`]): the statistics page (`stats uri`) asked with
//!   `;csv`, read by column name; [`haproxy`] says which server statuses route. The page
//!   needs `stats show-legends` for HAProxy to show server addresses.
//! * **Generic JSON** ([`Source::Generic`]): any URL answering JSON; a path (a JSON
//!   pointer in which `*` matches every element or member) says where the servers are,
//!   and an address field (and port field) where each holds its address. See [`json`].
//!
//! Addresses may be written `ip`, `ip:port`, `[v6]:port` or as a URL
//! (`http://10.0.0.5:80/`); see [`parse_address`]. An address without a port matches
//! its IP on every port, and [`Routes::routes_to`] without a port matches every port.
//!
//! ## Example: HAProxy
//!
//! ```yaml
//! source:
//!   haproxy:
//!     url: http://haproxy-stats.ingress:8404/stats   # `stats uri /stats`, `stats show-legends`
//!     backend: be_web                                # only this backend's servers
//! timeout: 2s
//! ```
//!
//! ## Example: Envoy
//!
//! Envoy's admin `/clusters?format=json` lists every cluster's hosts:
//!
//! ```json
//! {"cluster_statuses": [{"name": "web", "host_statuses": [
//!   {"address": {"socket_address": {"address": "10.42.1.17", "port_value": 8080}},
//!    "health_status": {"eds_health_status": "HEALTHY"}}]}]}
//! ```
//!
//! ```yaml
//! source:
//!   generic:
//!     url: http://envoy-admin.gateway:9901/clusters?format=json
//!     pointer: /cluster_statuses/*/host_statuses
//!     addressField: /address/socket_address/address
//!     portField: /address/socket_address/port_value
//! ```
//!
//! `*` takes every cluster; `/cluster_statuses/0/host_statuses` would take the first
//! alone. A host on a UNIX socket (`address.pipe`) has no `socket_address` and is passed
//! over. Every listed host counts, whatever its health: Envoy keeps a host it still
//! health-checks after service discovery dropped it (`pending_dynamic_removal`).
//!
//! ## Example: Traefik
//!
//! Traefik's API `/api/http/services` lists services; a load-balancing one holds its
//! servers' URLs:
//!
//! ```json
//! [{"name": "shop-web-80@kubernetes", "type": "loadbalancer",
//!   "loadBalancer": {"servers": [{"url": "http://10.42.1.17:8080"}]},
//!   "serverStatus": {"http://10.42.1.17:8080": "UP"}},
//!  {"name": "api@internal", "provider": "internal"}]
//! ```
//!
//! ```yaml
//! source:
//!   generic:
//!     url: http://traefik-api.ingress:8080/api/http/services?per_page=1000
//!     pointer: /*/loadBalancer/servers
//!     addressField: url
//! ```
//!
//! Services without `loadBalancer` (weighted, mirroring, internal) are passed over. The
//! API pages its lists (100 services a page unless `per_page` says otherwise); an answer
//! that is one page of several is an [`Error::Paginated`], so ask for a large page.
//! `/api/rawdata` is not paged: there the path is `/services/*/loadBalancer/servers`.
//! Servers count whatever their `serverStatus`.
//!
//! ## Use
//!
//! ```no_run
//! # async fn ask() -> Result<(), balancer_routes::Error> {
//! use balancer_routes::{BalancerConfig, Lister, Source};
//!
//! let config = BalancerConfig::new(Source::HaProxy {
//!     url: "http://haproxy-stats.ingress:8404/stats".into(),
//!     backend: Some("be_web".into()),
//! });
//! let lister = Lister::new(&config)?;
//! let routes = lister.routes().await?;
//! let still_routed = routes.routes_to("10.42.1.17".parse().unwrap(), Some(8080));
//! # let _ = still_routed;
//! # Ok(())
//! # }
//! ```

#![warn(clippy::too_many_lines)]

mod config;
mod error;
mod fetch;
pub mod haproxy;
pub mod json;
mod lister;
mod routes;

pub use config::{BalancerConfig, DEFAULT_TIMEOUT, Source};
pub use error::Error;
pub use fetch::MAX_ANSWER_BYTES;
pub use lister::Lister;
pub use routes::{Address, Routes, parse_address};

#[cfg(test)]
mod tests;
