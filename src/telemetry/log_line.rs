//! The human-readable log line when it goes to a file or a pipe (no colour):
//! the same text as `tracing_subscriber`'s default (`Full`) format, written
//! without its per-field styling calls and with the date worked out once a
//! second.
//!
//! Why: SPEC §7 wants one info event per guarded request, and with the
//! default formatter that line was ~7 % of the CPU of a replayed duplicate
//! (perf, load scenario c): a styled `Display` per field name, a `Debug`
//! pass per value, the calendar from scratch per line. At a terminal the
//! default formatter still writes the line, in colour.
//!
//! One deliberate difference: every value is cleaned of the control
//! characters a terminal acts on (ESC, BEL, BS, FF, DEL, C1), not only the
//! message and errors; an event ID is sender input.

use std::cell::Cell;
use std::fmt::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The plain-text event format; see the module comment.
pub struct PlainText;

impl<S, N> FormatEvent<S, N> for PlainText
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        write_timestamp(&mut writer, SystemTime::now())?;
        writer.write_str(level_str(meta.level()))?;
        writer.write_char(' ')?;
        if let Some(scope) = ctx.event_scope() {
            let mut seen = false;
            for span in scope.from_root() {
                Clean(&mut writer).write_str(span.metadata().name())?;
                seen = true;
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>() {
                    if !fields.is_empty() {
                        writer.write_char('{')?;
                        Clean(&mut writer).write_str(fields)?;
                        writer.write_char('}')?;
                    }
                }
                writer.write_char(':')?;
            }
            if seen {
                writer.write_char(' ')?;
            }
        }
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        let mut fields = Fields {
            out: &mut writer,
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writer.write_char('\n')
    }
}

/// As the default format pads them: right-aligned in five columns.
fn level_str(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        Level::ERROR => "ERROR",
    }
}

/// The event's fields as the default format writes them: the message bare,
/// then `name=value` with strings quoted and escaped (`Debug`), separated
/// by single spaces; the `log.*` fields of a `log` record are skipped (its
/// target is in the metadata already).
struct Fields<'a, 'w> {
    out: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Fields<'_, '_> {
    /// Starts a field; `false` when it is not to be written.
    fn begin(&mut self, field: &Field) -> bool {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return false;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        self.result = self.out.write_str(separator);
        if name != "message" {
            let name = name.strip_prefix("r#").unwrap_or(name);
            self.result = self
                .result
                .and_then(|()| self.out.write_str(name))
                .and_then(|()| self.out.write_char('='));
        }
        self.result.is_ok()
    }

    fn value(&mut self, args: fmt::Arguments<'_>) {
        self.result = Clean(&mut *self.out).write_fmt(args);
    }
}

/// Floats and booleans take `Visit`'s defaults, which pass them to
/// `record_debug`: their `Debug` is what the default format writes.
impl Visit for Fields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.begin(field) {
            return;
        }
        if field.name() == "message" {
            self.result = Clean(&mut *self.out).write_str(value);
        } else if value
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
        {
            // what `Debug` writes for printable ASCII, without its char loop
            self.result = self
                .out
                .write_char('"')
                .and_then(|()| self.out.write_str(value))
                .and_then(|()| self.out.write_char('"'));
        } else {
            self.value(format_args!("{value:?}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if !self.begin(field) {
            return;
        }
        match value.source() {
            None => self.value(format_args!("{value}")),
            Some(source) => {
                let name = field.name();
                self.value(format_args!("{value} {name}.sources={:?}", Sources(source)));
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.begin(field) {
            self.value(format_args!("{value:?}"));
        }
    }

    // Integers are what `Debug` writes, without the formatting machinery:
    // the request line has three of them.
    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.begin(field) {
            self.result = self.out.write_str(itoa::Buffer::new().format(value));
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.begin(field) {
            self.result = self.out.write_str(itoa::Buffer::new().format(value));
        }
    }
}

/// An error's chain of sources, as the default format lists them.
struct Sources<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Debug for Sources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        let mut next = Some(self.0);
        while let Some(e) = next {
            list.entry(&format_args!("{e}"));
            next = e.source();
        }
        list.finish()
    }
}

/// Writes through, escaping what a terminal would act on, as the default
/// format escapes messages: ESC, BEL, BS, FF and DEL as `\xNN`, the C1
/// controls (U+0080–U+009F) as `\u{NN}`.
struct Clean<'a, W: Write + ?Sized>(&'a mut W);

