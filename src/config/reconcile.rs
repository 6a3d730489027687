//! `reconcile:` on a route (SPEC §21): how idemgate asks the consumer what
//! it did with an event whose outcome it could not know. A `url` (a GET
//! with the event ID percent-encoded into it, headers from `env:`/`file:`
//! secrets) or a `sql` query against the consumer's own PostgreSQL; which
//! statuses mean done and not done; the status replayed for an event found
//! done; each question's time limit and how often the background asks.

use std::collections::BTreeMap;
use std::time::Duration;

use super::ctx::Ctx;
use super::fields;
use super::model::{Ask, AskUrl, OnAmbiguous, Reconcile};
use super::raw::{RawReconcile, RawReconcileSql, Text};
use super::verify::resolve_secret;

/// The placeholder of the event ID in `reconcile.url`.
const ID_PLACEHOLDER: &str = "{id}";

/// The defaults of SPEC §21.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_EVERY: Duration = Duration::from_secs(30);

/// Parses `reconcile` at `path`; `None` when absent or wrong (recorded).
pub fn reconcile(
    ctx: &mut Ctx,
    path: &str,
    raw: RawReconcile,
    on_ambiguous: OnAmbiguous,
) -> Option<Reconcile> {
    let errors_before = ctx.error_count();
    if on_ambiguous != OnAmbiguous::Hold {
        ctx.at_key(
            path,
            "reconcile needs `on_ambiguous: hold`: under `release` an ambiguous outcome is \
             forwarded again, never held to be asked about",
        );
    }
    let at = |key: &str| format!("{path}.{key}");
    let ask = ask(ctx, path, raw.url, raw.sql, raw.headers);
    let done_empty = raw.done.as_ref().is_some_and(Vec::is_empty);
    let done = status_list(ctx, &at("done"), raw.done, vec![200]);
    let not_done = status_list(ctx, &at("not_done"), raw.not_done, vec![404]);
    if done_empty {
        ctx.at_value(&at("done"), "done needs at least one status (e.g. [200])");
    }
    if let Some(both) = done.iter().find(|s| not_done.contains(s)) {
        ctx.at_value(&at("done"), format!("{both} is in both done and not_done"));
    }
    let delivered_status = match raw.delivered_status {
        None => 200,
        Some(s) => status(ctx, &at("delivered_status"), s).unwrap_or(200),
    };
    let (timeout, every) = timing(ctx, path, raw.timeout.as_ref(), raw.every.as_ref());
    if ctx.error_count() != errors_before {
        return None;
    }
    Some(Reconcile {
        ask: ask?,
        done,
        not_done,
        delivered_status,
        timeout,
        every,
    })
}

/// The question: `url` or `sql`, exactly one; `headers` only beside `url`.
fn ask(
    ctx: &mut Ctx,
    path: &str,
    url: Option<String>,
    sql: Option<RawReconcileSql>,
    headers: Option<BTreeMap<String, String>>,
) -> Option<Ask> {
    match (url, sql) {
        (Some(url), None) => ask_url(ctx, path, &url, headers),
        (None, Some(sql)) => {
            if headers.is_some() {
                ctx.at_key(
                    &format!("{path}.headers"),
                    "headers go with `url`, not with `sql`",
                );
            }
            ask_sql(ctx, &format!("{path}.sql"), sql)
        }
        (Some(_), Some(_)) => {
            ctx.at_key(path, "reconcile takes `url` or `sql`, not both");
            None
        }
        (None, None) => {
            ctx.at_key(
                path,
                "reconcile needs `url` (a GET to the consumer) or `sql` (a query on its database)",
            );
            None
        }
    }
}

/// `timeout` and `every`, defaults filled in: each longer than 0, and a
/// warning when a question may still be waiting as the next one is due.
fn timing(
    ctx: &mut Ctx,
    path: &str,
    timeout: Option<&Text>,
    every: Option<&Text>,
) -> (Duration, Duration) {
    let at = |key: &str| format!("{path}.{key}");
    let timeout = ctx.duration(&at("timeout"), timeout);
    let every = ctx.duration(&at("every"), every);
    let (timeout, every) = (
        timeout.unwrap_or(DEFAULT_TIMEOUT),
        every.unwrap_or(DEFAULT_EVERY),
    );
    for (key, d) in [("timeout", timeout), ("every", every)] {
        if d.is_zero() {
            ctx.at_value(&at(key), format!("{key} must be longer than 0"));
        }
    }
    if every < timeout {
        ctx.warn_value(
            &at("every"),
            "every is shorter than timeout: a question may still wait for its answer when the \
             next one is due",
        );
    }
    (timeout, every)
}

