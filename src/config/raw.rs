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

use super::model::{
    DigestMode, InFlight, OnAmbiguous, OnMissingId, OnStoreError, Provider, Scheme,
};
use super::route_fields::route_fields;

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
    pub instance: Option<String>,
    /// SPEC §22: peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Option<Vec<String>>,
    /// SPEC §19: OpenTelemetry traces.
    pub telemetry: Option<RawTelemetry>,
}

/// `telemetry:` as written (SPEC §19).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    pub otlp: Option<RawOtlp>,
    pub trace_url: Option<String>,
}

/// `telemetry.otlp:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlp {
    pub endpoint: Option<String>,
    pub headers: Option<std::collections::BTreeMap<String, String>>,
    pub sample: Option<f64>,
    pub service_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub url: Option<String>,
    pub max_connections: Option<u64>,
    /// Valkey / Redis only (SPEC §18): fsynced | replica_received | none.
    pub durability: Option<String>,
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

/// `defaults`, and a route: its identity, then the shared fields (repeated
/// by the macro rather than flattened: `flatten` would lose positions and
/// break `deny_unknown_fields`).
macro_rules! raw_structs {
    ($($(#[doc = $doc:literal])* $(#[serde($($serde:tt)*)])?
       $field:ident: $raw:ty => $parsed:ty = $default:expr, parse $parse:ident;)*) => {
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawDefaults {
            $($(#[serde($($serde)*)])? pub $field: Option<$raw>,)*
        }

        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawRoute {
            pub name: Option<String>,
            #[serde(rename = "match")]
            pub match_: Option<RawMatch>,
            pub upstream: Option<String>,
            pub provider: Option<Provider>,
            pub verify: Option<RawVerifyField>,
            /// SPEC §21: the route's own, never from `defaults`.
            pub reconcile: Option<RawReconcile>,
            $($(#[serde($($serde)*)])? pub $field: Option<$raw>,)*
        }

        impl RawRoute {
            /// Moves the shared fields out, as a `defaults` of the route's own.
            pub fn take_shared(&mut self) -> RawDefaults {
                RawDefaults {
                    $($field: self.$field.take(),)*
                }
            }
        }
    };
}
route_fields!(raw_structs);

/// `reconcile:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReconcile {
    pub url: Option<String>,
    pub headers: Option<std::collections::BTreeMap<String, String>>,
    pub sql: Option<RawReconcileSql>,
    pub done: Option<Vec<u64>>,
    pub not_done: Option<Vec<u64>>,
    pub delivered_status: Option<u64>,
    pub timeout: Option<Text>,
    pub every: Option<Text>,
}

/// `reconcile.sql` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReconcileSql {
    pub url: Option<String>,
    pub query: Option<String>,
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
    /// A composite ID (SPEC §17): each part a `header` or a `json_pointer`.
    pub parts: Option<Vec<RawIdPart>>,
}

/// One part of a composite ID; both keys optional so that "zero or two
/// sources" is one positioned error.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdPart {
    pub header: Option<String>,
    pub json_pointer: Option<String>,
}

/// `allow_from:` as written: a list of ranges, or `file:PATH` (any other
/// text is a positioned error of its own).
#[derive(Debug, Clone)]
pub enum RawAllowFrom {
    List(Vec<String>),
    Text(String),
}

impl<'de> Deserialize<'de> for RawAllowFrom {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawAllowFrom, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawAllowFrom;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of address ranges (CIDRs) or file:PATH")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawAllowFrom, E> {
                Ok(RawAllowFrom::Text(v.to_owned()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<RawAllowFrom, A::Error> {
                Vec::<String>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(RawAllowFrom::List)
            }
        }
        d.deserialize_any(V)
    }
}

/// `upstream_breaker:` as written; both keys required (a positioned
/// error names the one missing).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBreaker {
    pub failures: Option<u64>,
    pub open: Option<Text>,
}

/// `verify:` is a block, or `none` to say on purpose that a guarded route
/// checks no signature (which silences `check`'s warning about it).
#[derive(Debug)]
pub enum RawVerifyField {
    None,
    Block(Box<RawVerify>),
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
                    .map(|v| RawVerifyField::Block(Box::new(v)))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    pub scheme: Option<Scheme>,
    pub secrets: Option<Vec<String>>,
    pub tolerance: Option<Text>,
    pub header: Option<String>,
    // `scheme: hmac` only (SPEC §17):
    pub algorithm: Option<String>,
    pub encoding: Option<String>,
    pub prefix: Option<String>,
    pub signature_param: Option<String>,
    pub timestamp: Option<RawTimestamp>,
    pub message: Option<String>,
}

/// `verify.timestamp`: `{header: NAME}` or `{param: KEY}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTimestamp {
    pub header: Option<String>,
    pub param: Option<String>,
}

/// Schemes are the verifier's type; the file names them by
/// [`Scheme::as_str`].
impl<'de> Deserialize<'de> for Scheme {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scheme, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scheme;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a signature scheme")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scheme, E> {
                static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
                Scheme::ALL
                    .into_iter()
                    .find(|s| s.as_str() == v)
                    .ok_or_else(|| {
                        let names = NAMES.get_or_init(|| Scheme::ALL.map(Scheme::as_str).to_vec());
                        E::unknown_variant(v, names)
                    })
            }
        }
        d.deserialize_str(V)
    }
}
