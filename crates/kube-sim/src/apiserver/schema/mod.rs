//! Custom resources against their CustomResourceDefinition's `openAPIV3Schema`, the way
//! kube-apiserver (k8s.io/apiextensions-apiserver v0.37.2) treats them.
//!
//! Data flow: a write's body is first *decoded* — [`prune`] drops every field the
//! structural schema does not declare (`pkg/apiserver/schema/pruning/algorithm.go`), plus
//! unknown top-level `metadata` fields (`schema/objectmeta/coerce.go`), and reports their
//! paths so the `write` module can refuse them (`fieldValidation=Strict`), warn about
//! them (`Warn`, the default) or say nothing (`Ignore`); [`drop_nulls`] removes `null`s the
//! schema neither allows nor defaults (`schema/defaulting/prunenulls.go`). After defaulting
//! and mutating admission, [`check`] validates the object (`ValidateCustomResource` in
//! `pkg/apiserver/validation/validation.go`, on kube-openapi's `pkg/validation/validate`)
//! and answers 422 `Invalid` with one `details.causes` entry per field error, worded by
//! `kubeOpenAPIResultToFieldErrors` and k8s.io/apimachinery `util/validation/field`.
//! Updates are *ratcheted* (`pkg/apiserver/validation/ratcheting.go`): a part of the
//! object equal to its correlated part in the stored object is not held against the
//! update, so objects stored before a schema tightened can still be changed elsewhere.
//!
//! Validated keywords: `type` (with `nullable`, `x-kubernetes-int-or-string`), `enum`,
//! `minimum`/`maximum` (and their `exclusive…`), `multipleOf`, the ranges of integers
//! and of `format: int32` and `format: float`, `minLength`/`maxLength`, `pattern`,
//! `format` (`date-time`, `date`, `byte`, `uuid`/`uuid3`/`uuid4`/`uuid5`, `ipv4`, `ipv6`,
//! `cidr`, `k8s-short-name`, `k8s-long-name`), `minItems`/`maxItems`,
//! `minProperties`/`maxProperties`, `required`, `properties`, `additionalProperties`
//! (maps), `items`. Pruning honours `x-kubernetes-preserve-unknown-fields` and
//! `x-kubernetes-embedded-resource`; ratcheting correlates list items only for
//! `x-kubernetes-list-type: map` (by `x-kubernetes-list-map-keys`) and `set`, like
//! upstream. The wording of every error above was compared with the Go code's output.
//!
//! Not implemented (accepted unchecked): CEL rules (`x-kubernetes-validations`),
//! `allOf`/`anyOf`/`oneOf`/`not`, `uniqueItems`, `format`s other than those above
//! (`uri`, `email`, `hostname`, `mac`, `duration`, …), the uniqueness of
//! `x-kubernetes-list-type: map` keys and `set` items, validation of embedded resources'
//! `metadata`, and unknown fields nested inside `metadata`
//! (`metadata.ownerReferences[0].foo`). An invalid `pattern` is reported with Rust's
//! regex error rather than Go's.

mod format;
mod prune;
mod validate;

#[cfg(test)]
mod tests;

use serde_json::Value;

use super::meta::meta_str;
use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult, Cause};

pub(crate) use prune::{drop_nulls, prune};
pub(crate) use validate::validate;

/// The kind of a field error (`field.ErrorType`), which gives the cause's reason and the
/// words its message starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// A required property is absent.
    Required,
    /// A value breaks a constraint.
    Invalid,
    /// A value has the wrong JSON type or `format`.
    TypeInvalid,
    /// A value is not one of the `enum`.
    NotSupported,
    /// A string exceeds `maxLength`.
    TooLong,
    /// A list or map exceeds `maxItems` or `maxProperties`.
    TooMany,
}

