//! `events reconcile` (SPEC §21): asks the route's consumer now about its
//! ambiguous records (or one) and prints, per record, what it learned.

use super::{exit, ReconcileArgs};
use crate::claim::State;
use crate::config;
use crate::metrics::Metrics;
use crate::reconcile::{Asked, Reconciler};
use crate::store::{self, ClaimStore, ListFilter, StoreError};

/// Records listed per page while walking the route's ambiguous ones.
const PAGE: i64 = 200;

fn fail(e: impl std::fmt::Display) -> i32 {
    eprintln!("idemgate: {e}");
    exit::FAILURE
}

pub fn reconcile(args: ReconcileArgs) -> i32 {
    let cfg = match config::load_file(&args.config.config) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            loaded.config
        }
        Err(errors) => {
            eprintln!("{errors}");
            return exit::FAILURE;
        }
    };
    let Some(route) = cfg.routes.iter().find(|r| r.name == args.route) else {
        return fail(format!("route {} is not in the config", args.route));
    };
    if route.reconcile.is_none() {
        return fail(format!(
            "route {} has no `reconcile`: it does not ask its consumer",
            args.route
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let res = rt.block_on(async {
        let s = store::open(&args.store.store, 2).await?;
        let reconciler =
            Reconciler::new(&cfg.routes, s.clone(), Metrics::new(), cfg.instance.clone());
        let asked = ask_all(&*s, &reconciler, &args).await;
        s.close().await;
        asked
    });
    match res {
        Ok(()) => exit::OK,
        Err(e) => fail(e),
    }
}

/// Asks about the one record named, or every ambiguous record of the
/// route, and prints a line for each.
async fn ask_all(
    s: &dyn ClaimStore,
    reconciler: &Reconciler,
    args: &ReconcileArgs,
) -> Result<(), StoreError> {
    let route = args.route.as_str();
    if let Some(id) = &args.event_id {
        println!("{id}: {}", said(reconciler.ask(route, id).await?));
        return Ok(());
    }
    let mut filter = ListFilter {
        route: Some(route.to_owned()),
        state: Some(State::Ambiguous),
        limit: PAGE,
        ..ListFilter::default()
    };
    let mut n = 0;
    loop {
        let page = s.list(&filter).await?;
        for rec in &page {
            println!(
                "{}: {}",
                rec.event_id,
                said(reconciler.ask(route, &rec.event_id).await?)
            );
            n += 1;
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => filter.after = Some(last.list_key()),
            _ => break,
        }
    }
    println!("{n} ambiguous records of route {route} asked about");
    Ok(())
}

/// What one question came to, in words.
fn said(asked: Asked) -> String {
    match asked {
        Asked::Learned { answer, recorded } => {
            let now = match answer.learned.as_str() {
                "delivered" => "delivered: later deliveries are replayed",
                "failed" => "failed: the next delivery will be forwarded",
                _ => "still ambiguous",
            };
            if recorded {
                format!("{now} ({})", answer.detail)
            } else {
                format!(
                    "{} (the record changed meanwhile: left as it is)",
                    answer.detail
                )
            }
        }
        Asked::NotAmbiguous(state) => format!("{state}, not ambiguous: not asked"),
        Asked::NotFound => "no such record".into(),
        Asked::Busy => "being asked about already".into(),
        Asked::NotConfigured => "the route does not ask its consumer".into(),
    }
}
