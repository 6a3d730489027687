//! The JSON admin API (SPEC §11) on the admin listener:
//!
//! | request | answer |
//! |---|---|
//! | `GET /api/routes` | every route, its settings, live counters, whether it is paused, its ambiguous records |
//! | `GET /api/events?route&state&prefix&stuck&limit&before` | records, newest first, and a `next` cursor |
//! | `GET /api/events/{route}/{event_id}` | one record with its attempts |
//! | `POST /api/events/{route}/{event_id}/release[?force=true]` | release it |
//! | `POST /api/events/{route}/{event_id}/resolve` | resolve an ambiguous record (JSON body) |
//! | `POST /api/events/{route}/{event_id}/reconcile` | ask the route's consumer about it now (SPEC §21) |
//! | `POST /api/events/release` | release in bulk (JSON body) |
//! | `POST /api/routes/{name}/pause`, `…/resume` | pause or resume a route |
//!
//! Records are the documents of `events … --json` ([`record_json`]). Reads
//! are open; an action ([`super::actions`]) needs `Authorization: Bearer
//! <admin.token>`, compared in constant time (403 when no token is
//! configured, 401 when it is missing or wrong). Every refusal is
//! problem+json.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::{Method, Response, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::actions::{self, bool_param, no_params};
use super::ask;
use super::web::{json, method_not_allowed, query_pairs, segments, shown};
use crate::claim::now_ms;
use crate::claim::State;
use crate::config::{format_duration, Config, EventIdSource, IdPart, OnAmbiguous, Route};
use crate::metrics::Metrics;
use crate::problem::AdminKind;
use crate::problem::Problem;
use crate::reconcile::Reconciler;
use crate::store::json::{record_json, timestamp};
use crate::store::{ClaimStore, ListFilter, ListKey, Record};

/// `limit` when the request names none, and the most it may name.
const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 500;
/// A cursor longer than this was not made here.
const MAX_CURSOR: usize = 1024;

pub use super::web::ApiRequest;

pub struct Api {
    store: Arc<dyn ClaimStore>,
    metrics: Metrics,
    /// Asks a route's consumer (the `reconcile` action).
    reconciler: Reconciler,
    /// Each route's settings as `GET /api/routes` shows them.
    routes: Vec<(String, Value)>,
    /// SHA-256 of `admin.token`: comparing digests takes the same time
    /// whatever the length or content of what was presented.
    token: Option<[u8; 32]>,
    /// `telemetry.trace_url` (SPEC §19): a record's `trace_url` is it with
    /// `{trace_id}` filled in.
    trace_url: Option<String>,
}

impl Api {
    pub fn new(
        config: &Config,
        store: Arc<dyn ClaimStore>,
        metrics: Metrics,
        reconciler: Reconciler,
    ) -> Api {
        Api {
            store,
            metrics,
            reconciler,
            routes: config
                .routes
                .iter()
                .map(|r| (r.name.clone(), route_settings(r)))
                .collect(),
            token: config
                .admin
                .token
                .as_ref()
                .map(|t| Sha256::digest(&t.0).into()),
            trace_url: config.telemetry.as_ref().and_then(|t| t.trace_url.clone()),
        }
    }

    /// A record as the API shows it: `record_json`, and with `trace_url`
    /// the link to its trace.
    fn record(&self, rec: &Record) -> Value {
        let mut doc = record_json(rec);
        if let (Some(url), Some(id)) = (&self.trace_url, &rec.trace_id) {
            doc["trace_url"] = json!(url.replace("{trace_id}", id));
        }
        doc
    }

    /// Answers a request under `/api/`.
    pub async fn respond(&self, req: &ApiRequest<'_>) -> Response<Vec<u8>> {
        match self.route_request(req).await {
            Ok(resp) => resp,
            Err(problem) => problem.into_response(),
        }
    }

