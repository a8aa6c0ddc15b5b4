//! The [`StoreFormat`] suite: what every snapshot format must do, whatever
//! store it serves. `make` returns a fresh format object each call (no state
//! remembered from earlier snapshots); each check builds its own changelog,
//! store (through [`StoreFormat::create_empty`]) and in-memory repository.
//!
//! ```ignore
//! #[tokio::test]
//! async fn my_format_conforms() {
//!     statesnap::conformance::format::run_all(&|| MyFormat::new(), true).await;
//! }
//! ```

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::changelog::file::{FileChangelog, FileChangelogOptions};
use crate::error::ErrorKind;
use crate::format::{RestoreContext, RestoreStats, StoreFormat};
use crate::repo::{Manifest, Repository, StoreKey, paths};
use crate::restore::{RestoreOptions, restore_store};
use crate::snapshot::commit_snapshot;
use crate::store::logged::LoggedStore;
use crate::store::{StateStore, StateStoreExt};

type Model = BTreeMap<Bytes, Bytes>;

/// Runs every check. `reuses_parent_blobs`: whether an incremental snapshot
/// of this format reuses blobs of its parent (checked if true).
pub async fn run_all<F: StoreFormat>(make: &dyn Fn() -> F, reuses_parent_blobs: bool) {
    capture_reflects_the_store(make).await;
    round_trip_matches_a_model(make).await;
    a_cut_is_the_state_when_it_was_captured(make).await;
    if reuses_parent_blobs {
        an_incremental_snapshot_reuses_its_parent(make).await;
    }
    a_corrupt_blob_fails_corrupt_and_leaves_the_target_as_it_was(make).await;
    restore_replaces_its_own_store_and_refuses_a_foreign_directory(make).await;
}

/// A changelog, a store following it through a `LoggedStore`, an in-memory
/// repository, and the model of what was committed.
struct Fixture<F: StoreFormat> {
    dir: tempfile::TempDir,
    base: Arc<dyn ObjectStore>,
    repo: Repository,
    sk: StoreKey,
    format: F,
    ls: LoggedStore<F::Store, FileChangelog>,
    model: Model,
}

