//! Criterion benches for the per-request work of a guarded delivery, each
//! beside a naive baseline, plus one store claim + settle round trip per
//! backend.
//!
//! ```sh
//! cargo bench --bench hot_paths              # everything (~3 min)
//! cargo bench --bench hot_paths -- digest    # a filter, as usual with criterion
//! ```
//!
//! Groups:
//! - `digest/*`: `raw_digest` of a 1 KiB webhook body against plain `sha2`; the
//!   `json` path (`parse_json_body` + `json_digest`) against
//!   `serde_json::from_slice` + `to_vec` re-serialisation + `sha2`.
//! - `event_id/*`: the header check and the JSON-pointer extraction, against
//!   `str::from_utf8` and serde_json's own `Value::pointer`.
//! - `claim/*`: the pure `decide` and `settle` steps.
//! - `signature/*`: the github (body), slack (timestamp header) and stripe
//!   (`k=v` list) checks of a 1 KiB body through the declarative rule that
//!   verifies them now (`verify::Verifier`), each beside the hard-coded check
//!   it replaced (`hot_paths/legacy.rs`, a copy kept for this comparison);
//!   and a standard-webhooks `v1a` (Ed25519) entry.
//! - `request/*`: the seen-events hint (a new key, a key met before) and one
//!   log line appended to the log sink, against a plain `Vec` append.
//! - `store/*`: one claim + one delivered settle of a fresh event, one
//!   claim of a delivered event, and the read the proxy makes first for a
//!   duplicate it met (the replay path; on SQLite from the cache of delivered
//!   records), on SQLite (a file under
//!   `target/tmp`, WAL, `synchronous=FULL` as the store sets it) and on
//!   PostgreSQL (a schema of its own, dropped afterwards; skipped with a note
//!   when the server does not answer). `IDEMGATE_BENCH_PG_URL` overrides
//!   `postgres://postgres@127.0.0.1:5432/test`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idemgate::claim::digest::{canonical_json, json_digest, parse_json_body, raw_digest, to_hex};
use idemgate::claim::event_id::{event_id_from_json_tokens, validate_event_id};
use idemgate::claim::json_pointer::{parse_pointer, JsonPointer};
use idemgate::claim::{decide, settle, AttemptEnd, Current, Existing, State};
use idemgate::store::{self, ClaimOutcome, ClaimRequest, ClaimStore, SettleOutcome, SettleRequest};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

#[path = "hot_paths/legacy.rs"]
mod legacy;

/// A Stripe-like event, padded to exactly 1 KiB: nested objects, numbers,
/// booleans, nulls and an array, as real webhook payloads have.
fn webhook_body() -> Vec<u8> {
    let head = r#"{"id":"evt_1PqR5tLkdIwHu7ix0aBcDeFg","object":"event","api_version":"2024-06-20","created":1718000000,"livemode":false,"pending_webhooks":1,"request":{"id":"req_8XyZaBcDeFgHiJ","idempotency_key":"8f14e45f-ceea-467a-9af0-2e1f3b1c9d7e"},"type":"invoice.payment_succeeded","data":{"object":{"id":"in_1PqR5sLkdIwHu7ixQwErTyUi","object":"invoice","amount_due":4200,"amount_paid":4200,"amount_remaining":0,"attempt_count":1,"attempted":true,"billing_reason":"subscription_cycle","currency":"eur","customer":"cus_QhJkLmNoPqRsTu","customer_email":"jane.doe@example.com","discount":null,"lines":{"object":"list","data":[{"id":"il_1PqR5sLkdIwHu7ixAsDfGhJk","amount":4200,"description":"1 x Pro plan (at 42.00 / month)","period":{"end":1720592000,"start":1718000000},"quantity":1}],"has_more":false,"total_count":1},"paid":true,"status":"paid","subtotal":4200,"tax":null,"total":4200,"total_tax_amounts":[]}},"delivery_attempt":1,"note":""#;
    let tail = "\"}";
    let pad = 1024 - head.len() - tail.len();
    let mut body = Vec::with_capacity(1024);
    body.extend_from_slice(head.as_bytes());
    body.extend(std::iter::repeat_n(b'x', pad));
    body.extend_from_slice(tail.as_bytes());
    assert_eq!(body.len(), 1024);
    parse_json_body(&body).expect("the bench body is I-JSON");
    body
}

