//! The logical digest and exact counts of a checkpoint: derived from the
//! previous cut's by looking up the keys written in between, or a
//! read-only scan in key ranges; on blocking threads, concurrent with the
//! uploads (module docs, "Contents: digest and counts").

use super::*;

/// What a scan of a checkpoint's data counted: its logical digest (with
/// the exact key count) and its logical bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counted {
    pub(super) digest: crate::digest::LogicalDigest,
    pub(super) logical_bytes: u64,
    /// How: `None` scanned; `Some(n)` derived from the previous cut's by
    /// looking up the `n` keys written since.
    pub(super) derived_from: Option<u64>,
}

impl Counted {
    /// `digest` in the manifest's format metadata: `scanned` or `derived`.
    pub(super) fn how(&self) -> &'static str {
        if self.derived_from.is_some() {
            "derived"
        } else {
            "scanned"
        }
    }
}

/// The most keys a derivation looks up for a base of `base_keys` keys:
/// beyond an eighth of the store, two point lookups per key cost more than
/// reading every pair in order once. At least 16 384.
pub(super) fn max_derived_keys(base_keys: u64) -> usize {
    usize::try_from(base_keys / 8)
        .unwrap_or(usize::MAX)
        .max(16_384)
}

/// At some of the written keys: the base's pairs (`removed`: the cut no
/// longer has them) and the last values written (`added`), with their bytes.
#[derive(Default)]
struct Delta {
    removed: crate::digest::LogicalDigest,
    added: crate::digest::LogicalDigest,
    bytes_removed: u64,
    bytes_added: u64,
}

/// Looks the written keys (sorted) up in the base's checkpoint (open
/// read-only); their new pairs are the values written. Blocking.
/// `Ok(None)` when `stop` was set first.
fn delta(
    base: &DB,
    dir: &Path,
    changes: &[(bytes::Bytes, Option<bytes::Bytes>)],
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Option<Delta>> {
    let mut d = Delta::default();
    let cf = data_cf(base, dir)?;
    for chunk in changes.chunks(1024) {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        let old = base.batched_multi_get_cf(cf, chunk.iter().map(|(k, _)| k), true);
        for ((k, new), old) in chunk.iter().zip(old) {
            if let Some(v) = old.map_err(|e| rocks_error("look up written keys", dir, e))? {
                d.removed.add(k, &v);
                d.bytes_removed += (k.len() + v.len()) as u64;
            }
            if let Some(v) = new {
                d.added.add(k, v);
                d.bytes_added += (k.len() + v.len()) as u64;
            }
        }
    }
    Ok(Some(d))
}

/// Opens a checkpoint read-only with `format`'s options. Blocking.
pub(super) fn open_read_only(format: &RocksFormat, dir: &Path) -> Result<DB> {
    let (opts, cfs) = format.cf_descriptors();
    DB::open_cf_descriptors_read_only(&opts, dir, cfs, false)
        .map_err(|e| rocks_error("open checkpoint read-only", dir, e))
}

fn data_cf<'d>(db: &'d DB, dir: &Path) -> Result<&'d rocksdb::ColumnFamily> {
    db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .ok_or_else(|| {
            Error::corrupt(format!(
                "checkpoint has no default column family path=`{}`",
                dir.display()
            ))
        })
}

