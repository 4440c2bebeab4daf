//! The schema validator: kube-openapi's `SchemaValidator` (pkg/validation/validate) for
//! the keywords structural CRD schemas use, with apiextensions-apiserver's translation of
//! its results into field errors and its ratcheting of updates.

use serde_json::{Map, Value, json};

use super::format;
use super::{ErrorKind, FieldError, go_float, quote};

/// Validates `value` against `schema`; `old` is the stored object of an update, whose
/// unchanged correlated parts are not validated (ratcheting). Errors come in the order
/// kube-openapi's validators run: type, string, format, number, array, enum, object.
pub(crate) fn validate(schema: &Value, value: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut out = Vec::new();
    node(schema, value, old, "", &mut out);
    out
}

/// Where a node is and where its errors go.
struct At<'a> {
    path: &'a str,
    out: &'a mut Vec<FieldError>,
}

impl At<'_> {
    /// The field of an error at this node: kube-openapi names the root `""`, which
    /// apiextensions reports as a nil path.
    fn field(&self) -> String {
        if self.path.is_empty() {
            "<nil>".into()
        } else {
            self.path.to_string()
        }
    }

    fn push(&mut self, kind: ErrorKind, value: Value, detail: String) {
        let field = self.field();
        self.out.push(FieldError {
            kind,
            field,
            value,
            detail,
        });
    }

    /// An error kube-openapi raises as `errors.New` rather than a `Validation`, which
    /// apiextensions reports at the nil path with an empty value.
    fn push_unplaced(&mut self, detail: String) {
        self.out.push(FieldError {
            kind: ErrorKind::Invalid,
            field: "<nil>".into(),
            value: json!(""),
            detail,
        });
    }
}

fn node(schema: &Value, value: &Value, old: Option<&Value>, path: &str, out: &mut Vec<FieldError>) {
    if old == Some(value) {
        // Ratcheting: an unchanged node keeps whatever it had.
        return;
    }
    let mut at = At { path, out };
    let types = types_of(schema);
    if value.is_null() {
        null(schema, &types, &mut at);
        enumeration(schema, value, &mut at);
        return;
    }
    type_check(schema, &types, value, &mut at);
    if let Value::String(s) = value {
        string(schema, s, &mut at);
        string_format(schema, &types, s, &mut at);
    }
    if value.is_number() {
        number(schema, &types, value, &mut at);
    }
    if let Value::Array(items) = value {
        array(schema, items, old, &mut at);
    }
    enumeration(schema, value, &mut at);
    if let Value::Object(map) = value {
        object(schema, map, old, &mut at);
    }
}

/// The JSON types a schema allows: its `type`, or integer and string under
/// `x-kubernetes-int-or-string` (`ConvertJSONSchemaPropsWithPostProcess`).
fn types_of(schema: &Value) -> Vec<&str> {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return vec!["integer", "string"];
    }
    schema
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .into_iter()
        .collect()
}

/// The schema's `format`, if kube-apiserver keeps it for the schema's type.
fn format_of<'a>(schema: &'a Value, types: &[&str]) -> Option<&'a str> {
    let format = schema.get("format")?.as_str().filter(|f| !f.is_empty())?;
    // Like the post-processor, a schema of several types counts as untyped.
    let single = match types {
        [one] => Some(*one),
        _ => None,
    };
    format::supported(single, format).then_some(format)
}

/// The JSON type and Go format kube-openapi infers for a decoded value
/// (`schemaInfoForType`: JSON integers decode as int64, other numbers as float64).
fn json_type(value: &Value) -> (&'static str, &'static str) {
    match value {
        Value::Bool(_) => ("boolean", ""),
        Value::String(_) => ("string", ""),
        Value::Number(n) if n.is_f64() => ("number", "float64"),
        Value::Number(_) => ("integer", "int64"),
        Value::Array(_) => ("array", ""),
        Value::Object(_) => ("object", ""),
        Value::Null => ("null", ""),
    }
}

/// `swag.IsFloat64AJSONInteger`.
fn integral(f: f64) -> bool {
    f.is_finite() && f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0
}

fn type_error(at: &mut At<'_>, expected: &str, found: &str) {
    let detail = format!(
        "{} in body must be of type {expected}: {}",
        at.path,
        quote(found)
    );
    at.push(ErrorKind::TypeInvalid, json!(found), detail);
}

