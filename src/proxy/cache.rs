//! A short-lived cache of delivered records, so a storm of duplicates is
//! answered without a store round trip. `delivered` is final, so an entry
//! can only go stale through an operator's `events release --force` (or the
//! sweeper deleting the record after its retention); the TTL bounds that to a
//! couple of seconds, on every replica alike.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::Recorded;

/// How long a delivered record is answered from memory.
pub const TTL: Duration = Duration::from_secs(2);
/// Entries kept at most; past it the cache starts over (cheap, and rare).
const CAPACITY: usize = 16 * 1024;

struct Entry {
    digest: String,
    recorded: Arc<Recorded>,
    at: Instant,
}

/// What the cache knows about a delivery.
pub enum Hit {
    /// Delivered with this payload: replay.
    Replay(Arc<Recorded>),
    /// Delivered with another payload: 422.
    Mismatch,
}

#[derive(Default)]
pub struct DeliveredCache {
    entries: Mutex<HashMap<String, Entry>>,
}

fn key(route: &str, event_id: &str) -> String {
    let mut k = String::with_capacity(route.len() + 1 + event_id.len());
    k.push_str(route);
    k.push('\n'); // never part of a route name or an event ID
    k.push_str(event_id);
    k
}

impl DeliveredCache {
    pub fn get(&self, route: &str, event_id: &str, digest: &str) -> Option<Hit> {
        let entries = self.entries.lock().expect("cache lock");
        let e = entries.get(&key(route, event_id))?;
        if e.at.elapsed() > TTL {
            return None;
        }
        Some(if e.digest == digest {
            Hit::Replay(e.recorded.clone())
        } else {
            Hit::Mismatch
        })
    }

    pub fn insert(&self, route: &str, event_id: &str, digest: &str, recorded: Arc<Recorded>) {
        let mut entries = self.entries.lock().expect("cache lock");
        if entries.len() >= CAPACITY {
            entries.retain(|_, e| e.at.elapsed() <= TTL);
            if entries.len() >= CAPACITY {
                entries.clear();
            }
        }
        entries.insert(
            key(route, event_id),
            Entry {
                digest: digest.to_owned(),
                recorded,
                at: Instant::now(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(status: u16) -> Arc<Recorded> {
        Arc::new(Recorded {
            status: Some(status),
            content_type: None,
            body: None,
        })
    }

    #[test]
    fn replays_same_digest_and_refuses_another() {
        let c = DeliveredCache::default();
        assert!(c.get("r", "e", "d1").is_none());
        c.insert("r", "e", "d1", rec(202));
        assert!(matches!(c.get("r", "e", "d1"), Some(Hit::Replay(r)) if r.status == Some(202)));
        assert!(matches!(c.get("r", "e", "d2"), Some(Hit::Mismatch)));
        assert!(
            c.get("other", "e", "d1").is_none(),
            "routes are separate scopes"
        );
    }

    #[test]
    fn stays_bounded() {
        let c = DeliveredCache::default();
        for i in 0..(CAPACITY + 10) {
            c.insert("r", &i.to_string(), "d", rec(200));
        }
        assert!(c.entries.lock().unwrap().len() <= CAPACITY);
    }
}
