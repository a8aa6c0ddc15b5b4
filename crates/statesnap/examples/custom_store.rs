//! Plugging a custom store into statesnap.
//!
//! `LogFileStore` keeps its data in one append-only file (`data.log`) and an
//! in-memory index. Because the file only grows, a consistent cut is just
//! "the first N bytes" — an O(1) capture — and its own [`StoreFormat`]
//! uploads that prefix as one blob. The same store also gets the generic
//! portable format for free (one line of `PortableSource`), whose snapshots
//! restore into any other store type, here a `MemoryStore`.
//!
//! `main` first runs it the way an application does — through the runtime
//! (`StateManager`, `StoreSpec::new` with this format): open, write, commit,
//! close (a handoff snapshot), reopen (local store kept, nothing replayed).
//! Then it makes the calls the runtime makes, one by one.
//!
//! Run with `cargo run --example custom_store` (add
//! `--no-default-features` to skip building RocksDB).

use bytes::Bytes;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::ops::Bound;
use std::path::{Path, PathBuf};

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{ChangelogBinding, Record};
use statesnap::commit_snapshot;
use statesnap::format::portable::{PortableCut, PortableFormat, PortableSource};
use statesnap::format::{
    FormatOutput, LocalStoreInfo, RestoreContext, RestoreStats, StoreFormat, WriteContext,
};
use statesnap::repo::{
    BlobRef, Manifest, Repository, SnapshotStats, SnapshotWriter, StoreFormatId, StoreKey,
};
use statesnap::store::LoggedStore;
use statesnap::store::{KvIter, SizeEstimate, StateStore, StateStoreExt, in_bounds};
use statesnap::{Error, ErrorKind, Result, StateManager, StoreSpec};

const DATA: &str = "data.log";
/// Which changelog the store follows, written (atomically) before the first
/// batch and never changed.
const BINDING: &str = "binding.json";
const PUT: u8 = 1;
const DELETE: u8 = 0;
const COMMIT: u8 = 2;

/// A store on one append-only file: `[flag][key_len u32][key][value_len u32][value]`
/// records, each batch closed by `[COMMIT][offset u64]`. On open, records
/// after the last commit marker (a torn batch) are ignored.
#[derive(Debug)]
struct LogFileStore {
    path: PathBuf,
    file: File,
    len: u64,
    index: BTreeMap<Bytes, Bytes>,
    applied: Option<u64>,
    binding: Option<ChangelogBinding>,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("cannot {what} path=`{}`", path.display()),
    )
    .with_source(e)
}

impl LogFileStore {
    fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io("create store directory", dir, e))?;
        // Marks the directory as a store, so a later restore may replace it
        // (restores refuse to replace a non-empty directory without it).
        statesnap::store::mark_store_dir(dir)?;
        let path = dir.join(DATA);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io("read store file", &path, e)),
        };
        let (index, applied, committed_len) = parse(&bytes);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io("open store file", &path, e))?;
        // Drop a torn tail so the next append starts at a batch boundary.
        file.set_len(committed_len)
            .map_err(|e| io("truncate store file", &path, e))?;
        let binding = read_binding(dir)?;
        Ok(LogFileStore {
            path,
            file,
            len: committed_len,
            index,
            applied,
            binding,
        })
    }
}

