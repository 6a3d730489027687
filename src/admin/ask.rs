//! `POST /api/events/{route}/{event_id}/reconcile` (SPEC §21): asks the
//! route's consumer now about one ambiguous record, as `events reconcile`
//! does, and answers the record as it then is, with what was learned. The
//! caller has checked the method and the token.

use http::{Response, StatusCode};
use serde_json::json;

use super::actions::no_params;
use super::web::{json, ApiRequest};
use crate::problem::{AdminKind, Problem};
use crate::reconcile::{Answer, Asked, Reconciler};
use crate::store::json::record_json;
use crate::store::ClaimStore;

/// 200 with the record and `asked: {learned, detail, recorded}`; 409 for
/// a record that is not ambiguous, or one being asked about already; 404
/// for none, or a route that does not ask its consumer.
pub async fn reconcile(
    store: &dyn ClaimStore,
    reconciler: &Reconciler,
    route: &str,
    id: &str,
    req: &ApiRequest<'_>,
) -> Result<Response<Vec<u8>>, Problem> {
    no_params(req.query)?;
    let asked = reconciler.ask(route, id).await.map_err(Problem::store)?;
    let (answer, recorded) = learned(asked, route, id)?;
    tracing::info!(
        route,
        event_id = id,
        learned = answer.learned.as_str(),
        peer = req.peer.as_str(),
        "the consumer asked by the admin API"
    );
    let Some(rec) = store.show(route, id).await.map_err(Problem::store)? else {
        return Err(Problem::not_found(route, id));
    };
    let mut doc = record_json(&rec);
    doc["asked"] = json!({
        "learned": answer.learned.as_str(),
        "detail": answer.detail,
        "status": answer.status,
        "recorded": recorded,
    });
    Ok(json(StatusCode::OK, &doc))
}

/// What was learned, and whether it was recorded; the problem when nothing
/// was asked.
fn learned(asked: Asked, route: &str, id: &str) -> Result<(Answer, bool), Problem> {
    match asked {
        Asked::Learned { answer, recorded } => Ok((answer, recorded)),
        Asked::NotFound => Err(Problem::not_found(route, id)),
        Asked::NotConfigured => Err(Problem::admin(
            AdminKind::NoEndpoint,
            format!("route {route} has no `reconcile`: it does not ask its consumer"),
        )),
        Asked::NotAmbiguous(state) => Err(Problem::admin(
            AdminKind::NotAmbiguous,
            format!("the record is {state}: only an ambiguous record is asked about"),
        )
        .with_event_id(Some(id))),
        Asked::Busy => Err(Problem::admin(
            AdminKind::NotAmbiguous,
            "a question about this record is in flight: try again in a moment",
        )
        .with_event_id(Some(id))),
    }
}
