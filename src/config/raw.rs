//! Step 1: the file exactly as written.
//!
//! Every struct denies unknown fields; choices are typed enums. Fields the
//! user must write are still `Option` here so that a missing one is reported by
//! `validate` together with every other problem instead of stopping serde.
//! Durations, sizes and other texts with their own grammar stay [`Text`] so
//! that a malformed value is a positioned validation error, not a serde abort.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// A scalar kept as text (`30s`, `409`, `2xx`); numbers and booleans are
/// accepted and turned into their text so the validator can explain them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Distinguishes an absent key (`None`) from an explicit `null`
/// (`Some(None)`); used where `null` means "disable".
fn explicit_null<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub listen: Option<Text>,
    pub admin_listen: Option<Text>,
    pub store: Option<RawStore>,
    pub defaults: Option<RawDefaults>,
    pub routes: Option<Vec<RawRoute>>,
    pub shutdown_grace: Option<Text>,
    pub sweeper: Option<RawSweeper>,
    pub threads: Option<u64>,
    pub downstream: Option<RawDownstream>,
    pub tls: Option<RawTls>,
    pub admin: Option<RawAdmin>,
    pub upgrade_sock: Option<String>,
}

impl RawConfig {
    /// True for a file without any key (empty, only comments, `{}`).
    pub fn is_empty(&self) -> bool {
        let RawConfig {
            listen,
            admin_listen,
            store,
            defaults,
            routes,
            shutdown_grace,
            sweeper,
            threads,
            downstream,
            tls,
            admin,
            upgrade_sock,
        } = self;
        listen.is_none()
            && admin_listen.is_none()
            && store.is_none()
            && defaults.is_none()
            && routes.is_none()
            && shutdown_grace.is_none()
            && sweeper.is_none()
            && threads.is_none()
            && downstream.is_none()
            && tls.is_none()
            && admin.is_none()
            && upgrade_sock.is_none()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub url: Option<String>,
    pub max_connections: Option<u64>,
}

/// What one client connection may hold (SPEC §9).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDownstream {
    pub header_timeout: Option<Text>,
    pub body_timeout: Option<Text>,
    pub keepalive_timeout: Option<Text>,
    pub write_timeout: Option<Text>,
    pub max_connections: Option<u64>,
}

/// The listener's certificate and key, as `file:` references.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// `admin:` (SPEC §11): what the admin API's actions need.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// An `env:NAME` or `file:PATH` reference, like a verify secret.
    pub token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSweeper {
    pub interval: Option<Text>,
    pub batch_size: Option<u64>,
}

/// The route fields that `defaults` may also set (everything except a route's
/// identity: name, match, upstream, provider and verify).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    pub strip_prefix: Option<bool>,
    pub event_id: Option<RawEventId>,
    pub digest: Option<RawDigest>,
    pub digest_ignore: Option<Vec<String>>,
    pub guard_methods: Option<Vec<String>>,
    pub unverified_methods: Option<Vec<String>>,
    pub on_missing_id: Option<RawOnMissingId>,
    pub on_store_error: Option<RawOnStoreError>,
    pub in_flight: Option<RawInFlight>,
    pub max_waiters: Option<u64>,
    pub settle_on: Option<Vec<Text>>,
    pub replay_body: Option<bool>,
    pub replay_body_limit: Option<Text>,
    #[serde(default, deserialize_with = "explicit_null")]
    pub idempotency_key_header: Option<Option<String>>,
    pub lease: Option<Text>,
    pub retention: Option<Text>,
    pub max_body: Option<Text>,
    pub upstream_timeout: Option<Text>,
}

/// One route. The shared fields repeat [`RawDefaults`] on purpose: flattening
/// would lose line numbers and break `deny_unknown_fields`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: Option<String>,
    #[serde(rename = "match")]
    pub match_: Option<RawMatch>,
    pub upstream: Option<String>,
    pub provider: Option<RawProvider>,
    pub verify: Option<RawVerifyField>,
    pub strip_prefix: Option<bool>,
    pub event_id: Option<RawEventId>,
    pub digest: Option<RawDigest>,
    pub digest_ignore: Option<Vec<String>>,
    pub guard_methods: Option<Vec<String>>,
    pub unverified_methods: Option<Vec<String>>,
    pub on_missing_id: Option<RawOnMissingId>,
    pub on_store_error: Option<RawOnStoreError>,
    pub in_flight: Option<RawInFlight>,
    pub max_waiters: Option<u64>,
    pub settle_on: Option<Vec<Text>>,
    pub replay_body: Option<bool>,
    pub replay_body_limit: Option<Text>,
    #[serde(default, deserialize_with = "explicit_null")]
    pub idempotency_key_header: Option<Option<String>>,
    pub lease: Option<Text>,
    pub retention: Option<Text>,
    pub max_body: Option<Text>,
    pub upstream_timeout: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub host: Option<String>,
    pub path_prefix: Option<String>,
}

/// Both keys are optional here so that "zero or two sources" is one
/// positioned validation error.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEventId {
    pub header: Option<String>,
    pub json_pointer: Option<String>,
}

/// `verify:` is a block, or `none` to say on purpose that a guarded route
/// checks no signature (which silences `check`'s warning about it).
#[derive(Debug)]
pub enum RawVerifyField {
    None,
    Block(RawVerify),
}

impl<'de> Deserialize<'de> for RawVerifyField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawVerifyField, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawVerifyField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a verify block (scheme, secrets, ...) or `none`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawVerifyField, E> {
                if v == "none" {
                    Ok(RawVerifyField::None)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(v), &self))
                }
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RawVerifyField, A::Error> {
                RawVerify::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawVerifyField::Block)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    pub scheme: Option<RawScheme>,
    pub secrets: Option<Vec<String>>,
    pub tolerance: Option<Text>,
    pub header: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawDigest {
    Raw,
    Json,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawOnMissingId {
    Reject,
    Forward,
    BodyDigest,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawOnStoreError {
    Reject,
    Forward,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RawInFlight {
    Conflict,
    Wait,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawProvider {
    Stripe,
    Github,
    Shopify,
    Slack,
    StandardWebhooks,
    Svix,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawScheme {
    Stripe,
    Github,
    Shopify,
    Slack,
    StandardWebhooks,
    HmacSha256,
}
