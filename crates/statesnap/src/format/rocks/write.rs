//! Writing a cut: each checkpoint file reused, known or uploaded, the
//! small mutable ones inline, and the snapshot's statistics.

use super::*;

pub(super) fn hash_file(path: &Path) -> Result<BlobHash> {
    let f = std::fs::File::open(path).map_err(|e| io_err("open file to hash", path, e))?;
    let mut h = blake3::Hasher::new();
    h.update_reader(std::io::BufReader::with_capacity(1 << 20, f))
        .map_err(|e| io_err("read file to hash", path, e))?;
    Ok(BlobHash::from(h.finalize()))
}

pub(super) async fn hash_file_async(path: PathBuf) -> Result<BlobHash> {
    blocking(move || hash_file(&path)).await
}

/// One checkpoint file's part of a snapshot: reuse the parent's blob, or
/// one the repository already holds, or upload the file.
pub(super) async fn write_step(
    repo: crate::repo::Repository,
    sk: crate::repo::StoreKey,
    local: PathBuf,
    name: String,
    size: u64,
    plan: Plan,
) -> Result<(String, Done)> {
    // A parent's blob is reused only if it is still there: gc may have
    // swept it since (a retried snapshot re-uploads it from the checkpoint
    // instead of failing its commit again).
    let stored = |hash: BlobHash| {
        let (repo, sk) = (&repo, &sk);
        async move {
            Ok::<_, Error>(
                repo.blobs()
                    .head_blob(sk, &hash)
                    .await?
                    .is_some_and(|i| i.size == size),
            )
        }
    };
    let done = match plan {
        Plan::Inline => {
            let path = local.clone();
            let bytes =
                blocking(move || std::fs::read(&path).map_err(|e| io_err("read file", &path, e)))
                    .await?;
            // Chosen for its listed size; a file that changed since (not
            // one of ours) goes as a blob instead of overrunning the room.
            if bytes.len() as u64 == size {
                Done::Inline(bytes)
            } else {
                Done::Stored(repo.blobs().put_blob_file(&sk, &local).await?)
            }
        }
        Plan::Reuse(e) if stored(e.blake3).await? => Done::Reused(e),
        Plan::Known(hash) if stored(hash).await? => Done::Stored(PutOutcome {
            blob: BlobRef { hash, size },
            uploaded: false,
        }),
        Plan::CompareLocal(p)
            if hash_file_async(local.clone()).await? == p.blake3 && stored(p.blake3).await? =>
        {
            Done::Reused(FileEntry {
                path: name.clone(),
                size,
                blake3: p.blake3,
            })
        }
        // An SST is never written again once RocksDB finished it: a local
        // repository may link it (`TransferOptions::link_immutable_files`).
        _ if is_immutable(&name) => {
            Done::Stored(repo.blobs().put_immutable_file(&sk, &local).await?)
        }
        _ => Done::Stored(repo.blobs().put_blob_file(&sk, &local).await?),
    };
    Ok((name, done))
}

/// What one file's write step produced.
pub(super) enum Done {
    /// Named by the parent manifest: reuse its entry.
    Reused(FileEntry),
    /// Stored (uploaded, or found already present).
    Stored(PutOutcome),
    /// Read, to be carried in the manifest.
    Inline(Vec<u8>),
}

pub(super) enum Plan {
    /// Cached hash named by the parent.
    Reuse(FileEntry),
    /// Cached hash, not in the parent: the repository may still hold it.
    Known(BlobHash),
    /// Same name and size as this parent file, hash unknown: hash locally.
    CompareLocal(FileEntry),
    /// Upload (hashing while streaming).
    Upload,
    /// Carry in the manifest (small files; module docs, "Incremental write").
    Inline,
}

impl Plan {
    /// Order in which the write starts the steps: slowest kind first.
    pub(super) fn rank(&self) -> u8 {
        match self {
            Plan::Upload | Plan::CompareLocal(_) => 0,
            Plan::Known(_) | Plan::Reuse(_) => 1,
            Plan::Inline => 2,
        }
    }
}

