//! Step 3: the internal model. Only the runtime sees these types; every field
//! is fully resolved (route value > `defaults` value > built-in default), so
//! nothing downstream needs to know about `defaults` or provider presets.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::route_fields::route_fields;
use super::units::{format_duration, format_size};
use crate::claim::json_pointer::JsonPointer;
use crate::claim::Millis;
use crate::source::Ranges;
use crate::store::StoreUrl;
use crate::verify::{headers as verify_headers, HeaderSet};

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener: /metrics, /healthz, /readyz.
    pub admin_listen: SocketAddr,
    /// Where claims are recorded.
    pub store: StoreConfig,
    /// At least one route; order as in the file (matching is by longest prefix).
    pub routes: Vec<Route>,
    /// How long a graceful stop waits for in-flight requests (`shutdown_grace`, default 30s).
    pub shutdown_grace: Duration,
    /// Background deletion of expired records.
    pub sweeper: SweeperConfig,
    /// Worker threads for the proxy; `None` lets the runtime decide.
    pub threads: Option<usize>,
    /// What one client connection may hold (SPEC §9).
    pub downstream: Downstream,
    /// HTTPS on the proxy listener, when configured.
    pub tls: Option<Tls>,
    /// The admin API's and console's settings (SPEC §11).
    pub admin: AdminConfig,
    /// Where a new `serve --upgrade` waits for the listening sockets (SPEC §10).
    pub upgrade_sock: std::path::PathBuf,
    /// This process's name in attempt records (SPEC §13): the config's
    /// `instance`, else the host name and pid.
    pub instance: String,
    /// Peers whose `X-Forwarded-For` names the client (SPEC §22); empty:
    /// the client is always the TCP peer.
    pub trusted_proxies: Arc<Ranges>,
    /// OpenTelemetry (SPEC §19); `None`: no trace is recorded or sent.
    pub telemetry: Option<Telemetry>,
}

/// `telemetry:` (SPEC §19).
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    /// Where spans go; `None`: nothing is recorded (a `trace_url` alone
    /// still links the trace IDs another process recorded).
    pub otlp: Option<Otlp>,
    /// The console's link for a trace ID: `{trace_id}` replaced.
    pub trace_url: Option<String>,
}

/// `telemetry.otlp:`: an OTLP/HTTP (protobuf) collector.
#[derive(Debug, Clone, PartialEq)]
pub struct Otlp {
    pub endpoint: UpstreamUrl,
    /// The endpoint's path with `/v1/traces` appended.
    pub path: String,
    /// Sent with every export (values from secrets, marked sensitive).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The ratio of root traces kept (parent-based below the root).
    pub sample: f64,
    /// The resource's `service.name`.
    pub service_name: String,
}

/// The `downstream` section: the bounds on client connections (SPEC §9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downstream {
    /// A request head must be complete within it, counted from the accept
    /// (first request) or from its first byte on a kept-alive connection.
    pub header_timeout: Duration,
    /// A body idemgate reads must be complete within it (else 408, close).
    pub body_timeout: Duration,
    /// A kept-alive connection idle (no byte of a next request) this long is closed.
    pub keepalive_timeout: Duration,
    /// A response write that makes no progress this long closes the connection.
    pub write_timeout: Duration,
    /// Open client connections at most.
    pub max_connections: usize,
    /// `file:line:col` of `downstream.max_connections` (or of what stands for
    /// it), for the open-files check at start, which is a config error too.
    pub max_connections_at: String,
}

impl Default for Downstream {
    /// SPEC §2's defaults.
    fn default() -> Self {
        Downstream {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            max_connections: 10_000,
            max_connections_at: "(defaults)".to_string(),
        }
    }
}

/// The listener's TLS: the files as given and the server config built from
/// them (parsed, and the key checked against the certificate, at load).
#[derive(Clone)]
pub struct Tls {
    pub cert_path: std::path::PathBuf,
    pub key_path: std::path::PathBuf,
    pub server_config: std::sync::Arc<pingora::tls::ServerConfig>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Tls")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// `admin:`. `Debug` never shows the token.
#[derive(Debug, Clone, Default)]
pub struct AdminConfig {
    /// What `Authorization: Bearer …` must carry for an action; `None`: every
    /// action is refused (403).
    pub token: Option<AdminToken>,
}

/// The admin token's bytes, read from its `env:`/`file:` reference.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub Vec<u8>);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("AdminToken(redacted)")
    }
}

