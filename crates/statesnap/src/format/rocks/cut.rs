//! The cut: a RocksDB checkpoint in a staging directory of its own, its
//! metadata, and the optional compaction of it before it is written.

use super::*;

/// What a checkpoint's metadata says.
pub(super) struct CheckpointInfo {
    pub(super) offset: Option<u64>,
    pub(super) binding: Option<ChangelogBinding>,
    pub(super) keys: u64,
    pub(super) bytes: u64,
}

/// A consistent cut of a [`RocksStore`]: a checkpoint directory this value
/// owns (removed on drop, once the scan that counts its contents let go of
/// it too), with the offset and statistics read from it.
#[derive(Debug)]
pub struct RocksCut {
    pub(super) dir: Arc<CheckpointDir>,
    pub(super) files: Vec<(String, u64)>,
    pub(super) offset: Option<u64>,
    pub(super) binding: Option<ChangelogBinding>,
    pub(super) keys: u64,
    pub(super) logical_bytes: u64,
    pub(super) incarnation: uuid::Uuid,
    /// SST bytes of the data column family, and of those the bytes certain
    /// to hold one version of each key (read at capture; see
    /// [`RocksCut::space_amplification`]).
    pub(super) data_bytes: u64,
    pub(super) bottom_bytes: u64,
    /// SST files of the metadata column family (the applied offset and the
    /// binding): a new one with every snapshot, a few KiB each.
    pub(super) meta_files: std::collections::HashSet<String>,
    /// Set once the write step compacted the checkpoint: its files are no
    /// longer the live store's.
    pub(super) compacted: Option<Compacted>,
    /// The store's record of its writes, and this cut's place in it: what
    /// lets the write derive the digest from the previous cut's.
    pub(super) follow: Option<(Follow, Sealed)>,
}

/// What compacting a checkpoint did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Compacted {
    pub(super) sst_bytes_before: u64,
    pub(super) secs: f64,
}

impl RocksCut {
    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// Files of the checkpoint: name and size, sorted by name.
    pub fn files(&self) -> &[(String, u64)] {
        &self.files
    }

    /// The incarnation of the store it was taken from.
    pub fn incarnation(&self) -> uuid::Uuid {
        self.incarnation
    }

    /// Bytes of its SST and blob files.
    pub fn sst_bytes(&self) -> u64 {
        self.files
            .iter()
            .filter(|(n, _)| is_immutable(n))
            .map(|(_, s)| s)
            .sum()
    }

    /// Its space amplification, bounded from above: the data's SST bytes
    /// over those certain to hold one version of each key — the bottommost
    /// level (with everything still in level 0: its largest files that do
    /// not overlap), and other files whose key range meets none of those
    /// (everything else may be newer versions of the same keys). 1.0 for a
    /// store without data.
    pub fn space_amplification(&self) -> f64 {
        if self.bottom_bytes == 0 {
            return 1.0;
        }
        self.data_bytes as f64 / self.bottom_bytes as f64
    }
}

/// When the write step compacts a checkpoint before uploading it (see the
/// module docs, "Space amplification").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactionPolicy {
    /// Compact a checkpoint whose SST bytes exceed this multiple of the
    /// store's live data (default 1.3).
    pub max_space_amplification: f64,
    /// Never compact a checkpoint of fewer SST bytes (default 4 MiB: below
    /// that a restore is mostly fixed costs, and the bytes saved do not pay
    /// for the rewrite).
    pub min_bytes: u64,
    /// At most one compacted snapshot per store incarnation in this interval
    /// (default 10 minutes). Each one rewrites and uploads the live data
    /// once, and the next snapshot uploads the live store's own files once
    /// more; the interval bounds that cost for frequent snapshots.
    pub min_interval: std::time::Duration,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            max_space_amplification: 1.3,
            min_bytes: 4 << 20,
            min_interval: std::time::Duration::from_secs(600),
        }
    }
}

