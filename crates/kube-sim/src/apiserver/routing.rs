//! Where a webhook given as `clientConfig.service` is really reached: one of the
//! Service's endpoints from its EndpointSlices, then a route to a local process.
//!
//! kube-apiserver dials `NAME.NAMESPACE.svc:PORT`, which kube-proxy sends to a ready
//! endpoint of the Service, or to a serving-but-terminating one when none is ready
//! (ProxyTerminatingEndpoints); with no endpoint at all the call fails and the
//! failurePolicy decides (the aggregator-routing resolver in
//! `staging/src/k8s.io/apiserver/pkg/util/proxy/proxy.go` fails the same way with
//! "no endpoints available for service"). Simulated pods have no reachable address, so a
//! [`Route`] maps an endpoint (or every endpoint of a Service) to a local listener, which
//! lets a real local process play the pod.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::str::FromStr;

use rand::seq::IndexedRandom;
use serde_json::Value;

use super::Ctx;

/// What a route redirects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RouteFrom {
    /// Every endpoint of the Service `namespace/name`.
    Service {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
    },
    /// One endpoint address and port (a pod IP and container port).
    Endpoint(SocketAddr),
}

/// A route: calls to `from` connect to `to` instead. An [`RouteFrom::Endpoint`] route
/// wins over a [`RouteFrom::Service`] route for the same call; adding a route for a `from`
/// that already has one replaces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The endpoint or Service whose calls are redirected.
    pub from: RouteFrom,
    /// The local listener those calls connect to instead.
    pub to: SocketAddr,
}

impl FromStr for Route {
    type Err = String;

    /// `NAMESPACE/NAME=HOST:PORT` or `ENDPOINT_IP:PORT=HOST:PORT`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad =
            || format!("expected NAMESPACE/NAME=HOST:PORT or IP:PORT=HOST:PORT, got {text:?}");
        let (from, to) = text.split_once('=').ok_or_else(bad)?;
        let to: SocketAddr = to.parse().map_err(|e| format!("{}: {e}", bad()))?;
        if let Ok(endpoint) = from.parse::<SocketAddr>() {
            return Ok(Route {
                from: RouteFrom::Endpoint(endpoint),
                to,
            });
        }
        match from.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Route {
                    from: RouteFrom::Service {
                        namespace: ns.to_string(),
                        name: name.to_string(),
                    },
                    to,
                })
            }
            _ => Err(bad()),
        }
    }
}

/// The routes of a running API server.
#[derive(Debug, Default)]
pub(crate) struct Routes(HashMap<RouteFrom, SocketAddr>);

impl Routes {
    pub(crate) fn insert(&mut self, route: Route) {
        self.0.insert(route.from, route.to);
    }

    fn lookup(&self, namespace: &str, name: &str, endpoint: SocketAddr) -> Option<SocketAddr> {
        self.0
            .get(&RouteFrom::Endpoint(endpoint))
            .copied()
            .or_else(|| {
                self.0
                    .get(&RouteFrom::Service {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                    })
                    .copied()
            })
    }
}

/// Picks the endpoint a call to Service `namespace/name` port `port` reaches, and
/// where to connect for it.
pub(crate) fn resolve(
    ctx: &Ctx,
    namespace: &str,
    name: &str,
    port: u16,
) -> Result<SocketAddr, String> {
    let service = ctx
        .store
        .get("/services", &format!("{namespace}/{name}"))
        .ok_or_else(|| format!("service \"{name}\" not found"))?;
    let port_name = service
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p.get("port").and_then(Value::as_u64) == Some(u64::from(port)))
        })
        .map(|p| {
            p.get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .ok_or_else(|| format!("no service port {port} found for service \"{name}\""))?;
    let candidates = endpoints(ctx, namespace, name, &port_name);
    let ready: Vec<SocketAddr> = candidates.iter().filter(|e| e.1).map(|e| e.0).collect();
    // kube-proxy falls back to serving terminating endpoints only when none is ready.
    let pool: Vec<SocketAddr> = if ready.is_empty() {
        candidates.iter().filter(|e| e.2).map(|e| e.0).collect()
    } else {
        ready
    };
    let endpoint = *pool
        .choose(&mut rand::rng())
        .ok_or_else(|| format!("no endpoints available for service \"{name}\""))?;
    ctx.routes()
        .lookup(namespace, name, endpoint)
        .ok_or_else(|| {
            format!(
                "dial tcp {endpoint}: no route to simulated pod (route it with --route-service {endpoint}=HOST:PORT)"
            )
        })
}

/// (address:port, ready, serving-and-terminating) of every endpoint of the Service.
fn endpoints(
    ctx: &Ctx,
    namespace: &str,
    service: &str,
    port_name: &str,
) -> Vec<(SocketAddr, bool, bool)> {
    let (slices, _) = ctx
        .store
        .list("discovery.k8s.io/endpointslices", &format!("{namespace}/"));
    let mut out = Vec::new();
    for (_, slice) in slices {
        let owner = slice
            .pointer("/metadata/labels/kubernetes.io~1service-name")
            .and_then(Value::as_str);
        if owner != Some(service) {
            continue;
        }
        let Some(port) = slice
            .get("ports")
            .and_then(Value::as_array)
            .and_then(|ports| {
                ports
                    .iter()
                    .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
            })
            .and_then(|p| p.get("port").and_then(Value::as_u64))
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        let items = slice.get("endpoints").and_then(Value::as_array).cloned();
        for endpoint in items.unwrap_or_default() {
            let condition = |k: &str| {
                endpoint
                    .pointer(&format!("/conditions/{k}"))
                    .and_then(Value::as_bool)
            };
            // An unset `ready` means ready (discovery/v1 EndpointConditions).
            let ready = condition("ready").unwrap_or(true);
            let serving = condition("serving").unwrap_or(ready);
            let terminating = condition("terminating").unwrap_or(false);
            let addresses = endpoint.get("addresses").and_then(Value::as_array).cloned();
            for address in addresses.unwrap_or_default() {
                if let Some(ip) = address.as_str().and_then(|a| a.parse().ok()) {
                    out.push((SocketAddr::new(ip, port), ready, serving && terminating));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_services_and_endpoints() {
        let to = SocketAddr::from(([127, 0, 0, 1], 9443));
        assert_eq!(
            "gd/webhook=127.0.0.1:9443".parse::<Route>().unwrap(),
            Route {
                from: RouteFrom::Service {
                    namespace: "gd".into(),
                    name: "webhook".into()
                },
                to
            }
        );
        assert_eq!(
            "10.0.0.7:8443=127.0.0.1:9443".parse::<Route>().unwrap(),
            Route {
                from: RouteFrom::Endpoint(SocketAddr::from(([10, 0, 0, 7], 8443))),
                to
            }
        );
        assert!("no-slash=127.0.0.1:1".parse::<Route>().is_err());
        assert!("a/b=not-an-address".parse::<Route>().is_err());
        assert!("/b=127.0.0.1:1".parse::<Route>().is_err());
    }
}