fn status(ctx: &mut Ctx, path: &str, n: u64) -> Option<u16> {
    match u16::try_from(n) {
        Ok(s) if (100..=599).contains(&s) => Some(s),
        _ => {
            ctx.at_value(path, format!("{n} is not an HTTP status (100-599)"));
            None
        }
    }
}

fn status_list(ctx: &mut Ctx, path: &str, raw: Option<Vec<u64>>, default: Vec<u16>) -> Vec<u16> {
    let Some(raw) = raw else {
        return default;
    };
    (raw.into_iter().enumerate())
        .filter_map(|(i, n)| status(ctx, &format!("{path}[{i}]"), n))
        .collect()
}

/// `url` and its `headers`.
fn ask_url(
    ctx: &mut Ctx,
    path: &str,
    url: &str,
    headers: Option<BTreeMap<String, String>>,
) -> Option<Ask> {
    let at_url = format!("{path}.url");
    let headers = ask_headers(ctx, &format!("{path}.headers"), headers.unwrap_or_default());
    let parsed = split_url(url).map_err(|e| ctx.at_value(&at_url, e)).ok()?;
    Some(Ask::Url(AskUrl {
        headers: headers?,
        ..parsed
    }))
}

/// The URL split around its one `{id}`, which must be in the path or the
/// query: the host is never the sender's to choose.
fn split_url(url: &str) -> Result<AskUrl, String> {
    let bad = |why: &str| Err(format!("malformed reconcile URL `{url}`: {why}"));
    let Some((scheme, rest)) = url.trim().split_once("://") else {
        return bad("must start with http:// or https://");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => return bad("the path must hold {id}, e.g. http://127.0.0.1:3000/webhooks/{id}"),
    };
    if path.matches(ID_PLACEHOLDER).count() != 1 || authority.contains(ID_PLACEHOLDER) {
        return bad("{id} must appear once, in the path or the query");
    }
    if path.contains('#') {
        return bad("a fragment is not allowed");
    }
    let target = fields::upstream(&format!("{scheme}://{authority}"))
        .map_err(|e| e.replace("upstream", "reconcile"))?;
    let (before, after) = path.split_once(ID_PLACEHOLDER).unwrap_or((path, ""));
    Ok(AskUrl {
        target,
        before: before.to_owned(),
        after: after.to_owned(),
        headers: Vec::new(),
    })
}

/// Each header's value read from its secret reference.
pub(super) fn ask_headers(
    ctx: &mut Ctx,
    path: &str,
    raw: BTreeMap<String, String>,
) -> Option<Vec<(http::HeaderName, http::HeaderValue)>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut ok = true;
    for (name, reference) in raw {
        let at = format!("{path}.{name}");
        let name = match fields::header_name(&name) {
            Ok(n) => n,
            Err(e) => {
                ctx.at_key(&at, e);
                ok = false;
                continue;
            }
        };
        let value = resolve_secret(&reference, ctx.env)
            .and_then(|bytes| {
                http::HeaderValue::from_bytes(&bytes)
                    .map_err(|_| format!("the value from {reference} is not a valid header value"))
            })
            .map_err(|e| ctx.at_value(&at, e));
        match value {
            Ok(mut v) => {
                v.set_sensitive(true);
                out.push((name, v));
            }
            Err(()) => ok = false,
        }
    }
    ok.then_some(out)
}

/// `sql: {url, query}`.
fn ask_sql(ctx: &mut Ctx, path: &str, raw: RawReconcileSql) -> Option<Ask> {
    let url = match raw.url {
        Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => Some(u),
        Some(_) => {
            ctx.at_value(
                &format!("{path}.url"),
                "reconcile.sql.url must be a postgres:// URL",
            );
            None
        }
        None => {
            ctx.at_key(path, "required field `url` is missing (postgres://…)");
            None
        }
    };
    let query = match raw.query {
        Some(q) if !q.trim().is_empty() => Some(q),
        _ => {
            ctx.at_key(
                path,
                "required field `query` is missing (a row means done; $1 is the event ID)",
            );
            None
        }
    };
    Some(Ask::Sql {
        url: url?,
        query: query?,
    })
}