/// The claim store. `Debug` hides the URL's password.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Connection URL with `${VAR}` already expanded (the only key that
    /// expands variables); its scheme names the backend. May hold a
    /// password: print it only as `Display`/`Debug` do, redacted.
    pub url: StoreUrl,
    /// Connection pool size (default 16).
    pub max_connections: u32,
}

/// The sweeper that deletes records past their retention.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// Pause between sweeps (default 60s).
    pub interval: Duration,
    /// Rows deleted per statement, so a sweep never holds a long lock (default 1000).
    pub batch_size: u32,
}

/// A provider's signed handshake, sent without an event ID, that passes
/// unguarded (after its signature is checked) when the body's member at
/// `pointer` is `value`: zoom's `{"event": "endpoint.url_validation"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    pub pointer: &'static str,
    pub value: &'static str,
}

/// Builds [`Route`] from the field list of [`route_fields!`]: the route's
/// identity, then the shared fields with their docs, then provider and verify.
macro_rules! route_struct {
    ($($(#[doc = $doc:literal])* $(#[serde($($serde:tt)*)])?
       $field:ident: $raw:ty => $parsed:ty = $default:expr, parse $parse:ident;)*) => {
        /// One guarded (or pass-through) route, every field resolved and
        /// ready for the runtime.
        #[derive(Debug, Clone)]
        pub struct Route {
            /// Unique; the scope of event IDs in the store.
            pub name: String,
            /// Lowercased host name to match, without port (one with a port is a
            /// config error) or trailing dot; `None` matches any host.
            pub host: Option<String>,
            /// Starts with `/`, no trailing `/` except for `/` itself; matches whole segments.
            pub path_prefix: String,
            /// Where requests go.
            pub upstream: UpstreamUrl,
            $($(#[doc = $doc])* pub $field: $parsed,)*
            /// The provider preset the route named, if any.
            pub provider: Option<Provider>,
            /// The preset's signed handshake that passes unguarded, if it
            /// has one ([`Challenge`]).
            pub challenge: Option<Challenge>,
            /// Signature verification, when configured: the verifier itself.
            pub verify: Option<Verifier>,
            /// How to ask the consumer about an ambiguous outcome (SPEC §21).
            pub reconcile: Option<Reconcile>,
        }
    };
}
route_fields!(route_struct);

/// A duration the claim store counts in milliseconds (a lease, a
/// retention): the value as written, and its count as the store takes it,
/// converted once, at load. Compares equal to the [`Duration`] written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DurationMs {
    duration: Duration,
    ms: Millis,
}

impl DurationMs {
    /// No longer than this reaches the store: longer is the same as
    /// forever, and `now + ms` cannot overflow.
    const FOREVER: Millis = Millis::MAX / 2;

    pub const fn from_secs(secs: u32) -> DurationMs {
        DurationMs {
            duration: Duration::from_secs(secs as u64),
            ms: secs as Millis * 1000,
        }
    }

    /// The store's number.
    pub fn ms(self) -> Millis {
        self.ms
    }

    /// The duration as written.
    pub fn duration(self) -> Duration {
        self.duration
    }
}

impl From<Duration> for DurationMs {
    fn from(duration: Duration) -> DurationMs {
        let ms = Millis::try_from(duration.as_millis()).unwrap_or(Millis::MAX);
        DurationMs {
            duration,
            ms: ms.min(DurationMs::FOREVER),
        }
    }
}

impl From<DurationMs> for Duration {
    fn from(d: DurationMs) -> Duration {
        d.duration
    }
}

impl PartialEq<Duration> for DurationMs {
    fn eq(&self, other: &Duration) -> bool {
        self.duration == *other
    }
}

impl fmt::Debug for DurationMs {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        fmt::Debug::fmt(&self.duration(), f)
    }
}

/// A parsed `http://` or `https://` upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `https://`
    pub tls: bool,
    /// Lowercased host name or IP literal, without brackets (`::1`), ready
    /// for `(host, port).to_socket_addrs()` and SNI.
    pub host: String,
    /// Explicit port, else 80 / 443.
    pub port: u16,
    /// `""` or `/x` (no trailing slash); prepended to the forwarded path.
    pub base_path: String,
    /// The URL as written, for messages.
    pub original: String,
    /// `Host` for a forwarded request whose sender gave none (HTTP/1.0):
    /// the host, with its port unless it is the scheme's default.
    pub host_header: http::HeaderValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventIdSource {
    /// Event ID is this request header's value.
    Header(http::HeaderName),
    /// Event ID is the JSON body value at this RFC 6901 pointer.
    JsonPointer(JsonPointer),
    /// The `svix` preset (SPEC §8): the `svix-id` header, or `webhook-id`
    /// when the request carries the white-labelled `webhook-*` headers. The
    /// header is picked by [`HeaderSet::of`], the rule the standard-webhooks
    /// scheme verifies by, so the event ID is the ID the signature covers.
    /// Only a preset sets it; the config file cannot name it.
    SvixId,
    /// A composite ID (SPEC §17): these parts joined with `:`. A part that
    /// is absent is a missing ID.
    Parts(Vec<IdPart>),
}

/// One part of a composite event ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdPart {
    Header(http::HeaderName),
    JsonPointer(JsonPointer),
}

