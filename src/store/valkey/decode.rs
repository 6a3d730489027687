//! The scripts' and reads' answers as the store's types.

use std::collections::HashMap;

use redis::Value;

use crate::claim::Millis;
use crate::store::sql::Readback;
use crate::store::{state_of, Attempt, Record, ReleaseOutcome, StoreError, TraceRef};

/// The fields a refused claim or a peek reads, in [`readback`]'s order.
pub(super) const READBACK_FIELDS: [&str; 9] = [
    "state",
    "lease_until",
    "body_sha256",
    "last_status",
    "replay_status",
    "replay_content_type",
    "replay_body",
    "replay_headers",
    // SPEC §19: the latest send, written by every winning claim (a field
    // the release before's scripts neither write nor read)
    "send_trace",
];

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("valkey: {what}"))
}

fn bytes(v: Value) -> Result<Option<Vec<u8>>, StoreError> {
    match v {
        Value::Nil => Ok(None),
        other => redis::from_redis_value(other).map(Some).map_err(corrupt),
    }
}

fn text(v: Value) -> Result<Option<String>, StoreError> {
    bytes(v)?
        .map(|b| String::from_utf8(b).map_err(corrupt))
        .transpose()
}

fn int(v: Value) -> Result<Option<i64>, StoreError> {
    text(v)?
        .map(|t| t.parse::<i64>().map_err(|e| corrupt(format!("{t:?}: {e}"))))
        .transpose()
}

fn array(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(corrupt(format!("expected an array, got {other:?}"))),
    }
}

/// [`READBACK_FIELDS`] read back; `None` when the record does not exist.
fn readback_of(values: Vec<Value>) -> Result<Option<Readback>, StoreError> {
    let mut it = values.into_iter();
    let mut next = || it.next().unwrap_or(Value::Nil);
    let Some(state) = text(next())? else {
        return Ok(None);
    };
    Ok(Some(Readback {
        state: state_of(&state)?,
        lease_until: int(next())?,
        body_sha256: text(next())?.unwrap_or_default(),
        last_status: int(next())?,
        replay_status: int(next())?,
        replay_content_type: text(next())?,
        replay_body: bytes(next())?,
        replay_headers: text(next())?,
        send_trace: text(next())?,
    }))
}

/// A peek's `HMGET` of [`READBACK_FIELDS`].
pub(super) fn readback(v: Value) -> Result<Option<Readback>, StoreError> {
    readback_of(array(v)?)
}

/// What the claim script did.
pub(super) enum Claimed {
    /// `from`: the state a reclaim took over; `replaced`: the send it
    /// replaced (SPEC §19; none for a new record).
    Won {
        attempt: i64,
        from: Option<String>,
        replaced: Option<String>,
    },
    /// The record turned `ambiguous`; `trace` is its latest send.
    Held {
        trace: Option<String>,
    },
    Existing(Readback),
}

pub(super) fn claim(v: Value) -> Result<Claimed, StoreError> {
    let mut items = array(v)?.into_iter();
    let tag = text(items.next().unwrap_or(Value::Nil))?.unwrap_or_default();
    match tag.as_str() {
        "claimed" => {
            let attempt = match items.next() {
                Some(Value::Int(n)) => n,
                other => return Err(corrupt(format!("claim attempt {other:?}"))),
            };
            let from = text(items.next().unwrap_or(Value::Nil))?;
            let replaced = text(items.next().unwrap_or(Value::Nil))?;
            Ok(Claimed::Won {
                attempt,
                from,
                replaced,
            })
        }
        "held" => Ok(Claimed::Held {
            trace: text(items.next().unwrap_or(Value::Nil))?,
        }),
        "existing" => readback_of(items.collect())?
            .map(Claimed::Existing)
            .ok_or_else(|| corrupt("a refused claim without its record")),
        other => Err(corrupt(format!("claim answered {other:?}"))),
    }
}

/// A record's `HGETALL` as a [`Record`] (no history); `None` when empty.
pub(super) fn record(route: &str, event_id: &str, v: Value) -> Result<Option<Record>, StoreError> {
    let f: HashMap<String, Vec<u8>> = redis::from_redis_value(v).map_err(corrupt)?;
    if f.is_empty() {
        return Ok(None);
    }
    let text = |name: &str| -> Result<Option<String>, StoreError> {
        f.get(name)
            .map(|b| String::from_utf8(b.clone()).map_err(corrupt))
            .transpose()
    };
    let int = |name: &str| -> Result<Option<i64>, StoreError> {
        text(name)?
            .map(|t| {
                t.parse::<i64>()
                    .map_err(|e| corrupt(format!("{name} {t:?}: {e}")))
            })
            .transpose()
    };
    let need = |name: &str| int(name)?.ok_or_else(|| corrupt(format!("{name} missing")));
    let state = text("state")?.ok_or_else(|| corrupt("state missing"))?;
    let send = TraceRef::from_column(text("send_trace")?.as_deref());
    let (trace_id, span_id) = TraceRef::record_ids(send);
    Ok(Some(Record {
        route: route.to_string(),
        event_id: event_id.to_string(),
        body_sha256: text("body_sha256")?.unwrap_or_default(),
        state: state_of(&state)?,
        attempts: need("attempts")?,
        lease_until: int("lease_until")?,
        last_status: int("last_status")?,
        last_error: text("last_error")?,
        first_seen_at: need("first_seen_at")?,
        updated_at: need("updated_at")?,
        delivered_at: int("delivered_at")?,
        expires_at: need("expires_at")?,
        replay_status: int("replay_status")?,
        replay_content_type: text("replay_content_type")?,
        replay_body_bytes: f.get("replay_body").map(|b| b.len() as i64),
        trace_id,
        span_id,
        history: None,
    }))
}

