//! Durations and sizes.

use std::time::Duration;

use crate::config::{format_duration, format_size, parse_duration, parse_size};

#[test]
fn durations_in_every_unit() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
    assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
    assert_eq!(parse_duration(" 1s "), Ok(Duration::from_secs(1)));
}

#[test]
fn bad_durations_are_rejected() {
    for bad in [
        "",
        "0s",
        "0ms",
        "30",
        "s",
        "1.5s",
        "-1s",
        "+1s",
        "1 s",
        "1S",
        "1sec",
        "1w",
        "1h30m",
        "99999999999999999999s",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
    }
    assert!(parse_duration("0s")
        .unwrap_err()
        .contains("greater than zero"));
    assert!(parse_duration("30").unwrap_err().contains("missing unit"));
    assert!(parse_duration("18446744073709551615d")
        .unwrap_err()
        .contains("too large"));
}

#[test]
fn sizes_in_every_unit() {
    assert_eq!(parse_size("512B"), Ok(512));
    assert_eq!(parse_size("64KiB"), Ok(64 * 1024));
    assert_eq!(parse_size("1MiB"), Ok(1 << 20));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
}

#[test]
fn bad_sizes_are_rejected() {
    for bad in [
        "",
        "0B",
        "0KiB",
        "1024",
        "1KB",
        "1MB",
        "1kib",
        "1.5MiB",
        "KiB",
        "1 KiB",
        "-1B",
        "18446744073709551615GiB",
    ] {
        assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
    }
    assert!(parse_size("1MB").unwrap_err().contains("unknown unit `MB`"));
}

#[test]
fn formatting_picks_the_largest_exact_unit() {
    assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
    assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    assert_eq!(format_duration(Duration::from_secs(300)), "5m");
    assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
    assert_eq!(format_duration(Duration::from_secs(30 * 86_400)), "30d");
    assert_eq!(format_duration(Duration::ZERO), "0s");
    assert_eq!(format_duration(Duration::from_nanos(1500)), "1us 500ns");
    assert_eq!(format_size(512), "512B");
    assert_eq!(format_size(1500), "1500B");
    assert_eq!(format_size(64 * 1024), "64KiB");
    assert_eq!(format_size(1 << 20), "1MiB");
    assert_eq!(format_size(3 << 30), "3GiB");
    assert_eq!(format_size(0), "0B");
}

#[test]
fn formatting_round_trips() {
    for s in ["500ms", "30s", "5m", "2h", "7d"] {
        assert_eq!(format_duration(parse_duration(s).unwrap()), s);
    }
    for s in ["512B", "64KiB", "1MiB", "1GiB"] {
        assert_eq!(format_size(parse_size(s).unwrap()), s);
    }
}

#[test]
fn store_durations_are_milliseconds_that_cannot_overflow() {
    use crate::config::DurationMs;
    let d = DurationMs::from(Duration::from_millis(1500));
    assert_eq!((d.ms(), d.duration()), (1500, Duration::from_millis(1500)));
    assert_eq!(DurationMs::from_secs(60), Duration::from_secs(60));
    assert_eq!(DurationMs::from_secs(60).ms(), 60_000);
    // past what the store can add to `now`: forever, still shown as written
    for ms in [u64::MAX, i64::MAX as u64, i64::MAX as u64 / 2 + 1] {
        let d = DurationMs::from(Duration::from_millis(ms));
        assert_eq!(d.ms(), i64::MAX / 2, "{ms}");
        assert_eq!(format_duration(d), format!("{ms}ms"));
        assert!(d.ms().checked_add(4_102_444_800_000).is_some(), "year 2100");
    }
}
