//! Any JSON answer read into [`Routes`] by a [`JsonSpec`]: a [`Path`] to the servers,
//! and where in each server its address (and port) is.
//!
//! ## The path
//!
//! A [`Path`] is a JSON pointer (RFC 6901: `/a/b/0`, `~1` for a `/` and `~0` for a `~`
//! in a name) in which a segment that is exactly `*` stands for every element of an
//! array and every value of an object (so a member named `*` cannot be named). `""` is the whole answer. A step that does not
//! exist on some branch (a member that is absent, an index past the end, any step into
//! a string or number) drops that branch; the path is an error only when it matches
//! nothing at all, because a wrong path would otherwise read as "routes to nobody".
//!
//! Each node the path matches gives the entries: an array gives its elements (an empty
//! array gives none, which is an answer: routes to nobody), anything else is one entry.
//!
//! ## The address in an entry
//!
//! An entry is the address itself (a string), or, with an address field, holds it at a
//! JSON pointer relative to the entry (`/address/socket_address/address`; a bare member
//! name such as `url` means `/url`). Addresses are read by [`parse_address`]: `ip`,
//! `ip:port`, `[v6]:port` or a URL. A port field (a number or a numeric string) gives
//! the port of an address written without one; without it such an address matches its
//! IP on every port.
//!
//! An entry without the address field (or with `null` there) is skipped, so a path over
//! all of a balancer's clusters passes over one that listens on a UNIX socket; when no
//! entry at all has it, the field is wrong and that is an error. An address that is not
//! an IP (a host name) is an error too: it might be the pod, and this crate cannot tell.

use serde_json::Value;

use crate::routes::{Address, Routes, parse_address};

/// Why a JSON answer could not be read, or a path or field not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JsonError {
    /// A path or field is not a JSON pointer.
    #[error("{pointer:?} is not a JSON pointer: {reason}")]
    BadPointer {
        /// The pointer as configured.
        pointer: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The path matches no node of the answer.
    #[error("the path {0:?} matches nothing in the answer")]
    NoMatch(String),
    /// The path matches entries, and none of them has the address field.
    #[error("none of the {entries} entries at {path:?} has an address at {field:?}")]
    NoAddress {
        /// The configured path.
        path: String,
        /// The configured address field, `""` for the entry itself.
        field: String,
        /// How many entries were looked at.
        entries: usize,
    },
    /// An address or port is neither absent nor of the expected JSON type.
    #[error("{at} is {found}, not {expected}")]
    WrongType {
        /// The value's place in the answer, as a JSON pointer.
        at: String,
        /// The JSON type found.
        found: &'static str,
        /// What was expected there.
        expected: &'static str,
    },
    /// An address string is not an IP address, `ip:port` or a URL with an IP host.
    #[error("{at} is {value:?}, not an IP address")]
    BadAddress {
        /// The value's place in the answer, as a JSON pointer.
        at: String,
        /// The string found.
        value: String,
    },
    /// A port is not a number from 0 to 65535.
    #[error("{at} is {value}, not a port")]
    BadPort {
        /// The value's place in the answer, as a JSON pointer.
        at: String,
        /// The value found, as JSON.
        value: String,
    },
}

/// A JSON pointer in which a `*` segment matches every element or member value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    text: String,
    steps: Vec<Step>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Name(String),
    Every,
}

impl Path {
    /// Reads a path; see the module's head.
    pub fn parse(text: &str) -> Result<Self, JsonError> {
        let steps = segments(text)?
            .into_iter()
            .map(|(raw, name)| {
                if raw == "*" {
                    Step::Every
                } else {
                    Step::Name(name)
                }
            })
            .collect();
        Ok(Self {
            text: text.to_string(),
            steps,
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The nodes the path matches, each with its concrete pointer.
    fn select<'a>(&self, root: &'a Value) -> Vec<(String, &'a Value)> {
        let mut nodes = vec![(String::new(), root)];
        for step in &self.steps {
            nodes = nodes
                .into_iter()
                .flat_map(|(at, node)| children(&at, node, step))
                .collect();
        }
        nodes
    }
}

/// The nodes one step below `node`.
fn children<'a>(at: &str, node: &'a Value, step: &Step) -> Vec<(String, &'a Value)> {
    match (step, node) {
        (Step::Every, Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| (format!("{at}/{index}"), item))
            .collect(),
        (Step::Every, Value::Object(members)) => members
            .iter()
            .map(|(name, value)| (format!("{at}/{}", escape(name)), value))
            .collect(),
        (Step::Name(name), Value::Object(members)) => members
            .get(name)
            .map(|value| (format!("{at}/{}", escape(name)), value))
            .into_iter()
            .collect(),
        (Step::Name(name), Value::Array(items)) => index(name)
            .and_then(|index| items.get(index))
            .map(|item| (format!("{at}/{name}"), item))
            .into_iter()
            .collect(),
        _ => Vec::new(),
    }
}

/// An array index as RFC 6901 writes it: digits, no leading zero.
fn index(name: &str) -> Option<usize> {
    let digits = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
    if !digits || (name.len() > 1 && name.starts_with('0')) {
        return None;
    }
    name.parse().ok()
}

/// A pointer's segments, raw and unescaped; `""` has none.
fn segments(pointer: &str) -> Result<Vec<(&str, String)>, JsonError> {
    let bad = |reason| JsonError::BadPointer {
        pointer: pointer.to_string(),
        reason,
    };
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| bad("it does not start with `/`"))?;
    rest.split('/')
        .map(|raw| {
            Ok((
                raw,
                unescape(raw).ok_or_else(|| bad("`~` is not followed by 0 or 1"))?,
            ))
        })
        .collect()
}

