//! How a request that idemgate reads whole ends, and the one exit that
//! answers it: the guarded path and the unguarded ones that read the body
//! first come to a [`Verdict`] or stop with a [`Refused`] problem, and
//! [`answer`] counts it, writes it and, for a guarded request, logs it.
//!
//! Counting a request is this file's alone: every count hands back a
//! [`Counted`] proof, which only this file can make, and the hooks keep it
//! in the request's state, so the last hook (`logging`) counts only a
//! request that has none (pingora's streaming path, [`count_streamed`]).

use std::time::Instant;

use bytes::Bytes;
use pingora::proxy::Session;

use super::forward::{self, Answered, UpstreamFailure};
use super::respond;
use super::routes::RouteRt;
use super::shared::Shared;
use crate::metrics::{status_class, CloseReason, Outcome};
use crate::problem::{Problem, ProblemKind};
use crate::store::Recorded;

/// What the sender gets, when it is not a problem.
// Not boxed: an ending is moved once or twice per request, and a box would
// be an allocation on every forwarded one.
#[allow(clippy::large_enum_variant)]
pub enum Verdict {
    /// The recorded answer of a delivered event.
    Replay(Recorded),
    /// The upstream's answer, passed on.
    Relay(Relay),
}

/// An upstream answer to pass on.
pub struct Relay {
    pub answered: Answered,
    /// Body read already (to store it for replay), passed on first.
    pub prefix: Option<Bytes>,
    /// `forwarded`, or `unguarded` for a request forwarded without a claim.
    pub outcome: Outcome,
}

/// A request answered with a problem.
pub struct Refused {
    pub problem: Problem,
    /// The `outcome` label and `Idempotency-Status`: the problem's own, but
    /// `unguarded` for a request forwarded without a claim.
    pub outcome: Outcome,
    /// The connection closes after the answer (the body was not read, or
    /// its stream is unusable).
    pub close: bool,
    /// The upstream had answered: a settle that did not commit.
    pub upstream_status: Option<u16>,
}

impl Refused {
    pub fn new(problem: Problem) -> Refused {
        Refused {
            outcome: problem.kind.outcome(),
            problem,
            close: false,
            upstream_status: None,
        }
    }

    pub fn closing(mut self, close: bool) -> Refused {
        self.close = close;
        self
    }

    /// Counted and marked `unguarded`: the request was (or was to be)
    /// forwarded without a claim.
    pub fn unguarded(mut self) -> Refused {
        self.outcome = Outcome::Unguarded;
        self
    }

    /// A body over `max_body`: 413, and the connection closes (the rest of
    /// the body is not read).
    pub fn too_large(max_body: u64) -> Refused {
        let p = Problem::new(
            ProblemKind::BodyTooLarge,
            format!("the body is larger than {max_body} bytes"),
        );
        Refused::new(p).closing(true)
    }

    /// The upstream gave no answer (502 or 504); the detail names nothing of
    /// it (SPEC §4).
    pub fn upstream_failed(failure: &UpstreamFailure, event_id: Option<&str>) -> Refused {
        let kind = failure.kind();
        Refused::new(Problem::new(kind, forward::failure_detail(kind)).with_event_id(event_id))
    }
}

/// Why the guarded path (or an unguarded one that reads the body) stopped
/// short of a verdict.
pub enum Stop {
    /// With a problem for the sender.
    Refused(Refused),
    /// The downstream session failed: nothing more is written.
    Broken(Box<pingora::Error>),
}

impl From<Refused> for Stop {
    fn from(r: Refused) -> Stop {
        Stop::Refused(r)
    }
}

impl From<Box<pingora::Error>> for Stop {
    fn from(e: Box<pingora::Error>) -> Stop {
        Stop::Broken(e)
    }
}

pub type Ending = Result<Verdict, Stop>;

/// What an ending comes to for the log line: its outcome and the
/// upstream's status, if it answered.
fn summary(ending: &Ending) -> (Outcome, Option<u16>) {
    match ending {
        Ok(Verdict::Replay(recorded)) => (Outcome::Replayed, recorded.status),
        Ok(Verdict::Relay(r)) => (r.outcome, Some(r.answered.header.status.as_u16())),
        Err(Stop::Refused(r)) => (r.outcome, r.upstream_status),
        // the connection broke before an answer: as it was headed
        Err(Stop::Broken(_)) => (Outcome::Forwarded, None),
    }
}

/// How a request handled here ends for pingora: its response was written
/// (or the connection is gone).
pub type Handled = pingora::Result<bool>;

/// Proof that a request's count is settled: it was counted once, or its
/// connection broke on idemgate's own path before any answer (not
/// counted, as before), with the outcome it was counted as. Only this
/// file makes one.
pub struct Counted(Option<Outcome>);

impl Counted {
    /// The outcome the request was counted as; `None` for a connection
    /// that broke before any answer.
    pub fn outcome(&self) -> Option<Outcome> {
        self.0
    }
}

/// A request answered on idemgate's own path: for pingora, and the proof
/// that it was counted.
pub struct Exit {
    pub counted: Counted,
    pub handled: Handled,
}