/// The changelog binding recorded in `dir`, if any.
fn read_binding(dir: &Path) -> Result<Option<ChangelogBinding>> {
    let binding_path = dir.join(BINDING);
    match std::fs::read(&binding_path) {
        Ok(b) => Ok(Some(serde_json::from_slice(&b).map_err(|e| {
            Error::new(ErrorKind::Corrupt, "unreadable store binding").with_source(e)
        })?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("read store binding", &binding_path, e)),
    }
}

/// Replays the file; returns the index, the last committed offset and the
/// length up to the last commit marker.
fn parse(b: &[u8]) -> (BTreeMap<Bytes, Bytes>, Option<u64>, u64) {
    let (mut index, mut pending, mut applied, mut committed) =
        (BTreeMap::new(), Vec::new(), None, 0);
    let mut at = 0usize;
    let u32_at = |at: usize| {
        b.get(at..at + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize)
    };
    while at < b.len() {
        match b[at] {
            COMMIT => {
                let Some(s) = b.get(at + 1..at + 9) else {
                    break;
                };
                let mut o = [0u8; 8];
                o.copy_from_slice(s);
                for (k, v) in pending.drain(..) {
                    match v {
                        Some(v) => index.insert(k, v),
                        None => index.remove(&k),
                    };
                }
                applied = Some(u64::from_le_bytes(o));
                at += 9;
                committed = at as u64;
            }
            flag @ (PUT | DELETE) => {
                let Some(kl) = u32_at(at + 1) else { break };
                let Some(key) = b.get(at + 5..at + 5 + kl) else {
                    break;
                };
                at += 5 + kl;
                let value = if flag == PUT {
                    let Some(vl) = u32_at(at) else { break };
                    let Some(v) = b.get(at + 4..at + 4 + vl) else {
                        break;
                    };
                    at += 4 + vl;
                    Some(Bytes::copy_from_slice(v))
                } else {
                    None
                };
                pending.push((Bytes::copy_from_slice(key), value));
            }
            _ => break,
        }
    }
    (index, applied, committed)
}

impl StateStore for LogFileStore {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.index.get(key).cloned())
    }

    fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>> {
        let hits: Vec<_> = self
            .index
            .iter()
            .filter(|(k, _)| in_bounds(k, start, end))
            .map(|(k, v)| Ok((k.clone(), v.clone())))
            .collect();
        Ok(Box::new(hits.into_iter()))
    }

    fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()> {
        let mut buf = Vec::new();
        for r in batch {
            buf.push(if r.value.is_some() { PUT } else { DELETE });
            buf.extend_from_slice(&(r.key.len() as u32).to_le_bytes());
            buf.extend_from_slice(&r.key);
            if let Some(v) = &r.value {
                buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
                buf.extend_from_slice(v);
            }
        }
        // The commit marker carries the offset: data and offset land in one
        // append, and a torn append is dropped on open (atomic apply).
        buf.push(COMMIT);
        buf.extend_from_slice(&applied_offset.to_le_bytes());
        self.file
            .write_all(&buf)
            .map_err(|e| io("append to store file", &self.path, e))?;
        self.len += buf.len() as u64;
        for r in batch {
            match &r.value {
                Some(v) => self.index.insert(r.key.clone(), v.clone()),
                None => self.index.remove(&r.key),
            };
        }
        self.applied = Some(applied_offset);
        Ok(())
    }

    fn applied_offset(&self) -> Result<Option<u64>> {
        Ok(self.applied)
    }

    fn approximate_size(&self) -> Result<SizeEstimate> {
        Ok(SizeEstimate {
            keys: self.index.len() as u64,
            bytes: self.len,
        })
    }

    fn binding(&self) -> Result<Option<ChangelogBinding>> {
        Ok(self.binding.clone())
    }

    fn bind(&mut self, binding: &ChangelogBinding) -> Result<()> {
        if !statesnap::store::check_rebind(self.binding.as_ref(), binding)? {
            return Ok(());
        }
        // Durable before the first batch: write aside, fsync, rename.
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!("{BINDING}.tmp"));
        let json = serde_json::to_vec(binding)
            .map_err(|e| Error::new(ErrorKind::Internal, "encode binding").with_source(e))?;
        let mut f = File::create(&tmp).map_err(|e| io("create store binding", &tmp, e))?;
        f.write_all(&json)
            .and_then(|()| f.sync_all())
            .map_err(|e| io("write store binding", &tmp, e))?;
        std::fs::rename(&tmp, dir.join(BINDING))
            .map_err(|e| io("rename store binding", &tmp, e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("sync store directory", dir, e))?;
        self.binding = Some(binding.clone());
        Ok(())
    }
}

/// The generic portable format, for free.
impl PortableSource for LogFileStore {
    fn portable_cut(&self) -> Result<PortableCut> {
        PortableCut::materialize(self)
    }
}

/// The store's own format: upload the committed prefix of its one file.
#[derive(Debug)]
struct LogFileFormat;

/// A cut: the file and how much of it was committed at capture time. The
/// file only grows, so that prefix never changes while writes continue.
#[derive(Debug)]
struct LogFileCut {
    path: PathBuf,
    len: u64,
    offset: Option<u64>,
    binding: Option<ChangelogBinding>,
    keys: u64,
}

impl StoreFormat for LogFileFormat {
    type Store = LogFileStore;
    type Cut = LogFileCut;

    fn id(&self) -> StoreFormatId {
        StoreFormatId {
            name: "example-logfile".into(),
            version: 1,
        }
    }