fn unescape(raw: &str) -> Option<String> {
    let mut name = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '~' {
            name.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => name.push('~'),
            Some('1') => name.push('/'),
            _ => return None,
        }
    }
    Some(name)
}

fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// Where a value is in an entry: a JSON pointer, or a bare member name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    text: String,
    pointer: String,
}

impl Field {
    /// Reads a field: a JSON pointer relative to the entry, or a member name.
    pub fn parse(text: &str) -> Result<Self, JsonError> {
        let pointer = if text.starts_with('/') {
            segments(text)?; // only to refuse a bad `~` escape
            text.to_string()
        } else {
            format!("/{}", escape(text))
        };
        Ok(Self {
            text: text.to_string(),
            pointer,
        })
    }

    /// The field as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// How to read routes out of a JSON answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonSpec {
    /// Where the servers are.
    pub path: Path,
    /// Where an entry holds its address; `None` when the entry is the address.
    pub address_field: Option<Field>,
    /// Where an entry holds its port, for addresses written without one.
    pub port_field: Option<Field>,
}

impl JsonSpec {
    /// The routes `answer` lists; see the module's head.
    pub fn routes(&self, answer: &Value) -> Result<Routes, JsonError> {
        let nodes = self.path.select(answer);
        if nodes.is_empty() {
            return Err(JsonError::NoMatch(self.path.text.clone()));
        }
        let entries = nodes.into_iter().flat_map(|(at, node)| match node {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(index, item)| (format!("{at}/{index}"), item))
                .collect(),
            other => vec![(at, other)],
        });
        let (mut routes, mut count, mut with_address) = (Routes::default(), 0, 0);
        for (at, entry) in entries {
            count += 1;
            if let Some(address) = self.address(&at, entry)? {
                with_address += 1;
                routes.insert(address);
            }
        }
        if count > 0 && with_address == 0 {
            return Err(JsonError::NoAddress {
                path: self.path.text.clone(),
                field: self
                    .address_field
                    .as_ref()
                    .map_or("", Field::as_str)
                    .to_string(),
                entries: count,
            });
        }
        Ok(routes)
    }

    /// The address of one entry; `None` when it has none.
    fn address(&self, at: &str, entry: &Value) -> Result<Option<Address>, JsonError> {
        let (at_address, value) = match &self.address_field {
            Some(field) => (
                format!("{at}{}", field.pointer),
                entry.pointer(&field.pointer),
            ),
            None => (at.to_string(), Some(entry)),
        };
        let text = match value {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(text)) => text,
            Some(other) => return Err(wrong_type(at_address, other, "a string")),
        };
        let address = parse_address(text).ok_or_else(|| JsonError::BadAddress {
            at: at_address,
            value: text.clone(),
        })?;
        match (address.port(), &self.port_field) {
            (None, Some(field)) => Ok(Some(match port(at, entry, field)? {
                Some(port) => address.with_port(port),
                None => address,
            })),
            _ => Ok(Some(address)),
        }
    }
}

/// The port an entry holds at `field`; `None` when absent.
fn port(at: &str, entry: &Value, field: &Field) -> Result<Option<u16>, JsonError> {
    let at = format!("{at}{}", field.pointer);
    let bad = |value: &Value| JsonError::BadPort {
        at: at.clone(),
        value: value.to_string(),
    };
    match entry.pointer(&field.pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(value @ Value::Number(number)) => {
            let port = number.as_u64().and_then(|port| u16::try_from(port).ok());
            port.map(Some).ok_or_else(|| bad(value))
        }
        Some(value @ Value::String(text)) => text.trim().parse().map(Some).map_err(|_| bad(value)),
        Some(other) => Err(wrong_type(at.clone(), other, "a port number")),
    }
}

fn wrong_type(at: String, value: &Value, expected: &'static str) -> JsonError {
    let found = match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    JsonError::WrongType {
        at,
        found,
        expected,
    }
}

#[cfg(test)]
mod tests;