    async fn route_request(&self, req: &ApiRequest<'_>) -> Result<Response<Vec<u8>>, Problem> {
        let segs = match segments(req.path, "/api/") {
            Some(s) => s?,
            None => return Err(Problem::no_endpoint(ENDPOINTS)),
        };
        let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
        let get = req.method == Method::GET;
        let named = |route: &str, id: &str| !route.is_empty() && !id.is_empty();
        match segs.as_slice() {
            ["routes"] if get => self.routes(req.query).await,
            ["events"] if get => self.list(req.query).await,
            ["routes"] | ["events"] => Ok(method_not_allowed("GET")),
            ["events", "release"] => {
                self.action(req)?;
                let configured = |r: &str| self.routes.iter().any(|(name, _)| name == r);
                actions::release_bulk(&*self.store, configured, req.query, req.body, &req.peer)
                    .await
            }
            ["events", route, id] if named(route, id) => {
                if !get {
                    return Ok(method_not_allowed("GET"));
                }
                self.show(route, id, req.query).await
            }
            ["events", route, id, "release"] if named(route, id) => {
                self.action(req)?;
                actions::release(&*self.store, route, id, req).await
            }
            ["events", route, id, "resolve"] if named(route, id) => {
                self.action(req)?;
                actions::resolve(&*self.store, route, id, req).await
            }
            ["events", route, id, "reconcile"] if named(route, id) => {
                self.action(req)?;
                ask::reconcile(&*self.store, &self.reconciler, route, id, req).await
            }
            ["routes", name, verb @ ("pause" | "resume")] if !name.is_empty() => {
                self.action(req)?;
                if !self.routes.iter().any(|(n, _)| n == name) {
                    return Err(actions::unknown_route(name));
                }
                let paused = *verb == "pause";
                actions::set_paused(&*self.store, name, paused, req.query, req.body, &req.peer)
                    .await
            }
            _ => Err(Problem::no_endpoint(ENDPOINTS)),
        }
    }

    /// An action is a POST with the token.
    fn action(&self, req: &ApiRequest<'_>) -> Result<(), Problem> {
        if req.method != Method::POST {
            return Err(Problem::method_not_allowed("POST"));
        }
        self.authorize(&req.authorization)
    }

    /// 403 without a configured token, 401 unless exactly one
    /// `Authorization: Bearer <token>` carries it.
    fn authorize(&self, headers: &[&[u8]]) -> Result<(), Problem> {
        let Some(expected) = &self.token else {
            return Err(Problem::admin(
                AdminKind::ActionsDisabled,
                "no admin.token is configured, so every action is refused; \
                 set admin.token (env:NAME or file:PATH) to enable them",
            ));
        };
        let unauthorized = |detail: &str| Problem::admin(AdminKind::Unauthorized, detail);
        let presented = match headers {
            [] => {
                return Err(unauthorized(
                    "this action needs an `Authorization: Bearer <admin.token>` header",
                ))
            }
            [one] => bearer(one).ok_or_else(|| {
                unauthorized("the Authorization header must be `Bearer <admin.token>`")
            })?,
            _ => return Err(unauthorized("send one Authorization header, not several")),
        };
        let digest: [u8; 32] = Sha256::digest(presented).into();
        if bool::from(digest.ct_eq(expected)) {
            Ok(())
        } else {
            Err(unauthorized("the admin token is wrong"))
        }
    }

    async fn routes(&self, query: Option<&str>) -> Result<Response<Vec<u8>>, Problem> {
        no_params(query)?;
        let live = Live::read(&self.metrics);
        let state = RouteStates::read(&*self.store).await;
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|(name, settings)| {
                let mut doc = settings.clone();
                doc["counters"] = live.route(name);
                doc["upstream_state"] = upstream_state(&self.metrics, name);
                state.add_to(name, &mut doc);
                doc
            })
            .collect();
        Ok(json(
            StatusCode::OK,
            &json!({
                "routes": routes,
                "unrouted": live.route(""),
                "store": {"duration_seconds": live.store},
            }),
        ))
    }

    async fn list(&self, query: Option<&str>) -> Result<Response<Vec<u8>>, Problem> {
        let mut filter = list_filter(query)?;
        let limit = filter.limit;
        // one more than asked, to know whether a next page exists
        filter.limit += 1;
        let mut records = self.store.list(&filter).await.map_err(Problem::store)?;
        let next = if records.len() as i64 > limit {
            records.truncate(limit as usize);
            records.last().map(|r| encode_cursor(&r.list_key()))
        } else {
            None
        };
        let events: Vec<Value> = records.iter().map(|r| self.record(r)).collect();
        Ok(json(
            StatusCode::OK,
            &json!({"events": events, "next": next}),
        ))
    }

    async fn show(
        &self,
        route: &str,
        id: &str,
        query: Option<&str>,
    ) -> Result<Response<Vec<u8>>, Problem> {
        no_params(query)?;
        let found = self.store.show(route, id).await.map_err(Problem::store)?;
        match found {
            Some(rec) => Ok(json(StatusCode::OK, &self.record(&rec))),
            None => Err(Problem::not_found(route, id)),
        }
    }
}

