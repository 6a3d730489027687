//! One question to the consumer (SPEC §21) and what its answer means: a
//! GET to the route's `reconcile.url` on pingora's client connector (the
//! proxy's own, with its TLS), or a read-only query on the consumer's
//! PostgreSQL; bounded by `timeout` from the connect to the answer. Nothing
//! of the store is held meanwhile: the caller reads the record before and
//! writes the answer after.

use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::config::{Ask, AskUrl, Reconcile};
use crate::store::Learned;

/// What one question learned, with the words its attempt row keeps (no
/// address, no header value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub learned: Learned,
    /// The consumer's status, when it answered one.
    pub status: Option<u16>,
    pub detail: String,
}

/// How a route asks: its settings, and for `sql` the pool, opened on the
/// first question.
pub struct Asker {
    pub cfg: Reconcile,
    pool: OnceLock<Result<PgPool, String>>,
}

/// At most this many connections to the consumer's database per process.
const SQL_CONNECTIONS: u32 = 2;

impl Asker {
    pub fn new(cfg: Reconcile) -> Asker {
        Asker {
            cfg,
            pool: OnceLock::new(),
        }
    }

    /// Asks about `event_id`; never longer than `timeout`.
    pub async fn ask(&self, connector: &Connector, event_id: &str) -> Answer {
        let timeout = self.cfg.timeout;
        let asked = async {
            match &self.cfg.ask {
                Ask::Url(url) => self.by_url(connector, url, event_id).await,
                Ask::Sql { url, query } => self.by_sql(url, query, event_id).await,
            }
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(answer) => answer,
            Err(_) => unknown(
                None,
                format!(
                    "unknown: no answer within {}",
                    humantime::format_duration(timeout)
                ),
            ),
        }
    }

    /// The GET: its status decides.
    async fn by_url(&self, connector: &Connector, url: &AskUrl, event_id: &str) -> Answer {
        let status = match get(connector, url, event_id, self.cfg.timeout).await {
            Ok(status) => status,
            Err(why) => return unknown(None, format!("unknown: {why}")),
        };
        let said = format!("the consumer answered {status}");
        if self.cfg.done.contains(&status) {
            Answer {
                learned: Learned::Done {
                    status: self.cfg.delivered_status,
                },
                status: Some(status),
                detail: format!("done: {said}"),
            }
        } else if self.cfg.not_done.contains(&status) {
            Answer {
                learned: Learned::NotDone,
                status: Some(status),
                detail: format!("not done: {said}"),
            }
        } else {
            unknown(Some(status), format!("unknown: {said}"))
        }
    }

    /// The query: a row means done, none not done, an error unknown.
    async fn by_sql(&self, url: &str, query: &str, event_id: &str) -> Answer {
        let pool = self.pool.get_or_init(|| open_pool(url, self.cfg.timeout));
        let pool = match pool {
            Ok(pool) => pool,
            Err(why) => return unknown(None, format!("unknown: {why}")),
        };
        let found = sqlx::query(query).bind(event_id).fetch_optional(pool).await;
        match found {
            Ok(Some(_)) => Answer {
                learned: Learned::Done {
                    status: self.cfg.delivered_status,
                },
                status: None,
                detail: "done: the query found a row".into(),
            },
            Ok(None) => Answer {
                learned: Learned::NotDone,
                status: None,
                detail: "not done: the query found no row".into(),
            },
            Err(e) => {
                tracing::warn!(error = %e, "reconcile: the consumer's query failed");
                unknown(None, "unknown: the query failed".into())
            }
        }
    }
}

fn unknown(status: Option<u16>, detail: String) -> Answer {
    Answer {
        learned: Learned::Unknown,
        status,
        detail,
    }
}

/// The consumer's database, lazily: at most [`SQL_CONNECTIONS`], each
/// read-only and with the statement timeout set.
fn open_pool(url: &str, timeout: Duration) -> Result<PgPool, String> {
    let ms = timeout.as_millis().to_string();
    let options = PgConnectOptions::from_str(url)
        .map_err(|_| "the sql URL cannot be read".to_string())?
        .options([
            ("statement_timeout", ms.as_str()),
            ("default_transaction_read_only", "on"),
        ]);
    Ok(PgPoolOptions::new()
        .max_connections(SQL_CONNECTIONS)
        .min_connections(0)
        .acquire_timeout(timeout)
        .connect_lazy_with(options))
}

/// The GET's status, or why there is none (no address in the words).
async fn get(
    connector: &Connector,
    url: &AskUrl,
    event_id: &str,
    timeout: Duration,
) -> Result<u16, &'static str> {
    let target = &url.target;
    let addr = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or("the consumer's host name did not resolve")?;
    let mut peer = HttpPeer::new(addr, target.tls, target.host.clone());
    peer.options.connection_timeout = Some(timeout);
    peer.options.total_connection_timeout = Some(timeout);
    peer.options.read_timeout = Some(timeout);
    peer.options.write_timeout = Some(timeout);
    let (mut session, _) = connector
        .get_http_session(&peer)
        .await
        .map_err(|_| "the consumer could not be reached")?;
    let path = url.path_for(event_id);
    let mut req = RequestHeader::build("GET", path.as_bytes(), None)
        .map_err(|_| "the question could not be written")?;
    let head = || "the question could not be written";
    req.insert_header(http::header::HOST, target.host_header.clone())
        .map_err(|_| head())?;
    for (name, value) in &url.headers {
        req.insert_header(name.clone(), value.clone())
            .map_err(|_| head())?;
    }
    req.insert_header(http::header::CONNECTION, "close")
        .map_err(|_| head())?;
    let lost = |_| "the connection failed before the answer";
    session
        .write_request_header(Box::new(req))
        .await
        .map_err(lost)?;
    session.finish_request_body().await.map_err(lost)?;
    session.read_response_header().await.map_err(lost)?;
    let status = session
        .response_header()
        .map(|h| h.status.as_u16())
        .ok_or("no response header")?;
    session.shutdown().await;
    Ok(status)
}