/// `typeValidator` on `null`: refused unless the schema is untyped or `nullable`.
fn null(schema: &Value, types: &[&str], at: &mut At<'_>) {
    let nullable = schema.get("nullable") == Some(&Value::Bool(true));
    if !types.is_empty() && !types.contains(&"null") && !nullable {
        type_error(at, &types.join(","), "null");
    }
}

/// `typeValidator`: the value's JSON type must be one the schema allows (an integral
/// float passes as an integer, an integer as a number); a non-string value of a
/// schema with a string format is refused naming the format.
fn type_check(schema: &Value, types: &[&str], value: &Value, at: &mut At<'_>) {
    let format = format_of(schema, types);
    if types.is_empty() && format.is_none() {
        return;
    }
    let (found, found_format) = json_type(value);
    let float_int =
        found == "number" && value.as_f64().is_some_and(integral) && types.contains(&"integer");
    let int_float = found == "integer" && types.contains(&"number");
    let textual = value.is_string() || value.is_array();
    let allowed = types.contains(&found) || float_int || int_float;
    if let Some(format) = format {
        if !(textual || allowed || found_format == format) {
            type_error(at, format, found_format);
            return;
        }
        let numeric = types.contains(&"number") || types.contains(&"integer");
        if !numeric && textual {
            return;
        }
    }
    if !allowed {
        type_error(at, &types.join(","), found);
    }
}

fn int_of(schema: &Value, key: &str) -> Option<i64> {
    let v = schema.get(key)?;
    v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))
}

/// `stringValidator`: the first of maxLength, minLength (in characters) and pattern
/// that fails.
fn string(schema: &Value, s: &str, at: &mut At<'_>) {
    let length = s.chars().count() as i64;
    if let Some(max) = int_of(schema, "maxLength").filter(|max| length > *max) {
        let unit = if max == 1 { "byte" } else { "bytes" };
        let detail = format!("may not be more than {max} {unit}");
        return at.push(ErrorKind::TooLong, json!("<value omitted>"), detail);
    }
    if let Some(min) = int_of(schema, "minLength").filter(|min| length < *min) {
        let detail = format!("{} in body should be at least {min} chars long", at.path);
        return at.push(ErrorKind::Invalid, json!(s), detail);
    }
    let Some(pattern) = schema.get("pattern").and_then(Value::as_str) else {
        return;
    };
    let shown = match format::regex(pattern) {
        Some(re) if re.is_match(s) => return,
        Some(_) => pattern.to_string(),
        None => format!(
            "{pattern}, but pattern is invalid: {}",
            format::regex_error(pattern)
        ),
    };
    let detail = format!("{} in body should match '{shown}'", at.path);
    at.push(ErrorKind::Invalid, json!(s), detail);
}

/// `formatValidator` on strings.
fn string_format(schema: &Value, types: &[&str], s: &str, at: &mut At<'_>) {
    let Some(format) = format_of(schema, types) else {
        return;
    };
    if !format::valid(format, s) {
        let detail = format!("{} in body must be of type {format}: {}", at.path, quote(s));
        at.push(ErrorKind::TypeInvalid, json!(s), detail);
    }
}

/// `numberValidator`: the value fits the schema's numeric type
/// (`IsValueValidAgainstRange`), then multipleOf, minimum and maximum. A constraint
/// that fits the type compares natively (integers as integers, the constraint
/// truncated); one that does not is reported as such and compared as floats.
fn number(schema: &Value, types: &[&str], value: &Value, at: &mut At<'_>) {
    let range = Range::of(schema, types);
    if let Some(range) = range {
        range.check(range.holds(value), "Checked", at);
    }
    let native = |limit: f64, prefix: &str, at: &mut At<'_>| {
        range.is_none_or(|r| r.check(r.holds(&json!(limit)), prefix, at))
    };
    if let Some(factor) = schema.get("multipleOf").and_then(Value::as_f64) {
        let native = native(factor, "MultipleOf", at);
        multiple_of(value, factor, native, at);
    }
    for (key, prefix) in [
        ("minimum", "Minimum boundary"),
        ("maximum", "Maximum boundary"),
    ] {
        if let Some(limit) = schema.get(key).and_then(Value::as_f64) {
            let native = native(limit, prefix, at);
            bound(schema, value, key, limit, native, at);
        }
    }
}

