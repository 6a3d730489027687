//! The admin API's actions (SPEC §11, §12, §14), each as its CLI command
//! does it: release one record, resolve an `ambiguous` one, release in
//! bulk, pause or resume a route. The caller has checked the method and the
//! token; here the request's query or JSON body is read, the store acts,
//! and the action is logged at info with the peer (never a body).

use http::{Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use super::web::{json, query_pairs, shown, ApiRequest};
use crate::claim::{now_ms, Millis, State};
use crate::problem::AdminKind;
use crate::problem::Problem;
use crate::store::json::{parse_time, record_json, timestamp};
use crate::store::{BulkRelease, Resolution, ResolveOutcome, ResolveRequest};
use crate::store::{ClaimStore, ReleaseOutcome, ReleaseRequest};

type Answer = Result<Response<Vec<u8>>, Problem>;

/// `POST /api/events/{route}/{event_id}/release[?force=true]`: as `events
/// release`. An `ambiguous` record is released too (SPEC §12: the same as
/// resolving it as failed).
pub async fn release(
    store: &dyn ClaimStore,
    route: &str,
    id: &str,
    req: &ApiRequest<'_>,
) -> Answer {
    let (query, body, peer) = (req.query, req.body, req.peer.as_str());
    let mut force = false;
    for (k, v) in query_pairs(query)? {
        match k.as_str() {
            "force" => force = bool_param("force", &v)?,
            other => {
                return Err(Problem::bad_query(format!(
                    "unknown parameter `{}`: this endpoint takes force",
                    shown(other)
                )))
            }
        }
    }
    no_body(body)?;
    let outcome = store
        .release(&ReleaseRequest {
            route,
            event_id: id,
            force,
            now: now_ms(),
        })
        .await
        .map_err(Problem::store)?;
    match outcome {
        ReleaseOutcome::Released { previous } => {
            tracing::info!(
                route,
                event_id = id,
                previous = previous.as_str(),
                force,
                peer,
                "released by the admin API; the next delivery will be forwarded"
            );
            record_after(store, route, id).await
        }
        ReleaseOutcome::NotFound => Err(Problem::not_found(route, id)),
        ReleaseOutcome::RefusedDelivered => Err(Problem::admin(
            AdminKind::Delivered,
            "the event is delivered: releasing it makes the next delivery reach the \
             consumer again; add ?force=true if that is what you want",
        )
        .with_event_id(Some(id))),
    }
}

/// The body of `…/resolve`: `{"as": "delivered", "status": 200}` or
/// `{"as": "failed"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(rename = "as")]
    how: ResolveAs,
    #[serde(default)]
    status: Option<u16>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum ResolveAs {
    Delivered,
    Failed,
}

const RESOLVE_BODY: &str =
    "{\"as\": \"delivered\", \"status\": 200} or {\"as\": \"failed\"} (status: 100 to 599, 200 if absent)";

/// `POST /api/events/{route}/{event_id}/resolve`: as `events resolve`
/// (SPEC §12). 200 with the record after; 409 for a record that is not
/// `ambiguous`.
pub async fn resolve(
    store: &dyn ClaimStore,
    route: &str,
    id: &str,
    req: &ApiRequest<'_>,
) -> Answer {
    let peer = req.peer.as_str();
    no_params(req.query)?;
    let b: ResolveBody = json_body(req.body, RESOLVE_BODY)?;
    let how = resolution(b)?;
    let outcome = store
        .resolve(&ResolveRequest {
            route,
            event_id: id,
            how,
            now: now_ms(),
        })
        .await
        .map_err(Problem::store)?;
    match outcome {
        ResolveOutcome::Resolved => {
            let (resolved_as, status) = match how {
                Resolution::Delivered { status } => ("delivered", Some(status)),
                Resolution::Failed => ("failed", None),
            };
            tracing::info!(
                route,
                event_id = id,
                resolved_as,
                status,
                peer,
                "ambiguous record resolved by the admin API"
            );
            record_after(store, route, id).await
        }
        ResolveOutcome::NotFound => Err(Problem::not_found(route, id)),
        ResolveOutcome::NotAmbiguous(state) => Err(Problem::admin(
            AdminKind::NotAmbiguous,
            format!(
                "the record is {state}: only an ambiguous record can be resolved \
                 (a failed or processing one is released instead)"
            ),
        )
        .with_event_id(Some(id))),
    }
}

/// The resolution the body asks for: delivered with its status (200 if
/// absent), or failed (with none).
fn resolution(b: ResolveBody) -> Result<Resolution, Problem> {
    match (b.how, b.status) {
        (ResolveAs::Delivered, None) => Ok(Resolution::Delivered { status: 200 }),
        (ResolveAs::Delivered, Some(status)) if (100..=599).contains(&status) => {
            Ok(Resolution::Delivered { status })
        }
        (ResolveAs::Delivered, Some(status)) => Err(Problem::bad_body(format!(
            "status {status}: the status replayed to later deliveries is from 100 to 599"
        ))),
        (ResolveAs::Failed, None) => Ok(Resolution::Failed),
        (ResolveAs::Failed, Some(_)) => Err(Problem::bad_body(
            "status goes with \"as\": \"delivered\" only: a record resolved as failed \
             is forwarded again, not replayed",
        )),
    }
}

/// The body of `POST /api/events/release` (SPEC §14).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    route: String,
    state: String,
    #[serde(default)]
    updated_after: Option<String>,
    #[serde(default)]
    updated_before: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

const BULK_BODY: &str = "{\"route\": R, \"state\": \"failed\" | \"ambiguous\" | \"processing\", \
    \"updated_after\": T, \"updated_before\": T, \"dry_run\": true | false} \
    (times in RFC 3339, UTC; all but route and state optional)";

/// `POST /api/events/release`: as `events release --route R --state S`.
/// `configured(route)` says whether the config has the route (404 if not).
pub async fn release_bulk(
    store: &dyn ClaimStore,
    configured: impl Fn(&str) -> bool,
    query: Option<&str>,
    body: &[u8],
    peer: &str,
) -> Answer {
    no_params(query)?;
    let b: BulkBody = json_body(body, BULK_BODY)?;
    let state = bulk_state(&b.state)?;
    let updated_after = bulk_time("updated_after", &b.updated_after)?;
    let updated_before = bulk_time("updated_before", &b.updated_before)?;
    if !configured(&b.route) {
        return Err(unknown_route(&b.route));
    }
    let req = BulkRelease {
        route: &b.route,
        state,
        updated_after,
        updated_before,
        dry_run: b.dry_run,
        now: now_ms(),
    };
    let n = store.release_bulk(&req).await.map_err(Problem::store)?;
    tracing::info!(
        route = b.route.as_str(),
        state = state.as_str(),
        updated_after = b.updated_after.as_deref(),
        updated_before = b.updated_before.as_deref(),
        dry_run = b.dry_run,
        records = n,
        peer,
        "bulk release by the admin API"
    );
    let doc = if b.dry_run {
        json!({"would_release": n})
    } else {
        json!({"released": n})
    };
    Ok(json(StatusCode::OK, &doc))
}

/// The state to release in bulk: failed, ambiguous or processing, never
/// delivered.
fn bulk_state(state: &str) -> Result<State, Problem> {
    match State::parse(state) {
        Some(State::Delivered) => Err(Problem::bad_body(
            "state delivered: a delivered record is never released in bulk \
             (release it alone, with ?force=true)",
        )),
        Some(s) => Ok(s),
        None => Err(Problem::bad_body(format!(
            "state `{}`: expected failed, ambiguous or processing",
            shown(state)
        ))),
    }
}

/// `updated_after` or `updated_before`, when given: an RFC 3339 time in UTC.
fn bulk_time(name: &str, v: &Option<String>) -> Result<Option<Millis>, Problem> {
    v.as_deref().map(parse_time).transpose().map_err(|_| {
        Problem::bad_body(format!(
            "{name} `{}`: expected an RFC 3339 time in UTC, such as 2026-12-06T10:00:00Z",
            shown(v.as_deref().unwrap_or_default())
        ))
    })
}

/// `POST /api/routes/{name}/pause` and `…/resume` (SPEC §14): the route's
/// state after. The caller has checked that the route is configured.
pub async fn set_paused(
    store: &dyn ClaimStore,
    name: &str,
    paused: bool,
    query: Option<&str>,
    body: &[u8],
    peer: &str,
) -> Answer {
    no_params(query)?;
    no_body(body)?;
    store
        .set_paused(name, paused, now_ms())
        .await
        .map_err(Problem::store)?;
    tracing::info!(
        route = name,
        paused,
        peer,
        "{} by the admin API",
        if paused {
            "route paused"
        } else {
            "route resumed"
        }
    );
    let all = store.paused().await.map_err(Problem::store)?;
    let since = all.iter().find(|(r, _)| r == name).map(|(_, at)| *at);
    Ok(json(
        StatusCode::OK,
        &json!({
            "name": name,
            "paused": since.is_some(),
            "paused_at": since.map(timestamp),
        }),
    ))
}

pub fn unknown_route(name: &str) -> Problem {
    Problem::admin(
        AdminKind::UnknownRoute,
        format!("no route named `{}` is configured", shown(name)),
    )
}

/// The record as it is after an action, as `events show --json` prints it.
pub(super) async fn record_after(store: &dyn ClaimStore, route: &str, id: &str) -> Answer {
    match store.show(route, id).await.map_err(Problem::store)? {
        Some(rec) => Ok(json(StatusCode::OK, &record_json(&rec))),
        // swept in between: there is nothing left to show
        None => Err(Problem::not_found(route, id)),
    }
}

/// The action's JSON document; `shape` says what it takes, for the refusal.
fn json_body<T: DeserializeOwned>(body: &[u8], shape: &str) -> Result<T, Problem> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Problem::bad_body(format!(
            "this action needs a JSON body: {shape}"
        )));
    }
    // serde would take a struct's fields from an array too, by position
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(Problem::bad_body(format!(
            "the body must be a JSON object: {shape}"
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_data() {
            "the JSON is not what this action takes"
        } else {
            "the body is not JSON"
        };
        Problem::bad_body(format!("{what} ({e}); send {shape}"))
    })
}

