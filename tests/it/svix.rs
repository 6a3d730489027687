//! The `svix` preset against deliveries signed by Svix's own Python library
//! (`svix.webhooks.Webhook(secret).sign`, issue 25), through the real binary
//! to a real consumer, with a real SQLite store.
//!
//! Svix sends `svix-id`, `svix-timestamp`, `svix-signature` by default and,
//! with white-labelling on, the same values as `webhook-id`,
//! `webhook-timestamp`, `webhook-signature`. The library signs the same way
//! for both (it has no white-label switch on the signing side); its
//! `verify` reads either name. SPEC §8: the preset's event ID is the ID of
//! the header set that was verified.
//!
//! Needs `python3` with the `svix` package (`pip install svix`; `.ci/run`
//! installs it). Without it each test prints `SKIP` and passes — except in
//! CI (`CI` set), where it fails.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const PATH: &str = "/hooks/svix";

// ------------------------------------------------------------ the svix library

/// Reads one JSON request a line, answers one JSON line: `{"ok": …}` or
/// `{"err": "…"}`. The first line out says the library loaded.
const HELPER: &str = r#"
import json, sys
from datetime import datetime, timezone
import svix
from svix.webhooks import Webhook
print(json.dumps({"ok": svix.__version__}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    try:
        wh = Webhook(req["secret"])
        if req["op"] == "sign":
            ts = datetime.fromtimestamp(req["ts"], tz=timezone.utc)
            out = {"ok": wh.sign(req["id"], ts, req["body"])}
        else:
            wh.verify(req["body"].encode(), req["headers"])
            out = {"ok": None}
    except Exception as e:
        out = {"err": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)
"#;

/// One `python3` process running [`HELPER`]; killed on drop.
struct SvixPy {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    /// Everything python3 wrote to stderr (drained, so it never blocks).
    stderr: Arc<Mutex<String>>,
}

impl SvixPy {
    /// `None` (after printing SKIP) when python3 or the svix package is
    /// missing outside CI; a panic in CI.
    fn start() -> Option<SvixPy> {
        let why = match Self::spawn() {
            Ok(py) => return Some(py),
            Err(why) => why,
        };
        if std::env::var_os("CI").is_some() {
            panic!("{why}; CI requires it (`python3 -m pip install svix`)");
        }
        eprintln!("SKIP: {why}; `python3 -m pip install svix` to run this test");
        None
    }

    fn spawn() -> Result<SvixPy, String> {
        let mut child = Command::new("python3")
            .args(["-c", HELPER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("python3 cannot be run: {e}"))?;
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut err_pipe = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let drain = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = err_pipe.read(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut py = SvixPy {
            child,
            stdin,
            lines,
            stderr,
        };
        match py.answer() {
            Ok(version) => {
                eprintln!("signing with svix (Python) {version}");
                Ok(py)
            }
            Err(e) => {
                // the child is gone (or hung, and is killed here): its last
                // stderr line says why, e.g. `ModuleNotFoundError: …`
                let _ = py.child.kill();
                let _ = py.child.wait();
                let _ = drain.join(); // ends with the child's stderr
                let stderr = py.stderr.lock().unwrap().clone();
                let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
                Err(format!(
                    "python3 cannot load the svix package ({})",
                    last.map(str::trim).unwrap_or(&e)
                ))
            }
        }
    }

    fn answer(&mut self) -> Result<Value, String> {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .map_err(|e| format!("no answer from python3: {e}"))?;
        let v: Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
        match (v.get("ok"), v.get("err")) {
            (Some(ok), _) => Ok(ok.clone()),
            (_, Some(err)) => Err(err.as_str().unwrap_or_default().to_string()),
            _ => Err(format!("unexpected answer: {line}")),
        }
    }

    fn call(&mut self, req: Value) -> Result<Value, String> {
        writeln!(self.stdin, "{req}").map_err(|e| e.to_string())?;
        self.stdin.flush().map_err(|e| e.to_string())?;
        self.answer()
    }

    /// `Webhook(secret).sign(id, ts, body)`: the signature header's value.
    fn sign(&mut self, secret: &str, id: &str, ts: i64, body: &str) -> String {
        let v = self
            .call(json!({"op": "sign", "secret": secret, "id": id, "ts": ts, "body": body}))
            .expect("svix signs");
        v.as_str().expect("a signature string").to_string()
    }

    /// `Webhook(secret).verify(body, headers)`, as a consumer would run it.
    fn verify(
        &mut self,
        secret: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<(), String> {
        let headers: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let body = String::from_utf8(body.to_vec()).expect("UTF-8 body");
        self.call(json!({"op": "verify", "secret": secret, "headers": headers, "body": body}))
            .map(|_| ())
    }
}

impl Drop for SvixPy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------ deliveries

/// Which names Svix sends the three values under.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Names {
    /// `svix-*`, the default.
    Svix,
    /// `webhook-*`, white-labelled.
    WhiteLabelled,
}

impl Names {
    fn prefix(self) -> &'static str {
        match self {
            Names::Svix => "svix",
            Names::WhiteLabelled => "webhook",
        }
    }
}

/// One HTTP delivery: headers in order (repeats allowed) and the body.
#[derive(Clone, Debug)]
struct Delivery {
    headers: Vec<(String, String)>,
    body: String,
}

impl Delivery {
    /// What Svix sends for message `id` at `ts`, signed by the library.
    fn signed(py: &mut SvixPy, secret: &str, names: Names, id: &str, ts: i64) -> Delivery {
        let body =
            json!({"type": "invoice.paid", "data": {"message": id, "amount": 1200}}).to_string();
        let sig = py.sign(secret, id, ts, &body);
        let p = names.prefix();
        Delivery {
            headers: vec![
                ("content-type".into(), "application/json".into()),
                (format!("{p}-id"), id.into()),
                (format!("{p}-timestamp"), ts.to_string()),
                (format!("{p}-signature"), sig),
            ],
            body,
        }
    }

    fn get(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {name}"))
    }

    fn set(mut self, name: &str, value: &str) -> Delivery {
        self.headers.retain(|(k, _)| k != name);
        self.headers.push((name.into(), value.into()));
        self
    }

    fn add(mut self, name: &str, value: &str) -> Delivery {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn without(mut self, name: &str) -> Delivery {
        self.headers.retain(|(k, _)| k != name);
        self
    }

    fn post(&self, px: &Proxy) -> Response {
        px.post(PATH, &self.headers, self.body.as_bytes())
    }
}

/// A fresh `whsec_` secret, as the Svix portal shows one.
fn new_secret(tag: &str) -> String {
    use base64::Engine as _;
    let key: Vec<u8> = format!("{tag}-{}", eid("key")).bytes().take(24).collect();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

/// A harness whose route `svix` verifies with a fresh secret.
struct Setup {
    h: Harness,
    secret: String,
}

impl std::ops::Deref for Setup {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.h
    }
}

fn setup(tag: &str) -> Setup {
    let secret = new_secret(tag);
    let h = Harness::sqlite(tag)
        .yaml_with(|up| format!(
            "  - name: svix\n    match:\n      path_prefix: {PATH}\n    upstream: \"{up}\"\n    provider: svix\n    verify:\n      secrets: [env:SVIX_SECRET]\n    retention: 3d\n"
        ))
        .env("SVIX_SECRET", &secret)
        .start();
    Setup { h, secret }
}

/// Exit code of `events show` (0 found, 3 absent).
fn show_code(store: &str, id: &str) -> i32 {
    cli(&["events", "show", "--store", store, "--route", "svix", id]).0
}

fn requests(px: &Proxy, outcome: &str) -> f64 {
    px.requests("svix", outcome)
}

#[track_caller]
fn assert_problem(r: &Response, status: u16, kind: &str, needle: &str) {
    let p = r.json();
    assert_eq!(r.status, status, "{p}");
    assert_eq!(r.header("Content-Type"), Some("application/problem+json"));
    assert_eq!(p["type"], format!("urn:idemgate:problem:{kind}"), "{p}");
    let detail = p["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(needle), "`{detail}` lacks `{needle}`");
}

// ------------------------------------------------------------ tests

/// Issue 25: a white-labelled delivery is forwarded once, with
/// `Idempotency-Key` equal to its `webhook-id`, still verifiable by the
/// library at the consumer; its retry, re-signed with a new timestamp, is
/// replayed. A first attempt the consumer fails is retried and forwarded.
/// The default `svix-*` set keeps working, and a message keeps its ID
/// whichever names carry it.
#[test]
fn white_labelled_deliveries_are_forwarded_once_and_their_retries_replayed() {
    let Some(mut py) = SvixPy::start() else {
        return;
    };
    let s = setup("svixwl");
    let (up, px) = (&s.up, &s.px);
    let ts = unix_now();

    let id = eid("msg_wl");
    let first = Delivery::signed(&mut py, &s.secret, Names::WhiteLabelled, &id, ts);
    assert_eq!(
        py.verify(&s.secret, &first.headers, first.body.as_bytes()),
        Ok(()),
        "the library accepts what it signed under the white-labelled names"
    );
    let r = first.post(px);
    assert_eq!(r.status, 200, "{}", px.log());
    assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(up.count(&id), 1);
    let got = up.received().pop().unwrap();
    assert_eq!(got.header("Idempotency-Key"), Some(id.as_str()));
    assert_eq!(got.body, first.body.as_bytes());
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        assert_eq!(got.header(name), Some(first.get(name)), "{name} forwarded");
    }
    assert_eq!(got.header("svix-id"), None);
    let forwarded: Vec<(String, String)> = got
        .headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("webhook-"))
        .cloned()
        .collect();
    assert_eq!(
        py.verify(&s.secret, &forwarded, &got.body),
        Ok(()),
        "the consumer can verify what it was sent"
    );
    assert_eq!(show(&s.store, "svix", &id)["state"], "delivered");

    // Svix's retry: the same message, signed again at a later time.
    let retry = Delivery::signed(&mut py, &s.secret, Names::WhiteLabelled, &id, ts + 7);
    assert_ne!(
        retry.get("webhook-signature"),
        first.get("webhook-signature")
    );
    let r = retry.post(px);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(r.header("Idempotency-Status"), Some("replayed"));
    assert_eq!(up.count(&id), 1, "the retry is not forwarded");

    // A first attempt the consumer fails: the re-signed retry is forwarded.
    let failed = eid("msg_wl_500");
    up.script(&failed, vec![Reply::status(500), Reply::status(200)]);
    let r = Delivery::signed(
        &mut py,
        &s.secret,
        Names::WhiteLabelled,
        &failed,
        unix_now(),
    )
    .post(px);
    assert_eq!(r.status, 500);
    let r = Delivery::signed(
        &mut py,
        &s.secret,
        Names::WhiteLabelled,
        &failed,
        unix_now() + 5,
    )
    .post(px);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(up.count(&failed), 2);
    let r = Delivery::signed(
        &mut py,
        &s.secret,
        Names::WhiteLabelled,
        &failed,
        unix_now() + 9,
    )
    .post(px);
    assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(up.count(&failed), 2);

    // The default names, and the same message under the other names.
    let plain = eid("msg_plain");
    let r = Delivery::signed(&mut py, &s.secret, Names::Svix, &plain, unix_now()).post(px);
    assert_eq!(r.status, 200, "{}", px.log());
    let got = up.received().pop().unwrap();
    assert_eq!(got.header("Idempotency-Key"), Some(plain.as_str()));
    let r = Delivery::signed(
        &mut py,
        &s.secret,
        Names::WhiteLabelled,
        &plain,
        unix_now() + 3,
    )
    .post(px);
    assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
    let r = Delivery::signed(&mut py, &s.secret, Names::Svix, &id, unix_now() + 3).post(px);
    assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(up.count(&plain), 1);
    assert_eq!(up.count(&id), 1);

    // the attempt the consumer failed was forwarded too
    assert_eq!(requests(px, "forwarded"), 4.0);
    assert_eq!(requests(px, "replayed"), 4.0);
    assert_eq!(requests(px, "invalid_signature"), 0.0);
}

/// Forgeries that mix the `svix-*` and `webhook-*` sets, from a captured
/// message `a` toward a target ID `b`: what each is, the delivery, and the
/// status, problem type and detail it must get.
fn mixed_sets(
    py: &mut SvixPy,
    attacker: &str,
    (captured_wl, captured_svix): (&Delivery, &Delivery),
    (a, b): (&str, &str),
    ts: i64,
) -> Vec<(&'static str, Delivery, u16, &'static str, &'static str)> {
    // The `webhook-*` set is the one verified as soon as
    // any of it is present, and the event ID is its `webhook-id`.
    let (sig, missing, invalid) = ("invalid-signature", "missing-event-id", "invalid-event-id");
    vec![
        (
            "a verified webhook-* set with another svix-id",
            captured_wl.clone().add("svix-id", b),
            401,
            sig,
            "differs from the signed `webhook-id`",
        ),
        (
            "a verified webhook-* set with svix-id repeated, once the other",
            captured_wl.clone().add("svix-id", a).add("svix-id", b),
            401,
            sig,
            "differs from the signed `webhook-id`",
        ),
        (
            "a genuine svix-* set and a webhook-id naming the target",
            captured_svix.clone().add("webhook-id", b),
            401,
            sig,
            "missing signature header `webhook-signature`",
        ),
        (
            "the captured svix-* set under the target's ID, and a forged webhook-* set",
            captured_svix
                .clone()
                .set("svix-id", b)
                .add("webhook-id", b)
                .add("webhook-timestamp", &ts.to_string())
                .add(
                    "webhook-signature",
                    Delivery::signed(py, attacker, Names::WhiteLabelled, b, ts)
                        .get("webhook-signature"),
                ),
            401,
            sig,
            "no signature matches",
        ),
        (
            "svix-id and svix-timestamp with the captured webhook-signature",
            captured_svix
                .clone()
                .set("svix-id", b)
                .without("svix-signature")
                .add("webhook-timestamp", &ts.to_string())
                .add("webhook-signature", captured_wl.get("webhook-signature")),
            400,
            missing,
            "no webhook-id header",
        ),
        (
            "webhook-id repeated",
            captured_wl.clone().add("webhook-id", a),
            401,
            sig,
            "`webhook-id`: the header is repeated",
        ),
        (
            "webhook-id twice, once the target",
            captured_wl.clone().add("webhook-id", b),
            400,
            invalid,
            "several different webhook-id headers",
        ),
        (
            "the captured svix-signature repeated under the target's svix-id",
            captured_svix
                .clone()
                .set("svix-id", b)
                .add("svix-signature", captured_svix.get("svix-signature")),
            401,
            sig,
            "`svix-signature`: the header is repeated",
        ),
    ]
}

/// Issue 25: forgeries on either header set, and every way of mixing the
/// two sets, get 401 (or 400 when the selected set has no usable ID) and
/// claim nothing: no event ID is occupied, the consumer sees nothing, and
/// the genuine deliveries of those IDs are forwarded afterwards.
#[test]
fn forgeries_on_either_header_set_are_refused_and_claim_nothing() {
    let Some(mut py) = SvixPy::start() else {
        return;
    };
    let s = setup("svixforge");
    let (up, px, store) = (&s.up, &s.px, s.store.as_str());
    let attacker = new_secret("attacker");
    let sw = Names::WhiteLabelled;
    // `a` is a message the attacker captured; `b` one it wants to occupy.
    let a = eid("msg_captured");
    let b = eid("msg_target");
    let ts = unix_now();
    let captured_wl = Delivery::signed(&mut py, &s.secret, sw, &a, ts);
    let captured_svix = Delivery::signed(&mut py, &s.secret, Names::Svix, &a, ts);

    let mut refused = 0.0;
    for names in [Names::Svix, sw] {
        let p = names.prefix();
        let (id_h, sig_h) = (format!("{p}-id"), format!("{p}-signature"));
        let captured = if names == sw {
            &captured_wl
        } else {
            &captured_svix
        };
        let cases: Vec<(&str, Delivery, &str)> = vec![
            (
                "signed with another secret",
                Delivery::signed(&mut py, &attacker, names, &b, unix_now()),
                "no signature matches",
            ),
            (
                "the captured signature under another ID",
                captured.clone().set(&id_h, &b),
                "no signature matches",
            ),
            (
                "the captured headers with another body",
                Delivery {
                    body: captured.body.replace("1200", "9999"),
                    ..captured.clone()
                }
                .set(&id_h, &b),
                "no signature matches",
            ),
            (
                "a signature list of nothing but skipped entries",
                captured
                    .clone()
                    .set(&id_h, &b)
                    .set(&sig_h, "v1,AAAA v1a,AAAA"),
                "no `v1,` signature is base64 of 32 bytes",
            ),
        ];
        for (what, d, needle) in cases {
            assert_problem(&d.post(px), 401, "invalid-signature", needle);
            assert_eq!(
                show_code(store, &b),
                3,
                "{p}, {what}: the target is not claimed"
            );
            refused += 1.0;
        }
    }

    // Mixing the sets.
    let mixed = mixed_sets(
        &mut py,
        &attacker,
        (&captured_wl, &captured_svix),
        (&a, &b),
        ts,
    );
    for (what, d, status, kind, needle) in mixed {
        assert_problem(&d.post(px), status, kind, needle);
        if status == 401 {
            refused += 1.0;
        }
        assert_eq!(show_code(store, &b), 3, "{what}: the target is not claimed");
        assert_eq!(show_code(store, &a), 3, "{what}: nor the captured ID");
    }
    assert_eq!(up.total(), 0, "no forgery reaches the consumer");
    assert_eq!(requests(px, "invalid_signature"), refused);

    // Nothing was pre-empted: the genuine deliveries go through, once.
    for (id, names) in [(&a, sw), (&b, Names::Svix)] {
        let r = Delivery::signed(&mut py, &s.secret, names, id, unix_now()).post(px);
        assert_eq!(r.status, 200, "{}", px.log());
        assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
        assert_eq!(up.count(id), 1);
    }
    assert_eq!(up.total(), 2);
}

/// Issue 20's signature lists, with the library on the consumer's side: a
/// list with an entry that is not 32 bytes next to the library's own
/// signature is accepted by `Webhook.verify` and forwarded by idemgate.
#[test]
fn a_list_the_library_accepts_is_forwarded() {
    let Some(mut py) = SvixPy::start() else {
        return;
    };
    let s = setup("svixlist");
    for names in [Names::Svix, Names::WhiteLabelled] {
        let id = eid("msg_list");
        let d = Delivery::signed(&mut py, &s.secret, names, &id, unix_now());
        let sig_h = format!("{}-signature", names.prefix());
        // 16 bytes of base64, as an older or foreign signer might add
        let list = format!("v1,AAAAAAAAAAAAAAAAAAAAAA== {}", d.get(&sig_h));
        let d = d.set(&sig_h, &list);
        assert_eq!(py.verify(&s.secret, &d.headers, d.body.as_bytes()), Ok(()));
        let r = d.post(&s.px);
        assert_eq!(r.status, 200, "{names:?}: {}", s.px.log());
        assert_eq!(s.up.count(&id), 1);
    }
}
