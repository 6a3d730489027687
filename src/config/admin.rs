//! `admin:` (SPEC §11): the token the admin API's actions need.
//!
//! The token is a reference (`env:NAME` or `file:PATH`), read like a verify
//! secret; messages name the reference, never the value.

use super::ctx::Ctx;
use super::model::{AdminConfig, AdminToken};
use super::raw::RawAdmin;
use super::verify::resolve_secret;

/// Shorter tokens load, with a warning: the admin listener does not slow
/// down guesses.
const SHORT_TOKEN: usize = 16;

/// `None` means an error was recorded.
pub fn admin_config(ctx: &mut Ctx, raw: Option<RawAdmin>) -> Option<AdminConfig> {
    let Some(RawAdmin { token }) = raw else {
        return Some(AdminConfig::default());
    };
    let Some(reference) = token else {
        return Some(AdminConfig::default());
    };
    let path = "admin.token";
    let bytes = match resolve_secret(&reference, ctx.env) {
        Ok(b) => b,
        Err(e) => {
            ctx.at_value(path, format!("the admin token cannot be read: {e}"));
            return None;
        }
    };
    if let Some(at) = bytes.iter().position(|b| !(0x21..=0x7E).contains(b)) {
        ctx.at_value(
            path,
            format!(
                "the admin token from {reference} has a byte that is not visible ASCII \
                 (0x21-0x7E) at offset {at}: it must fit in an `Authorization: Bearer` header"
            ),
        );
        return None;
    }
    if bytes.len() < SHORT_TOKEN {
        ctx.warn_value(
            path,
            format!(
                "the admin token from {reference} is {} bytes long; use at least {SHORT_TOKEN} \
                 random ones (e.g. `openssl rand -hex 32`)",
                bytes.len()
            ),
        );
    }
    Some(AdminConfig {
        token: Some(AdminToken(bytes)),
    })
}
