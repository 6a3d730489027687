//! The OTLP/HTTP client: one `POST` of a protobuf body over pingora's
//! connector, which the tree has already (the consumer's questions use it
//! too), instead of a second HTTP stack (reqwest or hyper). It runs on the
//! export thread ([`super::export`]), one request at a time, and keeps its
//! connection to the collector between batches.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
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

    async fn peer(&self) -> Result<HttpPeer, String> {
        let t = &self.target;
        let addr = tokio::net::lookup_host((t.host.as_str(), t.port))
            .await
            .map_err(|e| format!("the collector's host name did not resolve: {e}"))?
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

    /// `POST`s `body` (an OTLP protobuf export request) to `path` with
    /// `headers`; `Ok` once the collector answered 2xx.
    pub async fn post(
        &self,
        path: &str,
        headers: &[(http::HeaderName, http::HeaderValue)],
        body: Vec<u8>,
    ) -> Result<(), String> {
        let peer = self.peer().await?;
        let e = |e: Box<pingora::Error>| e.to_string();
        let mut req = RequestHeader::build(http::Method::POST, path.as_bytes(), None).map_err(e)?;
        req.insert_header(http::header::HOST, self.target.host_header.clone())
            .map_err(e)?;
        req.insert_header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .map_err(e)?;
        for (name, value) in headers {
            req.append_header(name.clone(), value.clone()).map_err(e)?;
        }
        req.insert_header(http::header::CONTENT_LENGTH, body.len())
            .map_err(e)?;
        let (mut session, _reused) = self.connector.get_http_session(&peer).await.map_err(e)?;
        session
            .write_request_header(Box::new(req))
            .await
            .map_err(e)?;
        session
            .write_request_body(Bytes::from(body), true)
            .await
            .map_err(e)?;
        session.finish_request_body().await.map_err(e)?;
        session.read_response_header().await.map_err(e)?;
        let status = session
            .response_header()
            .ok_or("the collector sent no response header")?
            .status;
        let mut read = 0;
        while let Some(chunk) = session.read_response_body().await.map_err(e)? {
            read += chunk.len();
            if read > MAX_ANSWER {
                session.shutdown().await;
                return Err("the collector's answer is over 64 KiB".into());
            }
        }
        // read to its end: kept for the next batch if the collector lets it
        self.connector
            .release_http_session(session, &peer, peer.options.idle_timeout)
            .await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {status}"))
        }
    }
}
