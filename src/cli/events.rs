//! `migrate`, `events list|show|release` and `sweep`: the operator's view of
//! the store.

use serde_json::Value;

use super::{exit, EventsCommand, ListArgs, RecordArg, ReleaseArgs, ShowArgs, StoreArg, SweepArgs};
use crate::claim::now_ms;
use crate::claim::State;
use crate::store::json::{record_json, timestamp};
use crate::store::{
    self, ClaimStore, ListFilter, Record, ReleaseOutcome, ReleaseRequest, StoreError,
};

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
        // paced throughout: a proxy serving from the same store keeps its share
        let pacing = crate::sweeper::Pacing::THROUGHOUT;
        let n =
            crate::sweeper::sweep_all(s.as_ref(), None, now_ms(), args.batch_size, pacing).await?;
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
        ..Default::default()
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
    let rec = &args.record;
    let res = block_on(async {
        let s = open(&rec.store.store).await?;
        let r = s.get(&rec.route, &rec.event_id).await;
        s.close().await;
        r
    });
    match res {
        Ok(Some(found)) if args.json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&record_json(&found)).expect("JSON")
            );
            exit::OK
        }
        Ok(Some(found)) => {
            if let Value::Object(fields) = record_json(&found) {
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
        Ok(None) => not_found(rec),
        Err(e) => fail(e),
    }
}

fn release(args: ReleaseArgs) -> i32 {
    let rec = &args.record;
    let res = block_on(async {
        let s = open(&rec.store.store).await?;
        let r = s
            .release(&ReleaseRequest {
                route: &rec.route,
                event_id: &rec.event_id,
                force: args.force,
                now: now_ms(),
            })
            .await;
        s.close().await;
        r
    });
    match res {
        Ok(ReleaseOutcome::Released { previous }) => {
            println!(
                "released {} on route {} (was {previous}); the next delivery will be forwarded",
                rec.event_id, rec.route
            );
            exit::OK
        }
        Ok(ReleaseOutcome::NotFound) => not_found(rec),
        Ok(ReleaseOutcome::RefusedDelivered) => fail(format!(
            "{} on route {} is delivered: releasing it makes the next delivery reach the consumer again; \
             pass --force if that is what you want",
            rec.event_id, rec.route
        )),
        Err(e) => fail(e),
    }
}

fn not_found(rec: &RecordArg) -> i32 {
    eprintln!(
        "idemgate: no record for route {:?} and event ID {:?}",
        rec.route, rec.event_id
    );
    exit::NOT_FOUND
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
                r.state.to_string(),
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

/// A small runtime for the one-shot commands.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}