    fn capture(&self, store: &LogFileStore) -> Result<LogFileCut> {
        Ok(LogFileCut {
            path: store.path.clone(),
            len: store.len,
            offset: store.applied,
            binding: store.binding.clone(),
            keys: store.index.len() as u64,
        })
    }

    fn cut_offset(&self, cut: &LogFileCut) -> Option<u64> {
        cut.offset
    }

    fn cut_binding(&self, cut: &LogFileCut) -> Option<ChangelogBinding> {
        cut.binding.clone()
    }

    async fn write(&self, cut: LogFileCut, ctx: WriteContext<'_>) -> Result<FormatOutput> {
        let mut bytes = tokio::fs::read(&cut.path)
            .await
            .map_err(|e| io("read store file", &cut.path, e))?;
        bytes.truncate(cut.len as usize);
        let mut writer = SnapshotWriter::new(ctx.repo, ctx.store_key.clone());
        writer.put_bytes(DATA, Bytes::from(bytes)).await?;
        Ok(FormatOutput {
            writer,
            stats: SnapshotStats {
                keys: cut.keys,
                logical_bytes: cut.len,
                ..Default::default()
            },
            format_metadata: serde_json::json!({}),
            depends_on: vec![],
            required_features: vec![],
            // No digest: `verify --deep` says so ("no digest recorded").
            logical_digest: None,
        })
    }

    async fn restore(
        &self,
        m: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> Result<(LogFileStore, RestoreStats)> {
        let f = m.files.iter().find(|f| f.path == DATA).ok_or_else(|| {
            Error::new(
                ErrorKind::Corrupt,
                format!("snapshot has no {DATA} snapshot=`{}`", m.snapshot_id),
            )
        })?;
        // Verified against the manifest's size and blake3 before we see it.
        let bytes = ctx
            .repo
            .blobs()
            .get_blob_bytes(&m.store_key, &BlobRef::from(f))
            .await?;
        let _ = std::fs::remove_dir_all(ctx.target);
        std::fs::create_dir_all(ctx.target).map_err(|e| io("create target", ctx.target, e))?;
        std::fs::write(ctx.target.join(DATA), &bytes)
            .map_err(|e| io("write store file", ctx.target, e))?;
        let store = LogFileStore::open(ctx.target)?;
        let stats = RestoreStats {
            bytes_downloaded: bytes.len() as u64,
            files_downloaded: 1,
            ..Default::default()
        };
        Ok((store, stats))
    }

    fn create_empty(&self, target: &Path) -> Result<LogFileStore> {
        let _ = std::fs::remove_dir_all(target);
        LogFileStore::open(target)
    }

    // Local-first: the runtime keeps a store this format left on disk when
    // it follows the same changelog and is at or past the newest usable
    // snapshot, so a restart replays only the changelog tail.
    fn inspect_local(&self, dir: &Path) -> Result<Option<LocalStoreInfo>> {
        let path = dir.join(DATA);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("read store file", &path, e)),
        };
        let (_, applied_offset, _) = parse(&bytes);
        Ok(Some(LocalStoreInfo {
            applied_offset,
            binding: read_binding(dir)?,
        }))
    }

    fn open_local(&self, dir: &Path) -> Result<LogFileStore> {
        LogFileStore::open(dir)
    }
}

/// Prints what snapshot `m`, written with `format`, holds and uploaded.
fn report(format: &str, m: &Manifest) {
    println!(
        "{format}: snapshot {} at offset {} ({} file(s), {} bytes uploaded)",
        m.snapshot_id,
        m.changelog.offset,
        m.files.len(),
        m.stats.bytes_uploaded
    );
}

/// Restores snapshot `m` alone (no changelog replay) with `format` into
/// `target`.
async fn restore_into<F: StoreFormat>(
    format: &F,
    m: &Manifest,
    repo: &Repository,
    target: &Path,
) -> Result<(F::Store, RestoreStats)> {
    format.restore(m, RestoreContext { repo, target }).await
}

