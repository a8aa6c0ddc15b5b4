//! Which target partition a key belongs to.
//!
//! The default is Kafka's: the Java client's `BuiltInPartitioner` and
//! librdkafka's `murmur2_random` both place a keyed record in partition
//! `(murmur2(key) & 0x7fffffff) % partitions`, so a state resharded with
//! [`Murmur2`] sits where the producers of the recreated input topic will
//! send each key.

use std::fmt;
use std::sync::Arc;

/// Places keys in partitions. Must be a pure function of the key and the
/// partition count: a reshard that is retried recomputes every placement.
pub trait Partitioner: Send + Sync {
    /// The partition of `key` among `partitions` (always `< partitions`;
    /// `partitions >= 1`).
    fn partition(&self, key: &[u8], partitions: u32) -> u32;

    /// A short name for reports (`murmur2`, or the user's).
    fn name(&self) -> &str;
}

/// A shared partitioner.
pub type SharedPartitioner = Arc<dyn Partitioner>;

/// Kafka's default partitioner for keyed records.
#[derive(Debug, Clone, Copy, Default)]
pub struct Murmur2;

impl Partitioner for Murmur2 {
    fn partition(&self, key: &[u8], partitions: u32) -> u32 {
        (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
    }
    fn name(&self) -> &str {
        "murmur2"
    }
}

/// A partitioner from a function, for applications that place keys their
/// own way (a custom Kafka `Partitioner`, a key prefix, ...).
pub struct FnPartitioner<F> {
    name: String,
    f: F,
}

impl<F: Fn(&[u8], u32) -> u32 + Send + Sync> FnPartitioner<F> {
    /// `f(key, partitions)` must return a partition `< partitions`; a
    /// reshard refuses (`config`) when it does not.
    pub fn new(name: impl Into<String>, f: F) -> Self {
        FnPartitioner {
            name: name.into(),
            f,
        }
    }
}

impl<F> fmt::Debug for FnPartitioner<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnPartitioner")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<F: Fn(&[u8], u32) -> u32 + Send + Sync> Partitioner for FnPartitioner<F> {
    fn partition(&self, key: &[u8], partitions: u32) -> u32 {
        (self.f)(key, partitions)
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// The partitioner named `name`: `murmur2` (Kafka's default) is the only
/// built-in one; `None` for any other name.
pub fn by_name(name: &str) -> Option<SharedPartitioner> {
    match name {
        "murmur2" => Some(Arc::new(Murmur2)),
        _ => None,
    }
}

/// The names [`by_name`] knows.
pub const PARTITIONERS: &[&str] = &["murmur2"];

/// MurmurHash2 (32-bit) with Kafka's seed, as `org.apache.kafka.common.
/// utils.Utils.murmur2` and librdkafka's `rd_murmur2` compute it: four
/// little-endian bytes at a time, then the tail.
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Java hashes the length as an `int`; keys over 2 GiB do not exist.
    let mut h = SEED ^ (data.len() as u32);
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        if tail.len() >= 3 {
            h ^= u32::from(tail[2]) << 16;
        }
        if tail.len() >= 2 {
            h ^= u32::from(tail[1]) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of `Utils.murmur2` from the Kafka client's own unit test
    /// (`UtilsTest.testMurmur2`), as Java `int`s.
    #[test]
    fn murmur2_matches_the_java_client() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(
                murmur2(key) as i32,
                want,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn murmur2_places_every_key_below_the_count() {
        for n in 1..=17u32 {
            for i in 0..2_000u32 {
                let key = format!("user-{i}");
                assert!(Murmur2.partition(key.as_bytes(), n) < n);
            }
        }
        assert_eq!(Murmur2.partition(b"", 1), 0);
    }

    #[test]
    fn partitioners_are_found_by_name() {
        assert_eq!(
            by_name("murmur2").map(|p| p.name().to_owned()),
            Some("murmur2".into())
        );
        assert!(by_name("round-robin").is_none());
        let p = FnPartitioner::new("first-byte", |k: &[u8], n| u32::from(k[0]) % n);
        assert_eq!(p.partition(b"\x05", 4), 1);
        assert_eq!(p.name(), "first-byte");
    }
}
