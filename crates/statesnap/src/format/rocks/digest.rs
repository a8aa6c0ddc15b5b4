//! The logical digest and exact counts of a checkpoint: a read-only scan
//! in key ranges, on blocking threads, concurrent with the uploads.

use super::*;

/// What a scan of a checkpoint's data counted: its logical digest (with
/// the exact key count) and its logical bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counted {
    pub(super) digest: crate::digest::LogicalDigest,
    pub(super) logical_bytes: u64,
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
    let cf = db
        .cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .ok_or_else(|| {
            Error::corrupt(format!(
                "checkpoint has no default column family path=`{}`",
                dir.display()
            ))
        })?;
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
    }))
}

impl RocksFormat {
    /// Counts the checkpoint `dir`'s contents: opens it read-only and reads
    /// its data in [`scan_parts`] key ranges, each on a blocking thread
    /// (`util::blocking`: never the processing thread, never an executor
    /// thread), their digests and byte counts summed. Each range task holds
    /// the directory until it ends. `Ok(None)` when `stop` was set first.
    pub(super) async fn count_checkpoint(
        &self,
        dir: Arc<CheckpointDir>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Option<Counted>> {
        let (opts, cfs) = self.cf_descriptors();
        let d = Arc::clone(&dir);
        let (db, splits) = blocking(move || {
            let db = DB::open_cf_descriptors_read_only(&opts, &d.0, cfs, false)
                .map_err(|e| rocks_error("open checkpoint read-only", &d.0, e))?;
            let live = db
                .live_files()
                .map_err(|e| rocks_error("list checkpoint files", &d.0, e))?;
            let splits = split_keys(&live, scan_parts());
            Ok((Arc::new(db), splits))
        })
        .await?;
        let mut bounds: Vec<Option<Vec<u8>>> = vec![None];
        bounds.extend(splits.into_iter().map(Some));
        let n = bounds.len();
        // The last range takes `db` itself: only the tasks hold it, so it
        // is closed on a blocking thread.
        let mut db = Some(db);
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let lower = bounds[i].clone();
            let upper = bounds.get(i + 1).cloned().flatten();
            let db = if i + 1 == n {
                db.take()
            } else {
                db.as_ref().map(Arc::clone)
            };
            let (dir, stop, stop_others) = (Arc::clone(&dir), Arc::clone(&stop), Arc::clone(&stop));
            let scan = blocking(move || {
                let r = match &db {
                    Some(db) => scan_range(db, &dir.0, lower.as_deref(), upper, &stop),
                    None => Ok(None),
                };
                // The database before its directory.
                drop(db);
                drop(dir);
                r
            });
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
}
