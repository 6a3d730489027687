//! The HMAC algorithms, and a verifier's secrets with each one's keyed
//! state derived once.
//!
//! HMAC starts every tag by hashing the key padded to one block, twice
//! (inner and outer pad): two of the ~20 compressions a 1 KiB delivery
//! costs. The secrets do not change after config load, so that keyed state
//! is computed on the first delivery and cloned for each one after; the tag
//! is the same as a fresh `Hmac::new_from_slice` gives (tested below).

use std::ops::Deref;
use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Sha256, Sha512};

/// Longest tag any algorithm produces (SHA-512).
pub const MAX_TAG: usize = 64;

/// The hash under the HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha1,
    Sha256,
    Sha512,
}

impl Algorithm {
    /// Every algorithm, by its configuration name.
    pub const ALL: [(Algorithm, &'static str); 3] = [
        (Algorithm::Sha1, "sha1"),
        (Algorithm::Sha256, "sha256"),
        (Algorithm::Sha512, "sha512"),
    ];

    /// The tag's length in bytes.
    pub const fn tag_len(self) -> usize {
        match self {
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
            Algorithm::Sha512 => 64,
        }
    }

    pub(super) fn hex_why(self) -> &'static str {
        match self {
            Algorithm::Sha1 => "the signature is not 40 hex digits",
            Algorithm::Sha256 => "the signature is not 64 hex digits",
            Algorithm::Sha512 => "the signature is not 128 hex digits",
        }
    }

    pub(super) fn len_why(self) -> &'static str {
        match self {
            Algorithm::Sha1 => "the signature is not 20 bytes",
            Algorithm::Sha256 => "the signature is not 32 bytes",
            Algorithm::Sha512 => "the signature is not 64 bytes",
        }
    }

    /// HMAC of the concatenated `parts` under `key` (for signing).
    pub fn tag(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        let mut out = [0u8; MAX_TAG];
        self.mac(key, parts, &mut out);
        out[..self.tag_len()].to_vec()
    }

    /// HMAC of the concatenated `parts` under `key`, into `out[..tag_len]`.
    fn mac(self, key: &[u8], parts: &[&[u8]], out: &mut [u8; MAX_TAG]) {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]], out: &mut [u8]) {
            let mut m = <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
            for part in parts {
                m.update(part);
            }
            out.copy_from_slice(&m.finalize().into_bytes());
        }
        let out = &mut out[..self.tag_len()];
        match self {
            Algorithm::Sha1 => run::<Hmac<Sha1>>(key, parts, out),
            Algorithm::Sha256 => run::<Hmac<Sha256>>(key, parts, out),
            Algorithm::Sha512 => run::<Hmac<Sha512>>(key, parts, out),
        }
    }
}

/// The resolved key bytes of one verifier (any one matching passes). Read
/// as a slice; not changed after construction, which is what lets the keyed
/// states be kept.
pub struct Secrets {
    raw: Vec<Vec<u8>>,
    keyed: OnceLock<Keyed>,
}

/// Every secret's keyed HMAC state, under the verifier's one algorithm.
enum Keyed {
    Sha1(Box<[Hmac<Sha1>]>),
    Sha256(Box<[Hmac<Sha256>]>),
    Sha512(Box<[Hmac<Sha512>]>),
}

impl Keyed {
    fn of(algorithm: Algorithm, raw: &[Vec<u8>]) -> Keyed {
        fn keyed<M: Mac + hmac::digest::KeyInit>(raw: &[Vec<u8>]) -> Box<[M]> {
            raw.iter()
                .map(|k| <M as Mac>::new_from_slice(k).expect("HMAC takes keys of any length"))
                .collect()
        }
        match algorithm {
            Algorithm::Sha1 => Keyed::Sha1(keyed(raw)),
            Algorithm::Sha256 => Keyed::Sha256(keyed(raw)),
            Algorithm::Sha512 => Keyed::Sha512(keyed(raw)),
        }
    }

    fn algorithm(&self) -> Algorithm {
        match self {
            Keyed::Sha1(_) => Algorithm::Sha1,
            Keyed::Sha256(_) => Algorithm::Sha256,
            Keyed::Sha512(_) => Algorithm::Sha512,
        }
    }
}

impl Secrets {
    /// Calls `each` with the tag of the concatenated `parts` under every
    /// secret, in order (`tag_len` bytes each).
    pub fn for_each_tag(&self, algorithm: Algorithm, parts: &[&[u8]], each: impl FnMut(&[u8])) {
        let keyed = self.keyed.get_or_init(|| Keyed::of(algorithm, &self.raw));
        if keyed.algorithm() != algorithm {
            // A verifier has one algorithm; another one is keyed afresh.
            return Keyed::of(algorithm, &self.raw).tags(parts, each);
        }
        keyed.tags(parts, each)
    }
}

impl Keyed {
    fn tags(&self, parts: &[&[u8]], mut each: impl FnMut(&[u8])) {
        fn run<M: Mac + Clone>(macs: &[M], parts: &[&[u8]], each: &mut impl FnMut(&[u8])) {
            for keyed in macs {
                let mut m = keyed.clone();
                for part in parts {
                    m.update(part);
                }
                each(&m.finalize().into_bytes());
            }
        }
        match self {
            Keyed::Sha1(m) => run(m, parts, &mut each),
            Keyed::Sha256(m) => run(m, parts, &mut each),
            Keyed::Sha512(m) => run(m, parts, &mut each),
        }
    }
}

impl From<Vec<Vec<u8>>> for Secrets {
    fn from(raw: Vec<Vec<u8>>) -> Self {
        Secrets {
            raw,
            keyed: OnceLock::new(),
        }
    }
}

impl Deref for Secrets {
    type Target = [Vec<u8>];
    fn deref(&self) -> &[Vec<u8>] {
        &self.raw
    }
}

impl Clone for Secrets {
    /// The bytes; the copy keys its own states on first use.
    fn clone(&self) -> Self {
        self.raw.clone().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_states_give_the_fresh_tag_for_every_algorithm_and_key() {
        let keys = vec![b"k".to_vec(), vec![7u8; 200], b"whsec_another".to_vec()];
        let parts: [&[u8]; 3] = [b"1718000000", b".", b"{\"id\":1}"];
        for (alg, _) in Algorithm::ALL {
            let secrets = Secrets::from(keys.clone());
            // twice: the first call keys the states, the second reuses them
            for _ in 0..2 {
                let mut got = Vec::new();
                secrets.for_each_tag(alg, &parts, |t| got.push(t.to_vec()));
                let want: Vec<Vec<u8>> = keys.iter().map(|k| alg.tag(k, &parts)).collect();
                assert_eq!(got, want, "{alg:?}");
            }
        }
    }

    #[test]
    fn another_algorithm_after_the_first_is_keyed_afresh() {
        let secrets = Secrets::from(vec![b"k".to_vec()]);
        let parts: [&[u8]; 1] = [b"body"];
        secrets.for_each_tag(Algorithm::Sha256, &parts, |_| {});
        let mut got = Vec::new();
        secrets.for_each_tag(Algorithm::Sha1, &parts, |t| got.push(t.to_vec()));
        assert_eq!(got, vec![Algorithm::Sha1.tag(b"k", &parts)]);
    }
}
