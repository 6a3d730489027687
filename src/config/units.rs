//! Durations (`500ms 30s 5m 2h 7d`) and sizes (`512B 64KiB 1MiB 1GiB`) as the
//! config file writes them, and back again for `idemgate check`.
//!
//! The grammar is deliberately small: one unsigned integer immediately followed
//! by one unit. No fractions, no compound forms (`1h30m`), no decimal size units
//! (`KB`), so a value means exactly one thing. Zero is rejected because every
//! duration and size in the config is a limit, and a zero limit is always a typo.

use std::time::Duration;

/// Duration units, largest first (the order `format_duration` tries them in).
const DURATION_UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Size units, largest first.
const SIZE_UNITS: [(&str, u64); 4] = [
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("B", 1),
];

/// Splits `"30s"` into `(30, "s")`; the error says what was expected.
fn split_number(s: &str, what: &str, units: &str) -> Result<(u64, String), String> {
    let s = s.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    if s.is_empty() {
        return Err(format!(
            "empty {what}; expected an integer followed by one of {units}"
        ));
    }
    if digits == 0 {
        return Err(format!(
            "invalid {what} `{s}`: expected an integer followed by one of {units}"
        ));
    }
    if unit.is_empty() {
        return Err(format!(
            "invalid {what} `{s}`: missing unit (one of {units})"
        ));
    }
    let n = number
        .parse::<u64>()
        .map_err(|_| format!("invalid {what} `{s}`: number too large"))?;
    Ok((n, unit.to_string()))
}

/// Parses `500ms`, `30s`, `5m`, `2h`, `7d`. Zero is an error.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_in(s, "duration", "ms, s, m, h, d", &DURATION_UNITS).map(Duration::from_millis)
}

/// Parses `512B`, `64KiB`, `1MiB`, `1GiB` (binary units only). Zero is an error.
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_in(s, "size", "B, KiB, MiB, GiB", &SIZE_UNITS)
}

/// A number and one of `units` (named `names` in messages), as the
/// smallest unit's count.
fn parse_in(s: &str, what: &str, names: &str, units: &[(&str, u64)]) -> Result<u64, String> {
    let (n, unit) = split_number(s, what, names)?;
    let Some(&(_, factor)) = units.iter().find(|(u, _)| *u == unit) else {
        return Err(format!(
            "invalid {what} `{}`: unknown unit `{unit}` (use one of {names})",
            s.trim()
        ));
    };
    if n == 0 {
        return Err(format!("{what} `{}` must be greater than zero", s.trim()));
    }
    n.checked_mul(factor)
        .ok_or_else(|| format!("invalid {what} `{}`: too large", s.trim()))
}

/// Formats a duration in the largest unit that represents it exactly
/// (`30s`, `7d`, `90s`, `1500ms`); sub-millisecond values fall back to humantime.
pub fn format_duration(d: impl Into<Duration>) -> String {
    let d = d.into();
    if d.is_zero() {
        return "0s".to_string();
    }
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return humantime::format_duration(d).to_string();
    }
    let Ok(millis) = u64::try_from(d.as_millis()) else {
        return humantime::format_duration(d).to_string();
    };
    DURATION_UNITS
        .iter()
        .find(|(_, unit)| millis % unit == 0)
        .map(|(name, unit)| format!("{}{name}", millis / unit))
        .unwrap_or_else(|| format!("{millis}ms"))
}

/// Formats a byte count in the largest binary unit that represents it exactly
/// (`64KiB`, `1MiB`, `1500B`).
pub fn format_size(n: u64) -> String {
    if n == 0 {
        return "0B".to_string();
    }
    SIZE_UNITS
        .iter()
        .find(|(_, unit)| n.is_multiple_of(*unit))
        .map(|(name, unit)| format!("{}{name}", n / unit))
        .unwrap_or_else(|| format!("{n}B"))
}