fn digests(c: &mut Criterion) {
    let body = webhook_body();
    let doc = parse_json_body(&body).unwrap();
    let ignore = vec![JsonPointer::parse("/delivery_attempt").unwrap()];

    let mut g = c.benchmark_group("digest");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("raw/idemgate", |b| {
        b.iter(|| to_hex(&raw_digest(black_box(&body))))
    });
    g.bench_function("raw/baseline_sha2", |b| {
        b.iter(|| hex::encode(Sha256::digest(black_box(&body))))
    });
    g.bench_function("json_parse/idemgate_ijson", |b| {
        b.iter(|| parse_json_body(black_box(&body)).unwrap())
    });
    g.bench_function("json_parse/baseline_serde_json", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&body)).unwrap())
    });
    g.bench_function("json_canonical/idemgate_streamed", |b| {
        b.iter(|| json_digest(black_box(&doc), &[]))
    });
    g.bench_function("json_canonical/idemgate_materialised", |b| {
        b.iter(|| Sha256::digest(canonical_json(black_box(&doc))))
    });
    g.bench_function("json_canonical/baseline_to_vec", |b| {
        b.iter(|| Sha256::digest(serde_json::to_vec(black_box(&doc)).unwrap()))
    });
    g.bench_function("json_canonical/idemgate_with_ignore", |b| {
        b.iter(|| json_digest(black_box(&doc), &ignore))
    });
    // What a `digest: json` route does per request, from bytes to hex.
    g.bench_function("json_end_to_end/idemgate", |b| {
        b.iter(|| {
            let doc = parse_json_body(black_box(&body)).unwrap();
            to_hex(&json_digest(&doc, &ignore))
        })
    });
    g.bench_function("json_end_to_end/baseline", |b| {
        b.iter(|| {
            let doc: Value = serde_json::from_slice(black_box(&body)).unwrap();
            hex::encode(Sha256::digest(serde_json::to_vec(&doc).unwrap()))
        })
    });
    g.finish();
}

fn event_ids(c: &mut Criterion) {
    let body = webhook_body();
    let doc = parse_json_body(&body).unwrap();
    let header = b"evt_1PqR5tLkdIwHu7ix0aBcDeFg".as_slice();
    let tokens = parse_pointer("/id").unwrap();
    let deep = parse_pointer("/data/object/lines/data/0/id").unwrap();

    let mut g = c.benchmark_group("event_id");
    g.bench_function("header/idemgate_validate", |b| {
        b.iter(|| validate_event_id(black_box(header)).unwrap().to_owned())
    });
    g.bench_function("header/baseline_from_utf8", |b| {
        b.iter(|| std::str::from_utf8(black_box(header)).unwrap().to_owned())
    });
    g.bench_function("json_pointer/idemgate_top", |b| {
        b.iter(|| event_id_from_json_tokens(black_box(&doc), &tokens).unwrap())
    });
    // The baseline: serde_json's own pointer lookup, then the copy.
    let serde_pointer = |path: &'static str| {
        let doc = &doc;
        move || {
            black_box(doc)
                .pointer(path)
                .and_then(Value::as_str)
                .unwrap()
                .to_owned()
        }
    };
    g.bench_function("json_pointer/baseline_serde_top", |b| {
        b.iter(serde_pointer("/id"))
    });
    g.bench_function("json_pointer/idemgate_deep", |b| {
        b.iter(|| event_id_from_json_tokens(black_box(&doc), &deep).unwrap())
    });
    g.bench_function("json_pointer/baseline_serde_deep", |b| {
        b.iter(serde_pointer("/data/object/lines/data/0/id"))
    });
    g.finish();
}

