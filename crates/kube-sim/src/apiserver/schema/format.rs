//! String `format`s a CRD schema may declare, as kube-openapi's `strfmt` registry checks
//! them (`pkg/validation/strfmt`), and `pattern` regular expressions, compiled once.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{LazyLock, Mutex};

use regex::Regex;

/// The formats kube-apiserver v1.37 keeps for string schemas
/// (`supportedVersionedFormats` in apiextensions-apiserver pkg/apiserver/validation/formats.go),
/// named the way go-openapi normalizes them (dashes removed). Others are stripped from
/// the schema and never checked.
const SUPPORTED: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "k8sshortname",
    "k8slongname",
];

/// The format a schema's value is held to, if kube-apiserver keeps it
/// (`StripUnsupportedFormatsPostProcessorForVersion`): string formats on untyped and
/// string schemas, `int32`/`int64` on integers, `float`/`double` on numbers.
pub(super) fn supported(schema_type: Option<&str>, format: &str) -> bool {
    match schema_type {
        None | Some("string") => SUPPORTED.contains(&normalize(format).as_str()),
        Some("integer") => matches!(format, "int32" | "int64"),
        Some("number") => matches!(format, "float" | "double"),
        Some(_) => false,
    }
}

fn normalize(format: &str) -> String {
    format.replace('-', "")
}

/// Whether `value` is valid in `format`; formats not modelled here pass.
pub(super) fn valid(format: &str, value: &str) -> bool {
    match normalize(format).as_str() {
        "datetime" => date_time(value),
        "date" => date(value),
        "byte" => matches(
            "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$",
            value,
        ),
        "uuid" => matches(
            "(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
            value,
        ),
        "uuid3" => matches(
            "(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
            value,
        ),
        "uuid4" | "uuid5" => {
            let version = if format.ends_with('4') { '4' } else { '5' };
            matches(
                &format!(
                    "(?i)^[0-9a-f]{{8}}-?[0-9a-f]{{4}}-?{version}[0-9a-f]{{3}}-?[89ab][0-9a-f]{{3}}-?[0-9a-f]{{12}}$"
                ),
                value,
            )
        }
        "ipv4" => value.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => value.parse::<Ipv6Addr>().is_ok(),
        "cidr" => cidr(value),
        "k8sshortname" => value.len() <= 63 && matches(&format!("^{SHORT_NAME}$"), value),
        "k8slongname" => {
            value.len() <= 253 && matches(&format!("^{SHORT_NAME}(\\.{SHORT_NAME})*$"), value)
        }
        _ => true,
    }
}

/// `shortNameFmt` of strfmt/kubernetes-extensions.go.
const SHORT_NAME: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";

/// `IsDateTime` of strfmt/time.go: a full date, `t`, then a time with an optional
/// fraction and a `z` or `±hh:mm` offset, compared case-insensitively.
fn date_time(value: &str) -> bool {
    if value.len() < 4 {
        return false;
    }
    let lower = value.to_lowercase();
    let mut parts = lower.split('t');
    let (Some(day), Some(time)) = (parts.next(), parts.next()) else {
        return false;
    };
    if !date(day) {
        return false;
    }
    let Some(caps) = regex(
        r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$",
    )
    .and_then(|re| {
        re.captures(time)
            .map(|c| [1, 2, 3].map(|i| c[i].to_string()))
    }) else {
        return false;
    };
    caps[0].as_str() <= "23" && caps[1].as_str() <= "59" && caps[2].as_str() <= "59"
}

/// `IsDate`: `time.Parse("2006-01-02", value)`, a real calendar day.
fn date(value: &str) -> bool {
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let mut parts = value.split('-');
    let (Some(y), Some(m), Some(d), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    if !(digits(y, 4) && digits(m, 2) && digits(d, 2)) {
        return false;
    }
    match (y.parse::<i16>(), m.parse::<i8>(), d.parse::<i8>()) {
        (Ok(y), Ok(m), Ok(d)) => jiff::civil::Date::new(y, m, d).is_ok(),
        _ => false,
    }
}

fn cidr(value: &str) -> bool {
    let Some((ip, bits)) = value.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => bits <= 32,
        Ok(IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

fn matches(pattern: &str, value: &str) -> bool {
    regex(pattern).is_some_and(|re| re.is_match(value))
}

/// Compiled patterns by source; `None` for one that does not compile.
static PATTERNS: LazyLock<Mutex<HashMap<String, Option<Regex>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The compiled `pattern`, or `None` when it is not a valid regular expression. Schemas
/// hold few patterns and every write checks them again, so each compiles once.
pub(super) fn regex(pattern: &str) -> Option<Regex> {
    let mut cache = match PATTERNS.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    cache
        .entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).ok())
        .clone()
}

/// Why `pattern` does not compile, for the error upstream words as
/// `should match '<pattern>, but pattern is invalid: <why>'`.
pub(super) fn regex_error(pattern: &str) -> String {
    Regex::new(pattern)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}
