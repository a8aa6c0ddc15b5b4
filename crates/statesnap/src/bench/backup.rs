//! RocksDB snapshots side by side with RocksDB's own `BackupEngine` and a
//! plain `cp -r`, on the same database in one run.

use std::path::Path;
use std::time::Duration;

use rocksdb::backup::{BackupEngine, BackupEngineOptions, RestoreOptions as BeRestoreOptions};
use serde::Serialize;

use super::{Pair, disk_usage, file_log, key, local_repo, median, remove, store_key, timed, value};
use crate::changelog::file::FileChangelog;
use crate::changelog::{Changelog, ChangelogBinding, Record};
use crate::error::{Error, Result};
use crate::format::rocks::RocksFormat;
use crate::format::{RestoreContext, StoreFormat};
use crate::repo::{Manifest, Repository};
use crate::snapshot::{SnapshotOptions, commit_snapshot_with};
use crate::store::rocks::{RocksOptions, RocksStore};
use crate::store::{StateStore, ensure_follows};

/// statesnap's RocksDB snapshots against `BackupEngine` (times in seconds,
/// sizes in bytes). Restores are the median of `runs`.
#[derive(Debug, Clone, Serialize)]
pub struct BackupComparison {
    /// Keys loaded (100-byte values).
    pub keys: u64,
    /// The database's size on disk after loading and flushing.
    pub store_bytes: u64,
    /// Full snapshot vs `create_new_backup_flush`: seconds.
    pub full_secs: Pair,
    /// Bytes the full snapshot uploaded vs the backup directory's size.
    pub full_bytes: Pair,
    /// After rewriting 1 % of the keys, the changelog's tail synced
    /// (untimed, as its default policy would have): incremental snapshot vs
    /// the next backup, seconds. [`INCREMENTAL_ROUNDS`] rounds, each side
    /// going first in a third of them (the first flushes the memtable
    /// holding the rewrite, the others find it flushed); the median of
    /// each side's.
    pub incremental_secs: Pair,
    /// The same with the changelog's tail left unsynced
    /// (`FsyncPolicy::Never`): each snapshot fsyncs it first. Another
    /// [`INCREMENTAL_ROUNDS`] rounds.
    pub incremental_unsynced_secs: Pair,
    /// Bytes the incremental snapshot uploaded vs what the backup added.
    pub incremental_bytes: Pair,
    /// The same snapshots into a second local repository that hard-links
    /// the SSTs ([`TransferOptions::link_immutable_files`](crate::repo::TransferOptions::link_immutable_files))
    /// instead of copying them, vs the same backups: the full snapshot,
    /// seconds.
    pub full_linked_secs: Pair,
    /// The incremental snapshots into the linking repository vs the
    /// backups, seconds (median, the same rounds), the log synced.
    pub incremental_linked_secs: Pair,
    /// The same, the log unsynced.
    pub incremental_linked_unsynced_secs: Pair,
    /// Restore (every blob verified, the store opened) vs
    /// `restore_from_latest_backup`, seconds.
    pub restore_secs: Pair,
    /// Restore vs `cp -r` of the same files plus an fsync of each,
    /// seconds.
    pub restore_vs_cp_secs: Pair,
    /// `cp -r` without the fsyncs, seconds (for reference).
    pub cp_nosync_secs: f64,
    /// Our restore until its files were on disk as well (the background
    /// fsync of [`RestoreSync::Background`](crate::repo::RestoreSync)
    /// ended), seconds: what `BackupEngine`'s restore, which fsyncs before
    /// it returns, includes.
    pub restore_durable_secs: f64,
    /// The restored snapshot's bytes.
    pub restored_bytes: u64,
    /// Where a restore's time goes (medians over the runs).
    pub restore_breakdown: RestoreBreakdown,
}

/// A restore's time split by phase, seconds (medians over the runs).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RestoreBreakdown {
    /// Every file downloaded and verified into staging (and fsynced, unless
    /// the restore syncs in the background)
    /// ([`RestoreStats::transfer`](crate::format::RestoreStats::transfer)).
    pub transfer_secs: f64,
    /// Staging renamed into place, the store opened and its offset checked
    /// ([`RestoreStats::open`](crate::format::RestoreStats::open)).
    pub open_secs: f64,
    /// For scale: blake3 over the same bytes already in memory (the
    /// verification's share of `transfer_secs` if nothing overlapped).
    pub hash_secs: f64,
}

