//! Every object key of a repository is built and parsed here, and nowhere
//! else (style: "every object key built and parsed in one place").
//!
//! Layout (format version 1), relative to the repository root:
//!
//! ```text
//! statesnap.json                                          repository marker
//! stores/<store-key>/manifests/<offset:020>-<snapshot-id>.json
//! stores/<store-key>/blobs/<hh>/<blake3-hex>              content-addressed
//! stores/<store-key>/tmp/<ulid>                           staging for large uploads
//! stores/<store-key>/gc/<ulid>.json                       gc condemnation records
//! ```
//!
//! Parsing never panics: a key that is not exactly what the builder would
//! produce yields `None`.

use object_store::path::Path;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use crate::changelog::ChangelogId;
use crate::clock::Clock;
use crate::error::{Error, Result};

/// Where the random part of new ids (snapshot ids, staging, gc and
/// quarantine keys) comes from: injectable like the clock, so a seeded
/// simulation mints the same keys every run.
pub trait Entropy: Send + Sync + fmt::Debug {
    /// 128 random bits (a ULID uses the low 80).
    fn random_u128(&self) -> u128;
}

/// A shared entropy source.
pub type SharedEntropy = Arc<dyn Entropy>;

/// The operating system's randomness (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn random_u128(&self) -> u128 {
        uuid::Uuid::new_v4().as_u128()
    }
}

/// A deterministic sequence from a seed (splitmix64), for tests and
/// simulations. Not for production: ids from two processes with the same
/// seed collide.
#[derive(Debug)]
pub struct SeededEntropy(Mutex<u64>);

impl SeededEntropy {
    /// A sequence starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SeededEntropy(Mutex::new(seed))
    }

    fn next_u64(&self) -> u64 {
        let mut s = match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        crate::util::splitmix64(&mut s)
    }
}

impl Entropy for SeededEntropy {
    fn random_u128(&self) -> u128 {
        (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64())
    }
}

/// The default entropy source, [`OsEntropy`].
pub fn os_entropy() -> SharedEntropy {
    Arc::new(OsEntropy)
}

/// A fresh ULID for a new key: the clock's milliseconds plus 80 random bits.
pub(crate) fn new_ulid(clock: &dyn Clock, entropy: &dyn Entropy) -> ulid::Ulid {
    let ms = u64::try_from(clock.now_ms()).unwrap_or(0);
    ulid::Ulid::from_parts(ms, entropy.random_u128())
}

/// The repository marker object.
pub const MARKER: &str = "statesnap.json";
/// The folder holding one sub-folder per store partition.
pub const STORES: &str = "stores";

/// Longest application or store name.
pub const MAX_NAME_LEN: usize = 96;
/// Longest rendered store key.
pub const MAX_STORE_KEY_LEN: usize = 200;

/// A validated `(application, store, partition)` triple, rendered as
/// `<application>.<store>.<partition>`.
///
/// Names are 1..=96 characters of `[A-Za-z0-9_-]`; the partition is a decimal
/// `u32` without leading zeros. Because names cannot contain `.`, the rendering
/// is unambiguous and round-trips.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreKey {
    application: String,
    store: String,
    partition: u32,
}