/// What the one log line of a guarded request tells besides its ending.
pub struct LogLine<'a> {
    pub started: Instant,
    /// Once known: the header's or the body's, or the digest.
    pub event_id: Option<&'a str>,
    /// Once claimed.
    pub attempt: Option<i64>,
    /// The client address (SPEC §22): the peer, or behind a trusted proxy
    /// the one it names; `None`: unknown.
    pub client: Option<std::net::IpAddr>,
    /// While tracing is on: the request's trace, whose ID the line carries.
    pub trace: Option<&'a crate::otel::RequestTrace>,
}

/// The one exit of a request read whole on `route`: counts it (before the
/// answer goes out, so a sender that reads `/metrics` right after finds
/// it), then writes the replay, the upstream's answer or the problem; with
/// `log` (guarded requests), writes its one info line.
pub async fn answer(
    shared: &Shared,
    session: &mut Session,
    route: &RouteRt,
    ending: Ending,
    log: Option<LogLine<'_>>,
) -> Exit {
    let (outcome, upstream_status) = summary(&ending);
    let without_store = outcome == Outcome::StoreUnavailable;
    if without_store {
        // thousands a second during an outage: a summary line a second,
        // noted before the answer goes out, as the counts are
        crate::telemetry::outage::note(outcome.as_str());
    }
    let exit = write(shared, session, route, ending).await;
    if let (false, Some(line)) = (without_store, log) {
        let trace_id = line.trace.map(crate::otel::RequestTrace::trace_id);
        tracing::info!(
            route = route.name(),
            event_id = line.event_id.unwrap_or(""),
            outcome = outcome.as_str(),
            upstream_status = upstream_status.map(i64::from).unwrap_or(0),
            attempt = line.attempt.unwrap_or(0),
            client = %crate::source::Shown(line.client),
            trace_id = trace_id.as_deref(),
            // to the microsecond: `0.013`, not `0.013316999999999999`
            duration_ms = line.started.elapsed().as_micros() as f64 / 1000.0,
            "guarded request"
        );
    }
    exit
}

async fn write(shared: &Shared, session: &mut Session, route: &RouteRt, ending: Ending) -> Exit {
    let (counted, handled) = match ending {
        Ok(Verdict::Replay(recorded)) => {
            let counted = count(shared, Some(route), Outcome::Replayed);
            (counted, respond::replay(session, &recorded).await)
        }
        Ok(Verdict::Relay(relay)) => {
            let counted = count(shared, Some(route), relay.outcome);
            // Boxed: streaming the answer is most of this future's size
            // (the connection's reuse with it), and inline it would make
            // every request's future that large, replays and refusals too.
            let upstream = forward::Upstream::of(shared, route);
            let outcome = relay.outcome.as_str();
            let relayed = upstream.relay(session, relay.answered, relay.prefix, outcome);
            (counted, Box::pin(relayed).await)
        }
        Err(Stop::Refused(refused)) => return refuse(shared, session, Some(route), refused).await,
        Err(Stop::Broken(e)) => (Counted(None), Err(e)),
    };
    Exit {
        counted,
        handled: handled.map(|()| true),
    }
}

/// Counts and writes a problem; `route` is `None` for a request that
/// reached no route (counted with `route=""`).
pub async fn refuse(
    shared: &Shared,
    session: &mut Session,
    route: Option<&RouteRt>,
    r: Refused,
) -> Exit {
    let counted = count(shared, route, r.outcome);
    if r.problem.kind == ProblemKind::BodyTimeout {
        // a 408 closes its connection
        shared.metrics.connection_closed(CloseReason::BodyTimeout);
    }
    let written = respond::problem(session, &r.problem, r.outcome.as_str(), r.close).await;
    Exit {
        counted,
        handled: written.map(|()| true),
    }
}

fn count(shared: &Shared, route: Option<&RouteRt>, outcome: Outcome) -> Counted {
    match route {
        Some(route) => shared
            .metrics
            .route_request(&route.requests, route.name(), outcome),
        None => shared.metrics.request("", outcome),
    }
    Counted(Some(outcome))
}

/// Counts an unguarded request on pingora's streaming path once, as soon
/// as its outcome is known and before its answer goes out: a sender that
/// reads `/metrics` right after its answer finds it counted. `status` is
/// the upstream's answer; else `failure` says what broke, if anything did.
/// `upstream_started`: when it went upstream, for the upstream's time.
pub fn count_streamed(
    shared: &Shared,
    route: &RouteRt,
    upstream_started: Option<Instant>,
    status: Option<u16>,
    failure: Option<&pingora::Error>,
) -> Counted {
    use pingora::{ErrorSource, ErrorType};
    let counted = count(shared, Some(route), Outcome::Unguarded);
    let (name, metrics) = (route.name(), &shared.metrics);
    let class = match (status, failure) {
        (Some(s), _) => status_class(s),
        // the sender's side failed: no upstream outcome to count
        (None, Some(e)) if e.esource() == &ErrorSource::Downstream => return counted,
        (None, Some(e))
            if matches!(
                e.etype(),
                ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout
            ) =>
        {
            "timeout"
        }
        (None, Some(_)) => "connect_error",
        (None, None) => return counted,
    };
    metrics.upstream_outcome(name, class);
    if let Some(t) = upstream_started {
        metrics.upstream_time(name, t.elapsed());
    }
    counted
}