fn claim_steps(c: &mut Criterion) {
    let now = 1_718_000_000_000;
    let inputs = [
        ("none", None),
        (
            "processing_live",
            Some(Existing {
                state: State::Processing,
                lease_until: Some(now + 30_000),
                same_digest: true,
            }),
        ),
        (
            "delivered",
            Some(Existing {
                state: State::Delivered,
                lease_until: None,
                same_digest: true,
            }),
        ),
    ];
    let mut g = c.benchmark_group("claim");
    for (name, input) in inputs {
        g.bench_with_input(BenchmarkId::new("decide", name), &input, |b, i| {
            b.iter(|| decide(black_box(*i), black_box(now), false))
        });
    }
    let cur = Some(Current {
        state: State::Processing,
        attempts: 3,
    });
    for (name, end) in [
        ("settled", AttemptEnd::Settled),
        ("failed", AttemptEnd::Failed),
    ] {
        g.bench_with_input(BenchmarkId::new("settle", name), &end, |b, e| {
            b.iter(|| settle(black_box(cur), black_box(3), *e))
        });
    }
    g.finish();
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A claim on the bench route with a 30 s lease and a day's retention.
fn claim_req<'a>(id: &'a str, digest: &'a str, now: i64) -> ClaimRequest<'a> {
    ClaimRequest {
        route: "bench",
        event_id: id,
        digest,
        now,
        lease_ms: 30_000,
        retention_ms: 86_400_000,
        hold: false,
        instance: "test",
        token: 0,
        trace: None,
    }
}

/// One claim of a fresh event, then its delivered settle: the two commits
/// every first delivery makes.
async fn claim_and_settle(store: &dyn ClaimStore, digest: &str) {
    let id = format!("bench-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let now = now_ms();
    let out = store
        .claim(&claim_req(&id, digest, now))
        .await
        .expect("claim");
    let ClaimOutcome::Claimed { attempt, .. } = out else {
        panic!("a fresh event was not claimed: {out:?}")
    };
    store
        .settle(&SettleRequest {
            route: "bench",
            event_id: &id,
            attempt,
            now,
            retention_ms: 86_400_000,
            outcome: SettleOutcome::Delivered {
                status: 200,
                content_type: None,
                body: None,
                headers: None,
            },
            started_at: 0,
            instance: "test",
            attempt_error: None,
        })
        .await
        .expect("settle");
}

/// A duplicate of a delivered event: what every replay asks the store.
async fn claim_delivered(store: &dyn ClaimStore, id: &str, digest: &str) {
    let req = claim_req(id, digest, now_ms());
    assert_replay(Some(store.claim(&req).await.expect("claim")));
}

/// The read the proxy makes first for a duplicate of an event it met: on
/// SQLite answered from the cache of delivered records once it holds the
/// record, on PostgreSQL a (batched) lookup.
async fn read_delivered(store: &dyn ClaimStore, id: &str, digest: &str) {
    let req = claim_req(id, digest, now_ms());
    assert_replay(store.peek(&req).await.expect("peek"));
}

/// The store answered with the delivered record: a replay.
fn assert_replay(out: Option<ClaimOutcome>) {
    assert!(
        matches!(out, Some(ClaimOutcome::Existing { .. })),
        "not a replay: {out:?}"
    );
}

fn store_round_trip(
    c: &mut Criterion,
    name: &str,
    rt: &tokio::runtime::Runtime,
    store: Arc<dyn ClaimStore>,
) {
    let digest = to_hex(&raw_digest(&webhook_body()));
    rt.block_on(claim_and_settle(&*store, &digest));
    let delivered = format!("bench-{}", NEXT_ID.load(Ordering::Relaxed) - 1);

    let mut g = c.benchmark_group(format!("store/{name}"));
    g.sample_size(30).measurement_time(Duration::from_secs(6));
    g.bench_function("claim_settle_fresh", |b| {
        b.iter(|| rt.block_on(claim_and_settle(&*store, &digest)))
    });
    g.bench_function("claim_of_delivered", |b| {
        b.iter(|| rt.block_on(claim_delivered(&*store, &delivered, &digest)))
    });
    g.bench_function("read_of_delivered", |b| {
        b.iter(|| rt.block_on(read_delivered(&*store, &delivered, &digest)))
    });
    g.finish();
    rt.block_on(store.close());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn sqlite_store(c: &mut Criterion) {
    let rt = runtime();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-sqlite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let url = format!("sqlite://{}", dir.join("claims.db").display());
    let store = rt.block_on(async {
        let s = store::open(&url, 4).await.expect("open SQLite");
        s.migrate().await.expect("migrate SQLite");
        s
    });
    store_round_trip(c, "sqlite", &rt, store);
    let _ = std::fs::remove_dir_all(&dir);
}

fn postgres_store(c: &mut Criterion) {
    let base = std::env::var("IDEMGATE_BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let rt = runtime();
    let schema = format!("bench_hot_{}", std::process::id());
    let admin = rt.block_on(async {
        let pool = tokio::time::timeout(
            Duration::from_secs(3),
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&base),
        )
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&pool)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(pool)
    });
    let admin = match admin {
        Ok(p) => p,
        Err(e) => {
            eprintln!("SKIP store/postgres: PostgreSQL at {base} is not usable ({e})");
            return;
        }
    };
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
    let store = rt.block_on(async {
        let s = store::open(&url, 4).await.expect("open PostgreSQL");
        s.migrate().await.expect("migrate PostgreSQL");
        s
    });
    store_round_trip(c, "postgres", &rt, store);
    rt.block_on(async {
        let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&admin)
            .await;
        admin.close().await;
    });
}

/// The per-request bookkeeping around the claim: the seen-events hint that
/// decides read-first or claim-first, and appending one log line (the
/// shipped sink against a plain `Vec`, the floor for a copy).
fn request_bookkeeping(c: &mut Criterion) {
    use idemgate::proxy::seen::SeenEvents;
    use idemgate::telemetry::log_buffer::LogBuffer;
    use std::io::Write;
    use tracing_subscriber::fmt::MakeWriter;

    let mut g = c.benchmark_group("request");
    let seen = SeenEvents::default();
    // more keys than the table has slots, so each is new when it comes round
    let keys: Vec<String> = (0..1_000_003).map(|i| format!("evt_{i:012}")).collect();
    let mut next = keys.iter().cycle();
    g.bench_function("seen/new_key", |b| {
        b.iter(|| seen.check_and_record(black_box("stripe"), black_box(next.next().unwrap())))
    });
    seen.check_and_record("stripe", "evt_replayed");
    g.bench_function("seen/met_key", |b| {
        b.iter(|| seen.check_and_record(black_box("stripe"), black_box("evt_replayed")))
    });
    let line = "2026-11-30T10:00:00.000000Z  INFO idemgate::proxy::guard: guarded request \
                route=\"stripe\" event_id=\"evt_1NXb2c\" outcome=\"forwarded\" \
                upstream_status=200 attempt=1 duration_ms=1.234\n";
    let (buf, guard) = LogBuffer::new(std::io::sink(), |_| {});
    g.bench_function("log_line/log_buffer", |b| {
        b.iter(|| buf.make_writer().write_all(black_box(line.as_bytes())))
    });
    drop(guard);
    let mut plain = Vec::with_capacity(1 << 20);
    g.bench_function("log_line/vec_baseline", |b| {
        b.iter(|| {
            if plain.len() > (1 << 20) - line.len() {
                plain.clear();
            }
            plain.extend_from_slice(black_box(line.as_bytes()))
        })
    });
    g.finish();
}

/// The declarative verify of each fixed scheme beside its old hard-coded
/// check, on the same headers and body (both must accept them).
// long: three schemes × two paths and the v1a entry, each set up beside its bench
fn signatures(c: &mut Criterion) {
    use http::{HeaderMap, HeaderValue};
    use idemgate::verify::{sign, Scheme, Verifier};

    let body = webhook_body();
    let secret = b"whsec_bench_secret_0123456789abcdef".to_vec();
    let now = 1_718_000_000;
    let legacy = legacy::Legacy {
        secrets: vec![secret.clone()],
        tolerance_ms: 300_000,
    };
    let headers = |pairs: &[(&'static str, String)]| {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert("user-agent", HeaderValue::from_static("Bench-Hookshot/1.0"));
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    };
    let github = headers(&[("x-hub-signature-256", sign::github(&secret, &body))]);
    let slack = headers(&[
        ("x-slack-signature", sign::slack(&secret, now, &body)),
        ("x-slack-request-timestamp", now.to_string()),
    ]);
    let stripe = headers(&[("stripe-signature", sign::stripe(&secret, now, &body))]);

    let mut g = c.benchmark_group("signature");
    g.throughput(Throughput::Bytes(body.len() as u64));
    let verifier = |scheme| Verifier::new(scheme, vec![secret.clone()]);
    let (gh, sl, st) = (
        verifier(Scheme::Github),
        verifier(Scheme::Slack),
        verifier(Scheme::Stripe),
    );
    gh.verify(&github, &body, now).unwrap();
    sl.verify(&slack, &body, now).unwrap();
    st.verify(&stripe, &body, now).unwrap();
    legacy.github(&github, &body).unwrap();
    legacy.slack(&slack, &body, now).unwrap();
    legacy.stripe(&stripe, &body, now).unwrap();
    g.bench_function("github/declarative", |b| {
        b.iter(|| gh.verify(black_box(&github), black_box(&body), now))
    });
    g.bench_function("github/hard_coded", |b| {
        b.iter(|| legacy.github(black_box(&github), black_box(&body)))
    });
    g.bench_function("slack/declarative", |b| {
        b.iter(|| sl.verify(black_box(&slack), black_box(&body), now))
    });
    g.bench_function("slack/hard_coded", |b| {
        b.iter(|| legacy.slack(black_box(&slack), black_box(&body), now))
    });
    g.bench_function("stripe/declarative", |b| {
        b.iter(|| st.verify(black_box(&stripe), black_box(&body), now))
    });
    g.bench_function("stripe/hard_coded", |b| {
        b.iter(|| legacy.stripe(black_box(&stripe), black_box(&body), now))
    });
    // standard-webhooks v1a: Ed25519 (ring), one key
    let seed = [7u8; 32];
    let pk = sign::standard_webhooks_public_key(&seed);
    let pk = base64_32(pk.trim_start_matches("whpk_"));
    let ed = Verifier {
        public_keys: vec![pk],
        ..Verifier::new(Scheme::StandardWebhooks, vec![])
    };
    let sw = headers(&[
        ("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W".to_string()),
        ("webhook-timestamp", now.to_string()),
        (
            "webhook-signature",
            sign::standard_webhooks_v1a(&seed, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", now, &body),
        ),
    ]);
    ed.verify(&sw, &body, now).unwrap();
    g.bench_function("standard_webhooks_v1a/ed25519", |b| {
        b.iter(|| ed.verify(black_box(&sw), black_box(&body), now))
    });
    g.finish();
}

/// 32 bytes from standard base64.
fn base64_32(s: &str) -> [u8; 32] {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
    bytes.try_into().unwrap()
}

criterion_group!(
    pure,
    digests,
    event_ids,
    claim_steps,
    request_bookkeeping,
    signatures
);
criterion_group!(stores, sqlite_store, postgres_store);
criterion_main!(pure, stores);
