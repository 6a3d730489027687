//! The admin listener: `/healthz` (the process runs), `/readyz` (the proxy
//! listener accepts and the store answers), `/metrics` (Prometheus text).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::metrics::Metrics;
use crate::store::ClaimStore;

/// `/readyz` waits no longer than this for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Admin {
    pub store: Arc<dyn ClaimStore>,
    pub metrics: Metrics,
    /// The proxy's listen address: pingora starts the admin service before
    /// the proxy service, so `/readyz` must not say ready until the proxy
    /// listener accepts (a client that trusted it got "connection refused").
    pub proxy_listen: SocketAddr,
    /// Set once a connection to `proxy_listen` succeeded.
    pub proxy_up: AtomicBool,
}

impl Admin {
    async fn proxy_accepts(&self) -> bool {
        if self.proxy_up.load(Ordering::Relaxed) {
            return true;
        }
        let connect = tokio::net::TcpStream::connect(self.proxy_listen);
        let up = matches!(
            tokio::time::timeout(READY_TIMEOUT, connect).await,
            Ok(Ok(_))
        );
        if up {
            self.proxy_up.store(true, Ordering::Relaxed);
        }
        up
    }
}

fn text(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .expect("static response parts are valid")
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let plain = "text/plain; charset=utf-8";
        match session.req_header().uri.path() {
            "/healthz" => text(StatusCode::OK, plain, b"ok\n".to_vec()),
            "/readyz" => {
                if !self.proxy_accepts().await {
                    return text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        plain,
                        b"proxy listener: not accepting yet\n".to_vec(),
                    );
                }
                let t = std::time::Instant::now();
                let ping = tokio::time::timeout(READY_TIMEOUT, self.store.ping()).await;
                self.metrics.store_time("lookup", t.elapsed().as_secs_f64());
                // the body says only that: the store's error text (paths,
                // hosts, driver messages) goes to the log
                let unavailable = || {
                    text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        plain,
                        b"store: not answering\n".to_vec(),
                    )
                };
                match ping {
                    Ok(Ok(())) => text(StatusCode::OK, plain, b"ready\n".to_vec()),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "/readyz: the store does not answer");
                        unavailable()
                    }
                    Err(_) => {
                        tracing::warn!(
                            "/readyz: the store gave no answer within {}",
                            humantime::format_duration(READY_TIMEOUT)
                        );
                        unavailable()
                    }
                }
            }
            "/metrics" => text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics.render(),
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                plain,
                b"not found: try /healthz, /readyz or /metrics\n".to_vec(),
            ),
        }
    }
}
