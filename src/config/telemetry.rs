//! `telemetry:` (SPEC §19): where OpenTelemetry traces go (`otlp`: an
//! OTLP/HTTP endpoint, its headers from `env:`/`file:` secrets, the ratio
//! of traces kept and the service's name) and how the console links a
//! trace ID (`trace_url`).

use super::ctx::Ctx;
use super::fields;
use super::model::{Otlp, Telemetry, UpstreamUrl};
use super::raw::{RawOtlp, RawTelemetry};
use super::reconcile::ask_headers;

/// What OTLP/HTTP appends to the endpoint for traces.
const TRACES_PATH: &str = "/v1/traces";
/// The placeholder `trace_url` must hold.
const TRACE_ID: &str = "{trace_id}";

/// `telemetry`, if present: `Some(None)` when absent, `None` when wrong.
pub fn optional(ctx: &mut Ctx, raw: Option<RawTelemetry>) -> Option<Option<Telemetry>> {
    match raw {
        None => Some(None),
        Some(raw) => telemetry(ctx, raw).map(Some),
    }
}

/// Parses `telemetry`; `None` when wrong (recorded).
fn telemetry(ctx: &mut Ctx, raw: RawTelemetry) -> Option<Telemetry> {
    let errors_before = ctx.error_count();
    let otlp = raw.otlp.and_then(|o| otlp(ctx, o));
    let trace_url = raw.trace_url.filter(|url| {
        let ok = url.matches(TRACE_ID).count() == 1
            && (url.starts_with("http://") || url.starts_with("https://"));
        if !ok {
            ctx.at_value(
                "telemetry.trace_url",
                "trace_url must be an http:// or https:// URL holding {trace_id} once, \
                 e.g. https://grafana.example/explore?traceId={trace_id}",
            );
        }
        ok
    });
    (ctx.error_count() == errors_before).then_some(Telemetry { otlp, trace_url })
}

fn otlp(ctx: &mut Ctx, raw: RawOtlp) -> Option<Otlp> {
    let at = |key: &str| format!("telemetry.otlp.{key}");
    let errors_before = ctx.error_count();
    let endpoint = endpoint(ctx, raw.endpoint);
    let headers = ask_headers(ctx, &at("headers"), raw.headers.unwrap_or_default());
    let sample = match raw.sample {
        None => 1.0,
        Some(s) if (0.0..=1.0).contains(&s) => s,
        Some(s) => {
            ctx.at_value(
                &at("sample"),
                format!("sample {s} is not a ratio from 0 to 1"),
            );
            1.0
        }
    };
    let service_name = match raw.service_name {
        None => "idemgate".to_owned(),
        Some(name) if !name.trim().is_empty() && !name.chars().any(char::is_control) => name,
        Some(_) => {
            ctx.at_value(&at("service_name"), "service_name must be a non-empty name");
            String::new()
        }
    };
    if ctx.error_count() != errors_before {
        return None;
    }
    let endpoint = endpoint?;
    let path = format!("{}{TRACES_PATH}", endpoint.base_path);
    Some(Otlp {
        endpoint,
        path,
        headers: headers?,
        sample,
        service_name,
    })
}

/// `otlp.endpoint`, the collector's address, read as an upstream URL is.
fn endpoint(ctx: &mut Ctx, raw: Option<String>) -> Option<UpstreamUrl> {
    match raw {
        None => {
            ctx.at_key(
                "telemetry.otlp",
                "otlp needs `endpoint`, the collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318",
            );
            None
        }
        Some(url) => match fields::upstream(&url) {
            Ok(target) => Some(target),
            Err(e) => {
                ctx.at_value("telemetry.otlp.endpoint", e.replace("upstream", "endpoint"));
                None
            }
        },
    }
}