pub(super) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl RocksFormat {
    /// [`StoreFormat::write`].
    pub(super) async fn write_cut(
        &self,
        mut cut: RocksCut,
        ctx: WriteContext<'_>,
    ) -> Result<FormatOutput> {
        let amplification = cut.space_amplification();
        self.compact_if_amplified(&mut cut).await?;
        // The contents' digest and exact counts: derived from the previous
        // cut's, or a scan of the checkpoint (after any compaction: same
        // contents, and it needs the directory to itself), on blocking
        // threads while the files upload. It holds the directory until it
        // ends, and stops early when this write fails or is dropped.
        let stop = StopOnDrop(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let scanned = async {
            if ctx.logical_digest {
                self.count_cut(&cut, Arc::clone(&stop.0)).await
            } else {
                Ok(None)
            }
        };
        let repo = ctx.repo;
        let sk = ctx.store_key;
        let mut plans = self.plan_files(&cut, ctx.parent);
        // The slowest steps first, so none waits for a slot behind a queue
        // of quick ones: uploads and local hashes, largest first, then the
        // `head`s of reused blobs, then the inline reads. (In name order,
        // an incremental snapshot's new SST came last, behind twenty
        // others: 1 M keys, 1 % rewritten, its upload started some 6 ms
        // into the write.)
        plans.sort_by_key(|(_, size, plan)| (plan.rank(), std::cmp::Reverse(*size)));
        let dir = cut.dir().to_path_buf();
        // Every step's blocking part (reading and hashing a file) runs on a
        // blocking thread, so the steps overlap one another and the
        // changelog's flush, and large files hash on every core.
        let step = |(name, size, plan): (String, u64, Plan)| {
            write_step(repo.clone(), sk.clone(), dir.join(&name), name, size, plan)
        };
        let uploads = async {
            let r = drain_bounded(plans, repo.transfer().parallelism.max(1), step).await;
            if r.is_err() {
                stop.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            r
        };
        // Both run to their end (a failed upload stops the scan), so the
        // checkpoint is gone once this write returns.
        let (results, counted) = futures::join!(uploads, scanned);
        let results: Vec<(String, Done)> = results?;
        let (counted, counted_db) = match counted? {
            Some((c, db)) => (Some(c), db),
            None => (None, None),
        };
        if ctx.logical_digest && counted.is_none() {
            return Err(Error::internal(
                "the checkpoint scan stopped before the write ended",
            ));
        }
        let (writer, hashes, sst_files) = record_files(repo, sk, results).await?;
        // Its contents known exactly, the checkpoint is the next cut's
        // base: kept until a newer one replaces it or the store closes.
        // What it displaces is closed on a blocking thread. A derived cut
        // was never opened: it is opened in the background, off this
        // snapshot's path, for the next derivation to find it open.
        if let (Some(c), Some((follow, sealed))) = (&counted, &cut.follow) {
            let opened = counted_db.is_some();
            let base = Base {
                cut: sealed.cut,
                generation: sealed.generation,
                digest: c.digest,
                logical_bytes: c.logical_bytes,
                db: counted_db,
                path: cut.dir().to_path_buf(),
                _hold: Arc::clone(&cut.dir) as Arc<dyn std::any::Any + Send + Sync>,
            };
            let displaced = follow.lock().set_base(base);
            if let Some(old) = displaced {
                blocking(move || {
                    drop(old);
                    Ok(())
                })
                .await?;
            }
            if !opened {
                self.open_base_in_background(follow.clone(), sealed.cut, Arc::clone(&cut.dir));
            }
        }
        if cut.compacted.is_none() {
            // Remember this incarnation's hashes for the next snapshot; forget
            // its files that are gone (compacted away). A compacted
            // checkpoint's files are not the live store's: what the cache
            // knows of those stays.
            self.lock_cache().replace(
                cut.incarnation,
                hashes
                    .iter()
                    .filter(|e| is_immutable(&e.path))
                    .map(|e| (e.path.clone(), e.size, e.blake3)),
            );
        }
        let stats = snapshot_stats(counted, &cut);
        let mut format_metadata = serde_json::json!({
            "writer_incarnation": cut.incarnation.hyphenated().to_string(),
            "sst_files": sst_files,
            "space_amplification": round3(amplification),
        });
        if let Some(c) = &counted {
            format_metadata["digest"] = c.how().into();
            if let Some(n) = c.derived_from {
                format_metadata["digest_keys_read"] = n.into();
            }
        }
        if let Some(c) = cut.compacted {
            format_metadata["compacted"] = serde_json::json!({
                "sst_bytes_before": c.sst_bytes_before,
                "sst_bytes_after": cut.sst_bytes(),
                "secs": round3(c.secs),
            });
        }
        drop(cut);
        Ok(FormatOutput {
            writer,
            stats,
            format_metadata,
            depends_on: Vec::new(),
            required_features: Vec::new(),
            logical_digest: counted.map(|c| c.digest),
        })
    }

    /// Opens the base checkpoint `dir` of cut `cut` read-only on a blocking
    /// thread, not awaited, and hands it to `follow` (which drops it if
    /// that is no longer the base, or a derivation opened it first). A
    /// failure only means the next derivation opens it itself.
    fn open_base_in_background(&self, follow: Follow, cut: u64, dir: Arc<CheckpointDir>) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let format = self.clone();
        // Weak: a store closed meanwhile is not kept alive by this.
        let follow = follow.downgrade();
        drop(handle.spawn_blocking(move || {
            let Some(follow) = Follow::upgrade(&follow) else {
                return;
            };
            match open_read_only(&format, &dir.0) {
                Ok(db) => {
                    // Closed (if not kept) after the lock is released.
                    let unused = follow.lock().base_opened(cut, Arc::new(db));
                    drop(unused);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot open the base checkpoint in the background")
                }
            }
            // The handle (if it was not kept) before the directory.
            drop(dir);
        }));
    }

    /// What becomes of each checkpoint file: inline, reused from the
    /// parent, known to the repository (hash cached), compared with the
    /// parent's file of that name, or uploaded.
    fn plan_files(&self, cut: &RocksCut, parent: Option<&Manifest>) -> Vec<(String, u64, Plan)> {
        let mut parent_by_hash: HashMap<BlobHash, &FileEntry> = HashMap::new();
        let mut parent_by_name: HashMap<&str, &FileEntry> = HashMap::new();
        for f in parent.map(|p| p.files.as_slice()).unwrap_or_default() {
            parent_by_hash.insert(f.blake3, f);
            parent_by_name.insert(f.path.as_str(), f);
        }
        let inline = inline_choice(&cut.files, &cut.meta_files);
        let plans: Vec<(String, u64, Plan)> = {
            let mut cache = self.lock_cache();
            cut.files
                .iter()
                .enumerate()
                .map(|(i, (name, size))| {
                    // A compacted checkpoint's files are new: their names may
                    // repeat the live store's with other bytes.
                    let plan = if inline[i] {
                        Plan::Inline
                    } else if !is_immutable(name) || cut.compacted.is_some() {
                        Plan::Upload
                    } else if let Some(h) = cache.get(cut.incarnation, name, *size) {
                        match parent_by_hash.get(&h) {
                            Some(p) if p.size == *size => Plan::Reuse(FileEntry {
                                path: name.clone(),
                                size: *size,
                                blake3: h,
                            }),
                            _ => Plan::Known(h),
                        }
                    } else if let Some(p) = parent_by_name
                        .get(name.as_str())
                        .filter(|p| p.size == *size)
                    {
                        Plan::CompareLocal((*p).clone())
                    } else {
                        Plan::Upload
                    };
                    (name.clone(), *size, plan)
                })
                .collect()
        };
        plans
    }
}

/// The snapshot's files in name order: reused and uploaded ones recorded
/// in a new writer (their entries returned), inline ones put inline; and
/// how many are SSTs.
async fn record_files(
    repo: &crate::repo::Repository,
    sk: &crate::repo::StoreKey,
    mut results: Vec<(String, Done)>,
) -> Result<(SnapshotWriter, Vec<FileEntry>, u64)> {
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let mut writer = SnapshotWriter::new(repo, sk.clone());
    let mut hashes = Vec::with_capacity(results.len());
    let mut sst_files = 0u64;
    for (name, done) in results {
        if is_immutable(&name) {
            sst_files += 1;
        }
        let entry = match done {
            Done::Reused(e) => {
                writer.reuse(e.clone())?;
                e
            }
            Done::Stored(out) => writer.add_uploaded(&name, out)?,
            Done::Inline(bytes) => {
                writer.put_inline(&name, &bytes).await?;
                continue;
            }
        };
        hashes.push(entry);
    }
    Ok((writer, hashes, sst_files))
}

/// Counted when scanned; else RocksDB's estimates, read at capture
/// (`estimate-num-keys` counts overwritten and deleted entries not yet
/// compacted away).
fn snapshot_stats(counted: Option<Counted>, cut: &RocksCut) -> SnapshotStats {
    match counted {
        Some(c) => SnapshotStats {
            keys: c.digest.keys(),
            logical_bytes: c.logical_bytes,
            counts_exact: true,
            ..SnapshotStats::default()
        },
        None => SnapshotStats {
            keys: cut.keys,
            logical_bytes: cut.logical_bytes,
            ..SnapshotStats::default()
        },
    }
}
