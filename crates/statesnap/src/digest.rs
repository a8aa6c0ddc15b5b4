//! The logical digest: an order-independent fingerprint of a store's
//! key/value contents, the same for any store type and any file layout.
//!
//! It is a multiset hash (AdHash): each live pair contributes
//! `blake3(len(key) ‖ key ‖ len(value) ‖ value)` read as a 256-bit
//! little-endian integer, and the contributions are *added* modulo 2²⁵⁶,
//! with the pair count alongside. Addition (unlike XOR) does not cancel a
//! pair that appears twice, and the sum does not depend on the order the
//! pairs are visited, so a RocksDB snapshot and the portable snapshot of the
//! same state have the same digest. It detects accidental change (bit rot,
//! a lost or extra key, a wrong value) — it is not a defence against an
//! adversary who can choose many pairs.
//!
//! A value type, used by stores ([`crate::store::StateStoreExt::logical_digest`]),
//! manifests and restores alike; it depends on nothing else in the crate.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// An order-independent digest of a store's contents (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct LogicalDigest {
    sum: [u64; 4],
    keys: u64,
}

impl LogicalDigest {
    /// The digest of an empty store.
    pub fn new() -> Self {
        LogicalDigest::default()
    }

    /// Adds one live pair.
    pub fn add(&mut self, key: &[u8], value: &[u8]) {
        add_limbs(&mut self.sum, contribution(key, value));
        self.keys = self.keys.wrapping_add(1);
    }

    /// Takes away one pair that was added: `d.add(k, v); d.remove(k, v)`
    /// leaves `d` as it was. This is what lets a digest follow a store
    /// through its changes (remove the old pair, add the new one) instead
    /// of rescanning it.
    pub fn remove(&mut self, key: &[u8], value: &[u8]) {
        sub_limbs(&mut self.sum, contribution(key, value));
        self.keys = self.keys.wrapping_sub(1);
    }

    /// Adds every pair `other` holds: the digest of the union of two
    /// disjoint sets of pairs is the sum of theirs (so parts of a store
    /// can be digested apart, in parallel).
    pub fn merge(&mut self, other: &LogicalDigest) {
        add_limbs(&mut self.sum, other.sum);
        self.keys = self.keys.wrapping_add(other.keys);
    }

    /// Takes away every pair `other` holds (which must all have been
    /// added): the inverse of [`LogicalDigest::merge`]. A digest that
    /// follows a store's changes subtracts the old pairs of the keys that
    /// were written and merges their new ones.
    pub fn subtract(&mut self, other: &LogicalDigest) {
        sub_limbs(&mut self.sum, other.sum);
        self.keys = self.keys.wrapping_sub(other.keys);
    }

    /// Live pairs counted.
    pub fn keys(&self) -> u64 {
        self.keys
    }

    /// The digest of pairs from an iterator.
    pub fn of_pairs<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Self {
        let mut d = LogicalDigest::new();
        for (k, v) in pairs {
            d.add(k, v);
        }
        d
    }

    fn sum_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for limb in self.sum.iter().rev() {
            s.push_str(&format!("{limb:016x}"));
        }
        s
    }
}

/// `sum += words`, modulo 2²⁵⁶ (limbs least significant first).
fn add_limbs(sum: &mut [u64; 4], words: [u64; 4]) {
    let mut carry = false;
    for (limb, word) in sum.iter_mut().zip(words) {
        let (s1, c1) = limb.overflowing_add(word);
        let (s2, c2) = s1.overflowing_add(u64::from(carry));
        *limb = s2;
        carry = c1 || c2;
    }
}

/// `sum -= words`, modulo 2²⁵⁶ (limbs least significant first).
fn sub_limbs(sum: &mut [u64; 4], words: [u64; 4]) {
    let mut borrow = false;
    for (limb, word) in sum.iter_mut().zip(words) {
        let (s1, b1) = limb.overflowing_sub(word);
        let (s2, b2) = s1.overflowing_sub(u64::from(borrow));
        *limb = s2;
        borrow = b1 || b2;
    }
}

