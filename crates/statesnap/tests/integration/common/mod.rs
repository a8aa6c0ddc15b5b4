//! Helpers shared by the integration tests (`mod common;` in each file that
//! uses them). Each test binary compiles its own copy and uses a part of it.
#![allow(dead_code, unused_imports, clippy::unwrap_used)]

pub mod data;
pub mod recorder;
pub mod tree;

pub use tree::{Node, tree};

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{Changelog, LoggedRecord};
use statesnap::commit_snapshot;
use statesnap::format::{RestoreContext, RestoreStats, StoreFormat};
use statesnap::repo::paths;
use statesnap::repo::{BlobHash, Manifest, Repository, StoreKey};
use statesnap::restore::{
    ReplayOptions, ReplayReport, RestoreOptions, RestoreReport, replay, restore_store,
};
use statesnap::store::LoggedStore;
use statesnap::store::MemoryStore;
use statesnap::store::{StateStore, StateStoreExt};

/// This package's directory, read when the test runs (`cargo test` sets
/// `CARGO_MANIFEST_DIR` for the test process too). The value compiled in is
/// the directory the binary was built from, which need not be this
/// checkout: clones sharing one target directory reuse each other's test
/// binaries when no source file is newer.
pub fn package_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// The name libtest knows the test `name` of the module `module_path` by
/// (pass `module_path!()`): the path inside this test binary, without the
/// binary's own name, which is what `--exact` matches when a test runs
/// itself as a child process.
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}

/// A model of a store's contents.
pub type Kv = BTreeMap<Bytes, Bytes>;

/// Everything a store holds, in key order.
pub fn contents<S: StateStore + ?Sized>(s: &S) -> Kv {
    s.iter().unwrap().map(|kv| kv.unwrap()).collect()
}

/// Every record of `log` from offset `from` on, read in batches of `batch`,
/// or the first error.
pub fn try_read_all<C: Changelog + ?Sized>(
    log: &C,
    from: u64,
    batch: usize,
) -> statesnap::Result<Vec<LoggedRecord>> {
    let mut r = log.read_from(from)?;
    let mut out = Vec::new();
    while let Some(b) = r.next_batch(batch)? {
        out.extend(b);
    }
    Ok(out)
}

/// What a full replay of `log` into a new store holds, and its offset.
pub fn replayed<C: Changelog + ?Sized>(log: &C) -> (Kv, Option<u64>) {
    let mut s = MemoryStore::new();
    replay_tail(&mut s, log);
    (contents(&s), s.applied_offset().unwrap())
}

/// Replays `log` into `store`, from the store's offset to the log's end,
/// with the default options.
pub fn replay_tail<S: StateStore + ?Sized, C: Changelog + ?Sized>(
    store: &mut S,
    log: &C,
) -> ReplayReport {
    replay(store, log, &ReplayOptions::default(), &mut |_| {}).unwrap()
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

/// Creates the directory `dir` holding one file, `name`, of `bytes`.
pub fn dir_with_file(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// Cuts (or extends) the file at `path` to `len` bytes: a disk that lost
/// what was written after `len`.
pub fn set_len(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
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

/// A multi-threaded runtime (two workers) for sync tests that drive async code.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An empty repository in memory, and the object store under it (for tests
/// that look at or tamper with what it holds).
pub fn memory_repo() -> (Repository, Arc<dyn ObjectStore>) {
    let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    (Repository::from_store(Arc::clone(&base), "").unwrap(), base)
}

/// A file changelog in `dir` (default options) for partition 0 of store
/// `name` of application `app`.
pub fn file_log(dir: &Path, app: &str, name: &str) -> FileChangelog {
    let id = StoreKey::new(app, name, 0).unwrap().changelog_id();
    FileChangelog::open(dir, id, FileChangelogOptions::default()).unwrap()
}

/// Captures `store` with `format` and commits the snapshot on `parent`.
pub async fn snapshot<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    store: &F::Store,
    repo: &Repository,
    sk: &StoreKey,
    log: &C,
    parent: Option<&Manifest>,
) -> Manifest {
    let cut = format.capture(store).unwrap();
    commit_snapshot(format, cut, repo, sk, log, parent)
        .await
        .unwrap()
}

/// `restore_store` with the default options: the newest usable snapshot,
/// then the changelog's tail.
pub async fn restore_latest<F: StoreFormat, C: Changelog + ?Sized>(
    format: &F,
    repo: &Repository,
    sk: &StoreKey,
    log: &C,
    target: &Path,
) -> statesnap::Result<(F::Store, RestoreReport)> {
    restore_store(format, repo, sk, log, target, &RestoreOptions::default()).await
}

/// Restores snapshot `m` alone (no replay) into `target` with `format`.
pub async fn restore_snapshot<F: StoreFormat>(
    format: &F,
    m: &Manifest,
    repo: &Repository,
    target: &Path,
) -> statesnap::Result<(F::Store, RestoreStats)> {
    format.restore(m, RestoreContext { repo, target }).await
}

/// A xorshift64 stream from `seed` (not 0): cheap deterministic noise.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// `len` deterministic pseudo-random bytes (incompressible-ish values).
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut next = xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..len).map(|_| (next() >> 24) as u8).collect()
}