/// One attempt's row as the scripts write it (JSON, numbers as text): the
/// attempts hash's values, and the questions' rows (`questions.rs`, which
/// add the attempt's number).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct AttemptRow {
    pub(super) started_at: String,
    pub(super) ended_at: Option<String>,
    pub(super) status: Option<String>,
    pub(super) result: String,
    pub(super) error: Option<String>,
    pub(super) duration_ms: Option<String>,
    pub(super) instance: Option<String>,
}

impl AttemptRow {
    /// The attempt this row records, numbered `number` (its text).
    pub(super) fn into_attempt(self, number: &str) -> Result<Attempt, StoreError> {
        Ok(Attempt {
            attempt: number
                .parse()
                .map_err(|e| corrupt(format!("attempt {number:?}: {e}")))?,
            started_at: millis(Some(&self.started_at))?.unwrap_or_default(),
            ended_at: millis(self.ended_at.as_deref())?,
            status: millis(self.status.as_deref())?,
            result: self.result,
            error: self.error,
            duration_ms: millis(self.duration_ms.as_deref())?,
            instance: self.instance,
        })
    }
}

fn millis(t: Option<&str>) -> Result<Option<Millis>, StoreError> {
    t.map(|t| t.parse().map_err(|e| corrupt(format!("{t:?}: {e}"))))
        .transpose()
}

/// The attempts hash, oldest first.
pub(super) fn attempts(v: Value) -> Result<Vec<Attempt>, StoreError> {
    let rows: HashMap<String, String> = redis::from_redis_value(v).map_err(corrupt)?;
    let mut out = Vec::with_capacity(rows.len());
    for (n, json) in rows {
        let row: AttemptRow = serde_json::from_str(&json).map_err(corrupt)?;
        out.push(row.into_attempt(&n)?);
    }
    out.sort_by_key(|a| a.attempt);
    Ok(out)
}

/// A list script's flat answer: event ID, then its fields, for each.
pub(super) fn list_page(v: Value) -> Result<Vec<(String, Value)>, StoreError> {
    let mut out = Vec::new();
    let mut items = array(v)?.into_iter();
    while let (Some(id), Some(fields)) = (items.next(), items.next()) {
        out.push((text(id)?.unwrap_or_default(), fields));
    }
    Ok(out)
}

/// The release script's answer.
pub(super) fn release(v: Value) -> Result<ReleaseOutcome, StoreError> {
    let mut items = array(v)?.into_iter();
    let tag = text(items.next().unwrap_or(Value::Nil))?.unwrap_or_default();
    match tag.as_str() {
        "released" => {
            let previous = text(items.next().unwrap_or(Value::Nil))?.unwrap_or_default();
            Ok(ReleaseOutcome::Released {
                previous: state_of(&previous)?,
            })
        }
        "not_found" => Ok(ReleaseOutcome::NotFound),
        "refused" => Ok(ReleaseOutcome::RefusedDelivered),
        other => Err(corrupt(format!("release answered {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// The claim script's answers carry the sends (SPEC §19): the one a
    /// reclaim replaced, a held record's, a refused claim's record's.
    #[test]
    fn claim_answers_carry_the_sends() {
        let sent = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7";
        let won = claim(Value::Array(vec![
            bulk("claimed"),
            Value::Int(2),
            bulk("failed"),
            bulk(sent),
        ]))
        .unwrap();
        assert!(
            matches!(won, Claimed::Won { attempt: 2, ref from, ref replaced }
                if from.as_deref() == Some("failed") && replaced.as_deref() == Some(sent))
        );
        // a new record: no state taken over, no send replaced
        let new = claim(Value::Array(vec![bulk("claimed"), Value::Int(1)])).unwrap();
        assert!(matches!(
            new,
            Claimed::Won {
                attempt: 1,
                from: None,
                replaced: None
            }
        ));
        let held = claim(Value::Array(vec![bulk("held"), bulk(sent)])).unwrap();
        assert!(matches!(held, Claimed::Held { trace: Some(ref t) } if t == sent));
        let held = claim(Value::Array(vec![bulk("held"), Value::Nil])).unwrap();
        assert!(matches!(held, Claimed::Held { trace: None }));
        let mut fields = vec![bulk("delivered"), Value::Nil, bulk("d"), bulk("200")];
        fields.extend([Value::Nil, Value::Nil, Value::Nil, Value::Nil]);
        fields.push(bulk(sent));
        let mut answer = vec![bulk("existing")];
        answer.extend(fields.clone());
        let Claimed::Existing(rb) = claim(Value::Array(answer)).unwrap() else {
            panic!("existing");
        };
        assert_eq!(rb.send_trace.as_deref(), Some(sent));
        assert_eq!(
            readback(Value::Array(fields))
                .unwrap()
                .unwrap()
                .send_trace
                .as_deref(),
            Some(sent)
        );
    }
}