/// A pair's hash as four little-endian 64-bit limbs (least significant
/// first).
fn contribution(key: &[u8], value: &[u8]) -> [u64; 4] {
    let mut h = blake3::Hasher::new();
    h.update(&(key.len() as u64).to_le_bytes());
    h.update(key);
    h.update(&(value.len() as u64).to_le_bytes());
    h.update(value);
    let bytes = h.finalize();
    let b = bytes.as_bytes();
    std::array::from_fn(|i| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&b[i * 8..i * 8 + 8]);
        u64::from_le_bytes(word)
    })
}

impl std::fmt::Display for LogicalDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.keys, self.sum_hex())
    }
}

impl std::str::FromStr for LogicalDigest {
    type Err = Error;

    /// Parses `<keys>:<64 hex digits>` (the `Display` form).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::corrupt(format!(
                "malformed logical digest digest=`{}`; expected `<keys>:<64 hex digits>`",
                s.escape_debug()
            ))
        };
        let (keys, hex) = s.split_once(':').ok_or_else(bad)?;
        let keys: u64 = keys.parse().map_err(|_| bad())?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut sum = [0u64; 4];
        for (i, limb) in sum.iter_mut().rev().enumerate() {
            *limb = u64::from_str_radix(&hex[i * 16..i * 16 + 16], 16).map_err(|_| bad())?;
        }
        Ok(LogicalDigest { sum, keys })
    }
}

impl Serialize for LogicalDigest {
    fn serialize<Se: serde::Serializer>(&self, s: Se) -> std::result::Result<Se::Ok, Se::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for LogicalDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn digest(pairs: &[(Vec<u8>, Vec<u8>)]) -> LogicalDigest {
        LogicalDigest::of_pairs(pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
    }

    proptest! {
        #[test]
        fn order_does_not_matter_and_any_change_shows(
            pairs in proptest::collection::btree_map(
                proptest::collection::vec(any::<u8>(), 0..8),
                proptest::collection::vec(any::<u8>(), 0..8),
                1..30,
            ),
            seed in any::<u64>(),
        ) {
            let mut v: Vec<_> = pairs.into_iter().collect();
            let d = digest(&v);
            let mut shuffled = v.clone();
            let n = shuffled.len();
            shuffled.rotate_left((seed as usize) % n);
            shuffled.reverse();
            prop_assert_eq!(digest(&shuffled), d);
            // A changed value, a dropped pair, a duplicated pair: all differ.
            let i = (seed as usize) % n;
            let mut changed = v.clone();
            changed[i].1.push(1);
            prop_assert_ne!(digest(&changed), d);
            let dropped: Vec<_> = v.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, p)| p.clone()).collect();
            prop_assert_ne!(digest(&dropped), d);
            v.push(v[i].clone());
            prop_assert_ne!(digest(&v), d, "a pair counted twice does not cancel");
            // Removing what was added restores the digest exactly,
            // whatever the order.
            // (`v` now holds a pair twice: each copy is taken away.)
            let mut followed = digest(&v);
            followed.add(b"extra", b"pair");
            for (k, val) in v.iter().rev() {
                followed.remove(k, val);
            }
            followed.remove(b"extra", b"pair");
            prop_assert_eq!(followed, LogicalDigest::new());
            // Digested in two parts and merged: the same.
            let (a, b) = v.split_at(i);
            let mut merged = digest(a);
            merged.merge(&digest(b));
            prop_assert_eq!(merged, digest(&v));
            // Subtracting a part leaves the rest.
            merged.subtract(&digest(a));
            prop_assert_eq!(merged, digest(b));
            // Display / parse round trip.
            prop_assert_eq!(d.to_string().parse::<LogicalDigest>().unwrap(), d);
        }
    }

    #[test]
    fn key_value_boundaries_are_part_of_the_pair() {
        let a = LogicalDigest::of_pairs([(&b"ab"[..], &b"c"[..])]);
        let b = LogicalDigest::of_pairs([(&b"a"[..], &b"bc"[..])]);
        assert_ne!(a, b);
        assert_eq!(
            LogicalDigest::new().to_string(),
            format!("0:{}", "0".repeat(64))
        );
        for bad in [
            "",
            "1",
            "x:00",
            &format!("1:{}", "g".repeat(64)),
            &format!("1:{}", "0".repeat(63)),
        ] {
            let e = bad.parse::<LogicalDigest>().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{bad}");
        }
    }
}
