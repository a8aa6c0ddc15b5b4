//! Restoring a snapshot: files reused from the local store or downloaded
//! into staging, inline files written, then swapped into place.

use super::*;

/// Hard-links (or copies) `local` to `dest` if its bytes hash to `f.blake3`
/// (`held`: the staging directory `dest` is in, kept while the step runs).
pub(super) async fn reuse_local(
    (f, local, dest): (FileEntry, PathBuf, PathBuf),
    held: Hold,
) -> Result<(FileEntry, PathBuf, bool)> {
    let expected = f.blake3;
    let d = dest.clone();
    let ok = blocking_held(held, move || {
        if hash_file(&local)? != expected {
            return Ok(false);
        }
        if let Some(p) = d.parent() {
            std::fs::create_dir_all(p).map_err(|e| io_err("create directory", p, e))?;
        }
        if std::fs::hard_link(&local, &d).is_err() {
            std::fs::copy(&local, &d).map_err(|e| io_err("copy local file", &local, e))?;
        }
        Ok(true)
    })
    .await?;
    Ok((f, dest, ok))
}

/// Writes a manifest's inline files (checked against their hashes) under
/// `dir`, fsyncing each if `sync`.
pub(super) fn write_inline(
    files: &[crate::repo::InlineFile],
    dir: &Path,
    sync: bool,
) -> Result<()> {
    for f in files {
        let bytes = f.bytes()?;
        let dest = Manifest::file_path_within(dir, &f.path)?;
        if let Some(p) = dest.parent() {
            std::fs::create_dir_all(p).map_err(|e| io_err("create directory", p, e))?;
        }
        let mut file = std::fs::File::create(&dest).map_err(|e| io_err("create file", &dest, e))?;
        std::io::Write::write_all(&mut file, &bytes).map_err(|e| io_err("write file", &dest, e))?;
        if sync {
            file.sync_all()
                .map_err(|e| io_err("fsync file", &dest, e))?;
        }
    }
    Ok(())
}

/// Downloads one verified file, naming it in any error.
pub(super) async fn download_one(
    repo: &crate::repo::Repository,
    sk: &crate::repo::StoreKey,
    id: crate::repo::SnapshotId,
    f: FileEntry,
    dest: PathBuf,
    sync: bool,
) -> Result<()> {
    repo.blobs()
        .get_blob_to_file_with(sk, &BlobRef::from(&f), &dest, sync)
        .await
        .map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "cannot restore snapshot file file=`{}` snapshot=`{id}`: {}",
                    f.path,
                    e.message()
                ),
            )
            .with_source(e)
        })
}

