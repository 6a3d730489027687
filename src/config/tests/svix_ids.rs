//! The svix preset's event ID across verification: what the signature
//! covers is what the route's event-ID source reads (config's
//! `EventIdSource` over `verify`'s header sets; here, since config is the
//! module above verify).

use crate::config::EventIdSource;
use http::{HeaderMap, HeaderValue};

use crate::verify::sign;
use crate::verify::tests::{sw_verifier, SW_BODY, SW_ID, SW_SIG, SW_TS};

/// An attacker holds one genuine delivery of message `A` (signed under
/// either name) and sends any mix of the two header sets, each header
/// absent, genuine, or naming another message `B`, once or twice. Whenever
/// verification passes, the `svix` preset's event-ID header holds `A` —
/// the ID the signature covers — and so does every `svix-id` the consumer
/// could read. 3^6 × 2 header combinations, every one checked.
#[test]
fn svix_event_id_is_always_the_signed_id() {
    let ver = sw_verifier();
    let ts = SW_TS.to_string();
    let (a, b) = (SW_ID, "msg_someone_elses_id");
    // a genuine signature over `A`; any signature over `B` would be a forgery
    let forged_b = sign::standard_webhooks(&[1u8; 24], b, SW_TS, SW_BODY);
    let names = [
        "svix-id",
        "svix-timestamp",
        "svix-signature",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    ];
    let choices = |name: &str| -> [Option<String>; 3] {
        let genuine = if name.ends_with("-id") {
            a.to_string()
        } else if name.ends_with("-timestamp") {
            ts.clone()
        } else {
            SW_SIG.to_string()
        };
        let other = if name.ends_with("-id") {
            b.to_string()
        } else if name.ends_with("-timestamp") {
            (SW_TS + 1).to_string()
        } else {
            forged_b.clone()
        };
        [None, Some(genuine), Some(other)]
    };
    let mut passed = 0;
    for combo in 0..3usize.pow(6) {
        for doubled in [false, true] {
            let mut h = HeaderMap::new();
            let mut n = combo;
            for name in names {
                if let Some(value) = &choices(name)[n % 3] {
                    let value = HeaderValue::from_str(value).unwrap();
                    h.append(name, value.clone());
                    if doubled && name.ends_with("-id") {
                        h.append(name, value);
                    }
                }
                n /= 3;
            }
            if ver.verify(&h, SW_BODY, SW_TS).is_err() {
                continue;
            }
            passed += 1;
            let id_header = EventIdSource::SvixId.header_for(&h).unwrap();
            let ids: Vec<_> = h.get_all(id_header).iter().collect();
            assert!(!ids.is_empty() && ids.iter().all(|v| *v == a), "{h:?}");
            assert!(h.get_all("svix-id").iter().all(|v| v == a), "{h:?}");
        }
    }
    // What passes, and only that: the genuine svix-* set alone (1), and the
    // genuine webhook-* set with svix-id absent or `A` and svix-timestamp,
    // svix-signature anything (2 × 3 × 3); never with a repeated ID header.
    assert_eq!(passed, 19);
}
