//! The admin listener: `/healthz` (the process runs), `/readyz` (the proxy
//! listener accepts and the store answers), `/metrics` (Prometheus text),
//! the JSON admin API under `/api/` and the operator console at `/`
//! (SPEC §11; see [`api`] and [`console`]).

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

pub mod api;
pub mod console;
mod web;

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
    /// `/api/…` and the console.
    pub api: api::Api,
    /// The admin listener is on loopback: the API and the console answer
    /// only a loopback `Host` (see [`web::loopback_host`]).
    pub loopback_only: bool,
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
        if let Some(resp) = self.api_or_console(session).await {
            return resp;
        }
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
                b"not found: try /, /api/routes, /healthz, /readyz or /metrics\n".to_vec(),
            ),
        }
    }
}

impl Admin {
    /// The console's files and `/api/…`; `None` for the other paths.
    async fn api_or_console(&self, session: &mut ServerSession) -> Option<Response<Vec<u8>>> {
        let req = session.req_header();
        let path = req.uri.path();
        let is_api = path == "/api" || path.starts_with("/api/");
        let asset = if is_api { None } else { console::asset(path) };
        if !is_api && asset.is_none() {
            return None;
        }
        if self.loopback_only {
            let host = req
                .headers
                .get(http::header::HOST)
                .map(|h| h.to_str().unwrap_or("\u{fffd}"));
            if host.is_some_and(|h| !web::loopback_host(h)) {
                return Some(
                    web::ApiProblem::new(
                        StatusCode::MISDIRECTED_REQUEST,
                        "misdirected-request",
                        "Not a loopback host name",
                        "the admin listener is on loopback and answers only Host: localhost, \
                         127.0.0.1 or [::1] (a page that points another name here is refused)",
                    )
                    .into_response(),
                );
            }
        }
        if let Some(resp) = asset {
            return Some(resp);
        }
        // An action takes no body: rather than read one, close after answering.
        let has_body = req.headers.contains_key(http::header::TRANSFER_ENCODING)
            || req
                .headers
                .get(http::header::CONTENT_LENGTH)
                .is_some_and(|v| v.as_bytes() != b"0");
        let method = req.method.clone();
        let path = path.to_owned();
        let query = req.uri.query().map(str::to_owned);
        let authorization: Vec<Vec<u8>> = req
            .headers
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect();
        let peer = session
            .client_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        if has_body {
            session.set_keepalive(None);
        }
        let request = api::ApiRequest {
            method: &method,
            path: &path,
            query: query.as_deref(),
            authorization: authorization.iter().map(Vec::as_slice).collect(),
            peer,
        };
        Some(self.api.respond(&request).await)
    }
}
