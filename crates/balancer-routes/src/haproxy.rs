//! HAProxy's statistics in CSV, read into [`Routes`]: which servers HAProxy balances
//! traffic to now.
//!
//! The stats page answers CSV when `;csv` follows its `stats uri` (`/stats;csv`), and the
//! stats socket's `show stat` prints the same CSV. The first line is a header,
//! `# pxname,svname,…`, naming every column; the columns differ between versions and
//! builds (statistics modules append theirs after a `-` column), so they are found by
//! name, never by position. [`parse_stats`] reads `pxname` (the backend), `svname` (the
//! server), `status`, `addr` and, when present, `type` (2 is a server; 0, 1 and 3 are
//! frontends, backends and listeners). Without `type`, the `FRONTEND` and `BACKEND` rows
//! are told apart by their `svname`. [`stat_rows`] gives every row by column name, for
//! readers of the other columns (the error and retry counters).
//!
//! ## Which statuses route
//!
//! HAProxy writes a server's status as follows (its `stats.c`, and the Management Guide's
//! `set server … state` and the Configuration Manual's `http-check disable-on-404`).
//! A server routes when HAProxy may still send it a request; when in doubt it is counted
//! as routing, because a server wrongly counted only makes a drain wait out its full
//! delay, while one wrongly left out lets a pod be deleted under traffic.
//!
//! | status | meaning | routes |
//! |---|---|---|
//! | `UP` | up, balanced | yes |
//! | `UP 2/3` | up with failing checks, not yet `fall` of them: still balanced | yes |
//! | `no check` | up without health checks: always balanced | yes |
//! | `NOLB`, `NOLB 1/2` | stopping (`disable-on-404`, `set server … health stopping`): out of load balancing, still takes persistent connections | yes |
//! | `DRAIN`, `DRAIN 1/2`, `DRAIN (agent)` | drained (`set server … state drain`, weight 0): out of load balancing, still takes persistent connections | yes |
//! | `DOWN 1/2` | down with passing checks, going up: balanced again after `rise` of them | yes |
//! | `DOWN`, `DOWN (agent)` | down: no traffic | no |
//! | `MAINT`, `MAINT (via b/s)` | maintenance, set or inherited from a tracked server: no traffic | no |
//! | `MAINT (resolution)` | the DNS name no longer resolves (a `server-template` slot whose record went away): no traffic | no |
//! | anything else | a status this crate does not know | yes |
//!
//! ## Addresses
//!
//! HAProxy fills `addr` (`ip:port`, `[ipv6]:port`, or `unix`) only when it shows
//! "legends": on the stats page with `stats show-legends`, on the stats socket at level
//! `operator` or `admin`. A routing server with an empty `addr` is therefore an error
//! that says so, not a server routing to nobody. A routing server on a UNIX socket
//! cannot be a pod and is left out.

use std::collections::HashMap;

use crate::routes::{Address, Routes, parse_address};

/// Why a CSV answer could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CsvError {
    /// The answer does not start with HAProxy's `# pxname,…` header line.
    #[error("no `# pxname,svname,…` header line")]
    NoHeader,
    /// The header lacks a column the reading needs.
    #[error("the header has no `{0}` column")]
    MissingColumn(&'static str),
    /// A row ends inside a quoted field, or is shorter than the columns read from it.
    #[error("row {row} is malformed: {reason}")]
    Malformed {
        /// The row's line number, the header being line 1.
        row: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The configured backend appears in no row.
    #[error("no backend {0:?} in the statistics")]
    NoBackend(String),
    /// A routing server's `addr` is empty: HAProxy hides addresses without legends.
    #[error(
        "server {backend}/{server} is {status} but its `addr` is empty; HAProxy shows \
         addresses with `stats show-legends` (stats page) or at level operator (stats socket)"
    )]
    NoAddress {
        /// The server's backend (`pxname`).
        backend: String,
        /// The server's name (`svname`).
        server: String,
        /// Its status.
        status: String,
    },
    /// A routing server's `addr` is neither an IP address nor `unix`.
    #[error("server {backend}/{server} has the address {addr:?}, not ip:port")]
    BadAddress {
        /// The server's backend (`pxname`).
        backend: String,
        /// The server's name (`svname`).
        server: String,
        /// The `addr` as written.
        addr: String,
    },
}

/// `type` of a backend row (0 frontend, 1 backend, 2 server, 3 listener).
const TYPE_BACKEND: &str = "1";
/// `type` of a server row.
const TYPE_SERVER: &str = "2";

/// The servers of `csv` that route (of `backend` alone, when given).
pub fn parse_stats(csv: &str, backend: Option<&str>) -> Result<Routes, CsvError> {
    let mut records = records(csv).into_iter();
    let header = match records.next() {
        Some((_, Ok(fields))) => fields,
        Some((row, Err(reason))) => return Err(CsvError::Malformed { row, reason }),
        None => return Err(CsvError::NoHeader),
    };
    let columns = Columns::of(&header)?;
    let mut routes = Routes::default();
    let mut backend_seen = false;
    for (row, fields) in records {
        let fields = fields.map_err(|reason| CsvError::Malformed { row, reason })?;
        let server = columns.server(&fields, row)?;
        if backend.is_some_and(|wanted| wanted != server.backend) {
            continue;
        }
        backend_seen |= server.is_server || server.is_backend;
        if server.is_server
            && status_routes(server.status)
            && let Some(address) = server.address()?
        {
            routes.insert(address);
        }
    }
    match backend {
        Some(wanted) if !backend_seen => Err(CsvError::NoBackend(wanted.to_string())),
        _ => Ok(routes),
    }
}

