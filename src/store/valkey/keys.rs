//! Where a record lives (see the module doc of `valkey`): its hash tag,
//! and so its slot, from the route and a bucket of the event ID.

/// Buckets per route: a route's records spread over this many slots (so
/// over every shard of a cluster of up to a few dozen shards), and an
/// operator list or a sweep asks this many index keys per route.
pub const BUCKETS: u32 = 256;

/// The hash slots of a cluster (fixed by the protocol).
const SLOTS: u16 = 16_384;

/// Every route that ever had a record (a set of its own, on one slot).
pub const ROUTES: &str = "idemgate:routes";
/// The paused routes: a hash of route to `paused_at` (a key of its own).
pub const PAUSES: &str = "idemgate:pauses";
/// The store's format version (SPEC §18, "Schema").
pub const FORMAT: &str = "idemgate:format";
/// The format this binary writes and reads.
pub const FORMAT_VERSION: i64 = 1;

/// The bucket of an event ID: FNV-1a, fixed for all time (a record's keys
/// are found by it).
pub fn bucket(event_id: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in event_id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % BUCKETS
}

/// One bucket of one route: the hash tag that every key of its records
/// and of its indexes carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// `{r:<route>:<bucket>}`: route names are `[a-z0-9_-]`, so the first
    /// `}` closes the tag.
    tag: String,
    pub slot: u16,
}

impl Bucket {
    pub fn new(route: &str, bucket: u32) -> Bucket {
        let inner = format!("r:{route}:{bucket}");
        Bucket {
            slot: crc16(inner.as_bytes()) % SLOTS,
            tag: format!("{{{inner}}}"),
        }
    }

    pub fn of(route: &str, event_id: &str) -> Bucket {
        Bucket::new(route, bucket(event_id))
    }

    /// The hash tag, `{r:<route>:<bucket>}`: who the bucket is (two
    /// buckets may share a slot).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The record's hash.
    pub fn record(&self, event_id: &str) -> String {
        format!("{}:e:{event_id}", self.tag)
    }

    /// The record's attempts: a hash of attempt number to its row (JSON).
    pub fn attempts(&self, event_id: &str) -> String {
        format!("{}:a:{event_id}", self.tag)
    }

    /// The questions asked about the record (SPEC §21): a list of JSON
    /// rows, oldest first, the newest 20 kept.
    pub fn questions(&self, event_id: &str) -> String {
        format!("{}:q:{event_id}", self.tag)
    }

    /// Every record of the bucket by `first_seen_at` (the list's order).
    pub fn by_first_seen(&self) -> String {
        format!("{}:f", self.tag)
    }

    /// Every record of the bucket by `expires_at` (the sweep's order).
    pub fn by_expiry(&self) -> String {
        format!("{}:x", self.tag)
    }

    /// The bucket's `processing` records by `updated_at`.
    pub fn processing(&self) -> String {
        format!("{}:p", self.tag)
    }

    /// The bucket's `ambiguous` records: a set of event IDs, kept by every
    /// script that changes a state, so counting them is one `SCARD`.
    pub fn ambiguous(&self) -> String {
        format!("{}:m", self.tag)
    }

    /// The keys a script that closes or releases a claim touches (settle,
    /// release, resolve), in the order those scripts take them: the record,
    /// its attempts, and the indexes its state and expiry sit in.
    pub fn state_change_keys(&self, event_id: &str) -> [String; 5] {
        [
            self.record(event_id),
            self.attempts(event_id),
            self.by_expiry(),
            self.processing(),
            self.ambiguous(),
        ]
    }

    /// The prefix of a record's key: what the list script appends IDs to.
    pub fn record_prefix(&self) -> String {
        format!("{}:e:", self.tag)
    }

    pub fn attempts_prefix(&self) -> String {
        format!("{}:a:", self.tag)
    }
}

/// The slot of a key with no hash tag (the cluster hashes all of it).
pub fn slot_of(key: &str) -> u16 {
    debug_assert!(!key.contains('{'));
    crc16(key.as_bytes()) % SLOTS
}

/// CRC16/XMODEM, the cluster's key hash (slot = crc16(tag) mod 16384).
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_as_the_cluster_computes_them() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // `CLUSTER KEYSLOT foo` is 12182, `CLUSTER KEYSLOT bar` 5061
        assert_eq!(crc16(b"foo") % SLOTS, 12182);
        assert_eq!(crc16(b"bar") % SLOTS, 5061);
    }

    #[test]
    fn a_records_keys_share_its_tag_and_ids_spread() {
        let b = Bucket::of("stripe", "evt_{1}");
        let tag = &b.record("evt_{1}")[..b.record("evt_{1}").find('}').unwrap() + 1];
        for key in [
            b.attempts("evt_{1}"),
            b.by_first_seen(),
            b.by_expiry(),
            b.processing(),
            b.ambiguous(),
        ] {
            assert!(key.starts_with(tag), "{key}");
        }
        assert_eq!(bucket("evt_{1}"), bucket("evt_{1}"), "fixed");
        let used: std::collections::HashSet<u32> =
            (0..4000).map(|i| bucket(&format!("evt_{i}"))).collect();
        assert!(used.len() > 250, "{}", used.len());
        assert!(used.iter().all(|&b| b < BUCKETS));
    }
}