impl EventIdSource {
    /// The pointer into the JSON body, for a source that reads one.
    pub fn json_pointer(&self) -> Option<&JsonPointer> {
        match self {
            EventIdSource::JsonPointer(p) => Some(p),
            EventIdSource::Header(_) | EventIdSource::SvixId | EventIdSource::Parts(_) => None,
        }
    }

    /// Whether the ID is read from the JSON body (wholly or in part).
    pub fn reads_body(&self) -> bool {
        match self {
            EventIdSource::JsonPointer(_) => true,
            EventIdSource::Parts(parts) => {
                parts.iter().any(|p| matches!(p, IdPart::JsonPointer(_)))
            }
            EventIdSource::Header(_) | EventIdSource::SvixId => false,
        }
    }

    /// The header this request's event ID is read from; `None` for a JSON
    /// pointer.
    pub fn header_for<'a>(&'a self, headers: &http::HeaderMap) -> Option<&'a http::HeaderName> {
        static SVIX_ID: http::HeaderName = http::HeaderName::from_static(verify_headers::SVIX_ID);
        static WEBHOOK_ID: http::HeaderName =
            http::HeaderName::from_static(verify_headers::WEBHOOK_ID);
        match self {
            EventIdSource::Header(h) => Some(h),
            EventIdSource::JsonPointer(_) | EventIdSource::Parts(_) => None,
            EventIdSource::SvixId => Some(match HeaderSet::of(headers) {
                Some(HeaderSet::Webhook) => &WEBHOOK_ID,
                Some(HeaderSet::Svix) | None => &SVIX_ID,
            }),
        }
    }
}

/// Read from the file as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DigestMode {
    /// SHA-256 of the body bytes.
    Raw,
    /// SHA-256 of the RFC 8785 canonical JSON.
    Json,
}

// The guard's policies are the claim protocol's (claim::policy decides by them),
// read from the file as their snake_case names.
pub use crate::claim::policy::{InFlight, OnAmbiguous, OnMissingId, OnStoreError};

/// Statuses that settle a claim as delivered: whole classes and single codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleOn {
    /// Status classes as their first digit (`2` for `2xx`), 1..=5.
    pub classes: Vec<u16>,
    /// Single codes, 100..=599.
    pub codes: Vec<u16>,
}