/// A checkpoint directory, removed when its last owner lets go: the cut,
/// and the blocking scan that counts its contents (which finishes on its
/// own thread if the write is cancelled under it).
#[derive(Debug)]
pub(super) struct CheckpointDir(pub(super) PathBuf, pub(super) ParentOnDrop);

/// What happens to a checkpoint's staging directory when the checkpoint
/// goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ParentOnDrop {
    /// The default `<store>.statesnap-staging`, ours: removed once empty,
    /// so no empty directory outlives the snapshots beside the store.
    RemoveIfEmpty,
    /// A root the caller chose ([`RocksFormat::with_staging_root`]): kept.
    Keep,
}

impl Drop for CheckpointDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), error = %e, "cannot remove checkpoint; the next capture will");
        }
        unregister_live(&self.0);
        if self.1 == ParentOnDrop::RemoveIfEmpty
            && let Some(parent) = self.0.parent()
        {
            // Fails (and is meant to) while another checkpoint is in it; a
            // capture that finds it gone makes it again.
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Whether RocksDB never rewrites a file of this name once written.
pub(super) fn is_immutable(name: &str) -> bool {
    name.ends_with(".sst") || name.ends_with(".blob")
}

/// File names of the metadata column family's SSTs among `live`.
pub(super) fn meta_names(live: &[rocksdb::LiveFile]) -> impl Iterator<Item = String> + '_ {
    live.iter()
        .filter(|f| f.column_family_name == META_CF)
        .filter_map(|f| Path::new(&f.name).file_name())
        .map(|n| n.to_string_lossy().into_owned())
}

/// The live SST files of `store` now.
pub(super) fn live_files(store: &RocksStore) -> Result<Vec<rocksdb::LiveFile>> {
    store
        .db()
        .live_files()
        .map_err(|e| rocks_error("list live files", store.path(), e))
}

/// Which of a checkpoint's files (name and size) its manifest carries
/// inline: the mutable ones and the metadata column family's SSTs (`meta`;
/// the data's SSTs stay blobs, which later snapshots reuse by reference),
/// the smallest first, each at most [`MAX_INLINE_FILE`], while they fit in
/// [`MAX_INLINE_TOTAL`].
pub(super) fn inline_choice(
    files: &[(String, u64)],
    meta: &std::collections::HashSet<String>,
) -> Vec<bool> {
    let mut by_size: Vec<usize> = (0..files.len())
        .filter(|&i| {
            let (name, size) = &files[i];
            (!is_immutable(name) || meta.contains(name)) && *size <= MAX_INLINE_FILE
        })
        .collect();
    by_size.sort_by_key(|&i| files[i].1);
    let mut chosen = vec![false; files.len()];
    let mut room = MAX_INLINE_TOTAL;
    for i in by_size {
        let Some(left) = room.checked_sub(files[i].1) else {
            break;
        };
        room = left;
        chosen[i] = true;
    }
    chosen
}

/// Files of a checkpoint that belong in a snapshot (not the info log or lock).
pub(super) fn snapshot_file(name: &str) -> bool {
    !(name == "LOCK" || name.starts_with("LOG"))
}