fn rocks(what: &str) -> impl FnOnce(rocksdb::Error) -> Error + '_ {
    move |e| Error::new(crate::ErrorKind::Internal, format!("bench: {what}")).with_source(e)
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(format!("bench: {what}"), e)
}

/// Logs `records` 1 000 per batch and applies each batch to `store` at its
/// last offset (bulk loading without a `LoggedStore`'s pending map), then
/// flushes the store.
pub(crate) fn load(
    log: &FileChangelog,
    store: &mut RocksStore,
    records: impl Iterator<Item = Record>,
) -> Result<()> {
    let mut records = records.peekable();
    while records.peek().is_some() {
        let batch: Vec<Record> = records.by_ref().take(1000).collect();
        let offsets = log.append(&batch)?;
        if let Some(&last) = offsets.last() {
            store.apply(&batch, last)?;
        }
    }
    store.flush()
}

/// A RocksDB store at `db` bound to a new file changelog at `log`, loaded
/// with `keys` keys (100-byte values) through it and flushed.
pub(crate) fn loaded_store(
    db: &Path,
    log: &Path,
    name: &str,
    keys: u64,
) -> Result<(RocksStore, FileChangelog)> {
    let log = file_log(log, name)?;
    let mut store = RocksStore::open(db, &bench_options())?;
    ensure_follows(&mut store, &ChangelogBinding::of(&log)?)?;
    load(
        &log,
        &mut store,
        (0..keys).map(|i| Record::put(key(i), value(i))),
    )?;
    Ok((store, log))
}

/// Options for stores the benches load: no WAL (both sides flush first).
pub(crate) fn bench_options() -> RocksOptions {
    RocksOptions {
        wal: false,
        ..RocksOptions::default()
    }
}

async fn snap(
    format: &RocksFormat,
    store: &RocksStore,
    repo: &Repository,
    name: &str,
    log: &FileChangelog,
    parent: Option<&Manifest>,
) -> Result<(Manifest, Duration)> {
    snap_with(
        format,
        store,
        repo,
        name,
        log,
        parent,
        &SnapshotOptions::default(),
    )
    .await
}

/// [`snap`] with `options`.
async fn snap_with(
    format: &RocksFormat,
    store: &RocksStore,
    repo: &Repository,
    name: &str,
    log: &FileChangelog,
    parent: Option<&Manifest>,
    options: &SnapshotOptions,
) -> Result<(Manifest, Duration)> {
    let started = std::time::Instant::now();
    let cut = format.capture(store)?;
    let m =
        commit_snapshot_with(format, cut, repo, &store_key(name)?, log, parent, options).await?;
    Ok((m, started.elapsed()))
}

fn fsync_tree(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir).map_err(io("read cp target"))? {
        let e = e.map_err(io("read cp target"))?;
        std::fs::File::open(e.path())
            .and_then(|f| f.sync_all())
            .map_err(io("fsync cp target"))?;
    }
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io("fsync cp target"))
}

/// Incremental rounds [`rocks_vs_backup_engine`] times, with the log synced
/// and again without (each of its three sides goes first in a third of
/// them): single rounds vary by 2x on a busy machine.
pub const INCREMENTAL_ROUNDS: u64 = 9;

/// Loads `keys` keys into a RocksDB store under `dir`, then measures: a
/// full snapshot and a backup (the memtable flushed and the changelog
/// synced first, untimed, so neither pays for them); twice
/// [`INCREMENTAL_ROUNDS`] times 1 % of keys rewritten (the log synced
/// before the snapshots, then not), each time an incremental snapshot, a
/// backup and a snapshot into a second repository that hard-links SSTs,
/// each side going first in a third of the rounds (whichever goes first
/// flushes the rewrite for the others); and `runs` restores of each
/// kind (ours, the backup's, `cp -r` of the snapshot's files). Everything
/// reads from the page cache where it can: all sides were just written.
pub async fn rocks_vs_backup_engine(
    dir: &Path,
    keys: u64,
    runs: usize,
) -> Result<BackupComparison> {
    let format = RocksFormat::new(bench_options());
    let (mut store, log) = loaded_store(&dir.join("db"), &dir.join("log-main"), "main", keys)?;
    let store_bytes = disk_usage(&dir.join("db"));
    let repo_dir = dir.join("repo");
    let repo = local_repo(&repo_dir).await?;
    let linked_format = RocksFormat::new(bench_options());
    let linked =
        local_repo(&dir.join("repo-linked"))
            .await?
            .with_transfer(crate::repo::TransferOptions {
                link_immutable_files: true,
                ..crate::repo::TransferOptions::default()
            });
    let be_dir = dir.join("backup");
    let (full, be) = full_round(
        &format,
        &linked_format,
        &store,
        &log,
        &repo,
        &linked,
        &be_dir,
    )
    .await?;
    let mut sides = Sides {
        log,
        format,
        repo,
        linked_format,
        linked,
        be,
        be_dir,
    };
    let inc = sides.incremental_rounds(&mut store, keys, &full).await?;
    let restored_bytes = inc.last.file_bytes();
    drop(store);
    let cp_src = files_for_cp(dir, &repo_dir, &inc.last)?;
    let restores = sides.restore_runs(dir, &inc.last, &cp_src, runs).await?;
    for p in ["cp-src", "backup", "db", "log-main", "repo-linked"] {
        remove(&dir.join(p))?;
    }
    Ok(comparison(
        keys,
        store_bytes,
        &full,
        &inc,
        restored_bytes,
        &restores,
    ))
}