const ENDPOINTS: &str = "the admin API has GET /api/routes, GET /api/events, \
    GET /api/events/{route}/{event_id}, POST /api/events/{route}/{event_id}/release, \
    POST /api/events/{route}/{event_id}/resolve, POST /api/events/{route}/{event_id}/reconcile, \
    POST /api/events/release, \
    POST /api/routes/{name}/pause and POST /api/routes/{name}/resume \
    (write a `/` inside an event ID as %2F)";

/// `GET /api/events`'s query as a filter; `stuck=true` lists the
/// processing records whose lease has ended.
fn list_filter(query: Option<&str>) -> Result<ListFilter, Problem> {
    let mut filter = ListFilter {
        limit: DEFAULT_LIMIT,
        ..Default::default()
    };
    let mut stuck = false;
    for (k, v) in query_pairs(query)? {
        match k.as_str() {
            "route" => filter.route = Some(route_param(&v)?),
            "state" => {
                filter.state = Some(State::parse(&v).ok_or_else(|| {
                    Problem::bad_query(format!(
                        "state `{}`: expected processing, delivered, failed or ambiguous",
                        shown(&v)
                    ))
                })?)
            }
            "prefix" if v.is_empty() => {}
            "prefix" if v.len() > crate::claim::event_id::MAX_EVENT_ID_LEN => {
                return Err(Problem::bad_query(
                    "prefix is longer than any event ID can be",
                ))
            }
            "prefix" => filter.id_prefix = Some(v),
            "stuck" => stuck = bool_param("stuck", &v)?,
            "limit" => filter.limit = limit_param(&v)?,
            "before" => filter.after = Some(decode_cursor(&v)?),
            other => {
                return Err(Problem::bad_query(format!(
                    "unknown parameter `{}`: this endpoint takes route, state, prefix, \
                     stuck, limit and before",
                    shown(other)
                )))
            }
        }
    }
    if stuck {
        if filter.state.is_some_and(|s| s != State::Processing) {
            return Err(Problem::bad_query(
                "stuck=true lists processing records; it cannot be combined with another state",
            ));
        }
        filter.lease_ended_by = Some(now_ms());
    }
    Ok(filter)
}

/// `limit`: a whole number from 1 to MAX_LIMIT.
fn limit_param(v: &str) -> Result<i64, Problem> {
    v.parse::<i64>()
        .ok()
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .ok_or_else(|| {
            Problem::bad_query(format!(
                "limit `{}`: expected a whole number from 1 to {MAX_LIMIT}",
                shown(v)
            ))
        })
}

/// A route name has the config's grammar, `[a-z0-9_-]{1,64}`; a route that
/// is no longer configured may still have records.
fn route_param(v: &str) -> Result<String, Problem> {
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(v.to_owned())
    } else {
        Err(Problem::bad_query(format!(
            "route `{}` is not a route name ([a-z0-9_-], 1 to 64)",
            shown(v)
        )))
    }
}

/// The token of `Bearer <token>` (scheme case-insensitive, RFC 7235).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// A page boundary as an opaque text: the key, as JSON, in URL-safe base64.
fn encode_cursor(key: &ListKey) -> String {
    let doc = json!([key.first_seen_at, key.route, key.event_id]);
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&doc).expect("JSON"))
}

fn decode_cursor(text: &str) -> Result<ListKey, Problem> {
    let bad = || {
        Problem::admin(
            AdminKind::InvalidCursor,
            "`before` must be a `next` value from an earlier answer",
        )
    };
    if text.len() > MAX_CURSOR {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| bad())?;
    let (first_seen_at, route, event_id): (i64, String, String) =
        serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if route_param(&route).is_err() || event_id.chars().any(char::is_control) {
        return Err(bad());
    }
    Ok(ListKey {
        first_seen_at,
        route,
        event_id,
    })
}