fn validate_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(Error::config(format!(
            "invalid {what} name: length must be 1..={MAX_NAME_LEN} {what}=`{}` length={}",
            name.escape_debug(),
            name.len()
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
    {
        return Err(Error::config(format!(
            "invalid {what} name: only [A-Za-z0-9_-] allowed {what}=`{}` char=`{}`",
            name.escape_debug(),
            c.escape_debug()
        )));
    }
    Ok(())
}

impl StoreKey {
    /// A store key, rejecting hostile or over-long names with a config error.
    pub fn new(application: &str, store: &str, partition: u32) -> Result<Self> {
        validate_name("application", application)?;
        validate_name("store", store)?;
        let key = StoreKey {
            application: application.to_owned(),
            store: store.to_owned(),
            partition,
        };
        let len = key.to_string().len();
        if len > MAX_STORE_KEY_LEN {
            return Err(Error::config(format!(
                "invalid store key: longer than {MAX_STORE_KEY_LEN} store_key=`{key}` length={len}"
            )));
        }
        Ok(key)
    }

    /// The application name.
    pub fn application(&self) -> &str {
        &self.application
    }
    /// The store name.
    pub fn store(&self) -> &str {
        &self.store
    }
    /// The partition.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The changelog this store partition follows by convention, named like
    /// Kafka Streams does: topic `<application>-<store>-changelog`, this
    /// key's partition.
    ///
    /// Infallible: a key's names are valid topic characters, and a valid
    /// key's topic is at most 208 characters (Kafka allows 249).
    pub fn changelog_id(&self) -> ChangelogId {
        let topic = format!("{}-{}-changelog", self.application, self.store);
        debug_assert!(ChangelogId::new(topic.as_str(), self.partition).is_ok());
        ChangelogId {
            topic,
            partition: self.partition,
        }
    }

    /// Parses a rendering made by [`fmt::Display`]; `None` if it is not one.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.split('.');
        let (app, store, part) = (it.next()?, it.next()?, it.next()?);
        if it.next().is_some() {
            return None;
        }
        let partition = parse_canonical_u64(part, 10).and_then(|p| u32::try_from(p).ok())?;
        StoreKey::new(app, store, partition).ok()
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.application, self.store, self.partition)
    }
}

impl FromStr for StoreKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        StoreKey::parse(s).ok_or_else(|| {
            Error::config(format!(
                "invalid store key: expected `<application>.<store>.<partition>` with names of \
                 [A-Za-z0-9_-] store_key=`{}`",
                s.escape_debug()
            ))
        })
    }
}

impl serde::Serialize for StoreKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for StoreKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        StoreKey::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("invalid store key `{}`", s.escape_debug()))
        })
    }
}

/// Parses a decimal number with no sign, no leading zeros (except "0") and
/// (if `width` is given as the exact digit count) a fixed width.
fn parse_canonical_u64(s: &str, max_digits: usize) -> Option<u64> {
    if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    s.parse().ok()
}

/// A snapshot id: a ULID, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId(pub ulid::Ulid);

impl SnapshotId {
    /// An id from a millisecond timestamp and 80 random bits.
    pub fn from_parts(ms: u64, random: u128) -> Self {
        SnapshotId(ulid::Ulid::from_parts(ms, random))
    }
    /// Parses the canonical 26-character uppercase rendering.
    pub fn parse(s: &str) -> Option<Self> {
        if s.len() != 26 {
            return None;
        }
        let u = ulid::Ulid::from_string(s).ok()?;
        (u.to_string() == s).then_some(SnapshotId(u))
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for SnapshotId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        SnapshotId::parse(s).ok_or_else(|| {
            Error::config(format!(
                "invalid snapshot id: expected a ulid id=`{}`",
                s.escape_debug()
            ))
        })
    }
}

impl serde::Serialize for SnapshotId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for SnapshotId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SnapshotId::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("invalid snapshot id `{}`", s.escape_debug()))
        })
    }
}

/// A blake3 hash, rendered as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobHash(pub [u8; 32]);

impl BlobHash {
    /// The hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        BlobHash(*blake3::hash(bytes).as_bytes())
    }
    /// Parses 64 lowercase hex digits.
    pub fn parse(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0])?;
            let lo = hex_val(pair[1])?;
            out[i] = (hi << 4) | lo;
        }
        Some(BlobHash(out))
    }
    /// The 64-digit hex rendering.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl From<blake3::Hash> for BlobHash {
    fn from(h: blake3::Hash) -> Self {
        BlobHash(*h.as_bytes())
    }
}

impl fmt::Display for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobHash({self})")
    }
}

impl serde::Serialize for BlobHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for BlobHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        BlobHash::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("invalid blake3 hash `{}`", s.escape_debug()))
        })
    }
}