/// The numeric type a schema's numbers and numeric constraints must convert to without
/// loss (`IsValueValidAgainstRange`): only a schema of the single type `integer`, or
/// `number` with `format: float`, has one.
#[derive(Clone, Copy, Debug)]
enum Range {
    Int64,
    Int32,
    Float32,
}

impl Range {
    fn of(schema: &Value, types: &[&str]) -> Option<Self> {
        match (types, schema.get("format").and_then(Value::as_str)) {
            (["integer"], Some("int32")) => Some(Self::Int32),
            (["integer"], _) => Some(Self::Int64),
            (["number"], Some("float")) => Some(Self::Float32),
            _ => None,
        }
    }

    /// Whether `number` converts to the type.
    fn holds(self, number: &Value) -> bool {
        match (self, number.as_i64()) {
            (Self::Int64, Some(_)) => true,
            (Self::Int32, Some(i)) => i32::try_from(i).is_ok(),
            _ => number.as_f64().is_some_and(|f| self.holds_float(f)),
        }
    }

    fn holds_float(self, f: f64) -> bool {
        let whole = |min: f64, max: f64| f.fract() == 0.0 && f >= min && f <= max;
        match self {
            Self::Int64 => whole(i64::MIN as f64, i64::MAX as f64),
            Self::Int32 => whole(f64::from(i32::MIN), f64::from(i32::MAX)),
            Self::Float32 => f.abs() <= f64::from(f32::MAX),
        }
    }

    /// Passes `fits` through, adding the unplaced error `<prefix> value must be of type
    /// <type> in <path>` when false.
    fn check(self, fits: bool, prefix: &str, at: &mut At<'_>) -> bool {
        if !fits {
            let name = match self {
                Self::Int64 => "integer (default format)",
                Self::Int32 => "integer with format int32",
                Self::Float32 => "number with format float",
            };
            at.push_unplaced(format!(
                "{prefix} value must be of type {name} in {}",
                at.path
            ));
        }
        fits
    }
}

/// `MultipleOfNativeType`, or `MultipleOf` on floats when not `native`.
fn multiple_of(value: &Value, factor: f64, native: bool, at: &mut At<'_>) {
    let data = value.as_f64().unwrap_or(0.0);
    let (off, shown) = match value.as_i64().filter(|_| native) {
        Some(i) => {
            let factor = factor as i64;
            if factor <= 0 {
                let detail = format!(
                    "factor MultipleOf declared for {} must be positive: {factor}",
                    at.path
                );
                return at.push(ErrorKind::Invalid, json!(factor), detail);
            }
            (i % factor != 0, factor.to_string())
        }
        None => {
            let mult = if factor < 1.0 {
                1.0 / factor * data
            } else {
                data / factor
            };
            (!integral(mult), go_float(factor))
        }
    };
    if off {
        let detail = format!("{} in body should be a multiple of {shown}", at.path);
        at.push(ErrorKind::Invalid, number_value(value, native), detail);
    }
}

/// The value an error shows: as decoded, or as the float it was compared as.
fn number_value(value: &Value, native: bool) -> Value {
    if native {
        value.clone()
    } else {
        value.as_f64().map_or_else(|| value.clone(), |f| json!(f))
    }
}

/// `minimum`/`maximum` with their `exclusive…` flags.
fn bound(schema: &Value, value: &Value, key: &str, limit: f64, native: bool, at: &mut At<'_>) {
    let exclusive_key = if key == "minimum" {
        "exclusiveMinimum"
    } else {
        "exclusiveMaximum"
    };
    let exclusive = schema.get(exclusive_key) == Some(&Value::Bool(true));
    let (shown, breaks) = match value.as_i64().filter(|_| native) {
        Some(i) => {
            let limit = limit as i64;
            (limit.to_string(), breaks(i.cmp(&limit), key, exclusive))
        }
        None => {
            let f = value.as_f64().unwrap_or(0.0);
            let ordering = f.partial_cmp(&limit).unwrap_or(std::cmp::Ordering::Equal);
            (go_float(limit), breaks(ordering, key, exclusive))
        }
    };
    if !breaks {
        return;
    }
    let relation = match (key, exclusive) {
        ("minimum", false) => "greater than or equal to",
        ("minimum", true) => "greater than",
        (_, false) => "less than or equal to",
        (_, true) => "less than",
    };
    let detail = format!("{} in body should be {relation} {shown}", at.path);
    at.push(ErrorKind::Invalid, number_value(value, native), detail);
}

