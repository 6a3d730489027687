//! The OTLP exporter's HTTP client: a small [`HttpClient`] over pingora's
//! connector, which the tree has already (the consumer's questions use it
//! too), instead of a second HTTP stack (reqwest or hyper). It runs on the
//! exporter's own thread ([`super::export`]), one request at a time, and
//! keeps its connection to the collector between batches.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;

use crate::config::UpstreamUrl;

/// A collector's answer is a small protobuf; more is not read.
const MAX_ANSWER: usize = 64 * 1024;

/// The collector, reached through pingora's connector.
pub struct Collector {
    connector: Connector,
    target: UpstreamUrl,
    /// Connecting, and each read and write.
    timeout: Duration,
}

impl fmt::Debug for Collector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collector")
            .field("endpoint", &self.target.original)
            .finish()
    }
}

impl Collector {
    /// Must be made on the runtime that sends (the connector's pool lives
    /// there).
    pub fn new(target: UpstreamUrl, timeout: Duration) -> Collector {
        Collector {
            connector: Connector::new(None),
            target,
            timeout,
        }
    }

    async fn peer(&self) -> Result<HttpPeer, HttpError> {
        let t = &self.target;
        let addr = tokio::net::lookup_host((t.host.as_str(), t.port))
            .await?
            .next()
            .ok_or("the collector's host name did not resolve")?;
        let mut peer = HttpPeer::new(addr, t.tls, t.host.clone());
        let o = &mut peer.options;
        o.connection_timeout = Some(self.timeout);
        o.total_connection_timeout = Some(self.timeout);
        o.read_timeout = Some(self.timeout);
        o.write_timeout = Some(self.timeout);
        o.idle_timeout = Some(Duration::from_secs(30));
        Ok(peer)
    }
}

#[async_trait::async_trait]
impl HttpClient for Collector {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let peer = self.peer().await?;
        let (parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = RequestHeader::build(parts.method, path.as_bytes(), None)?;
        req.insert_header(http::header::HOST, self.target.host_header.clone())?;
        for (name, value) in &parts.headers {
            req.append_header(name.clone(), value.clone())?;
        }
        req.insert_header(http::header::CONTENT_LENGTH, body.len())?;
        let (mut session, _reused) = self.connector.get_http_session(&peer).await?;
        session.write_request_header(Box::new(req)).await?;
        session.write_request_body(body, true).await?;
        session.finish_request_body().await?;
        session.read_response_header().await?;
        let header = session
            .response_header()
            .ok_or("the collector sent no response header")?
            .clone();
        let mut answer = Vec::new();
        while let Some(chunk) = session.read_response_body().await? {
            if answer.len() + chunk.len() > MAX_ANSWER {
                session.shutdown().await;
                return Err("the collector's answer is over 64 KiB".into());
            }
            answer.extend_from_slice(&chunk);
        }
        // read to its end: kept for the next batch if the collector lets it
        self.connector
            .release_http_session(session, &peer, peer.options.idle_timeout)
            .await;
        let mut response = Response::builder().status(header.status);
        for (name, value) in header.headers.iter() {
            response = response.header(name, value);
        }
        Ok(response.body(Bytes::from(answer))?)
    }
}