/// What the full snapshots and the full backup measured.
struct FullRound {
    /// The full snapshot and its time.
    ours: Manifest,
    ours_secs: Duration,
    /// The full backup's time and size.
    be_secs: Duration,
    be_bytes: u64,
    /// The full snapshot into the hard-linking repository and its time.
    linked: Manifest,
    linked_secs: Duration,
}

/// What the incremental rounds measured.
struct Incremental {
    /// The newest incremental snapshot (the one the restores restore).
    last: Manifest,
    /// The first incremental snapshot (its upload is the figure).
    first: Manifest,
    /// What the first incremental backup added.
    be_bytes: u64,
    /// Each side's median (ours, the backup's, linked), the log synced.
    synced: [Duration; 3],
    /// The same, the log unsynced.
    unsynced: [Duration; 3],
}

/// The medians of the restore runs.
struct RestoreTimes {
    ours: Duration,
    theirs: Duration,
    cp: Duration,
    cp_nosync: Duration,
    durable: Duration,
    transfer: Duration,
    open: Duration,
    hash: Duration,
}

/// Everything the rounds write to, bar the store itself: its changelog,
/// statesnap's two repositories (copying, hard-linking) with their formats,
/// and the `BackupEngine`.
struct Sides {
    log: FileChangelog,
    format: RocksFormat,
    repo: Repository,
    linked_format: RocksFormat,
    linked: Repository,
    be: BackupEngine,
    be_dir: std::path::PathBuf,
}

/// The full snapshot, the full backup (the `BackupEngine` opened in
/// `be_dir` for it), and the full snapshot into the linking repository.
async fn full_round(
    format: &RocksFormat,
    linked_format: &RocksFormat,
    store: &RocksStore,
    log: &FileChangelog,
    repo: &Repository,
    linked: &Repository,
    be_dir: &Path,
) -> Result<(FullRound, BackupEngine)> {
    // Full. Both sides flush the memtable first; whichever went first
    // would flush it for the other, so it is flushed here, untimed. The
    // changelog is synced here too: this bench's log never syncs by itself
    // (`FsyncPolicy::Never`, to load fast), and the first snapshot would
    // otherwise fsync all ~120 MB of it (0.36 s) before its manifest may
    // name the offset, where a log with the default policy synced each
    // append as it was written.
    store.db().flush().map_err(rocks("flush"))?;
    log.flush()?;
    let (full, ours_full) = snap(format, store, repo, "main", log, None).await?;
    let mut be = BackupEngine::open(
        &BackupEngineOptions::new(be_dir).map_err(rocks("backup options"))?,
        &rocksdb::Env::new().map_err(rocks("rocksdb env"))?,
    )
    .map_err(rocks("open BackupEngine"))?;
    let (r, be_full) = timed(|| be.create_new_backup_flush(store.db(), true));
    r.map_err(rocks("full backup"))?;
    let be_full_bytes = disk_usage(be_dir);
    let (full_linked, linked_full) = snap(linked_format, store, linked, "main", log, None).await?;

    Ok((
        FullRound {
            ours: full,
            ours_secs: ours_full,
            be_secs: be_full,
            be_bytes: be_full_bytes,
            linked: full_linked,
            linked_secs: linked_full,
        },
        be,
    ))
}