/// Every row of `csv` after its header, as column name → field: for readers of columns
/// other than those [`parse_stats`] reads, such as the counters `hrsp_5xx` or `wretr`.
/// A row shorter than the header lacks the columns it does not reach; the nameless
/// column after HAProxy's trailing comma is left out.
pub fn stat_rows(csv: &str) -> Result<Vec<HashMap<String, String>>, CsvError> {
    let mut records = records(csv).into_iter();
    let header = match records.next() {
        Some((_, Ok(fields))) => fields,
        Some((row, Err(reason))) => return Err(CsvError::Malformed { row, reason }),
        None => return Err(CsvError::NoHeader),
    };
    let names = column_names(&header)?;
    records
        .map(|(row, fields)| {
            let fields = fields.map_err(|reason| CsvError::Malformed { row, reason })?;
            Ok(names
                .iter()
                .zip(fields)
                .filter(|(name, _)| !name.is_empty())
                .map(|(name, field)| ((*name).to_string(), field))
                .collect())
        })
        .collect()
}

/// The column names of the header line, its leading `# ` taken off the first.
fn column_names(header: &[String]) -> Result<Vec<&str>, CsvError> {
    let first = header.first().ok_or(CsvError::NoHeader)?;
    let first = first.strip_prefix('#').ok_or(CsvError::NoHeader)?.trim();
    Ok(std::iter::once(first)
        .chain(header.iter().skip(1).map(String::as_str))
        .collect())
}

/// Whether HAProxy may send a server in this `status` a request (the table of the
/// module's head).
pub fn status_routes(status: &str) -> bool {
    let word = status.split_whitespace().next().unwrap_or_default();
    match word {
        "UP" | "NOLB" | "DRAIN" | "no" => true,
        // `DOWN 1/2` is rising: its checks pass and it is balanced again after `rise`.
        "DOWN" => status.contains('/'),
        "MAINT" => false,
        _ => true,
    }
}

/// Where the columns read are in each row.
struct Columns {
    pxname: usize,
    svname: usize,
    status: usize,
    addr: usize,
    kind: Option<usize>,
}

/// The columns of one row that say whether and where it routes.
struct Server<'a> {
    backend: &'a str,
    name: &'a str,
    status: &'a str,
    addr: &'a str,
    is_server: bool,
    is_backend: bool,
}

impl Columns {
    fn of(header: &[String]) -> Result<Self, CsvError> {
        let index: HashMap<&str, usize> = column_names(header)?
            .into_iter()
            .enumerate()
            .map(|(at, name)| (name, at))
            .collect();
        let find = |name: &'static str| index.get(name).copied();
        let need = |name: &'static str| find(name).ok_or(CsvError::MissingColumn(name));
        Ok(Self {
            pxname: need("pxname")?,
            svname: need("svname")?,
            status: need("status")?,
            addr: need("addr")?,
            kind: find("type"),
        })
    }

    fn server<'a>(&self, fields: &'a [String], row: usize) -> Result<Server<'a>, CsvError> {
        let field = |at: usize| {
            fields
                .get(at)
                .map(String::as_str)
                .ok_or_else(|| CsvError::Malformed {
                    row,
                    reason: format!("{} fields, column {} needed", fields.len(), at + 1),
                })
        };
        let name = field(self.svname)?;
        let (is_server, is_backend) = match self.kind {
            Some(at) => (field(at)? == TYPE_SERVER, field(at)? == TYPE_BACKEND),
            None => (name != "FRONTEND" && name != "BACKEND", name == "BACKEND"),
        };
        Ok(Server {
            backend: field(self.pxname)?,
            name,
            status: field(self.status)?,
            addr: field(self.addr)?,
            is_server,
            is_backend,
        })
    }
}

impl Server<'_> {
    /// The server's address; `None` for a UNIX socket.
    fn address(&self) -> Result<Option<Address>, CsvError> {
        match self.addr.trim() {
            "" => Err(CsvError::NoAddress {
                backend: self.backend.to_string(),
                server: self.name.to_string(),
                status: self.status.to_string(),
            }),
            "unix" => Ok(None),
            addr => parse_address(addr)
                .map(Some)
                .ok_or_else(|| CsvError::BadAddress {
                    backend: self.backend.to_string(),
                    server: self.name.to_string(),
                    addr: addr.to_string(),
                }),
        }
    }
}

/// The CSV's records with their starting line numbers. HAProxy quotes a field holding a
/// comma, a quote or a line break (`"a ""b"", c"`), so a record may span lines; blank
/// lines are skipped. A record whose quote never closes is an `Err`.
fn records(text: &str) -> Vec<(usize, Result<Vec<String>, String>)> {
    let mut records = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((at, line)) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        let mut record = line.to_string();
        let parsed = loop {
            match split_record(&record) {
                Some(fields) => break Ok(fields),
                None => match lines.next() {
                    Some((_, more)) => {
                        record.push('\n');
                        record.push_str(more);
                    }
                    None => break Err("a quoted field never ends".to_string()),
                },
            }
        };
        records.push((at + 1, parsed));
    }
    records
}

/// The fields of one record, or `None` when a quoted field is still open at its end.
fn split_record(record: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = record.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => fields.push(std::mem::take(&mut field)),
            (_, c) => field.push(c),
        }
    }
    if quoted {
        return None;
    }
    fields.push(field);
    Some(fields)
}

#[cfg(test)]
mod tests;