fn breaks(ordering: std::cmp::Ordering, key: &str, exclusive: bool) -> bool {
    use std::cmp::Ordering::{Equal, Greater, Less};
    match (key, ordering) {
        (_, Equal) => exclusive,
        ("minimum", Less) | ("maximum", Greater) => true,
        _ => false,
    }
}

/// `schemaSliceValidator`: each item against `items`, then minItems and maxItems.
fn array(schema: &Value, items: &[Value], old: Option<&Value>, at: &mut At<'_>) {
    if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
        for (i, item) in items.iter().enumerate() {
            let old_item = correlated_item(schema, old, item);
            node(
                item_schema,
                item,
                old_item,
                &format!("{}[{i}]", at.path),
                at.out,
            );
        }
    }
    let size = items.len() as i64;
    if let Some(min) = int_of(schema, "minItems").filter(|min| size < *min) {
        let detail = format!("{} in body should have at least {min} items", at.path);
        at.push(ErrorKind::Invalid, json!(size), detail);
    }
    if let Some(max) = int_of(schema, "maxItems").filter(|max| size > *max) {
        at.push(ErrorKind::TooMany, json!(size), at_most(max));
    }
}

/// `field.TooMany`'s detail.
fn at_most(max: i64) -> String {
    let unit = if max == 1 { "item" } else { "items" };
    format!("must have at most {max} {unit}")
}

/// The old item a new list item is compared with when ratcheting: the one with the
/// same keys in a `map` list, an equal one in a `set`; atomic lists correlate nothing.
fn correlated_item<'a>(schema: &Value, old: Option<&'a Value>, item: &Value) -> Option<&'a Value> {
    let old = old?.as_array()?;
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("map") => {
            let keys = schema.get("x-kubernetes-list-map-keys")?.as_array()?;
            let key_of = |v: &Value| -> Vec<Option<Value>> {
                keys.iter()
                    .map(|k| k.as_str().and_then(|k| v.get(k)).cloned())
                    .collect()
            };
            let wanted = key_of(item);
            old.iter().find(|o| key_of(o) == wanted)
        }
        Some("set") => old.iter().find(|o| *o == item),
        _ => None,
    }
}

/// `basicCommonValidator`: the value must equal one of `enum` (numbers by value).
fn enumeration(schema: &Value, value: &Value, at: &mut At<'_>) {
    let Some(allowed) = schema
        .get("enum")
        .and_then(Value::as_array)
        .filter(|e| !e.is_empty())
    else {
        return;
    };
    let same = |a: &Value| match (a.as_f64(), value.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == value,
    };
    if allowed.iter().any(same) {
        return;
    }
    let listed: Vec<String> = allowed
        .iter()
        .map(|v| match v {
            Value::String(s) => quote(s),
            other => quote(&other.to_string()),
        })
        .collect();
    let detail = format!("supported values: {}", listed.join(", "));
    at.push(ErrorKind::NotSupported, value.clone(), detail);
}

/// `objectValidator`: property counts, each present property and `additionalProperties`
/// value against its schema, then `required`.
fn object(schema: &Value, map: &Map<String, Value>, old: Option<&Value>, at: &mut At<'_>) {
    let size = map.len() as i64;
    if let Some(min) = int_of(schema, "minProperties").filter(|min| size < *min) {
        let detail = format!("{} in body should have at least {min} properties", at.path);
        at.push(ErrorKind::Invalid, json!(size), detail);
    }
    if let Some(max) = int_of(schema, "maxProperties").filter(|max| size > *max) {
        at.push(ErrorKind::TooMany, json!(size), at_most(max));
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let extra = schema.get("additionalProperties").filter(|s| s.is_object());
    for (key, member) in map {
        let Some(member_schema) = properties.and_then(|p| p.get(key)).or(extra) else {
            continue;
        };
        let old_member = old.and_then(|o| o.get(key));
        let path = if at.path.is_empty() {
            key.clone()
        } else {
            format!("{}.{key}", at.path)
        };
        node(member_schema, member, old_member, &path, at.out);
    }
    let required = schema.get("required").and_then(Value::as_array);
    for key in required.into_iter().flatten().filter_map(Value::as_str) {
        if !map.contains_key(key) {
            let path = if at.path.is_empty() {
                key.to_string()
            } else {
                format!("{}.{key}", at.path)
            };
            at.out.push(FieldError {
                kind: ErrorKind::Required,
                field: path,
                value: json!(""),
                detail: String::new(),
            });
        }
    }
}
