//! Who sent a request (SPEC §22): address ranges (CIDRs) and the client
//! address behind trusted proxies. Pure: the caller passes the peer and the
//! `X-Forwarded-For` values.
//!
//! A set of ranges is kept as sorted, merged, disjoint intervals over one
//! 128-bit space (an IPv4 address is its IPv4-mapped IPv6 form,
//! `::ffff:a.b.c.d`), so an IPv4 peer and an IPv4-mapped IPv6 peer are the
//! same address, and a lookup is one binary search whatever the list's
//! length (a provider's published list holds thousands of ranges). Why not
//! a crate: `ipnet` parses but does not search, and the prefix tries on
//! crates.io (`ip_network_table`, `treebitmap`) carry more than these sixty
//! lines of search.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One range as written: an address and a prefix length (a bare address
/// is the range of itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The first address, in the 128-bit space (IPv4 mapped).
    first: u128,
    /// The last address, inclusive.
    last: u128,
}

/// Why a range does not parse; the text is fit for `file:line:col: path: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address range `{text}`: {why}")]
pub struct RangeError {
    text: String,
    why: &'static str,
}

impl Range {
    /// `10.0.0.0/8`, `2001:db8::/32`, `192.0.2.7` (a /32), `::1` (a /128).
    /// The address must be the range's first (no bits past the prefix), so
    /// that a typo such as `10.1.0.0/8` is not read as a wider range than meant.
    pub fn parse(text: &str) -> Result<Range, RangeError> {
        let err = |why| RangeError {
            text: text.to_owned(),
            why,
        };
        let (addr, len) = match text.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (text, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| {
            err("expected an IPv4 or IPv6 address, e.g. 192.0.2.0/24 or 2001:db8::/32")
        })?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len: u32 = match len {
            None => max,
            Some(l) if !l.is_empty() && l.len() <= 3 && l.bytes().all(|b| b.is_ascii_digit()) => l
                .parse()
                .map_err(|_| err("the prefix length is not a number"))?,
            Some(_) => return Err(err("the prefix length is a number after `/`")),
        };
        if len > max {
            return Err(err(if max == 32 {
                "an IPv4 prefix length is at most 32"
            } else {
                "an IPv6 prefix length is at most 128"
            }));
        }
        // the length in the 128-bit space: an IPv4 /n is a /(96+n)
        let len = len + (128 - max);
        let first = key(ip);
        let host_bits = if len == 128 { 0 } else { u128::MAX >> len };
        if first & host_bits != 0 {
            return Err(err(
                "the address has bits set past the prefix length (write the range's first address)",
            ));
        }
        Ok(Range {
            first,
            last: first | host_bits,
        })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        (self.first..=self.last).contains(&key(ip))
    }
}

/// An address in the one 128-bit space: IPv4, and IPv4-mapped IPv6, as
/// `::ffff:a.b.c.d`.
fn key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// A set of ranges, matched by binary search (see the module doc).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Ranges {
    /// Disjoint, sorted, and not adjacent (touching intervals are merged).
    spans: Vec<(u128, u128)>,
}

impl Ranges {
    pub fn new(ranges: impl IntoIterator<Item = Range>) -> Ranges {
        let mut all: Vec<(u128, u128)> = ranges.into_iter().map(|r| (r.first, r.last)).collect();
        all.sort_unstable();
        let mut spans: Vec<(u128, u128)> = Vec::with_capacity(all.len());
        for (first, last) in all {
            match spans.last_mut() {
                Some((_, end)) if first <= end.saturating_add(1) => *end = (*end).max(last),
                _ => spans.push((first, last)),
            }
        }
        spans.shrink_to_fit();
        Ranges { spans }
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Whether `ip` is in one of the ranges: one binary search.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let k = key(ip);
        // the first span that starts after k; the one before it may hold k
        let i = self.spans.partition_point(|&(first, _)| first <= k);
        i > 0 && self.spans[i - 1].1 >= k
    }
}

impl fmt::Debug for Ranges {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Ranges({} spans)", self.spans.len())
    }
}

/// A client address for a log line or the admin API: the address, or
/// `unknown` (see [`client`]).
#[derive(Debug, Clone, Copy)]
pub struct Shown(pub Option<IpAddr>);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.0 {
            Some(ip) => write!(f, "{ip}"),
            None => f.write_str("unknown"),
        }
    }
}