impl RocksFormat {
    /// [`StoreFormat::restore`].
    pub(super) async fn restore_snapshot(
        &self,
        manifest: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> Result<(RocksStore, RestoreStats)> {
        if manifest.store_format.name != FORMAT_NAME
            || manifest.store_format.version > FORMAT_VERSION
        {
            return Err(Error::config(format!(
                "snapshot was not written by this rocksdb format snapshot=`{}` format=`{}` version={}",
                manifest.snapshot_id, manifest.store_format.name, manifest.store_format.version
            )));
        }
        let repo = ctx.repo;
        let target = normalize_target(ctx.target)?;
        check_replaceable(&target)?;
        self.clean_leftovers(&target)?;
        let (staging, guard) = new_restore_staging(&target)?;
        std::fs::create_dir(&staging)
            .map_err(|e| io_err("create staging directory", &staging, e))?;

        let started = std::time::Instant::now();
        let mut stats = RestoreStats::default();
        // Background: the files are fsynced after the store is published,
        // which a mark with this boot's id makes safe (`store::unsynced`).
        let boot = match repo.transfer().restore_sync {
            crate::repo::RestoreSync::Background => unsynced::boot_id(),
            crate::repo::RestoreSync::Immediate => None,
        };
        fill_staging(repo, manifest, &staging, &target, boot, &mut stats).await?;
        stats.transfer = started.elapsed();

        let started = std::time::Instant::now();
        let this = self.clone();
        let manifest_c = manifest.clone();
        let staging_c = staging.clone();
        let target_c = target.clone();
        // Held: if this restore is cancelled meanwhile, the install still
        // finishes, and the staging paths (this one and, when `target` is
        // itself one, the outer one) are removed only after it.
        let held = hold(&[&staging, &target]);
        let store = blocking_held(held, move || {
            this.install(&staging_c, &target_c, &manifest_c)
        })
        .await?;
        // `staging` was renamed to `target`: nothing left to remove.
        guard.disarm();
        drop(guard);
        self.seed_cache(store.incarnation(), &manifest.files);
        stats.open = started.elapsed();
        Ok((store, stats))
    }

    /// Reads offset, binding and statistics from a store directory, opened
    /// read-only.
    pub(super) fn read_checkpoint(&self, dir: &Path) -> Result<CheckpointInfo> {
        let (opts, cfs) = self.cf_descriptors();
        let db = DB::open_cf_descriptors_read_only(&opts, dir, cfs, false)
            .map_err(|e| rocks_error("open checkpoint read-only", dir, e))?;
        read_info(&db, dir)
    }

    pub(super) fn seed_cache(&self, incarnation: uuid::Uuid, files: &[FileEntry]) {
        self.lock_cache().replace(
            incarnation,
            files
                .iter()
                .filter(|f| is_immutable(&f.path))
                .map(|f| (f.path.clone(), f.size, f.blake3)),
        );
    }

    /// Moves `staging` over `target`, opens the store and checks its offset;
    /// on failure puts the old target back.
    pub(super) fn install(
        &self,
        staging: &Path,
        target: &Path,
        manifest: &Manifest,
    ) -> Result<RocksStore> {
        swap_into_place(staging, target, |target| {
            use crate::store::StateStore;
            let mut store = RocksStore::open(target, &self.options)?;
            // A checkpoint of a bound store carries its binding; one taken
            // before bindings existed is bound here, from the manifest.
            crate::store::bind_restored(&mut store, &manifest.changelog.binding())?;
            let applied = store.applied_offset()?;
            if applied != Some(manifest.changelog.offset) {
                return Err(Error::corrupt(format!(
                    "restored store does not sit at its snapshot's offset snapshot=`{}` \
                     snapshot_offset={} applied_offset={applied:?} path=`{}`",
                    manifest.snapshot_id,
                    manifest.changelog.offset,
                    target.display()
                )));
            }
            Ok(store)
        })
    }
}

/// The snapshot's files sorted into those a same-sized local file may
/// stand in for (to be hash-checked) and those to download.
#[allow(clippy::type_complexity)]
fn sort_files(
    manifest: &Manifest,
    staging: &Path,
    target: &Path,
) -> Result<(
    Vec<(FileEntry, PathBuf)>,
    Vec<(FileEntry, PathBuf, PathBuf)>,
)> {
    let mut downloads: Vec<(FileEntry, PathBuf)> = Vec::new();
    let mut candidates: Vec<(FileEntry, PathBuf, PathBuf)> = Vec::new();
    for f in &manifest.files {
        let dest = Manifest::file_path_within(staging, &f.path)?;
        let local = Manifest::file_path_within(target, &f.path)?;
        // `symlink_metadata`: a symlink in the old store is never followed
        // (its target could be anything, anywhere) nor carried over.
        let same_size = is_immutable(&f.path)
            && std::fs::symlink_metadata(&local).is_ok_and(|m| m.is_file() && m.len() == f.size);
        if same_size {
            candidates.push((f.clone(), local, dest));
        } else {
            downloads.push((f.clone(), dest));
        }
    }
    Ok((downloads, candidates))
}

/// Fills `staging` with the snapshot's files (reused local ones, verified
/// downloads, inline ones), marks it as a store (and unsynced, with the
/// boot id, when `boot` is given) and makes its entries durable.
async fn fill_staging(
    repo: &crate::repo::Repository,
    manifest: &Manifest,
    staging: &Path,
    target: &Path,
    boot: Option<&'static str>,
    stats: &mut RestoreStats,
) -> Result<()> {
    let sk = &manifest.store_key;
    // Files reused from a store that is itself still marked may not be
    // on disk yet: an immediate restore must sync them too.
    let reused_unsynced = boot.is_none() && unsynced::is_marked(target)?;
    let (mut downloads, candidates) = sort_files(manifest, staging, target)?;
    let parallelism = repo.transfer().parallelism.max(1);
    // Local-first: a local file is reused only if its bytes hash to the
    // manifest's blake3, never on name and size alone.
    // Errors drain the transfers still running before the guard removes
    // `staging`, so none of them re-creates it (see `drain_bounded`).
    let checked: Vec<(FileEntry, PathBuf, bool)> = drain_bounded(candidates, parallelism, |c| {
        reuse_local(c, hold(&[staging]))
    })
    .await?;
    for (f, dest, ok) in checked {
        if ok {
            stats.files_reused_locally += 1;
            stats.bytes_reused_locally += f.size;
        } else {
            downloads.push((f, dest));
        }
    }
    for (f, _) in &downloads {
        stats.files_downloaded += 1;
        stats.bytes_downloaded += f.size;
    }
    let id = manifest.snapshot_id;
    let sync_each = boot.is_none();
    drain_bounded(downloads, parallelism, |(f, dest)| {
        download_one(repo, sk, id, f, dest, sync_each)
    })
    .await?;
    if !manifest.inline_files.is_empty() {
        let (inline, s) = (manifest.inline_files.clone(), staging.to_path_buf());
        blocking_held(hold(&[staging]), move || {
            write_inline(&inline, &s, sync_each)
        })
        .await?;
    }
    crate::store::mark_store_dir(staging)?;
    if let Some(boot) = boot {
        unsynced::mark(staging, boot)?;
    } else if reused_unsynced {
        let s = staging.to_path_buf();
        blocking_held(hold(&[staging]), move || sync_tree(&s)).await?;
    }
    // Immediate: every file was fsynced by its download. Background:
    // the mark. Either way the directory's entries must be durable
    // before the rename publishes it.
    let s = staging.to_path_buf();
    blocking_held(hold(&[staging]), move || sync_dir(&s)).await?;
    Ok(())
}