impl RocksFormat {
    /// [`StoreFormat::capture`]: a checkpoint of `store` in a staging
    /// directory of its own, and what it holds.
    pub(super) fn checkpoint(&self, store: &RocksStore) -> Result<RocksCut> {
        let root = self.staging_root_for(store.path());
        std::fs::create_dir_all(&root).map_err(|e| io_err("create staging directory", &root, e))?;
        remove_leftovers(&root, |n| n.starts_with(CHECKPOINT_PREFIX))?;
        let dir = root.join(format!(
            "{CHECKPOINT_PREFIX}{}",
            uuid::Uuid::new_v4().simple()
        ));
        register_live(&dir);
        // From here on the cut owns `dir`: dropping it (also on error) removes it.
        let mut cut = RocksCut {
            dir: Arc::new(CheckpointDir(
                dir,
                if self.staging_root.is_some() {
                    ParentOnDrop::Keep
                } else {
                    ParentOnDrop::RemoveIfEmpty
                },
            )),
            files: Vec::new(),
            offset: None,
            binding: None,
            keys: 0,
            logical_bytes: 0,
            incarnation: store.incarnation(),
            data_bytes: 0,
            bottom_bytes: 0,
            meta_files: std::collections::HashSet::new(),
            compacted: None,
            follow: None,
        };
        // The metadata column family's files, listed before the checkpoint
        // and after it: its flush can start a compaction that removes the
        // older ones from the live store while the checkpoint still holds
        // them, and the newest appears only after. (Which files these are
        // only decides what travels inline.)
        let mut meta_files: std::collections::HashSet<String> =
            meta_names(&live_files(store)?).collect();
        let cp = rocksdb::checkpoint::Checkpoint::new(store.db())
            .map_err(|e| rocks_error("checkpoint", store.path(), e))?;
        // log_size_for_flush = 0: flush memtables (atomically, both column
        // families) so the checkpoint is complete even with the WAL off.
        let mut made = cp.create_checkpoint_with_log_size(cut.dir(), 0);
        if made.is_err() && !root.is_dir() {
            // The previous cut removed the (then empty) staging directory
            // between our creating it and the checkpoint: make it again.
            std::fs::create_dir_all(&root)
                .map_err(|e| io_err("create staging directory", &root, e))?;
            made = cp.create_checkpoint_with_log_size(cut.dir(), 0);
        }
        made.map_err(|e| rocks_error("checkpoint", cut.dir(), e))?;
        // Read under the same borrow as the checkpoint: writes need `&mut`,
        // so the checkpoint holds exactly what these describe (module docs).
        // After it, so the statistics count the memtables it flushed.
        let info = read_info(store.db(), store.path())?;
        // The same borrow: the writes recorded so far are exactly those the
        // checkpoint holds.
        let sealed = store
            .follow()
            .lock()
            .seal(store.db().latest_sequence_number());
        cut.follow = Some((store.follow().clone(), sealed));
        let live = live_files(store)?;
        (cut.data_bytes, cut.bottom_bytes) = level_bytes(&live);
        meta_files.extend(meta_names(&live));
        cut.meta_files = meta_files;
        cut.files = list_checkpoint(cut.dir())?;
        cut.offset = info.offset;
        cut.binding = info.binding;
        cut.keys = info.keys;
        cut.logical_bytes = info.bytes;
        Ok(cut)
    }