/// The client address of a request (SPEC §22): the TCP peer, unless the
/// peer is a trusted proxy, in which case it is the right-most
/// `X-Forwarded-For` entry that is not itself a trusted proxy (entries of
/// every `X-Forwarded-For` field, in order; the last field's last entry is
/// the nearest hop). `xff` yields the fields' values in the order received.
///
/// An entry that is not an address (an attacker writes the left part of
/// the chain; only trusted proxies write the right part) ends the walk
/// with `None`: the client is unknown, and an unknown client is in no
/// range, so garbage never turns a refused source into an allowed one.
/// When every entry is a trusted proxy, the left-most is the client.
pub fn client<'a>(
    peer: IpAddr,
    trusted: &Ranges,
    xff: impl DoubleEndedIterator<Item = &'a [u8]>,
) -> Option<IpAddr> {
    if trusted.is_empty() || !trusted.contains(peer) {
        return Some(peer);
    }
    let mut client = peer;
    for field in xff.rev() {
        for entry in field.rsplit(|&b| b == b',') {
            let entry = entry.trim_ascii();
            if entry.is_empty() {
                continue; // `a, , b` and a trailing comma: list syntax (RFC 9110 §5.6.1)
            }
            client = forwarded_addr(entry)?;
            if !trusted.contains(client) {
                return Some(client);
            }
        }
    }
    Some(client)
}

/// One `X-Forwarded-For` entry: an address, an IPv4 address with a port,
/// or a bracketed IPv6 address with or without a port. Anything else is
/// `None`.
fn forwarded_addr(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(is_port);
        return port_ok.then(|| v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6))?;
    }
    let (v4, port) = text.split_once(':')?;
    is_port(port)
        .then(|| v4.parse::<Ipv4Addr>().ok().map(IpAddr::V4))
        .flatten()
}