/// The name of a manifest: its changelog offset and snapshot id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ManifestName {
    /// Last changelog offset the snapshot includes.
    pub offset: u64,
    /// The snapshot id.
    pub id: SnapshotId,
}

/// What a repository key is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedKey {
    /// `statesnap.json`.
    Marker,
    /// A manifest.
    Manifest(StoreKey, ManifestName),
    /// A blob.
    Blob(StoreKey, BlobHash),
    /// A staging object of an in-flight (or crashed) large upload.
    Staging(StoreKey, ulid::Ulid),
    /// A gc condemnation record.
    GcRecord(StoreKey, ulid::Ulid),
    /// A blob [`Maintenance::verify`](crate::repo::Maintenance::verify) found bad and moved aside.
    Quarantined(StoreKey, BlobHash, ulid::Ulid),
}

/// `statesnap.json`.
pub fn marker() -> Path {
    Path::from(MARKER)
}

/// `stores/`.
pub fn stores_prefix() -> Path {
    Path::from(STORES)
}

/// `stores/<sk>/`.
pub fn store_prefix(sk: &StoreKey) -> Path {
    Path::from(format!("{STORES}/{sk}"))
}

/// `stores/<sk>/manifests/`.
pub fn manifests_prefix(sk: &StoreKey) -> Path {
    Path::from(format!("{STORES}/{sk}/manifests"))
}

/// `stores/<sk>/blobs/`.
pub fn blobs_prefix(sk: &StoreKey) -> Path {
    Path::from(format!("{STORES}/{sk}/blobs"))
}

/// `stores/<sk>/tmp/`.
pub fn staging_prefix(sk: &StoreKey) -> Path {
    Path::from(format!("{STORES}/{sk}/tmp"))
}

/// `stores/<sk>/gc/`.
pub fn gc_prefix(sk: &StoreKey) -> Path {
    Path::from(format!("{STORES}/{sk}/gc"))
}

/// `stores/<sk>/manifests/<offset:020>-<id>.json`.
pub fn manifest(sk: &StoreKey, name: ManifestName) -> Path {
    Path::from(format!(
        "{STORES}/{sk}/manifests/{:020}-{}.json",
        name.offset, name.id
    ))
}

/// `stores/<sk>/blobs/<hh>/<hex>`.
pub fn blob(sk: &StoreKey, hash: &BlobHash) -> Path {
    let hex = hash.to_hex();
    Path::from(format!("{STORES}/{sk}/blobs/{}/{hex}", &hex[..2]))
}

/// `stores/<sk>/tmp/<ulid>`.
pub fn staging(sk: &StoreKey, id: ulid::Ulid) -> Path {
    Path::from(format!("{STORES}/{sk}/tmp/{id}"))
}

/// `stores/<sk>/gc/<ulid>.json`.
pub fn gc_record(sk: &StoreKey, id: ulid::Ulid) -> Path {
    Path::from(format!("{STORES}/{sk}/gc/{id}.json"))
}

/// `stores/<sk>/quarantine/<hex>-<ulid>`: a bad blob moved out of the blob
/// space, kept for inspection (gc leaves it alone).
pub fn quarantine(sk: &StoreKey, hash: &BlobHash, id: ulid::Ulid) -> Path {
    Path::from(format!("{STORES}/{sk}/quarantine/{}-{id}", hash.to_hex()))
}

fn parse_ulid(s: &str) -> Option<ulid::Ulid> {
    SnapshotId::parse(s).map(|id| id.0)
}

/// Parses a manifest file name `<offset:020>-<id>.json`.
pub fn parse_manifest_name(file: &str) -> Option<ManifestName> {
    let stem = file.strip_suffix(".json")?;
    let (off, id) = stem.split_once('-')?;
    if off.len() != 20 || !off.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let offset: u64 = off.parse().ok()?;
    Some(ManifestName {
        offset,
        id: SnapshotId::parse(id)?,
    })
}