/// What an application does: the runtime, with this store's own format.
/// Returns the number of records the second open replayed.
async fn through_the_runtime(repo: &Repository, dir: &Path) -> Result<u64> {
    let state = StateManager::builder(repo.clone()).build()?;
    let log = || {
        FileChangelog::open(
            dir.join("changelog"),
            StoreKey::new("example", "sessions", 0)?.changelog_id(),
            FileChangelogOptions::default(),
        )
    };
    let key = StoreKey::new("example", "sessions", 0)?;
    let spec = |log| StoreSpec::new(key.clone(), log, LogFileFormat, dir.join("store"));
    let mut sessions = state.open(spec(log()?)).await?;
    for i in 0..1000u32 {
        sessions.put(format!("session:{i:04}"), "open");
    }
    sessions.commit()?;
    let handoff = sessions.close().await?; // the next owner replays nothing
    let sessions = state.open(spec(log()?)).await?;
    println!(
        "runtime: handoff snapshot at offset {:?}; reopened from the {} with {} records replayed",
        handoff.offset,
        sessions.report().source,
        sessions.report().replay.records
    );
    let replayed = sessions.report().replay.records;
    sessions.abandon().await;
    state.shutdown().await;
    Ok(replayed)
}

#[tokio::main]
async fn main() -> Result<()> {
    let tmp = tempfile::tempdir().map_err(|e| io("create temp dir", Path::new("/tmp"), e))?;
    let repo_url = format!("file://{}", tmp.path().join("repo").display());
    let repo = Repository::init(&repo_url, Default::default()).await?;
    if through_the_runtime(&repo, &tmp.path().join("runtime")).await? != 0 {
        return Err(Error::new(
            ErrorKind::Internal,
            "example check failed: replayed after a handoff",
        ));
    }

    // Underneath the runtime: the calls it makes, one by one.
    let store_key = StoreKey::new("example", "logfile", 0)?;
    let changelog = FileChangelog::open(
        tmp.path().join("changelog"),
        StoreKey::new("example", "logfile", 0)?.changelog_id(),
        FileChangelogOptions::default(),
    )?;

    // Fill the store through its changelog: every batch is logged first,
    // then applied with its offset (and the store is bound to the log).
    let mut logged = LoggedStore::new(LogFileStore::open(&tmp.path().join("store"))?, changelog)?;
    for batch in 0..10u32 {
        for i in 0..1000u32 {
            logged.put(
                format!("user:{:06}", batch * 1000 + i),
                format!("visits={}", i % 17),
            );
        }
        logged.delete(format!("user:{:06}", batch * 10));
        logged.commit()?;
    }
    println!(
        "store: {} keys at offset {:?}, {} bytes on disk",
        logged.store().index.len(),
        logged.store().applied,
        logged.store().len
    );

    // 1. Its own format: O(1) capture, then writes continue while uploading.
    let cut = LogFileFormat.capture(logged.store())?;
    logged.put("user:999999", "written after the cut");
    logged.commit()?;
    let m = commit_snapshot(
        &LogFileFormat,
        cut,
        &repo,
        &store_key,
        logged.changelog(),
        None,
    )
    .await?;
    report("own format", &m);
    let target = tmp.path().join("restored-own");
    let (restored, stats) = restore_into(&LogFileFormat, &m, &repo, &target).await?;
    println!(
        "own format: restored {} keys at offset {:?} ({} bytes downloaded); the key written after the cut is {}",
        restored.index.len(),
        restored.applied,
        stats.bytes_downloaded,
        if restored.get(b"user:999999")?.is_none() {
            "absent, as it should be"
        } else {
            "PRESENT (bug)"
        }
    );

    // 2. The portable format, for free, restoring into another store type.
    let portable = PortableFormat::new(|dir: &Path| LogFileStore::open(dir));
    let (store, changelog) = logged.into_parts();
    let pm = commit_snapshot(
        &portable,
        portable.capture(&store)?,
        &repo,
        &store_key,
        &changelog,
        None,
    )
    .await?;
    report("portable", &pm);
    let target = tmp.path().join("restored-mem");
    let (mem, _) = restore_into(&PortableFormat::memory(), &pm, &repo, &target).await?;
    let same = mem
        .iter()?
        .map(|kv| kv.map(|(k, _)| k))
        .collect::<Result<Vec<_>>>()?
        == store
            .iter()?
            .map(|kv| kv.map(|(k, _)| k))
            .collect::<Result<Vec<_>>>()?;
    println!(
        "portable: restored into a MemoryStore: {} keys at offset {:?}; keys identical to the source: {same}",
        mem.len(),
        mem.applied_offset()?
    );
    if !same || restored.get(b"user:999999")?.is_some() {
        return Err(Error::new(ErrorKind::Internal, "example check failed"));
    }
    Ok(())
}

/// The store-format conformance suite on this example's format (it uploads
/// the whole file each time, so it reuses nothing of a parent).
#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_example_format_conforms() {
        statesnap::conformance::format::run_all(&|| super::LogFileFormat, false).await;
    }
}
