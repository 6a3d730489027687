//! `migrate`, `events list|show|release|resolve`, `routes pause|resume|list`
//! and `sweep`: the operator's view of the store.

use serde_json::Value;

use super::{
    exit, EventsCommand, ListArgs, RecordArg, ReleaseArgs, ResolveArgs, ResolveAs, RouteArg,
    RoutesCommand, ShowArgs, StoreArg, SweepArgs,
};
use crate::claim::now_ms;
use crate::claim::State;
use crate::store::json::{parse_time, record_json, timestamp};
use crate::store::{
    self, ClaimStore, ListFilter, Record, ReleaseOutcome, ReleaseRequest, StoreError,
};
use crate::store::{BulkRelease, Resolution, ResolveOutcome, ResolveRequest};

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
        EventsCommand::Release(a) if a.state.is_some() => release_bulk(a),
        EventsCommand::Release(a) => release(a),
        EventsCommand::Resolve(a) => resolve(a),
        // in a file of its own: it needs the config
        EventsCommand::Reconcile(a) => super::reconcile::reconcile(a),
    }
}

fn list(args: ListArgs) -> i32 {
    let state = match args.state.as_deref().map(|s| State::parse(s).ok_or(s)) {
        Some(Err(s)) => {
            return fail(format!(
                "--state {s:?}: expected processing, delivered, failed or ambiguous"
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
        let r = s.show(&rec.route, &rec.event_id).await;
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
                for (k, v) in fields.into_iter().filter(|(k, _)| k != "history") {
                    let v = match v {
                        Value::Null => "-".to_string(),
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    println!("{k:<20} {v}");
                }
            }
            print_history(found.history.as_deref().unwrap_or_default());
            exit::OK
        }
        Ok(None) => not_found(rec),
        Err(e) => fail(e),
    }
}

fn release(args: ReleaseArgs) -> i32 {
    let Some(event_id) = args.event_id.clone() else {
        return fail("an event ID, or --state for a bulk release, is required");
    };
    let rec = RecordArg {
        store: args.store,
        route: args.route,
        event_id,
    };
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
        Ok(ReleaseOutcome::NotFound) => not_found(&rec),
        Ok(ReleaseOutcome::RefusedDelivered) => fail(format!(
            "{} on route {} is delivered: releasing it makes the next delivery reach the consumer again; \
             pass --force if that is what you want",
            rec.event_id, rec.route
        )),
        Err(e) => fail(e),
    }
}

/// `events release --route R --state S [...]` (SPEC §14).
fn release_bulk(args: ReleaseArgs) -> i32 {
    let state = match args.state.as_deref().map(State::parse) {
        Some(Some(s)) if s != State::Delivered => s,
        _ => {
            return fail(
                "--state must be failed, ambiguous or processing (a delivered record is never released in bulk)",
            )
        }
    };
    let after = match args.updated_after.as_deref().map(parse_time).transpose() {
        Ok(t) => t,
        Err(e) => return fail(format!("--updated-after: {e}")),
    };
    let before = match args.updated_before.as_deref().map(parse_time).transpose() {
        Ok(t) => t,
        Err(e) => return fail(format!("--updated-before: {e}")),
    };
    let req = BulkRelease {
        route: &args.route,
        state,
        updated_after: after,
        updated_before: before,
        dry_run: args.dry_run,
        now: now_ms(),
    };
    let res = block_on(async {
        let s = open(&args.store.store).await?;
        let r = s.release_bulk(&req).await;
        s.close().await;
        r
    });
    match res {
        Ok(n) if args.dry_run => {
            println!(
                "{n} {state} records of route {} would be released",
                args.route
            );
            exit::OK
        }
        Ok(n) => {
            println!("{n} {state} records of route {} released", args.route);
            exit::OK
        }
        Err(e) => fail(e),
    }
}

/// `events resolve` (SPEC §12).
fn resolve(args: ResolveArgs) -> i32 {
    let rec = &args.record;
    let how = match (args.resolve_as, args.status) {
        (ResolveAs::Delivered, status) => Resolution::Delivered {
            status: status.unwrap_or(200),
        },
        (ResolveAs::Failed, None) => Resolution::Failed,
        (ResolveAs::Failed, Some(_)) => return fail("--status goes with --as delivered only"),
    };
    let res = block_on(async {
        let s = open(&rec.store.store).await?;
        let r = s
            .resolve(&ResolveRequest {
                route: &rec.route,
                event_id: &rec.event_id,
                how,
                now: now_ms(),
            })
            .await;
        s.close().await;
        r
    });
    match res {
        Ok(ResolveOutcome::Resolved) => {
            match how {
                Resolution::Delivered { status } => println!(
                    "resolved {} on route {} as delivered: later deliveries are replayed with {status}",
                    rec.event_id, rec.route
                ),
                Resolution::Failed => println!(
                    "resolved {} on route {} as failed: the next delivery will be forwarded",
                    rec.event_id, rec.route
                ),
            }
            exit::OK
        }
        Ok(ResolveOutcome::NotFound) => not_found(rec),
        Ok(ResolveOutcome::NotAmbiguous(state)) => fail(format!(
            "{} on route {} is {state}, not ambiguous: only an ambiguous record can be resolved",
            rec.event_id, rec.route
        )),
        Err(e) => fail(e),
    }
}

/// `routes pause|resume|list` (SPEC §14).
pub fn routes(cmd: RoutesCommand) -> i32 {
    let (store_url, change) = match &cmd {
        RoutesCommand::Pause(RouteArg { store, name }) => (&store.store, Some((name, true))),
        RoutesCommand::Resume(RouteArg { store, name }) => (&store.store, Some((name, false))),
        RoutesCommand::List(store) => (&store.store, None),
    };
    if let Some((name, _)) = change {
        if let Err(e) = crate::config::route_name(name) {
            return fail(e);
        }
    }
    let res = block_on(async {
        let s = open(store_url).await?;
        let r = async {
            if let Some((name, paused)) = change {
                s.set_paused(name, paused, now_ms()).await?;
            }
            s.paused().await
        }
        .await;
        s.close().await;
        r
    });
    let paused = match res {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match change {
        Some((name, true)) => println!(
            "route {name} paused: every process on this store refuses what it would forward within 2 s"
        ),
        Some((name, false)) => println!("route {name} resumed"),
        None if paused.is_empty() => println!("no route is paused"),
        None => {
            for (route, since) in &paused {
                println!("{route}  paused since {}", timestamp(*since));
            }
        }
    }
    exit::OK
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

/// A record's attempts as a table (SPEC §13).
fn print_history(history: &[store::Attempt]) {
    if history.is_empty() {
        return;
    }
    println!("\nATTEMPT  STARTED                   STATUS  RESULT        MS       INSTANCE  ERROR");
    for a in history {
        let opt = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{:<7}  {:<24}  {:<6}  {:<12}  {:<7}  {}  {}",
            a.attempt,
            timestamp(a.started_at),
            opt(a.status),
            a.result,
            opt(a.duration_ms),
            a.instance.as_deref().unwrap_or("-"),
            a.error.as_deref().unwrap_or("-"),
        );
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
