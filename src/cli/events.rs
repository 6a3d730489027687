//! `migrate`, `events list|show|release` and `sweep`: the operator's view of
//! the store.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{json, Value};

use super::{block_on, exit, EventsCommand, ListArgs, ReleaseArgs, ShowArgs, StoreArg, SweepArgs};
use crate::claim::{Millis, State};
use crate::proxy::now_ms;
use crate::store::{self, ClaimStore, ListFilter, Record, ReleaseOutcome, StoreError};

async fn open(url: &str) -> Result<std::sync::Arc<dyn ClaimStore>, StoreError> {
    store::open(url, 2).await
}

fn fail(e: impl std::fmt::Display) -> i32 {
    eprintln!("idemgate: {e}");
    exit::FAILURE
}

pub fn migrate(args: StoreArg) -> i32 {
    let res = block_on(async {
        let s = open(&args.store).await?;
        s.migrate().await?;
        s.close().await;
        Ok::<_, StoreError>(())
    });
    match res {
        Ok(()) => {
            println!("migrations applied to {}", store::redact_url(&args.store));
            exit::OK
        }
        Err(e) => fail(e),
    }
}

pub fn sweep(args: SweepArgs) -> i32 {
    if args.batch_size < 1 {
        return fail("--batch-size must be at least 1");
    }
    let res = block_on(async {
        let s = open(&args.store.store).await?;
        let n = crate::sweeper::sweep_all(s.as_ref(), None, now_ms(), args.batch_size).await?;
        s.close().await;
        Ok::<_, StoreError>(n)
    });
    match res {
        Ok(n) => {
            println!("{n} expired records deleted");
            exit::OK
        }
        Err(e) => fail(e),
    }
}

pub fn events(cmd: EventsCommand) -> i32 {
    match cmd {
        EventsCommand::List(a) => list(a),
        EventsCommand::Show(a) => show(a),
        EventsCommand::Release(a) => release(a),
    }
}

fn list(args: ListArgs) -> i32 {
    let state = match args.state.as_deref().map(|s| State::parse(s).ok_or(s)) {
        Some(Err(s)) => {
            return fail(format!(
                "--state {s:?}: expected processing, delivered or failed"
            ))
        }
        Some(Ok(s)) => Some(s),
        None => None,
    };
    if args.limit < 1 {
        return fail("--limit must be at least 1");
    }
    let filter = ListFilter {
        route: args.route,
        state,
        limit: args.limit,
    };
    let res = block_on(async {
        let s = open(&args.store.store).await?;
        let r = s.list(&filter).await;
        s.close().await;
        r
    });
    match res {
        Ok(records) if args.json => {
            let docs: Vec<Value> = records.iter().map(record_json).collect();
            println!("{}", serde_json::to_string_pretty(&docs).expect("JSON"));
            exit::OK
        }
        Ok(records) => {
            print_table(&records);
            exit::OK
        }
        Err(e) => fail(e),
    }
}

fn show(args: ShowArgs) -> i32 {
    let res = block_on(async {
        let s = open(&args.store.store).await?;
        let r = s.get(&args.route, &args.event_id).await;
        s.close().await;
        r
    });
    match res {
        Ok(Some(rec)) if args.json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&record_json(&rec)).expect("JSON")
            );
            exit::OK
        }
        Ok(Some(rec)) => {
            if let Value::Object(fields) = record_json(&rec) {
                for (k, v) in fields {
                    let v = match v {
                        Value::Null => "-".to_string(),
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    println!("{k:<20} {v}");
                }
            }
            exit::OK
        }
        Ok(None) => {
            eprintln!(
                "idemgate: no record for route {:?} and event ID {:?}",
                args.route, args.event_id
            );
            exit::NOT_FOUND
        }
        Err(e) => fail(e),
    }
}

fn release(args: ReleaseArgs) -> i32 {
    let res = block_on(async {
        let s = open(&args.store.store).await?;
        let r = s
            .release(&args.route, &args.event_id, args.force, now_ms())
            .await;
        s.close().await;
        r
    });
    match res {
        Ok(ReleaseOutcome::Released { previous }) => {
            println!(
                "released {} on route {} (was {previous}); the next delivery will be forwarded",
                args.event_id, args.route
            );
            exit::OK
        }
        Ok(ReleaseOutcome::NotFound) => {
            eprintln!("idemgate: no record for route {:?} and event ID {:?}", args.route, args.event_id);
            exit::NOT_FOUND
        }
        Ok(ReleaseOutcome::RefusedDelivered) => fail(format!(
            "{} on route {} is delivered: releasing it makes the next delivery reach the consumer again; \
             pass --force if that is what you want",
            args.event_id, args.route
        )),
        Err(e) => fail(e),
    }
}

/// RFC 3339 UTC with milliseconds.
pub fn timestamp(ms: Millis) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// A record as JSON: the SPEC §3 field names; `null` where unset.
pub fn record_json(r: &Record) -> Value {
    let ts = |v: Option<Millis>| v.map(timestamp);
    let mut doc = json!({
        "route": r.route,
        "event_id": r.event_id,
        "body_sha256": r.body_sha256,
        "state": r.state,
        "attempts": r.attempts,
        "lease_until": ts(r.lease_until),
        "last_status": r.last_status,
        "last_error": r.last_error,
        "first_seen_at": timestamp(r.first_seen_at),
        "updated_at": timestamp(r.updated_at),
        "delivered_at": ts(r.delivered_at),
        "expires_at": timestamp(r.expires_at),
    });
    if r.replay_status.is_some() {
        doc["replay_status"] = json!(r.replay_status);
        doc["replay_content_type"] = json!(r.replay_content_type);
        doc["replay_body_bytes"] = json!(r.replay_body_bytes);
    }
    doc
}

fn print_table(records: &[Record]) {
    if records.is_empty() {
        println!("no records");
        return;
    }
    let rows: Vec<[String; 6]> = records
        .iter()
        .map(|r| {
            [
                r.route.clone(),
                r.event_id.clone(),
                r.state.clone(),
                r.attempts.to_string(),
                r.last_status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "-".into()),
                timestamp(r.updated_at),
            ]
        })
        .collect();
    let head = [
        "ROUTE", "EVENT ID", "STATE", "ATTEMPTS", "STATUS", "UPDATED",
    ];
    let mut widths = head.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(&head.map(String::from)));
    for row in &rows {
        println!("{}", line(row));
    }
}