/// A route's settings for `GET /api/routes`: what it matches, where it goes
/// (scheme, host, port and base path only: never credentials), where its
/// event ID comes from, its provider, lease and retention.
fn route_settings(r: &Route) -> Value {
    let u = &r.upstream;
    let host = if u.host.contains(':') {
        format!("[{}]", u.host)
    } else {
        u.host.clone()
    };
    let scheme = if u.tls { "https" } else { "http" };
    let guarded = !r.guard_methods.is_empty();
    let event_id = match (&r.event_id, guarded) {
        (_, false) => Value::Null,
        (EventIdSource::Header(h), true) => json!({"header": h.as_str()}),
        (EventIdSource::JsonPointer(p), true) => json!({"json_pointer": p}),
        // the svix preset: the header set that was verified names the ID
        (EventIdSource::SvixId, true) => json!({"header": "svix-id", "or_header": "webhook-id"}),
        (EventIdSource::Parts(parts), true) => {
            let parts: Vec<Value> = parts
                .iter()
                .map(|p| match p {
                    IdPart::Header(h) => json!({"header": h.as_str()}),
                    IdPart::JsonPointer(p) => json!({"json_pointer": p.as_str()}),
                })
                .collect();
            json!({ "parts": parts })
        }
    };
    json!({
        "name": r.name,
        "match": {"host": r.host, "path_prefix": r.path_prefix},
        "upstream": format!("{scheme}://{host}:{}{}", u.port, u.base_path),
        "event_id": event_id,
        "guard_methods": r.guard_methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
        "provider": r.provider.map(|p| p.as_str()),
        "verify": r.verify.as_ref().map(|v| v.scheme.as_str()),
        "lease": format_duration(r.lease),
        "retention": format_duration(r.retention),
        "on_ambiguous": match r.on_ambiguous {
            OnAmbiguous::Release => "release",
            OnAmbiguous::Hold => "hold",
        },
        "limits": limits_settings(&r.limits()),
    })
}

/// A route's `upstream_*` limits as the config file writes them (`null`:
/// not set).
fn limits_settings(l: &crate::limits::LimitsCfg) -> Value {
    let rate = l.rate.map(|r| r.to_string());
    let breaker = l
        .breaker
        .map(|b| json!({"failures": b.failures, "open": format_duration(b.open)}));
    let wait = l.wait.map(format_duration);
    json!({"concurrency": l.concurrency, "rate": rate, "wait": wait, "breaker": breaker})
}

/// A route's consumer as this process sees it now (SPEC §15): requests in
/// flight (routes with a limit) and the breaker's state.
fn upstream_state(metrics: &Metrics, route: &str) -> Value {
    let Some((cfg, s)) = metrics.upstream_state(route) else {
        return Value::Null;
    };
    let limited = cfg.concurrency.is_some() || cfg.rate.is_some() || cfg.breaker.is_some();
    json!({
        "in_flight": limited.then_some(s.in_flight),
        "waiting": cfg.wait.is_some().then_some(s.waiting),
        "breaker": s.breaker,
        "breaker_open_seconds": (s.open_secs > 0).then_some(s.open_secs),
    })
}

/// What the store says of the routes: which are paused and since when,
/// and how many ambiguous records each has. A store that does not answer
/// leaves them `null` (the rest of `GET /api/routes` is still worth having
/// while the store is down).
struct RouteStates {
    paused: Option<Vec<(String, i64)>>,
    ambiguous: Option<Vec<(String, i64)>>,
}

impl RouteStates {
    async fn read(store: &dyn ClaimStore) -> RouteStates {
        let (paused, ambiguous) = tokio::join!(store.paused(), store.ambiguous_counts());
        let ok = |r: Result<Vec<(String, i64)>, crate::store::StoreError>| {
            r.map_err(|e| tracing::warn!(error = %e, "admin API: the routes' state is unknown"))
                .ok()
        };
        RouteStates {
            paused: ok(paused),
            ambiguous: ok(ambiguous),
        }
    }

    fn add_to(&self, name: &str, doc: &mut Value) {
        let find = |rows: &[(String, i64)]| rows.iter().find(|(r, _)| r == name).map(|(_, n)| *n);
        match &self.paused {
            Some(rows) => {
                let since = find(rows);
                doc["paused"] = json!(since.is_some());
                doc["paused_at"] = json!(since.map(timestamp));
            }
            None => {
                doc["paused"] = Value::Null;
                doc["paused_at"] = Value::Null;
            }
        }
        doc["ambiguous_records"] = json!(self
            .ambiguous
            .as_deref()
            .map(|rows| find(rows).unwrap_or(0)));
    }
}

/// The live counters, read from the same registry `/metrics` renders.
#[derive(Default)]
struct Live {
    /// route → outcome → count (route `""`: requests no route took).
    requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// route → class → count.
    upstream: BTreeMap<String, BTreeMap<String, u64>>,
    /// route → seconds.
    oldest: BTreeMap<String, f64>,
    /// operation → `{count, sum, buckets: [[le, cumulative count], …]}`.
    store: BTreeMap<String, Value>,
}