impl<F: StoreFormat> Fixture<F> {
    fn new(make: &dyn Fn() -> F) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = FileChangelog::open(
            dir.path().join("log"),
            StoreKey::new("conformance", "format", 0)
                .expect("changelog id")
                .changelog_id(),
            FileChangelogOptions::default(),
        )
        .expect("open changelog");
        let format = make();
        let store = format
            .create_empty(&dir.path().join("store"))
            .expect("create_empty");
        let base: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let repo = Repository::from_store(Arc::clone(&base), "").expect("repository");
        Fixture {
            ls: LoggedStore::new(store, log).expect("LoggedStore::new on an empty store"),
            dir,
            base,
            repo,
            sk: StoreKey::new("conformance", "format", 0).expect("store key"),
            format,
            model: Model::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `n` writes (every seventh a delete) over a key space of 300, committed
    /// in batches of 50, mirrored in the model.
    fn write(&mut self, n: u32, seed: u32) {
        for i in 0..n {
            let k = Bytes::from(format!("key-{:04}", (i * 7 + seed * 13) % 300));
            if (i + seed).is_multiple_of(7) {
                self.ls.delete(k.clone());
                self.model.remove(&k);
            } else {
                let v = Bytes::from(format!(
                    "value-{seed}-{i}-{}",
                    "x".repeat((i % 50) as usize)
                ));
                self.ls.put(k.clone(), v.clone());
                self.model.insert(k, v);
            }
            if i % 50 == 49 {
                self.ls.commit().expect("commit");
            }
        }
        self.ls.commit().expect("commit");
    }

    /// Rewrites the `n` lowest keys (a change confined to one end of the
    /// key space, as incremental snapshots are built for).
    fn touch(&mut self, n: u32) {
        for i in 0..n {
            let k = Bytes::from(format!("key-{i:04}"));
            let v = Bytes::from(format!("touched-{i}"));
            self.ls.put(k.clone(), v.clone());
            self.model.insert(k, v);
        }
        self.ls.commit().expect("commit");
    }

    async fn snapshot(&self, parent: Option<&Manifest>) -> Manifest {
        let cut = self.format.capture(self.ls.store()).expect("capture");
        commit_snapshot(
            &self.format,
            cut,
            &self.repo,
            &self.sk,
            self.ls.changelog(),
            parent,
        )
        .await
        .expect("commit_snapshot")
    }

    /// `restore_store` into `target` (newest usable snapshot + tail).
    async fn restore_store(
        &self,
        format: &F,
        target: &Path,
    ) -> crate::Result<(F::Store, crate::restore::RestoreReport)> {
        restore_store(
            format,
            &self.repo,
            &self.sk,
            self.ls.changelog(),
            target,
            &RestoreOptions::default(),
        )
        .await
    }

    /// Restores `m` into `target` with a fresh format object.
    async fn restore(
        &self,
        make: &dyn Fn() -> F,
        m: &Manifest,
        target: &Path,
    ) -> crate::Result<(F::Store, RestoreStats)> {
        make()
            .restore(
                m,
                RestoreContext {
                    repo: &self.repo,
                    target,
                },
            )
            .await
    }
}

fn contents<S: StateStore + ?Sized>(s: &S) -> Model {
    s.iter()
        .expect("iter")
        .map(|kv| kv.expect("iter item"))
        .collect()
}

/// Every file under `dir` with its bytes (empty if `dir` is absent).
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            // A restore's background sync removes its mark when it ends,
            // whenever that is (`store::unsynced`): not a change to the
            // store, and no business of the test comparing trees.
            if e.file_name()
                .to_string_lossy()
                .starts_with(crate::store::unsynced::UNSYNCED_PREFIX)
            {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else if let Ok(b) = std::fs::read(&p) {
                out.insert(p.strip_prefix(root).unwrap_or(&p).to_path_buf(), b);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// A cut reports the store's offset and binding; an empty store's cut has
/// no offset (nothing to snapshot).
pub async fn capture_reflects_the_store<F: StoreFormat>(make: &dyn Fn() -> F) {
    let mut fx = Fixture::new(make);
    let empty = fx
        .format
        .capture(fx.ls.store())
        .expect("capture of an empty store");
    assert_eq!(
        fx.format.cut_offset(&empty),
        None,
        "offset of an empty store's cut"
    );
    fx.write(120, 1);
    let cut = fx.format.capture(fx.ls.store()).expect("capture");
    assert_eq!(
        fx.format.cut_offset(&cut),
        fx.ls.store().applied_offset().expect("applied_offset"),
        "the cut's offset is the store's applied offset"
    );
    assert_eq!(
        fx.format.cut_binding(&cut),
        fx.ls.store().binding().expect("binding"),
        "the cut carries the store's changelog binding"
    );
}

/// Write, snapshot, restore into a new directory: the restored store holds
/// exactly the model, at the snapshot's offset.
pub async fn round_trip_matches_a_model<F: StoreFormat>(make: &dyn Fn() -> F) {
    let mut fx = Fixture::new(make);
    fx.write(400, 2);
    let m = fx.snapshot(None).await;
    assert_eq!(
        Some(m.changelog.offset),
        fx.ls.store().applied_offset().expect("applied_offset")
    );
    let (store, _) = fx
        .restore(make, &m, &fx.path("restored"))
        .await
        .expect("restore");
    assert_eq!(contents(&store), fx.model, "restored contents");
    assert_eq!(
        store.applied_offset().expect("applied_offset"),
        Some(m.changelog.offset),
        "restored offset"
    );
}

/// Writes committed after the capture are not in the snapshot: it holds the
/// state at the cut's offset.
pub async fn a_cut_is_the_state_when_it_was_captured<F: StoreFormat>(make: &dyn Fn() -> F) {
    let mut fx = Fixture::new(make);
    fx.write(200, 3);
    let at_cut = fx.model.clone();
    let cut = fx.format.capture(fx.ls.store()).expect("capture");
    let offset = fx.format.cut_offset(&cut);
    fx.write(200, 4);
    let m = commit_snapshot(&fx.format, cut, &fx.repo, &fx.sk, fx.ls.changelog(), None)
        .await
        .expect("commit_snapshot");
    assert_eq!(Some(m.changelog.offset), offset);
    let (store, _) = fx
        .restore(make, &m, &fx.path("restored"))
        .await
        .expect("restore");
    assert_eq!(contents(&store), at_cut, "contents at the cut, not later");
}

/// A second snapshot after a small change (a few keys at one end of the key
/// space), with the first as parent, reuses some of the parent's bytes, and
/// restores exactly.
pub async fn an_incremental_snapshot_reuses_its_parent<F: StoreFormat>(make: &dyn Fn() -> F) {
    let mut fx = Fixture::new(make);
    fx.write(600, 5);
    let first = fx.snapshot(None).await;
    fx.touch(5);
    let second = fx.snapshot(Some(&first)).await;
    assert!(
        second.stats.bytes_reused > 0,
        "nothing of the parent was reused: {:?}",
        second.stats
    );
    let (store, _) = fx
        .restore(make, &second, &fx.path("restored"))
        .await
        .expect("restore");
    assert_eq!(contents(&store), fx.model);
}

/// A blob whose bytes rotted fails the restore with kind `corrupt`, and the
/// target keeps what it held (here: an earlier restore).
pub async fn a_corrupt_blob_fails_corrupt_and_leaves_the_target_as_it_was<F: StoreFormat>(
    make: &dyn Fn() -> F,
) {
    let mut fx = Fixture::new(make);
    fx.write(300, 7);
    let first = fx.snapshot(None).await;
    fx.write(300, 8);
    let second = fx.snapshot(None).await;
    let target = fx.path("target");
    let (store, _) = fx.restore(make, &first, &target).await.expect("restore");
    drop(store);
    let before = tree(&target);
    // A blob only the second snapshot has, so no local copy can stand in.
    let old: std::collections::BTreeSet<_> = first.files.iter().map(|f| f.blake3).collect();
    let victim = second
        .files
        .iter()
        .filter(|f| !old.contains(&f.blake3) && f.size > 0)
        .max_by_key(|f| f.size)
        .expect("the second snapshot has a file the first does not");
    let key = paths::blob(&fx.sk, &victim.blake3);
    let mut bytes = fx
        .base
        .get(&key)
        .await
        .expect("get blob")
        .bytes()
        .await
        .expect("blob bytes")
        .to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    fx.base
        .put(&key, PutPayload::from(bytes))
        .await
        .expect("put rotted blob");
    let err = match fx.restore(make, &second, &target).await {
        Ok(_) => panic!("a restore over a rotted blob succeeded"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(
        tree(&target) == before,
        "a failed restore changed the target's files"
    );
}

/// `restore_store` replaces a store it restored before, and refuses
/// (`config`) a non-empty directory that is not a store, leaving it whole.
pub async fn restore_replaces_its_own_store_and_refuses_a_foreign_directory<F: StoreFormat>(
    make: &dyn Fn() -> F,
) {
    let mut fx = Fixture::new(make);
    fx.write(150, 9);
    fx.snapshot(None).await;
    let target = fx.path("target");
    let format = make();
    let (store, _) = fx
        .restore_store(&format, &target)
        .await
        .expect("first restore");
    drop(store);
    fx.write(150, 10);
    let (store, report) = fx
        .restore_store(&format, &target)
        .await
        .expect("restore over its own earlier restore");
    assert!(report.snapshot.is_some(), "{report:?}");
    assert_eq!(contents(&store), fx.model, "snapshot + tail");
    drop(store);

    let foreign = fx.path("foreign");
    std::fs::create_dir_all(&foreign).expect("mkdir");
    std::fs::write(foreign.join("notes.txt"), b"not a store").expect("write");
    let err = match fx.restore_store(&format, &foreign).await {
        Ok(_) => panic!("a restore replaced a foreign directory"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(
        std::fs::read(foreign.join("notes.txt")).expect("read"),
        b"not a store"
    );
}