impl<W: Write + ?Sized> Write for Clean<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // C1 controls are 0xC2 0x80..=0x9F in UTF-8: a 0xC2 byte is the cue
        let plain = |b: u8| !matches!(b, 0x1b | 0x07 | 0x08 | 0x0c | 0x7f | 0xc2);
        if s.bytes().all(plain) {
            return self.0.write_str(s);
        }
        let mut start = 0;
        for (at, ch) in s.char_indices() {
            let escaped = match ch {
                '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' => true,
                c => ('\u{80}'..='\u{9f}').contains(&c),
            };
            if escaped {
                self.0.write_str(&s[start..at])?;
                if (ch as u32) < 0x80 {
                    write!(self.0, "\\x{:02x}", ch as u32)?;
                } else {
                    write!(self.0, "\\u{{{:x}}}", ch as u32)?;
                }
                start = at + ch.len_utf8();
            }
        }
        self.0.write_str(&s[start..])
    }
}

thread_local! {
    /// The second last formatted on this thread and its text up to the
    /// seconds: the calendar is worked out once a second per thread.
    static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

/// `2026-11-30T18:20:01.123456Z ` (UTC, microseconds, a trailing space), as
/// the default format's `SystemTime` timer writes it for years 0–9999.
fn write_timestamp(w: &mut impl Write, now: SystemTime) -> fmt::Result {
    let Ok(since) = now.duration_since(UNIX_EPOCH) else {
        return w.write_str("<unknown time> ");
    };
    let secs = since.as_secs();
    let prefix = SECOND.with(|cell| {
        let (cached, text) = cell.get();
        if cached == secs {
            return text;
        }
        let text = date_time_to_seconds(secs);
        cell.set((secs, text));
        text
    });
    let mut line = [0u8; 28];
    line[..19].copy_from_slice(&prefix);
    line[19] = b'.';
    let mut micros = since.subsec_micros();
    for at in (20..26).rev() {
        line[at] = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    line[26] = b'Z';
    line[27] = b' ';
    // only ASCII digits and punctuation were written
    w.write_str(std::str::from_utf8(&line).map_err(|_| fmt::Error)?)
}

/// `YYYY-MM-DDTHH:MM:SS` for seconds since the Unix epoch (UTC); years past
/// 9999 wrap their digits (not a concern for a clock that is right).
fn date_time_to_seconds(secs: u64) -> [u8; 19] {
    let days = (secs / 86_400) as i64;
    let in_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let mut out = *b"0000-00-00T00:00:00";
    let mut put = |at: usize, width: usize, mut v: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year as u64);
    put(5, 2, u64::from(month));
    put(8, 2, u64::from(day));
    put(11, 2, in_day / 3600);
    put(14, 2, in_day / 60 % 60);
    put(17, 2, in_day % 60);
    out
}

/// Proleptic Gregorian (year, month, day) of a day count since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[derive(Debug)]
    struct Outer(Inner);
    #[derive(Debug)]
    struct Inner;
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the claim failed")
        }
    }
    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("connection refused")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    impl std::error::Error for Inner {}

    /// Every kind of event the proxy writes, and some it might.
    fn emit_all() {
        let span = tracing::info_span!("serve", port = 8080, name = "x y");
        let _entered = span.enter();
        tracing::info!(
            route = "stripe",
            event_id = "evt_1PqR5s",
            outcome = "replayed",
            upstream_status = 200i64,
            attempt = 1u64,
            duration_ms = 0.183262f64,
            "guarded request"
        );
        tracing::info!(
            duration_ms = 12.0f64,
            whole = 3.0e21f64,
            tiny = 1.0e-7f64,
            "floats"
        );
        tracing::warn!(
            event_id = "quote\" back\\slash tab\t nl\n é ✓",
            "escaped strings"
        );
        tracing::warn!(ok = true, n = -5i64, "bools and negatives");
        tracing::warn!(min = i64::MIN, max = u64::MAX, zero = 0u64, "extremes");
        tracing::error!(error = %Outer(Inner), "display field");
        let e = Outer(Inner);
        tracing::error!(
            error = &e as &(dyn std::error::Error + 'static),
            "error field"
        );
        tracing::error!(
            error = &Inner as &(dyn std::error::Error + 'static),
            "no sources"
        );
        tracing::debug!(value = ?vec![1, 2], r#type = "raw name", "debug field");
        tracing::info!("message only");
        tracing::info!(with_message_in_middle = 1, "first {} then", "args");
    }

    /// A `MakeWriter` into `sink`.
    fn writer_into(sink: &Sink) -> impl Fn() -> Sink + Send + Sync + 'static {
        let sink = sink.clone();
        move || sink.clone()
    }

    fn render(plain: bool) -> String {
        let sink = Sink::default();
        let writer = writer_into(&sink);
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(Level::DEBUG)
            .with_writer(writer);
        if plain {
            tracing::subscriber::with_default(builder.event_format(PlainText).finish(), emit_all);
        } else {
            tracing::subscriber::with_default(builder.without_time().finish(), emit_all);
        }
        sink.text()
    }

    #[test]
    fn lines_read_as_the_default_format_writes_them() {
        let plain = render(true);
        let full = render(false);
        let plain_lines: Vec<&str> = plain.lines().collect();
        let full_lines: Vec<&str> = full.lines().collect();
        assert_eq!(plain_lines.len(), full_lines.len(), "{plain}\n{full}");
        for (p, f) in plain_lines.iter().zip(&full_lines) {
            let (stamp, rest) = p.split_at(28);
            assert!(stamp.ends_with("Z "), "{p}");
            assert_eq!(rest, *f);
        }
        assert!(plain.contains(
            "serve{port=8080 name=\"x y\"}: idemgate::telemetry::log_line::tests: guarded request \
             route=\"stripe\" event_id=\"evt_1PqR5s\" outcome=\"replayed\" upstream_status=200 \
             attempt=1 duration_ms=0.183262\n"
        ));
    }

    #[test]
    fn terminal_controls_in_any_value_are_escaped() {
        let sink = Sink::default();
        let writer = writer_into(&sink);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(writer)
            .event_format(PlainText)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                event_id = "a\u{1b}[2Jb\u{85}c",
                peer = %"d\u{1b}]0;title\u{7}e",
                "msg \u{9b}31m"
            );
        });
        let text = sink.text();
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{85}'),
            "{text:?}"
        );
        assert!(
            !text.contains('\u{7}') && !text.contains('\u{9b}'),
            "{text:?}"
        );
        assert!(text.contains("msg \\u{9b}31m"), "{text}");
        assert!(text.contains(r#"event_id="a\u{1b}[2Jb\u{85}c""#), "{text}");
        assert!(text.contains(r"peer=d\x1b]0;title\x07e"), "{text}");
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_microseconds() {
        let at = |secs: u64, micros: u32| {
            let mut s = String::new();
            let t = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros.into());
            write_timestamp(&mut s, t).unwrap();
            s
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z ");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z ");
        assert_eq!(at(951_868_799, 999_999), "2000-02-29T23:59:59.999999Z ");
        assert_eq!(at(1_796_065_201, 123_456), "2026-11-30T19:00:01.123456Z ");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z ");
        assert_eq!(at(253_402_300_799, 0), "9999-12-31T23:59:59.000000Z ");
        // the per-thread cache answers within a second and moves on after it
        assert_eq!(at(1_796_065_201, 5), "2026-11-30T19:00:01.000005Z ");
        assert_eq!(at(1_796_065_202, 5), "2026-11-30T19:00:02.000005Z ");
        let mut s = String::new();
        write_timestamp(&mut s, UNIX_EPOCH - Duration::from_secs(1)).unwrap();
        assert_eq!(s, "<unknown time> ");
    }

    #[test]
    fn the_calendar_matches_day_by_day_counting() {
        // walk 1970..2401 one day at a time and compare
        let (mut y, mut m, mut d) = (1970i64, 1u32, 1u32);
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        for days in 0..157_000i64 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let month_len = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > month_len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }
}
