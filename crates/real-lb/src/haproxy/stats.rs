//! One backend's statistics from HAProxy's CSV (`show stat` on the stats socket, or the
//! stats page's `;csv`), read by column name through balancer-routes' reader
//! ([`balancer_routes::haproxy::stat_rows`]).
//!
//! The counters are the Management Guide's (section 9.1, "CSV format"): `hrsp_5xx`
//! responses with a 5xx code, `eresp` response errors (the server closed or failed
//! mid-answer), `econ` connection errors, `wretr` retries, `wredis` redispatches. An empty
//! field, which HAProxy writes for a counter that does not apply, reads as 0.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use balancer_routes::haproxy::{CsvError, stat_rows, status_routes};

/// A backend's counters and servers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// The backend's name.
    pub backend: String,
    /// Responses with a 5xx status, HAProxy's own (a 503 for want of a server) included.
    pub hrsp_5xx: u64,
    /// Response errors: the server closed or failed while answering.
    pub eresp: u64,
    /// Connection errors: a server could not be connected to.
    pub econ: u64,
    /// Retries of a connection or request.
    pub wretr: u64,
    /// Redispatches: retries sent to another server.
    pub wredis: u64,
    /// The servers, the template's slots included, in the CSV's order.
    pub servers: Vec<ServerStats>,
}

/// One server of a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerStats {
    /// Its name (`pod1`, ...).
    pub name: String,
    /// Its address, when it has one (a template slot without an answer has none).
    pub addr: Option<SocketAddr>,
    /// Its status as HAProxy writes it (`UP`, `DOWN 1/2`, `MAINT (resolution)`, ...).
    pub status: String,
    /// Responses with a 2xx status it gave.
    pub hrsp_2xx: u64,
    /// Responses with a 5xx status it gave.
    pub hrsp_5xx: u64,
}

impl ServerStats {
    /// Whether HAProxy may send it a request (balancer-routes' table of statuses) at an
    /// address.
    pub fn routes(&self) -> bool {
        self.addr.is_some() && status_routes(&self.status)
    }
}

impl BackendStats {
    /// The addresses of the servers that route.
    pub fn routed(&self) -> BTreeSet<SocketAddr> {
        self.servers
            .iter()
            .filter(|s| s.routes())
            .filter_map(|s| s.addr)
            .collect()
    }
}

/// Why the statistics could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatsError {
    /// Not HAProxy's CSV.
    #[error(transparent)]
    Csv(#[from] CsvError),
    /// No row of the backend.
    #[error("no backend {0:?} in the statistics")]
    NoBackend(String),
    /// A counter that is not a number.
    #[error("{backend}/{server}: `{column}` is {value:?}, not a count")]
    BadCount {
        /// The backend.
        backend: String,
        /// The row's `svname`.
        server: String,
        /// The column.
        column: &'static str,
        /// What it holds.
        value: String,
    },
}

/// `backend`'s statistics in `csv`.
pub fn backend_stats(csv: &str, backend: &str) -> Result<BackendStats, StatsError> {
    let mut stats = BackendStats {
        backend: backend.to_string(),
        ..BackendStats::default()
    };
    let mut seen = false;
    for row in stat_rows(csv)? {
        if field(&row, "pxname") != backend {
            continue;
        }
        let server = field(&row, "svname");
        let count = |column: &'static str| {
            let value = field(&row, column);
            match value {
                "" => Ok(0),
                v => v.parse::<u64>().map_err(|_| StatsError::BadCount {
                    backend: backend.to_string(),
                    server: server.to_string(),
                    column,
                    value: v.to_string(),
                }),
            }
        };
        match server {
            "FRONTEND" => {}
            "BACKEND" => {
                seen = true;
                stats.hrsp_5xx = count("hrsp_5xx")?;
                stats.eresp = count("eresp")?;
                stats.econ = count("econ")?;
                stats.wretr = count("wretr")?;
                stats.wredis = count("wredis")?;
            }
            name => stats.servers.push(ServerStats {
                name: name.to_string(),
                addr: field(&row, "addr").parse().ok(),
                status: field(&row, "status").to_string(),
                hrsp_2xx: count("hrsp_2xx")?,
                hrsp_5xx: count("hrsp_5xx")?,
            }),
        }
    }
    if seen {
        Ok(stats)
    } else {
        Err(StatsError::NoBackend(backend.to_string()))
    }
}

fn field<'a>(row: &'a HashMap<String, String>, column: &str) -> &'a str {
    row.get(column).map_or("", String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "# pxname,svname,econ,eresp,wretr,wredis,status,hrsp_2xx,hrsp_5xx,addr,\n\
        fe_app,FRONTEND,,,,,OPEN,50,1,,\n\
        app,pod1,0,1,2,1,UP,30,0,127.64.0.2:8080,\n\
        app,pod2,3,0,0,0,MAINT (resolution),20,1,,\n\
        app,pod3,0,0,0,0,DOWN,0,0,127.64.0.4:8080,\n\
        app,BACKEND,3,1,2,1,UP,50,1,,\n";

    #[test]
    fn a_backend_s_counters_and_its_servers_are_read_by_column_name() {
        let stats = backend_stats(CSV, "app").unwrap();
        assert_eq!(
            (
                stats.hrsp_5xx,
                stats.eresp,
                stats.econ,
                stats.wretr,
                stats.wredis
            ),
            (1, 1, 3, 2, 1)
        );
        let names: Vec<_> = stats.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["pod1", "pod2", "pod3"]);
        assert_eq!(stats.servers[1].addr, None);
        assert_eq!(stats.servers[0].hrsp_2xx, 30);
        let routed: Vec<String> = stats.routed().iter().map(ToString::to_string).collect();
        assert_eq!(routed, ["127.64.0.2:8080"]);
    }

    #[test]
    fn a_missing_backend_or_a_count_that_is_no_number_is_an_error() {
        assert_eq!(
            backend_stats(CSV, "other"),
            Err(StatsError::NoBackend("other".into()))
        );
        let bad = CSV.replace("UP,30,", "UP,many,");
        assert!(matches!(
            backend_stats(&bad, "app"),
            Err(StatsError::BadCount {
                column: "hrsp_2xx",
                ..
            })
        ));
    }
}