/// Sets its flag when dropped: stops a scan whose write was cancelled or
/// failed.
pub(super) struct StopOnDrop(pub(super) Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How many parts a checkpoint's scan is split into, each read on a
/// blocking thread of its own: the machine's cores, at most 4.
pub(super) fn scan_parts() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Keys splitting a checkpoint's data into at most `parts` ranges of about
/// equal SST bytes: the first keys of its files (sorted), where the bytes
/// before them cross a quantile. Sorted and distinct. Any keys would be
/// correct — the ranges between them partition the key space — these only
/// balance the work.
pub(super) fn split_keys(live: &[rocksdb::LiveFile], parts: usize) -> Vec<Vec<u8>> {
    let mut files: Vec<(&[u8], u64)> = live
        .iter()
        .filter(|f| f.column_family_name == rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .filter_map(|f| Some((f.start_key.as_deref()?, f.size as u64)))
        .collect();
    files.sort();
    let total: u64 = files.iter().map(|f| f.1).sum();
    let parts = parts.max(1) as u64;
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let (mut before, mut next) = (0u64, 1u64);
    for (start, size) in files {
        if next < parts && before > 0 && before >= total / parts * next {
            if keys.last().is_none_or(|k| k.as_slice() < start) {
                keys.push(start.to_vec());
            }
            next += 1;
        }
        before += size;
    }
    keys
}

/// Reads every live pair of the data column family of `db` (a checkpoint
/// at `dir`, opened read-only) in `[lower, upper)` into a logical digest
/// and a byte count. Blocking. `Ok(None)` when `stop` was set before it
/// finished.
pub(super) fn scan_range(
    db: &DB,
    dir: &Path,
    lower: Option<&[u8]>,
    upper: Option<Vec<u8>>,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Option<Counted>> {
    let cf = data_cf(db, dir)?;
    let mut read = rocksdb::ReadOptions::default();
    // One pass over everything: nothing worth keeping in the block cache.
    read.fill_cache(false);
    read.set_readahead_size(2 << 20);
    if let Some(u) = upper {
        read.set_iterate_upper_bound(u);
    }
    let mut it = db.raw_iterator_cf_opt(cf, read);
    match lower {
        Some(l) => it.seek(l),
        None => it.seek_to_first(),
    }
    let mut digest = crate::digest::LogicalDigest::new();
    let mut logical_bytes = 0u64;
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        digest.add(k, v);
        logical_bytes += (k.len() + v.len()) as u64;
        if digest.keys().is_multiple_of(4096) && stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        it.next();
    }
    it.status()
        .map_err(|e| rocks_error("read checkpoint", dir, e))?;
    Ok(Some(Counted {
        digest,
        logical_bytes,
        derived_from: None,
    }))
}

impl RocksFormat {
    /// Counts the cut's contents: derives the digest from the base's if
    /// the store's record of its writes allows
    /// ([`Written::derivation`](crate::store::written)) — the cut's
    /// checkpoint is then not even opened — else opens the checkpoint
    /// read-only and reads every pair. Returns the count, and the
    /// checkpoint's handle if it was opened. `Ok(None)` when `stop` was set
    /// first.
    pub(super) async fn count_cut(
        &self,
        cut: &RocksCut,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Option<(Counted, Option<Arc<DB>>)>> {
        let derivation = cut
            .follow
            .as_ref()
            .and_then(|(f, sealed)| f.lock().derivation(*sealed, max_derived_keys));
        if let (Some(d), Some((follow, _))) = (derivation, &cut.follow) {
            match self.derive(d, follow.clone(), Arc::clone(&stop)).await {
                Ok(counted) => return Ok(counted.map(|c| (c, None))),
                // The base's checkpoint could not be read (removed by hand,
                // a disk error): this cut is scanned, and following starts
                // again from it.
                Err(e) => {
                    tracing::warn!(error = %e, "cannot derive the digest from the previous snapshot's checkpoint; reading every pair instead");
                    follow.lock().lose();
                }
            }
        }
        let format = self.clone();
        let d = Arc::clone(&cut.dir);
        let (db, splits) = blocking(move || {
            let db = open_read_only(&format, &d.0)?;
            let live = db
                .live_files()
                .map_err(|e| rocks_error("list checkpoint files", &d.0, e))?;
            let splits = split_keys(&live, scan_parts());
            Ok((Arc::new(db), splits))
        })
        .await?;
        match scan(Arc::clone(&db), splits, Arc::clone(&cut.dir), stop).await {
            Ok(Some(c)) => Ok(Some((c, Some(db)))),
            other => {
                // Closing a database is file I/O: on a blocking thread.
                blocking(move || {
                    drop(db);
                    Ok(())
                })
                .await?;
                other.map(|_| None)
            }
        }
    }

    /// The cut's digest from the base's: minus the base's pairs at the
    /// keys written in between, plus the values written, the base looked
    /// up in [`scan_parts`] parts on blocking threads (opened first if the
    /// background open after its snapshot has not yet).
    async fn derive(
        &self,
        d: Derivation,
        follow: Follow,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Option<Counted>> {
        let base = match d.base_db.clone() {
            Some(db) => db,
            None => {
                let (format, path, hold) =
                    (self.clone(), d.base_path.clone(), Arc::clone(&d.base_hold));
                let db = blocking(move || {
                    let db = open_read_only(&format, &path);
                    drop(hold);
                    db
                })
                .await?;
                let db = Arc::new(db);
                // Kept as the base's handle unless the background open was
                // first (then this one closes here, after the lock).
                let unused = follow.lock().base_opened(d.base_cut, Arc::clone(&db));
                drop(unused);
                db
            }
        };
        let changes = Arc::new(d.changes);
        let n = changes.len();
        let per = n.div_ceil(scan_parts()).max(1);
        let mut tasks = Vec::new();
        for start in (0..n).step_by(per) {
            let (changes, base, path, hold, stop) = (
                Arc::clone(&changes),
                Arc::clone(&base),
                d.base_path.clone(),
                Arc::clone(&d.base_hold),
                Arc::clone(&stop),
            );
            tasks.push(blocking(move || {
                let r = delta(&base, &path, &changes[start..(start + per).min(n)], &stop);
                if r.is_err() {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                // The handle before the directory it reads.
                drop(base);
                drop(hold);
                r
            }));
        }
        let mut digest = d.base_digest;
        let mut logical_bytes = d.base_bytes;
        let mut stopped = false;
        for part in futures::future::join_all(tasks).await {
            match part? {
                Some(delta) => {
                    digest.subtract(&delta.removed);
                    digest.merge(&delta.added);
                    logical_bytes = (logical_bytes + delta.bytes_added)
                        .checked_sub(delta.bytes_removed)
                        .ok_or_else(|| {
                            Error::internal(
                                "a derived byte count went below zero: the previous snapshot's count was wrong",
                            )
                        })?;
                }
                None => stopped = true,
            }
        }
        Ok((!stopped).then_some(Counted {
            digest,
            logical_bytes,
            derived_from: Some(n as u64),
        }))
    }
}

/// Reads every live pair of the cut in key ranges split at `splits`, each
/// on a blocking thread, their digests and byte counts summed. Each range
/// task holds the directory until it ends.
async fn scan(
    db: Arc<DB>,
    splits: Vec<Vec<u8>>,
    dir: Arc<CheckpointDir>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Result<Option<Counted>> {
    let mut bounds: Vec<Option<Vec<u8>>> = vec![None];
    bounds.extend(splits.into_iter().map(Some));
    let n = bounds.len();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let lower = bounds[i].clone();
        let upper = bounds.get(i + 1).cloned().flatten();
        let (db, dir, stop, stop_others) = (
            Arc::clone(&db),
            Arc::clone(&dir),
            Arc::clone(&stop),
            Arc::clone(&stop),
        );
        let scan = blocking(move || scan_range(&db, &dir.0, lower.as_deref(), upper, &stop));
        tasks.push(async move {
            let r = scan.await;
            if r.is_err() {
                // A failed range stops the others.
                stop_others.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            r
        });
    }
    let mut total = Counted {
        digest: crate::digest::LogicalDigest::new(),
        logical_bytes: 0,
        derived_from: None,
    };
    let (mut stopped, mut failed) = (false, None);
    // Every task is awaited, also after a failure (which stops the
    // others), so none holds the directory when this returns.
    for part in futures::future::join_all(tasks).await {
        match part {
            Ok(Some(c)) => {
                total.digest.merge(&c.digest);
                total.logical_bytes += c.logical_bytes;
            }
            Ok(None) => stopped = true,
            Err(e) => {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok((!stopped).then_some(total)),
    }
}
