//! The operator console (SPEC §11): one page and its script, style and
//! icon, built into the binary. The page reads and acts only through the
//! JSON API ([`super::api`]).
//!
//! Its Content-Security-Policy lets the page load nothing but these files
//! from this listener and talk to nothing else; it runs no inline script or
//! style; and with Trusted Types an HTML sink (`innerHTML` and the like)
//! throws, so the script can only put values in the page as text.

use http::{Response, StatusCode};

use super::web::response;

/// The page's policy.
pub const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'";

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");
const ICON: &str = include_str!("assets/favicon.svg");

/// The file at `path`, if it is one of the console's.
pub fn asset(path: &str) -> Option<Response<Vec<u8>>> {
    let (content_type, body) = match path {
        "/" | "/index.html" => ("text/html; charset=utf-8", INDEX),
        "/console.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/console.css" => ("text/css; charset=utf-8", STYLE),
        "/favicon.svg" => ("image/svg+xml", ICON),
        _ => return None,
    };
    Some(response(
        StatusCode::OK,
        content_type,
        PAGE_CSP,
        body.as_bytes().to_vec(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the CSP cannot check by itself: the page has no inline script,
    /// style or handler, and the script writes no HTML.
    #[test]
    fn the_page_has_nothing_inline_and_the_script_no_html_sink() {
        let lower = INDEX.to_ascii_lowercase();
        assert_eq!(lower.matches("<script").count(), 1);
        assert!(lower.contains("<script src=\"/console.js\" defer></script>"));
        for inline in [
            "<style",
            " style=",
            " onclick",
            " onload",
            " onerror",
            "javascript:",
        ] {
            assert!(!lower.contains(inline), "index.html has {inline}");
        }
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "setTimeout('",
            "cookie",
            "localStorage",
        ] {
            let code: String = SCRIPT
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            assert!(!code.contains(sink), "console.js uses {sink}");
        }
        // only this listener: no URL with a scheme or host anywhere
        for text in [INDEX, SCRIPT, STYLE] {
            assert!(
                !text.contains("http://") && !text.contains("https://") && !text.contains("//cdn")
            );
        }
    }

    #[test]
    fn every_asset_has_the_policy_and_its_type() {
        for (path, ty) in [
            ("/", "text/html; charset=utf-8"),
            ("/console.js", "text/javascript; charset=utf-8"),
            ("/console.css", "text/css; charset=utf-8"),
            ("/favicon.svg", "image/svg+xml"),
        ] {
            let r = asset(path).unwrap();
            assert_eq!(r.headers()["content-type"], ty);
            assert_eq!(r.headers()["content-security-policy"], PAGE_CSP);
            assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        }
        assert!(asset("/console.map").is_none());
    }
}
