//! A real OpenTelemetry collector for the tracing tests (SPEC §19):
//! `rotel-agent` from the PyPI package `rotel` (.ci/run pins it), started
//! on free loopback ports with its debug log of every span received
//! (`--debug-log traces --debug-log-verbosity detailed`) going to a file;
//! [`Collector::spans`] reads that log back into [`Span`]s. Dropping the
//! handle kills the process. Without the package: SKIP outside CI, a
//! failure in CI.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, wait_until, TempDir};

/// One span as the collector printed it.
#[derive(Debug, Clone, Default)]
pub struct Span {
    pub trace_id: String,
    /// Empty for a root.
    pub parent_id: String,
    pub id: String,
    pub name: String,
    /// `SPAN_KIND_SERVER`, `SPAN_KIND_CLIENT`, `SPAN_KIND_INTERNAL`.
    pub kind: String,
    /// `STATUS_CODE_UNSET`, `STATUS_CODE_ERROR`.
    pub status: String,
    /// Values as printed: `Str(x)` is `x`, `Int(3)` is `3`.
    pub attributes: BTreeMap<String, String>,
    pub links: Vec<Link>,
}

/// A span link: where it leads, and its attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    pub trace_id: String,
    pub span_id: String,
    pub attributes: BTreeMap<String, String>,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

pub struct Collector {
    child: Option<Child>,
    pub port: u16,
    log: PathBuf,
    _dir: TempDir,
}

/// `rotel-agent` inside the installed `rotel` package.
fn agent_binary() -> Result<PathBuf, String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import rotel, os; print(os.path.dirname(rotel.__file__))",
        ])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(
            "the python package rotel is not installed (python3 -m pip install rotel==0.0.1a15)"
                .into(),
        );
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bin = PathBuf::from(dir).join("rotel-agent");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!("no collector binary at {}", bin.display()))
    }
}

impl Collector {
    /// A collector taking OTLP/HTTP on a free loopback port; `None`: skipped.
    pub fn start(tag: &str) -> Option<Collector> {
        let bin = match agent_binary() {
            Ok(b) => b,
            Err(why) => {
                if std::env::var_os("CI").is_some() {
                    panic!("the OTLP collector rotel is needed in CI: {why}");
                }
                eprintln!("SKIP: no OTLP collector: {why}");
                return None;
            }
        };
        let dir = TempDir::new(&format!("otel-{tag}"));
        let (port, grpc) = (free_port(), free_port());
        let log = dir.path().join("collector.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(["start", "--otlp-http-endpoint"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--otlp-grpc-endpoint")
            .arg(format!("127.0.0.1:{grpc}"))
            .args([
                "--exporter",
                "blackhole",
                "--debug-log",
                "traces",
                "--debug-log-verbosity",
                "detailed",
            ])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("rotel-agent");
        let c = Collector {
            child: Some(child),
            port,
            log,
            _dir: dir,
        };
        let up = wait_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "the collector did not listen: {}", c.text());
        Some(c)
    }

    /// The `telemetry.otlp.endpoint` to give idemgate.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Everything the collector printed.
    pub fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        parse(&self.text())
    }

    /// The spans received once `enough` holds of them, within `within`.
    #[track_caller]
    pub fn wait(&self, within: Duration, enough: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let mut spans = Vec::new();
        let ok = wait_until(within, || {
            spans = self.spans();
            enough(&spans)
        });
        assert!(
            ok,
            "the collector did not get the spans in {within:?}: {spans:#?}"
        );
        spans
    }

    /// The spans of one trace, once it has `count` of them.
    #[track_caller]
    pub fn trace(&self, trace_id: &str, count: usize) -> Vec<Span> {
        let of = |s: &[Span]| s.iter().filter(|s| s.trace_id == trace_id).count();
        let spans = self.wait(Duration::from_secs(15), |s| of(s) >= count);
        spans
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The debug log's spans: blocks from `Span #N` on, with their
/// `Attributes:` and `SpanLink #N` entries.
fn parse(text: &str) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    // where `-> key: value` lines go: the span, or its last link
    let mut in_link = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("Span #") {
            spans.push(Span::default());
            in_link = false;
            continue;
        }
        if t.starts_with("ResourceSpans #") || t.starts_with("ScopeSpans #") {
            in_link = false;
            continue;
        }
        let Some(span) = spans.last_mut() else {
            continue;
        };
        if t.starts_with("SpanLink #") {
            span.links.push(Link::default());
            in_link = true;
            continue;
        }
        if t.starts_with("SpanEvent #") {
            in_link = false;
            continue;
        }
        if let Some(kv) = t.strip_prefix("-> ") {
            let Some((key, value)) = kv.split_once(": ") else {
                continue;
            };
            let value = unwrap_value(value);
            match (in_link, key) {
                (true, "Trace ID") => span.links.last_mut().unwrap().trace_id = value,
                (true, "ID") => span.links.last_mut().unwrap().span_id = value,
                (true, "TraceState" | "DroppedAttributesCount" | "Attributes:") => {}
                (true, _) => {
                    span.links
                        .last_mut()
                        .unwrap()
                        .attributes
                        .insert(key.to_owned(), value);
                }
                (false, _) => {
                    span.attributes.insert(key.to_owned(), value);
                }
            }
            continue;
        }
        if let Some((key, value)) = t.split_once(':') {
            let value = value.trim().to_owned();
            match key.trim() {
                "Trace ID" => span.trace_id = value,
                "Parent ID" => span.parent_id = value,
                "ID" => span.id = value,
                "Name" => span.name = value,
                "Kind" => span.kind = value,
                "Status code" => span.status = value,
                _ => {}
            }
        }
    }
    spans
}

/// `Str(x)` → `x`, `Int(3)` → `3`; anything else as printed.
fn unwrap_value(v: &str) -> String {
    for tag in ["Str(", "Int(", "Bool(", "Double("] {
        if let Some(inner) = v.strip_prefix(tag).and_then(|r| r.strip_suffix(')')) {
            return inner.to_owned();
        }
    }
    v.trim().to_owned()
}

#[test]
fn the_debug_log_parses_into_spans_and_links() {
    let text = "\
ResourceSpans #0
Span #0
    Trace ID       : aa
    Parent ID      : 
    ID             : 01
    Name           : POST /hooks
    Kind           : SPAN_KIND_SERVER
    Status code    : STATUS_CODE_UNSET
Attributes:
     -> idemgate.outcome: Str(replayed)
     -> http.response.status_code: Int(200)
Links:
SpanLink #0
     -> Trace ID: bb
     -> ID: 02
     -> TraceState: 
     -> DroppedAttributesCount: 0
     -> Attributes::
          -> idemgate.link: Str(replayed)
Span #1
    Trace ID       : aa
    Parent ID      : 01
    ID             : 03
    Name           : idemgate.claim
";
    let spans = parse(text);
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[0].attr("idemgate.outcome"), Some("replayed"));
    assert_eq!(spans[0].attr("http.response.status_code"), Some("200"));
    assert_eq!(spans[0].parent_id, "");
    assert_eq!(spans[0].links.len(), 1);
    let link = &spans[0].links[0];
    assert_eq!(
        (link.trace_id.as_str(), link.span_id.as_str()),
        ("bb", "02")
    );
    assert_eq!(
        link.attributes.get("idemgate.link").map(String::as_str),
        Some("replayed")
    );
    assert_eq!(spans[1].parent_id, "01");
}