impl Live {
    fn read(metrics: &Metrics) -> Live {
        let mut live = Live::default();
        for family in metrics.gather() {
            for m in family.get_metric() {
                let label = |name: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == name)
                        .map(|l| l.value().to_owned())
                        .unwrap_or_default()
                };
                match family.name() {
                    "idemgate_requests_total" => {
                        live.requests
                            .entry(label("route"))
                            .or_default()
                            .insert(label("outcome"), m.get_counter().get_value() as u64);
                    }
                    "idemgate_upstream_responses_total" => {
                        live.upstream
                            .entry(label("route"))
                            .or_default()
                            .insert(label("class"), m.get_counter().get_value() as u64);
                    }
                    "idemgate_processing_oldest_age_seconds" => {
                        live.oldest
                            .insert(label("route"), m.get_gauge().get_value());
                    }
                    "idemgate_store_duration_seconds" => {
                        let h = m.get_histogram();
                        let buckets: Vec<Value> = h
                            .get_bucket()
                            .iter()
                            .map(|b| json!([b.upper_bound(), b.cumulative_count()]))
                            .collect();
                        live.store.insert(
                            label("operation"),
                            json!({
                                "count": h.get_sample_count(),
                                "sum": h.get_sample_sum(),
                                "buckets": buckets,
                            }),
                        );
                    }
                    _ => {}
                }
            }
        }
        live
    }

    fn route(&self, name: &str) -> Value {
        let mut doc = json!({
            "requests": self.requests.get(name).cloned().unwrap_or_default(),
        });
        if !name.is_empty() {
            doc["upstream_responses"] = json!(self.upstream.get(name).cloned().unwrap_or_default());
            doc["processing_oldest_age_seconds"] =
                json!(self.oldest.get(name).copied().unwrap_or(0.0));
        }
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let key = ListKey {
            first_seen_at: 1_700_000_000_123,
            route: "orders".into(),
            event_id: "evt/1?x=<b>&y=\"z\"".into(),
        };
        let c = encode_cursor(&key);
        assert!(c
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(decode_cursor(&c).unwrap(), key);
        for bad in [
            "",
            "!!!",
            "bm90IGpzb24", // "not json"
            &URL_SAFE_NO_PAD.encode(b"[1,\"Bad Route\",\"e\"]"),
            &URL_SAFE_NO_PAD.encode(b"[1,\"r\",\"a\\u0000b\"]"),
            &URL_SAFE_NO_PAD.encode(b"[\"1\",\"r\",\"e\"]"),
            &"A".repeat(MAX_CURSOR + 4),
        ] {
            let e = decode_cursor(bad).unwrap_err();
            assert_eq!(
                (e.status(), e.kind),
                (
                    400,
                    crate::problem::ProblemKind::Admin(AdminKind::InvalidCursor)
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn route_settings_name_the_id_source_and_no_credentials() {
        let text = "listen: \"127.0.0.1:1\"\nadmin_listen: \"127.0.0.1:2\"\n\
            store: {url: \"sqlite:///tmp/x.db\"}\nroutes:\n\
            - {name: s, match: {path_prefix: /s}, upstream: \"https://[::1]:8443/in\", \
               provider: svix, verify: {secrets: [env:WH]}}\n\
            - {name: p, match: {path_prefix: /p}, upstream: \"http://h.example\", guard_methods: []}\n";
        let env = |_: &str| Some("whsec_aGVsbG8=".to_string());
        let config = crate::config::load_str(text, "c.yaml", &env)
            .unwrap()
            .config;
        let s = route_settings(&config.routes[0]);
        assert_eq!(
            s["event_id"],
            json!({"header": "svix-id", "or_header": "webhook-id"})
        );
        assert_eq!(s["provider"], "svix");
        assert_eq!(s["verify"], "standard-webhooks");
        assert_eq!(s["upstream"], "https://[::1]:8443/in");
        let p = route_settings(&config.routes[1]);
        assert_eq!(p["event_id"], Value::Null);
        assert_eq!(p["upstream"], "http://h.example:80");
        assert_eq!(p["guard_methods"], json!([]));
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"BEARER abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Basic YWJj"), None);
        assert_eq!(bearer(b"Bearerabc"), None);
        assert_eq!(bearer(b"abc"), None);
    }
}