impl Sides {
    /// Twice [`INCREMENTAL_ROUNDS`] rounds of rewritten keys, each an
    /// incremental snapshot, a backup and a linked snapshot.
    async fn incremental_rounds(
        &mut self,
        store: &mut RocksStore,
        keys: u64,
        full: &FullRound,
    ) -> Result<Incremental> {
        // 1 % of keys rewritten per round (other keys each round). Each side's
        // snapshot flushes the memtable holding the rewrite, and the ones that
        // go after find it flushed: each side goes first in a third of the
        // rounds.
        let rewrite = |round: u64| rewritten_keys(keys, round);
        // Two phases of [`INCREMENTAL_ROUNDS`] rounds. In the first the
        // changelog's new tail is synced before the snapshots, untimed: what
        // the default policy (`FsyncPolicy::EveryBatch`) does as it appends,
        // and an `Interval` policy or Kafka mostly does. In the second it is
        // left unsynced, as `FsyncPolicy::Never` leaves it: each snapshot then
        // fsyncs the ~1.3 MB of log written since the last before its manifest
        // may name the offset (invariant 11), which `BackupEngine`,
        // backing up the database alone, has no counterpart of.
        let mut times: [[Vec<Duration>; 3]; 2] = Default::default();
        let (mut inc, mut inc_linked) = (full.ours.clone(), full.linked.clone());
        let (mut first, mut be_inc_bytes) = (None, None);
        for round in 0..2 * INCREMENTAL_ROUNDS {
            let phase = usize::from(round >= INCREMENTAL_ROUNDS);
            load(&self.log, store, rewrite(round))?;
            if phase == 0 {
                self.log.flush()?;
            }
            for side in (0..3).map(|k| (round + k) % 3) {
                let d = match side {
                    0 => {
                        let (m, d) = snap(
                            &self.format,
                            store,
                            &self.repo,
                            "main",
                            &self.log,
                            Some(&inc),
                        )
                        .await?;
                        first.get_or_insert_with(|| m.clone());
                        inc = m;
                        d
                    }
                    1 => {
                        let (r, d) = timed(|| self.be.create_new_backup_flush(store.db(), true));
                        r.map_err(rocks("incremental backup"))?;
                        be_inc_bytes.get_or_insert_with(|| {
                            disk_usage(&self.be_dir).saturating_sub(full.be_bytes)
                        });
                        d
                    }
                    _ => {
                        // Without the digest: this side measures the
                        // transfer. Its cut counts nothing, so it never
                        // becomes the base the next digest is derived from,
                        // and ours pays for every round's changes whichever
                        // side goes first (derived from this side's cut of
                        // the same store, it would look up nothing).
                        let no_digest = SnapshotOptions {
                            logical_digest: Some(false),
                            ..SnapshotOptions::default()
                        };
                        let (m, d) = snap_with(
                            &self.linked_format,
                            store,
                            &self.linked,
                            "main",
                            &self.log,
                            Some(&inc_linked),
                            &no_digest,
                        )
                        .await?;
                        inc_linked = m;
                        d
                    }
                };
                times[phase][side as usize].push(d);
            }
        }
        let first = first.ok_or_else(|| Error::internal("bench: no incremental round ran"))?;
        let be_inc_bytes = be_inc_bytes.unwrap_or_default();
        let [synced, unsynced] = times.map(|sides| sides.map(median));
        Ok(Incremental {
            last: inc,
            first,
            be_bytes: be_inc_bytes,
            synced,
            unsynced,
        })
    }