/// Puts `key` = `value` on `ls` (`None`: deletes `key`), and the same on
/// `model`.
pub fn write_both<S: StateStore, C: Changelog>(
    ls: &mut LoggedStore<S, C>,
    model: &mut Kv,
    key: Bytes,
    value: Option<Bytes>,
) {
    match value {
        Some(v) => {
            ls.put(key.clone(), v.clone());
            model.insert(key, v);
        }
        None => {
            ls.delete(key.clone());
            model.remove(&key);
        }
    }
}

/// A write the model tests make: a put of `key(k)` (value: `v`'s
/// little-endian bytes) or a delete of `key(k)`.
#[derive(Debug, Clone)]
pub enum Write {
    Put(u8, u16),
    Delete(u8),
}

/// Writes over the keys `0..keys`: `puts` puts to `deletes` deletes.
pub fn writes(keys: u8, puts: u32, deletes: u32) -> impl Strategy<Value = Write> {
    prop_oneof![
        puts => (0..keys, any::<u16>()).prop_map(|(k, v)| Write::Put(k, v)),
        deletes => (0..keys).prop_map(Write::Delete),
    ]
}

/// A model test's puts and deletes over the keys `0..keys` (as `write`
/// makes them its `Op`) and its `commit`s, in the proportion
/// `puts : deletes : commits`.
pub fn writes_and_commits<Op: Clone + std::fmt::Debug + 'static>(
    keys: u8,
    [puts, deletes, commits]: [u32; 3],
    write: fn(Write) -> Op,
    commit: Op,
) -> impl Strategy<Value = Op> {
    prop_oneof![
        puts + deletes => writes(keys, puts, deletes).prop_map(write),
        commits => Just(commit),
    ]
}

/// What a `LoggedStore` under test should hold: its committed writes, and
/// the writes pending since its last commit.
#[derive(Debug, Default)]
pub struct Model {
    pub committed: Kv,
    pub pending: BTreeMap<Bytes, Option<Bytes>>,
}

impl Model {
    /// Makes `w` on `ls`, pending until the next commit.
    pub fn write<S: StateStore, C: Changelog>(&mut self, ls: &mut LoggedStore<S, C>, w: &Write) {
        match *w {
            Write::Put(k, v) => {
                let v = Bytes::from(v.to_le_bytes().to_vec());
                ls.put(key(k), v.clone());
                self.pending.insert(key(k), Some(v));
            }
            Write::Delete(k) => {
                ls.delete(key(k));
                self.pending.insert(key(k), None);
            }
        }
    }

    /// Commits `ls`; its pending writes are committed.
    pub fn commit<S: StateStore, C: Changelog>(&mut self, ls: &mut LoggedStore<S, C>) {
        ls.commit().unwrap();
        apply_to(&mut self.committed, std::mem::take(&mut self.pending));
    }

    /// What reads see: the pending writes over the committed state.
    pub fn view(&self) -> Kv {
        let mut view = self.committed.clone();
        apply_to(&mut view, self.pending.clone());
        view
    }
}