/// Parses any repository key. `None` for anything the builders above would
/// not have produced.
pub fn parse(key: &Path) -> Option<ParsedKey> {
    let s = key.as_ref();
    if s == MARKER {
        return Some(ParsedKey::Marker);
    }
    let parts: Vec<&str> = s.split('/').collect();
    match parts.as_slice() {
        [STORES, sk, "manifests", file] => Some(ParsedKey::Manifest(
            StoreKey::parse(sk)?,
            parse_manifest_name(file)?,
        )),
        [STORES, sk, "blobs", hh, hex] => {
            let hash = BlobHash::parse(hex)?;
            (hex.get(..2) == Some(*hh)).then_some(())?;
            Some(ParsedKey::Blob(StoreKey::parse(sk)?, hash))
        }
        [STORES, sk, "tmp", id] => Some(ParsedKey::Staging(StoreKey::parse(sk)?, parse_ulid(id)?)),
        [STORES, sk, "gc", file] => {
            let id = parse_ulid(file.strip_suffix(".json")?)?;
            Some(ParsedKey::GcRecord(StoreKey::parse(sk)?, id))
        }
        [STORES, sk, "quarantine", file] => {
            let (hex, id) = file.split_once('-')?;
            Some(ParsedKey::Quarantined(
                StoreKey::parse(sk)?,
                BlobHash::parse(hex)?,
                parse_ulid(id)?,
            ))
        }
        _ => None,
    }
}

/// Parses a manifest key.
pub fn parse_manifest(key: &Path) -> Option<(StoreKey, ManifestName)> {
    match parse(key)? {
        ParsedKey::Manifest(sk, n) => Some((sk, n)),
        _ => None,
    }
}

