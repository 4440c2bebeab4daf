//! Go `time.Duration` strings (`1m30s`, `500ms`, `15m0s`), as Kubernetes writes them: the
//! `timeout` query parameter the API server appends to webhook calls and the `sla` of a
//! LifecycleTransition. One parser for both.

use std::time::Duration;

/// Parses a Go duration: one or more `<number><unit>` pairs with units `h`, `m`, `s`, `ms`,
/// `us`/`µs` and `ns`, decimals allowed. A bare number, a sign, spaces inside or an unknown
/// unit give `None` (surrounding whitespace is ignored).
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_from_the_api_server() {
        let cases = [
            ("10s", Some(10.0)),
            ("30s", Some(30.0)),
            ("1m30s", Some(90.0)),
            ("1m0s", Some(60.0)),
            ("500ms", Some(0.5)),
            ("1.5s", Some(1.5)),
            ("", None),
            ("10", None),
            ("ten seconds", None),
            ("5d", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_go_duration(text).map(|d| d.as_secs_f64()),
                want,
                "{text:?}"
            );
        }
    }

    #[test]
    fn go_durations_parse_like_go() {
        let ok = [
            ("15m0s", 900.0),
            ("1h30m", 5400.0),
            ("300ms", 0.3),
            ("1.5s", 1.5),
            ("2h0m0s", 7200.0),
            ("10us", 0.00001),
        ];
        for (s, secs) in ok {
            let got = parse_go_duration(s).unwrap().as_secs_f64();
            assert!((got - secs).abs() < 1e-9, "{s}: {got}");
        }
        for s in ["", "15", "m", "15 minutes", "1x", "-5s", "1..5s"] {
            assert_eq!(parse_go_duration(s), None, "{s}");
        }
    }
}