impl SettleOn {
    /// Parses one item: a class `"1xx"`..`"5xx"` or a code `100`..=`599`.
    pub fn parse_item(&mut self, item: &str) -> Result<(), String> {
        let item = item.trim();
        let bytes = item.as_bytes();
        if bytes.len() == 3
            && bytes[1..].eq_ignore_ascii_case(b"xx")
            && (b'1'..=b'5').contains(&bytes[0])
        {
            let class = u16::from(bytes[0] - b'0');
            if !self.classes.contains(&class) {
                self.classes.push(class);
            }
            return Ok(());
        }
        match item.parse::<u16>() {
            Ok(code) if (100..=599).contains(&code) => {
                if !self.codes.contains(&code) {
                    self.codes.push(code);
                }
                Ok(())
            }
            _ => Err(format!(
                "invalid status `{item}`: expected a class \"1xx\"..\"5xx\" or a code 100..599"
            )),
        }
    }

    /// Builds from items such as `["2xx", "409"]`.
    pub fn parse(items: &[&str]) -> Result<SettleOn, String> {
        let mut s = SettleOn {
            classes: Vec::new(),
            codes: Vec::new(),
        };
        for item in items {
            s.parse_item(item)?;
        }
        Ok(s)
    }

    /// True when `status` settles the claim as delivered.
    pub fn matches(&self, status: u16) -> bool {
        self.codes.contains(&status) || self.classes.contains(&(status / 100))
    }
}

impl Default for SettleOn {
    /// `["2xx"]`.
    fn default() -> SettleOn {
        SettleOn {
            classes: vec![2],
            codes: Vec::new(),
        }
    }
}

impl fmt::Display for SettleOn {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let items: Vec<String> = self
            .classes
            .iter()
            .map(|c| format!("{c}xx"))
            .chain(self.codes.iter().map(u16::to_string))
            .collect();
        write!(f, "[{}]", items.join(","))
    }
}

/// Read from the file as its kebab-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    Stripe,
    Github,
    Shopify,
    Slack,
    StandardWebhooks,
    Svix,
    Paddle,
    Gitlab,
    Typeform,
    Zoom,
}

impl Provider {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Stripe => "stripe",
            Provider::Github => "github",
            Provider::Shopify => "shopify",
            Provider::Slack => "slack",
            Provider::StandardWebhooks => "standard-webhooks",
            Provider::Svix => "svix",
            Provider::Paddle => "paddle",
            Provider::Gitlab => "gitlab",
            Provider::Typeform => "typeform",
            Provider::Zoom => "zoom",
        }
    }
}

/// Signature schemes and the verifier (whose `Debug` never shows a secret)
/// are the verify module's own types: config builds the verifier.
pub use crate::limits::{BreakerCfg, Rate};
pub use crate::verify::{Scheme, Verifier};

impl Route {
    /// What protects the route's consumer (SPEC §15).
    pub fn limits(&self) -> crate::limits::LimitsCfg {
        crate::limits::LimitsCfg {
            concurrency: self.upstream_concurrency,
            rate: self.upstream_rate,
            breaker: self.upstream_breaker,
            wait: self.upstream_wait,
        }
    }

    /// `header x-event-id` or `json_pointer /id`, for `idemgate check`.
    /// Header names print in their canonical lowercase form.
    pub fn event_id_source_text(&self) -> String {
        match &self.event_id {
            EventIdSource::Header(h) => format!("header {h}"),
            EventIdSource::JsonPointer(p) => format!("json_pointer {p}"),
            EventIdSource::SvixId => "header svix-id (webhook-id when white-labelled)".to_string(),
            EventIdSource::Parts(parts) => {
                let parts: Vec<String> = parts
                    .iter()
                    .map(|p| match p {
                        IdPart::Header(h) => format!("header {h}"),
                        IdPart::JsonPointer(p) => format!("json_pointer {p}"),
                    })
                    .collect();
                format!("parts [{}]", parts.join(", "))
            }
        }
    }
}