/// Parses a blob key.
pub fn parse_blob(key: &Path) -> Option<(StoreKey, BlobHash)> {
    match parse(key)? {
        ParsedKey::Blob(sk, h) => Some((sk, h)),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn seeded_entropy_mints_the_same_ids_for_the_same_seed() {
        let clock = crate::clock::ManualClock::new(1_700_000_000_000);
        let ids = |seed| {
            let e = SeededEntropy::new(seed);
            (0..4).map(|_| new_ulid(&clock, &e)).collect::<Vec<_>>()
        };
        assert_eq!(ids(7), ids(7));
        assert_ne!(ids(7), ids(8));
        let a = ids(7);
        assert!(a.windows(2).all(|w| w[0] != w[1]), "{a:?}");
        assert!(a.iter().all(|u| u.timestamp_ms() == 1_700_000_000_000));
        assert_ne!(new_ulid(&clock, &OsEntropy), new_ulid(&clock, &OsEntropy));
    }

    fn name() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_-]{1,40}"
    }

    proptest! {
        #[test]
        fn store_key_round_trips(app in name(), store in name(), part in any::<u32>()) {
            let sk = StoreKey::new(&app, &store, part).unwrap();
            prop_assert_eq!(StoreKey::parse(&sk.to_string()), Some(sk.clone()));
            prop_assert_eq!(sk.application(), app.as_str());
        }

        #[test]
        fn manifest_key_round_trips(app in name(), store in name(), part in any::<u32>(),
                                    offset in any::<u64>(), ms in 0u64..(1u64 << 48), r in any::<u128>()) {
            let sk = StoreKey::new(&app, &store, part).unwrap();
            let n = ManifestName { offset, id: SnapshotId::from_parts(ms, r) };
            let key = manifest(&sk, n);
            prop_assert_eq!(parse_manifest(&key), Some((sk, n)));
        }

        #[test]
        fn blob_key_round_trips(app in name(), store in name(), part in any::<u32>(), h in any::<[u8; 32]>()) {
            let sk = StoreKey::new(&app, &store, part).unwrap();
            let hash = BlobHash(h);
            let key = blob(&sk, &hash);
            prop_assert_eq!(parse_blob(&key), Some((sk.clone(), hash)));
            prop_assert_eq!(parse(&key), Some(ParsedKey::Blob(sk, hash)));
        }

        #[test]
        fn quarantine_key_round_trips(ms in 0u64..(1u64 << 48), r in any::<u128>(), h in any::<[u8; 32]>()) {
            let sk = StoreKey::new("a", "b", 0).unwrap();
            let id = ulid::Ulid::from_parts(ms, r);
            let hash = BlobHash(h);
            prop_assert_eq!(
                parse(&quarantine(&sk, &hash, id)),
                Some(ParsedKey::Quarantined(sk, hash, id))
            );
        }

        #[test]
        fn staging_and_gc_keys_round_trip(ms in 0u64..(1u64 << 48), r in any::<u128>()) {
            let sk = StoreKey::new("a", "b", 0).unwrap();
            let id = ulid::Ulid::from_parts(ms, r);
            prop_assert_eq!(parse(&staging(&sk, id)), Some(ParsedKey::Staging(sk.clone(), id)));
            prop_assert_eq!(parse(&gc_record(&sk, id)), Some(ParsedKey::GcRecord(sk, id)));
        }

        #[test]
        fn garbage_keys_never_panic(s in "\\PC{0,120}") {
            let _ = StoreKey::parse(&s);
            let _ = parse_manifest_name(&s);
            if let Ok(p) = Path::parse(&s) {
                let _ = parse(&p);
            }
        }

        #[test]
        fn garbage_under_stores_never_panics(a in "[a-z0-9._-]{0,12}", b in "[a-z0-9._-]{0,30}", c in "[a-zA-Z0-9.-]{0,70}") {
            for shape in [format!("stores/{a}/manifests/{b}"), format!("stores/{a}/blobs/{b}/{c}"),
                          format!("stores/{a}/gc/{c}"), format!("stores/{a}/tmp/{c}"), format!("stores/{a}.{b}.1/blobs/{c}")] {
                if let Ok(p) = Path::parse(&shape) {
                    let _ = parse(&p);
                }
            }
        }
    }

    #[test]
    fn hostile_names_are_config_errors() {
        let long = "x".repeat(97);
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a.b",
            "a b",
            "é",
            "a\0b",
            "a\nb",
            "a\\b",
            "%2e",
            long.as_str(),
        ] {
            let e = StoreKey::new(bad, "s", 0).expect_err(bad);
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{bad}");
            let e = StoreKey::new("a", bad, 0).expect_err(bad);
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{bad}");
        }
        let long = "y".repeat(96);
        let e = StoreKey::new(&long, &long, 4_000_000_000).expect_err("over-long key");
        assert_eq!(e.kind(), crate::ErrorKind::Config);
    }

    #[test]
    fn foreign_keys_do_not_parse() {
        for k in [
            "stores/a.b.0/manifests/1-01ARZ3NDEKTSV4RRFFQ69G5FAV.json",
            "stores/a.b.00/manifests/00000000000000000001-01ARZ3NDEKTSV4RRFFQ69G5FAV.json",
            "stores/a.b.0/manifests/00000000000000000001-01arz3ndektsv4rrffq69g5fav.json",
            "stores/a.b.0/manifests/00000000000000000001-01ARZ3NDEKTSV4RRFFQ69G5FAV.json.tmp",
            "stores/a.b.0/manifests/99999999999999999999-01ARZ3NDEKTSV4RRFFQ69G5FAV.json",
            "stores/a.b.0/blobs/00/ff00000000000000000000000000000000000000000000000000000000000000",
            "stores/a.b.0/blobs/ff/FF00000000000000000000000000000000000000000000000000000000000000",
            "stores/a.b/blobs/ff/ff00000000000000000000000000000000000000000000000000000000000000",
            "stores/a.b.0/other/x",
            "statesnap.json.bak",
        ] {
            assert_eq!(parse(&Path::from(k)), None, "{k}");
        }
        let ok = "stores/a.b.0/manifests/00000000000000000001-01ARZ3NDEKTSV4RRFFQ69G5FAV.json";
        assert!(parse_manifest(&Path::from(ok)).is_some());
    }
}