    /// Compacts the cut's checkpoint in place if the policy asks for it.
    /// The checkpoint is this cut's own directory of hard links: compacting
    /// it writes new files there and unlinks its links, and the live
    /// store's files are never touched.
    pub(super) async fn compact_if_amplified(&self, cut: &mut RocksCut) -> Result<()> {
        let Some(policy) = self.compaction else {
            return Ok(());
        };
        let before = cut.sst_bytes();
        if before < policy.min_bytes || cut.space_amplification() <= policy.max_space_amplification
        {
            return Ok(());
        }
        if !self
            .lock_cache()
            .claim_compaction(cut.incarnation, policy.min_interval)
        {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let (opts, cfs) = self.cf_descriptors();
        let dir = cut.dir().to_path_buf();
        let expected = cut.offset;
        let files = blocking(move || {
            let db = DB::open_cf_descriptors(&opts, &dir, cfs)
                .map_err(|e| rocks_error("open checkpoint to compact", &dir, e))?;
            for name in [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF] {
                let cf = db.cf_handle(name).ok_or_else(|| {
                    Error::corrupt(format!(
                        "checkpoint has no column family `{name}` path=`{}`",
                        dir.display()
                    ))
                })?;
                db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
            }
            // Same contents, same offset: anything else is a bug here.
            let offset = read_applied_offset(&db, &dir)?;
            if offset != expected {
                return Err(Error::internal(format!(
                    "compacting a checkpoint changed its offset path=`{}` before={expected:?} \
                     after={offset:?}",
                    dir.display()
                )));
            }
            drop(db);
            list_checkpoint(&dir)
        })
        .await?;
        cut.files = files;
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(
            path = %cut.dir().display(),
            sst_bytes_before = before,
            sst_bytes_after = cut.sst_bytes(),
            secs,
            "compacted a space-amplified checkpoint before upload"
        );
        cut.compacted = Some(Compacted {
            sst_bytes_before: before,
            secs,
        });
        Ok(())
    }
}

/// The files of a checkpoint that belong in a snapshot: name and size,
/// sorted by name.
pub(super) fn list_checkpoint(dir: &Path) -> Result<Vec<(String, u64)>> {
    let mut files = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| io_err("list checkpoint", dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| io_err("list checkpoint", dir, e))?;
        let meta = entry
            .metadata()
            .map_err(|e| io_err("stat checkpoint file", &entry.path(), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if meta.is_file() && snapshot_file(&name) {
            files.push((name, meta.len()));
        }
    }
    files.sort();
    Ok(files)
}

/// SST bytes of the data column family, and of those the bytes that hold
/// at most one version of each key: a reference set of files whose key
/// ranges do not overlap — the bottommost non-empty level, or with
/// everything still in level 0 the largest files taken greedily while they
/// overlap none already taken — plus every other file whose key range meets
/// none of the reference's (its keys cannot be newer versions of the
/// reference's: a store growing in key order).
pub(super) fn level_bytes(files: &[rocksdb::LiveFile]) -> (u64, u64) {
    let mut data: Vec<&rocksdb::LiveFile> = files
        .iter()
        .filter(|f| f.column_family_name == rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .collect();
    let total = data.iter().map(|f| f.size as u64).sum();
    pub(super) fn range(f: &rocksdb::LiveFile) -> Option<(&[u8], &[u8])> {
        Some((f.start_key.as_deref()?, f.end_key.as_deref()?))
    }
    // Sorted by first key and non-overlapping: a key range meets one of
    // them iff it meets the last one starting at or before its end.
    let meets = |ranges: &[(&[u8], &[u8])], f: &rocksdb::LiveFile| -> bool {
        let Some((start, end)) = range(f) else {
            return true;
        };
        let i = ranges.partition_point(|(s, _)| *s <= end);
        i > 0 && ranges[i - 1].1 >= start
    };
    let bottom = data.iter().map(|f| f.level).max().unwrap_or(0);
    let mut reference: Vec<(&[u8], &[u8])> = Vec::new();
    let mut single = 0u64;
    if bottom > 0 {
        for f in data.iter().filter(|f| f.level == bottom) {
            single += f.size as u64;
            reference.extend(range(f));
        }
        reference.sort();
    } else {
        data.sort_by_key(|f| std::cmp::Reverse(f.size));
        for f in &data {
            if let Some(r) = range(f)
                && !meets(&reference, f)
            {
                single += f.size as u64;
                let at = reference.partition_point(|x| *x < r);
                reference.insert(at, r);
            }
        }
        return (total, single);
    }
    single += data
        .iter()
        .filter(|f| f.level != bottom && !meets(&reference, f))
        .map(|f| f.size as u64)
        .sum::<u64>();
    (total, single)
}

/// Offset, binding and statistics of an open database.
pub(super) fn read_info(db: &DB, dir: &Path) -> Result<CheckpointInfo> {
    let offset = read_applied_offset(db, dir)?;
    let binding = read_binding(db, dir)?;
    let cf = db
        .cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .ok_or_else(|| {
            Error::corrupt(format!(
                "store has no default column family path=`{}`",
                dir.display()
            ))
        })?;
    let prop = |name: &str| -> Result<u64> {
        Ok(db
            .property_int_value_cf(cf, name)
            .map_err(|e| rocks_error("property", dir, e))?
            .unwrap_or(0))
    };
    let keys = prop("rocksdb.estimate-num-keys")?;
    let bytes = prop("rocksdb.estimate-live-data-size")?;
    Ok(CheckpointInfo {
        offset,
        binding,
        keys,
        bytes,
    })
}