impl Route {
    /// The route's line, its name padded to `width`: the keys every route
    /// has, then those set (provider, limits, verification).
    fn check_line(&self, width: usize) -> String {
        let event_id = if self.guard_methods.is_empty() {
            "none (pass-through)".to_string()
        } else {
            self.event_id_source_text()
        };
        let mut line = format!(
            "{:width$}  {}{} -> {}  event_id={event_id}  digest={} lease={} retention={} max_body={}",
            self.name,
            self.host.as_deref().unwrap_or(""),
            self.path_prefix,
            self.upstream.original,
            match self.digest {
                DigestMode::Raw => "raw",
                DigestMode::Json => "json",
            },
            format_duration(self.lease),
            format_duration(self.retention),
            format_size(self.max_body),
        );
        self.push_set_keys(&mut line);
        line
    }

    /// The keys a route may leave unset, each only when set.
    fn push_set_keys(&self, line: &mut String) {
        if let Some(p) = self.provider {
            line.push_str(&format!("  provider={}", p.as_str()));
        }
        if let Some(n) = self.upstream_concurrency {
            line.push_str(&format!("  upstream_concurrency={n}"));
        }
        if let Some(rate) = self.upstream_rate {
            line.push_str(&format!("  upstream_rate={rate}"));
        }
        if let Some(w) = self.upstream_wait {
            line.push_str(&format!("  upstream_wait={}", format_duration(w)));
        }
        if let Some(b) = self.upstream_breaker {
            let open = format_duration(b.open);
            line.push_str(&format!("  upstream_breaker={}/{open}", b.failures));
        }
        if let Some(v) = &self.verify {
            line.push_str(&format!(
                "  verify={} ({} secret(s))",
                v.scheme.as_str(),
                v.secrets.len()
            ));
            if !self.unverified_methods.is_empty() {
                let m: Vec<&str> = self
                    .unverified_methods
                    .iter()
                    .map(http::Method::as_str)
                    .collect();
                line.push_str(&format!("  unverified_methods=[{}]", m.join(",")));
            }
        }
    }
}

impl Config {
    /// One line per route for `idemgate check`: name, match, upstream,
    /// event-id source and the main limits. Never includes secrets.
    pub fn describe_routes(&self) -> Vec<String> {
        let width = self.routes.iter().map(|r| r.name.len()).max().unwrap_or(0);
        self.routes.iter().map(|r| r.check_line(width)).collect()
    }
}

/// How a route asks its consumer (SPEC §21), ready for the runtime.
#[derive(Debug, Clone)]
pub struct Reconcile {
    pub ask: Ask,
    /// The consumer's statuses that mean it acted on the event.
    pub done: Vec<u16>,
    /// Those that mean it never did.
    pub not_done: Vec<u16>,
    /// Replayed to later deliveries of an event found done.
    pub delivered_status: u16,
    /// The longest one question may take (connect to answer).
    pub timeout: Duration,
    /// How often the background asks about each ambiguous record.
    pub every: Duration,
}

/// What a question is.
#[derive(Debug, Clone)]
pub enum Ask {
    Url(AskUrl),
    /// A query whose row means done; `$1` is the event ID. The URL may
    /// hold a password: it is never printed.
    Sql {
        url: String,
        query: String,
    },
}

/// A GET to the consumer: the URL split around `{id}`.
#[derive(Clone)]
pub struct AskUrl {
    /// The scheme, host and port (its `base_path` is unused).
    pub target: UpstreamUrl,
    /// The path (and query) before the event ID, starting with `/`.
    pub before: String,
    /// The path (and query) after it.
    pub after: String,
    /// Sent with each question: names and values read from secrets.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl fmt::Debug for AskUrl {
    /// Never the header values: they are secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("AskUrl")
            .field("target", &self.target.original)
            .field("before", &self.before)
            .field("after", &self.after)
            .field("headers", &names)
            .finish()
    }
}

impl AskUrl {
    /// The question's path and query: the event ID percent-encoded, every
    /// byte but RFC 3986's unreserved ones, so that no ID can add a path
    /// segment, a query, a fragment or another host.
    pub fn path_for(&self, event_id: &str) -> String {
        const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'.')
            .remove(b'_')
            .remove(b'~');
        let id = percent_encoding::utf8_percent_encode(event_id, KEEP);
        format!("{}{id}{}", self.before, self.after)
    }
}
