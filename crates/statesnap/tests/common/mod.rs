//! Helpers shared by the integration tests (`mod common;` in each file that
//! uses them). Each test binary compiles its own copy and uses a part of it.
#![allow(dead_code, clippy::unwrap_used)]

use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::collections::BTreeMap;
use std::sync::Arc;

use statesnap::changelog::Changelog;
use statesnap::repo::paths;
use statesnap::repo::{BlobHash, StoreKey};
use statesnap::restore::{ReplayOptions, replay};
use statesnap::store::memory::MemoryStore;
use statesnap::store::{StateStore, StateStoreExt};

/// A model of a store's contents.
pub type Kv = BTreeMap<Bytes, Bytes>;

/// Everything a store holds, in key order.
pub fn contents<S: StateStore + ?Sized>(s: &S) -> Kv {
    s.iter().unwrap().map(|kv| kv.unwrap()).collect()
}

/// What a full replay of `log` into a new store holds, and its offset.
pub fn replayed<C: Changelog + ?Sized>(log: &C) -> (Kv, Option<u64>) {
    let mut s = MemoryStore::new();
    replay(&mut s, log, &ReplayOptions::default(), &mut |_| {}).unwrap();
    (contents(&s), s.applied_offset().unwrap())
}

/// Applies writes (`None`: a delete) to a model, in order.
pub fn apply_to(model: &mut Kv, writes: impl IntoIterator<Item = (Bytes, Option<Bytes>)>) {
    for (k, v) in writes {
        match v {
            Some(v) => model.insert(k, v),
            None => model.remove(&k),
        };
    }
}

/// The key model tests use for small integers: `key-007`.
pub fn key(k: u8) -> Bytes {
    Bytes::from(format!("key-{k:03}"))
}

/// A seeded splitmix64 stream: deterministic "random" choices.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Flips bits of the byte at `at` in a local file (bit rot).
pub fn flip_file_byte(path: &std::path::Path, at: u64, mask: u8) {
    let mut b = std::fs::read(path).unwrap();
    b[at as usize] ^= mask;
    std::fs::write(path, b).unwrap();
}

/// Rots a stored blob of `sk` in place: same size, the middle byte's bits
/// in `mask` flipped.
pub async fn rot_blob(store: &Arc<dyn ObjectStore>, sk: &StoreKey, hash: &BlobHash, mask: u8) {
    let key = paths::blob(sk, hash);
    let mut bytes = store
        .get(&key)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= mask;
    store
        .put(&key, PutPayload::from(Bytes::from(bytes)))
        .await
        .unwrap();
}