    /// `runs` restores of each kind: ours of `inc`, the backup's, `cp -r`
    /// of `cp_src` (the same files).
    async fn restore_runs(
        &mut self,
        dir: &Path,
        inc: &Manifest,
        cp_src: &Path,
        runs: usize,
    ) -> Result<RestoreTimes> {
        let (mut ours, mut theirs, mut cp, mut cp_nosync) = (vec![], vec![], vec![], vec![]);
        let (mut transfer, mut open, mut hash, mut durable) = (vec![], vec![], vec![], vec![]);
        let hash_input = read_files(cp_src)?;
        for _ in 0..runs.max(1) {
            let target = dir.join("restore-ours");
            remove(&target)?;
            let ctx = RestoreContext {
                repo: &self.repo,
                target: &target,
            };
            let started = std::time::Instant::now();
            let (restored, stats) = self.format.restore(inc, ctx).await?;
            let d = started.elapsed();
            // Untimed for the restore, but waited for: the next step must not
            // run while the disk still writes this one back (and removing the
            // files first would spare the disk that work altogether).
            restored.wait_durable()?;
            durable.push(started.elapsed());
            drop(restored);
            ours.push(d);
            transfer.push(stats.transfer);
            open.push(stats.open);
            let ((), d) = timed(|| {
                for b in &hash_input {
                    std::hint::black_box(blake3::hash(b));
                }
            });
            hash.push(d);
            remove(&target)?;

            let r_be = dir.join("restore-be");
            let (r, d) = timed(|| {
                self.be
                    .restore_from_latest_backup(&r_be, &r_be, &BeRestoreOptions::default())
            });
            r.map_err(rocks("BackupEngine restore"))?;
            theirs.push(d);
            remove(&r_be)?;

            let cp_dst = dir.join("cp-dst");
            let (status, copy) = timed(|| {
                std::process::Command::new("cp")
                    .arg("-r")
                    .arg(cp_src)
                    .arg(&cp_dst)
                    .status()
            });
            if !status.map_err(io("run cp -r"))?.success() {
                return Err(Error::new(crate::ErrorKind::Io, "bench: cp -r failed"));
            }
            let (r, sync) = timed(|| fsync_tree(&cp_dst));
            r?;
            cp.push(copy + sync);
            cp_nosync.push(copy);
            remove(&cp_dst)?;
        }
        Ok(RestoreTimes {
            ours: median(ours),
            theirs: median(theirs),
            cp: median(cp),
            cp_nosync: median(cp_nosync),
            durable: median(durable),
            transfer: median(transfer),
            open: median(open),
            hash: median(hash),
        })
    }
}

/// Round `round`'s rewrite: 1 % of the `keys` keys, other keys each round.
fn rewritten_keys(keys: u64, round: u64) -> impl Iterator<Item = Record> {
    (0..keys / 100).map(move |j| {
        let i = (j + round * keys / 100).wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys.max(1);
        Record::put(key(i), value(i ^ 0xdead_beef ^ round))
    })
}

/// The snapshot's files under their names, for `cp -r`: `cp-src` in `dir`.
fn files_for_cp(dir: &Path, repo_dir: &Path, inc: &Manifest) -> Result<std::path::PathBuf> {
    let cp_src = dir.join("cp-src");
    std::fs::create_dir_all(&cp_src).map_err(io("create cp source"))?;
    for f in &inc.files {
        let blob = crate::repo::paths::blob(&inc.store_key, &f.blake3);
        std::fs::copy(repo_dir.join(blob.as_ref()), cp_src.join(&f.path))
            .map_err(io("copy blob for cp -r"))?;
    }
    for f in &inc.inline_files {
        std::fs::write(cp_src.join(&f.path), f.bytes()?).map_err(io("write file for cp -r"))?;
    }
    Ok(cp_src)
}

/// The figures, from what the rounds measured.
fn comparison(
    keys: u64,
    store_bytes: u64,
    full: &FullRound,
    inc: &Incremental,
    restored_bytes: u64,
    r: &RestoreTimes,
) -> BackupComparison {
    let (synced, unsynced) = (inc.synced, inc.unsynced);
    let secs = |d: Duration| d.as_secs_f64();
    let restore = r.ours;
    BackupComparison {
        keys,
        store_bytes,
        full_secs: Pair::secs(full.ours_secs, full.be_secs),
        full_bytes: Pair {
            ours: full.ours.stats.bytes_uploaded as f64,
            theirs: full.be_bytes as f64,
        },
        incremental_secs: Pair::secs(synced[0], synced[1]),
        incremental_unsynced_secs: Pair::secs(unsynced[0], unsynced[1]),
        incremental_bytes: Pair {
            ours: inc.first.stats.bytes_uploaded as f64,
            theirs: inc.be_bytes as f64,
        },
        full_linked_secs: Pair::secs(full.linked_secs, full.be_secs),
        incremental_linked_secs: Pair::secs(synced[2], synced[1]),
        incremental_linked_unsynced_secs: Pair::secs(unsynced[2], unsynced[1]),
        restore_secs: Pair::secs(restore, r.theirs),
        restore_vs_cp_secs: Pair::secs(restore, r.cp),
        cp_nosync_secs: secs(r.cp_nosync),
        restore_durable_secs: secs(r.durable),
        restored_bytes,
        restore_breakdown: RestoreBreakdown {
            transfer_secs: secs(r.transfer),
            open_secs: secs(r.open),
            hash_secs: secs(r.hash),
        },
    }
}

/// The contents of every file in `dir`.
fn read_files(dir: &Path) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io("read hash source"))? {
        let e = e.map_err(io("read hash source"))?;
        out.push(std::fs::read(e.path()).map_err(io("read file to hash"))?);
    }
    Ok(out)
}