/// An action that takes nothing in its body: anything there was meant for
/// something else, and is refused rather than ignored.
fn no_body(body: &[u8]) -> Result<(), Problem> {
    if body.is_empty() {
        Ok(())
    } else {
        Err(Problem::bad_body(
            "this action takes no body (its options are query parameters)",
        ))
    }
}

pub fn no_params(query: Option<&str>) -> Result<(), Problem> {
    match query_pairs(query)?.first() {
        None => Ok(()),
        Some((k, _)) => Err(Problem::bad_query(format!(
            "unknown parameter `{}`: this endpoint takes none",
            shown(k)
        ))),
    }
}

pub fn bool_param(name: &str, v: &str) -> Result<bool, Problem> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Problem::bad_query(format!(
            "{name} `{}`: expected true or false",
            shown(v)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_read_strictly() {
        let ok: ResolveBody = json_body(br#"{"as":"delivered","status":202}"#, "x").unwrap();
        assert!(matches!(ok.how, ResolveAs::Delivered) && ok.status == Some(202));
        let ok: ResolveBody = json_body(br#" {"as": "failed"} "#, "x").unwrap();
        assert!(matches!(ok.how, ResolveAs::Failed) && ok.status.is_none());
        for (bad, says) in [
            (&b""[..], "needs a JSON body"),
            (b"  \n", "needs a JSON body"),
            (b"{", "not JSON"),
            (b"{\"as\":\"failed\"} x", "not JSON"),
            (b"as=failed", "a JSON object"),
            (b"\"failed\"", "a JSON object"),
            (br#"{"as":"maybe"}"#, "unknown variant"),
            (br#"{"as":"failed","force":true}"#, "unknown field"),
            (br#"{"as":"failed","as":"delivered"}"#, "duplicate field"),
            (br#"{"status":200}"#, "missing field"),
            (
                br#"{"as":"delivered","status":70000}"#,
                "not what this action takes",
            ),
            (br#"["failed"]"#, "a JSON object"),
        ] {
            let e = json_body::<ResolveBody>(bad, "SHAPE").err().unwrap();
            assert_eq!(
                (e.status(), e.kind),
                (400, crate::problem::ProblemKind::InvalidBody)
            );
            assert!(e.detail.contains(says), "{bad:?}: {}", e.detail);
            if !bad.trim_ascii().is_empty() {
                assert!(e.detail.contains("SHAPE"), "{}", e.detail);
            }
        }
        let b: BulkBody = json_body(br#"{"route":"r","state":"failed"}"#, "x").unwrap();
        assert!(!b.dry_run && b.updated_after.is_none() && b.updated_before.is_none());
        assert!(no_body(b"").is_ok());
        assert_eq!(no_body(b"{}").unwrap_err().status(), 400);
    }
}