fn is_port(p: &str) -> bool {
    p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn set(list: &[&str]) -> Ranges {
        Ranges::new(list.iter().map(|r| Range::parse(r).unwrap()))
    }

    #[test]
    fn ranges_parse_and_refuse() {
        for ok in [
            "10.0.0.0/8",
            "192.0.2.7",
            "0.0.0.0/0",
            "::/0",
            "2001:db8::/32",
            "::1",
            "1.2.3.4/32",
        ] {
            assert!(Range::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "10.1.0.0/8",
            "10.0.0.0/8/8",
            "10.0.0/8",
            "10.0.0.0/+8",
            "10.0.0.0/ 8",
            " 10.0.0.0/8",
            "2001:db8::1/32",
            "example.com",
            "10.0.0.0/0008",
        ] {
            assert!(Range::parse(bad).is_err(), "{bad:?}");
        }
        let e = Range::parse("10.1.0.0/8").unwrap_err().to_string();
        assert!(e.contains("first address"), "{e}");
    }

    #[test]
    fn matches_ipv4_ipv6_and_mapped() {
        let s = set(&["192.0.2.0/24", "2001:db8::/32", "127.0.0.2"]);
        for yes in [
            "192.0.2.0",
            "192.0.2.255",
            "::ffff:192.0.2.9",
            "2001:db8:ffff::1",
            "127.0.0.2",
        ] {
            assert!(s.contains(ip(yes)), "{yes}");
        }
        for no in [
            "192.0.3.0",
            "192.0.1.255",
            "2001:db9::",
            "127.0.0.3",
            "::ffff:127.0.0.3",
            "::1",
            "0.0.0.0",
        ] {
            assert!(!s.contains(ip(no)), "{no}");
        }
        // an IPv4 /0 is every IPv4 address, and no IPv6 one
        let v4 = set(&["0.0.0.0/0"]);
        assert!(v4.contains(ip("255.255.255.255")) && v4.contains(ip("::ffff:1.2.3.4")));
        assert!(!v4.contains(ip("2001:db8::1")));
        assert!(set(&["::/0"]).contains(ip("10.0.0.1")));
        assert!(!Ranges::default().contains(ip("10.0.0.1")));
    }

    #[test]
    fn overlapping_and_adjacent_ranges_merge() {
        let s = set(&[
            "10.0.0.0/24",
            "10.0.1.0/24",
            "10.0.0.128/25",
            "10.0.3.0/24",
            "10.0.0.0/23",
        ]);
        assert_eq!(s.spans.len(), 2);
        assert!(
            s.contains(ip("10.0.1.255"))
                && !s.contains(ip("10.0.2.0"))
                && s.contains(ip("10.0.3.7"))
        );
    }

    /// Against a linear scan, on many ranges and addresses (a search bug
    /// at a span's edge would show here).
    #[test]
    fn binary_search_agrees_with_a_scan() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut ranges = Vec::new();
        for _ in 0..5000 {
            let len = 8 + (next() % 25) as u32;
            let addr = (next() as u32) & (u32::MAX << (32 - len));
            ranges.push(Range::parse(&format!("{}/{len}", Ipv4Addr::from(addr))).unwrap());
        }
        let s = Ranges::new(ranges.iter().copied());
        for i in 0..50_000u64 {
            let a = if i % 2 == 0 {
                IpAddr::V4(Ipv4Addr::from(next() as u32))
            } else {
                // the edges of the ranges themselves
                let r = ranges[(next() % 5000) as usize];
                let k = if i % 4 == 1 {
                    r.first.wrapping_sub(1)
                } else {
                    r.last.wrapping_add(1)
                };
                IpAddr::V6(Ipv6Addr::from(k))
            };
            assert_eq!(s.contains(a), ranges.iter().any(|r| r.contains(a)), "{a}");
        }
    }

    fn client_of(peer: &str, trusted: &Ranges, fields: &[&str]) -> Option<IpAddr> {
        client(ip(peer), trusted, fields.iter().map(|f| f.as_bytes()))
    }

    #[test]
    // long: one table of chains, an assertion a line
    fn forwarded_for_counts_only_from_a_trusted_peer() {
        let lb = set(&["10.0.0.0/8"]);
        // untrusted peer: the header is ignored, however it is written
        assert_eq!(
            client_of("203.0.113.9", &lb, &["192.0.2.1"]),
            Some(ip("203.0.113.9"))
        );
        assert_eq!(
            client_of("203.0.113.9", &Ranges::default(), &["192.0.2.1"]),
            Some(ip("203.0.113.9"))
        );
        // trusted peer without the header: the peer
        assert_eq!(client_of("10.0.0.1", &lb, &[]), Some(ip("10.0.0.1")));
        // the right-most entry that is not a trusted proxy
        assert_eq!(
            client_of("10.0.0.1", &lb, &["198.51.100.7, 192.0.2.1, 10.0.0.5"]),
            Some(ip("192.0.2.1"))
        );
        // several fields are one list, in order
        assert_eq!(
            client_of(
                "10.0.0.1",
                &lb,
                &["198.51.100.7", "192.0.2.1", "10.9.9.9,10.0.0.5"]
            ),
            Some(ip("192.0.2.1"))
        );
        // every entry trusted: the left-most
        assert_eq!(
            client_of("10.0.0.1", &lb, &["10.1.1.1, 10.0.0.5"]),
            Some(ip("10.1.1.1"))
        );
        // ports and brackets, empty list members
        assert_eq!(
            client_of("10.0.0.1", &lb, &["192.0.2.1:443,,"]),
            Some(ip("192.0.2.1"))
        );
        assert_eq!(
            client_of("10.0.0.1", &lb, &["[2001:db8::1]:80"]),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(
            client_of("10.0.0.1", &lb, &["[2001:db8::1]"]),
            Some(ip("2001:db8::1"))
        );
        // a mapped peer is the IPv4 one
        assert_eq!(
            client_of("::ffff:10.0.0.1", &lb, &["192.0.2.1"]),
            Some(ip("192.0.2.1"))
        );
    }

    #[test]
    fn garbage_in_the_chain_makes_the_client_unknown() {
        let lb = set(&["10.0.0.0/8"]);
        for garbage in [
            "unknown",
            "192.0.2.1 x",
            "192.0.2.1:99999",
            "[::1",
            "1.2.3.4:",
            "_hidden",
            "\u{ff}",
        ] {
            // garbage nearest the proxy: unknown, never the entry before it
            let fields = [format!("192.0.2.1, {garbage}")];
            let got = client(ip("10.0.0.1"), &lb, fields.iter().map(|f| f.as_bytes()));
            assert_eq!(got, None, "{garbage:?}");
        }
        // garbage left of the first untrusted entry is never read
        assert_eq!(
            client_of("10.0.0.1", &lb, &["junk, 192.0.2.1"]),
            Some(ip("192.0.2.1"))
        );
        // raw bytes outside UTF-8
        let raw: [&[u8]; 1] = [b"192.0.2.1, \xff\xfe"];
        assert_eq!(client(ip("10.0.0.1"), &lb, raw.into_iter()), None);
    }
}