impl ErrorKind {
    /// The `details.causes[].reason` (`field.ErrorType`).
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::TypeInvalid => "FieldValueTypeInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::TooLong => "FieldValueTooLong",
            Self::TooMany => "FieldValueTooMany",
        }
    }

    /// `ErrorType.String()`.
    fn text(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid | Self::TypeInvalid => "Invalid value",
            Self::NotSupported => "Unsupported value",
            Self::TooLong => "Too long",
            Self::TooMany => "Too many",
        }
    }

    /// Whether the message shows the bad value (`ErrorBody`).
    fn shows_value(self) -> bool {
        !matches!(self, Self::Required | Self::TooLong)
    }
}

/// One refused field (`field.Error`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FieldError {
    /// What is wrong.
    pub kind: ErrorKind,
    /// The field's path, such as `spec.ports[0].name` (`<nil>` for the object itself).
    pub field: String,
    /// The refused value as the message prints it.
    pub value: Value,
    /// What the value should have been, when said.
    pub detail: String,
}

impl FieldError {
    /// The message after the field (`ErrorBody`): `Required value`, `Invalid value:
    /// "integer": spec.x in body must be of type string: "integer"`, ...
    pub(crate) fn body(&self) -> String {
        let mut body = self.kind.text().to_string();
        if self.kind.shows_value() {
            body.push_str(": ");
            body.push_str(&go_value(&self.value));
        }
        if !self.detail.is_empty() {
            body.push_str(": ");
            body.push_str(&self.detail);
        }
        body
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// 422 when `obj` breaks its CRD schema; `old` is the stored object of an update, whose
/// unchanged parts are not held against it. Kinds without a schema pass.
pub(crate) fn check(def: &ResourceDef, obj: &Value, old: Option<&Value>) -> ApiResult<()> {
    let Some(schema) = def.schema.as_deref().filter(|_| def.custom) else {
        return Ok(());
    };
    let errors = validate(schema, obj, old);
    if errors.is_empty() {
        return Ok(());
    }
    Err(invalid(def, meta_str(obj, "name"), &errors))
}

/// `apierrors.NewInvalid`: `Kind.group "name" is invalid: <errors>`, one error as is and
/// several (each once) as `[a, b]`, with a cause per error.
pub(crate) fn invalid(def: &ResourceDef, name: &str, errors: &[FieldError]) -> ApiError {
    let qualified = if def.group.is_empty() {
        def.kind.clone()
    } else {
        format!("{}.{}", def.kind, def.group)
    };
    let mut printed: Vec<String> = Vec::new();
    for error in errors {
        let text = error.to_string();
        if !printed.contains(&text) {
            printed.push(text);
        }
    }
    let aggregate = match printed.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let mut error = ApiError::new(
        422,
        "Invalid",
        format!("{qualified} \"{name}\" is invalid: {aggregate}"),
    )
    .with_details(&def.group, &def.kind, name);
    error.causes = errors
        .iter()
        .map(|e| Cause {
            reason: e.kind.reason().into(),
            message: e.body(),
            field: e.field.clone(),
        })
        .collect();
    error
}

/// A value the way Go's `%v`/`%q` print it in field errors: strings quoted, numbers
/// and booleans bare (floats in Go's shortest `%v` form), anything else as JSON.
pub(crate) fn go_value(value: &Value) -> String {
    match value {
        Value::String(s) => quote(s),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (None, Some(u), _) => u.to_string(),
            (None, None, Some(f)) => go_float(f),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// Go's `%q` of a string (JSON escaping is the same for what schemas carry).
pub(crate) fn quote(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Go's `%v` of a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`): the shortest digits,
/// in exponent form when the exponent is below -4 or at least 6 (`1e+06`, `1.5e-05`).
pub(crate) fn go_float(f: f64) -> String {
    if f == 0.0 || !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f.is_infinite() {
            if f > 0.0 { "+Inf" } else { "-Inf" }.into()
        } else {
            "0".into()
        };
    }
    let sci = format!("{f:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..6).contains(&exponent) {
        return format!("{f}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}
