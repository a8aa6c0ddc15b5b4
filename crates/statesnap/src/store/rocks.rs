//! [`RocksStore`]: a persistent store on RocksDB.
//!
//! Data lives in RocksDB's `default` column family; the applied changelog
//! offset lives in a metadata column family (`statesnap_meta`) and is written
//! in the **same `WriteBatch`** as the data it covers, with `atomic_flush`
//! enabled so the two column families are always flushed together. After any
//! crash RocksDB recovers a prefix of whole batches, so data and offset can
//! never disagree (invariant 2).
//!
//! ## Defaults for a state store
//!
//! | option | value | why |
//! |---|---|---|
//! | WAL | on, not synced per write | the changelog is the durable record; the WAL only lets a clean restart skip replay |
//! | `atomic_flush` | on | data and offset column families flush together |
//! | compression | LZ4, ZSTD at the bottommost level | cheap on hot levels, compact at rest (and smaller snapshots) |
//! | bloom filter | 10 bits/key, block-based table, 16 KiB blocks | point lookups dominate stream processing |
//! | block cache | 64 MiB (configurable) | bounded memory per store |
//! | write buffer | 64 MiB, 3 buffers | absorbs bursts between flushes |
//! | background jobs | number of cores (≥ 2) | |
//! | `level_compaction_dynamic_level_bytes` | on | stable space amplification |

use bytes::Bytes;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompressionType, Options, ReadOptions,
    WriteBatch, WriteOptions,
};
use std::ops::Bound;
use std::path::{Path, PathBuf};

use super::written::Follow;
use super::{BulkLoader, KvIter, SizeEstimate, StateStore};
use crate::changelog::{ChangelogBinding, Record};
use crate::error::{Error, ErrorKind, Result};

/// Name of the column family holding statesnap's metadata.
pub const META_CF: &str = "statesnap_meta";
/// Key of the applied offset (u64 little-endian) in [`META_CF`].
pub const APPLIED_OFFSET_KEY: &[u8] = b"applied_offset";
/// Key of the [`ChangelogBinding`] (JSON) in [`META_CF`].
pub const BINDING_KEY: &[u8] = b"changelog_binding";

/// Tuning for a [`RocksStore`]. The defaults are documented in the module docs.
#[derive(Debug, Clone)]
pub struct RocksOptions {
    /// Create the database if it does not exist (default `true`).
    pub create_if_missing: bool,
    /// Block cache size in bytes (default 64 MiB).
    pub block_cache_bytes: usize,
    /// Memtable size in bytes (default 64 MiB).
    pub write_buffer_bytes: usize,
    /// Background flush/compaction jobs (default: available cores, at least 2).
    pub background_jobs: i32,
    /// Write the RocksDB WAL (default `true`). Without it a crash loses
    /// everything since the last flush — still consistent, and replay
    /// restores it, but restarts replay more.
    pub wal: bool,
}

impl Default for RocksOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        RocksOptions {
            create_if_missing: true,
            block_cache_bytes: 64 << 20,
            write_buffer_bytes: 64 << 20,
            background_jobs: i32::try_from(cores.max(2)).unwrap_or(2),
            wal: true,
        }
    }
}

impl RocksOptions {
    /// The RocksDB options these settings produce (also used to open
    /// checkpoints and restored directories the same way).
    pub fn db_options(&self) -> Options {
        let mut opts = Options::default();
        opts.create_if_missing(self.create_if_missing);
        opts.create_missing_column_families(true);
        opts.set_atomic_flush(true);
        opts.set_compression_type(DBCompressionType::Lz4);
        opts.set_bottommost_compression_type(DBCompressionType::Zstd);
        opts.set_write_buffer_size(self.write_buffer_bytes);
        opts.set_max_write_buffer_number(3);
        opts.set_max_background_jobs(self.background_jobs);
        opts.set_level_compaction_dynamic_level_bytes(true);
        opts.set_bytes_per_sync(1 << 20);
        let mut table = BlockBasedOptions::default();
        table.set_block_size(16 << 10);
        table.set_bloom_filter(10.0, false);
        table.set_cache_index_and_filter_blocks(true);
        table.set_block_cache(&Cache::new_lru_cache(self.block_cache_bytes));
        opts.set_block_based_table_factory(&table);
        opts
    }
}

/// A [`StateStore`] on RocksDB.
pub struct RocksStore {
    db: DB,
    path: PathBuf,
    applied_offset: Option<u64>,
    binding: Option<ChangelogBinding>,
    write_opts: WriteOptions,
    /// A fresh identity per open: SST file names are unique only within one
    /// incarnation, so snapshot code keys its file-hash cache on it.
    incarnation: uuid::Uuid,
    /// The background fsync of files a restore left to reach the disk
    /// (see [`RocksStore::wait_durable`]).
    restored_sync: Option<super::unsynced::BackgroundSync>,
    /// The options SST files for [`StateStore::bulk_loader`] are written
    /// with (the database's: same table format, filters, compression).
    sst_options: Box<Options>,
    /// The keys written since the last cuts, for snapshots whose digest
    /// follows the changes (`store::written`).
    follow: Follow,
}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStore")
            .field("path", &self.path)
            .field("applied_offset", &self.applied_offset)
            .field("incarnation", &self.incarnation)
            .finish_non_exhaustive()
    }
}

/// Maps a RocksDB error to a statesnap error with context.
pub(crate) fn rocks_error(what: &str, path: &Path, err: rocksdb::Error) -> Error {
    use rocksdb::ErrorKind as K;
    let kind = match err.kind() {
        K::Corruption => ErrorKind::Corrupt,
        K::NotFound => ErrorKind::NotFound,
        K::Busy | K::TryAgain | K::TimedOut | K::Incomplete | K::Expired => ErrorKind::Transient,
        K::InvalidArgument | K::NotSupported => ErrorKind::Config,
        // Another handle or process has the store open: nothing is wrong
        // with the store, and the caller must not move on to replacing it
        // (a restore falls back on every error that is not transient).
        K::IOError if err.as_ref().contains("lock") => ErrorKind::Transient,
        _ => ErrorKind::Io,
    };
    let locked = err.as_ref().contains("lock");
    let hint = if locked {
        " (is another process or handle using this store?)"
    } else {
        ""
    };
    let e = Error::new(
        kind,
        format!("rocksdb {what} failed path=`{}`{hint}", path.display()),
    )
    .with_source(err);
    if locked {
        e.with_reason(crate::Reason::InUse)
    } else {
        e
    }
}

impl RocksStore {
    /// Opens (or creates) a store at `path`.
    ///
    /// A store that a restore published before its files were on disk (the
    /// default on Linux, see [`RestoreSync`](crate::repo::RestoreSync)) is
    /// refused (`corrupt`) if the machine has restarted since, as its files
    /// may be incomplete: restore it again. On the same boot it opens, and
    /// the background fsync starts again if the restoring process ended
    /// before it finished.
    pub fn open(path: impl AsRef<Path>, options: &RocksOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let unsynced = super::unsynced::check(&path)?;
        let opts = options.db_options();
        let cfs = vec![
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, opts.clone()),
            ColumnFamilyDescriptor::new(META_CF, opts.clone()),
        ];
        // Bulk-loaded files are written once, fast: LZ4 throughout (an SST
        // writer would otherwise use the bottommost ZSTD), recompressed by
        // RocksDB when a compaction rewrites them.
        let mut sst_options = Box::new(opts.clone());
        sst_options.set_bottommost_compression_type(DBCompressionType::Lz4);
        let db = DB::open_cf_descriptors(&opts, &path, cfs)
            .map_err(|e| rocks_error("open", &path, e))?;
        let mut write_opts = WriteOptions::default();
        // Not synced: the changelog is the durable record (invariant 1); a lost
        // WAL tail only means a longer replay, and batches stay atomic.
        write_opts.set_sync(false);
        write_opts.disable_wal(!options.wal);
        let applied_offset = read_applied_offset(&db, &path)?;
        let binding = read_binding(&db, &path)?;
        // A directory RocksDB opened as a store is one restores may replace.
        super::mark_store_dir(&path)?;
        let restored_sync = if unsynced.is_empty() {
            None
        } else {
            Some(super::unsynced::BackgroundSync::spawn(
                path.clone(),
                unsynced,
            )?)
        };
        let follow = Follow::new(db.latest_sequence_number());
        Ok(RocksStore {
            follow,
            db,
            path,
            applied_offset,
            binding,
            write_opts,
            incarnation: uuid::Uuid::new_v4(),
            restored_sync,
            sst_options,
        })
    }

    /// Blocks until the files a restore left to reach the disk in the
    /// background are durable (at once if there are none), and returns
    /// whether that succeeded. A store is usable before then; waiting only
    /// matters to a caller that wants the restore's bytes on disk — for a
    /// benchmark, or before taking the machine down on purpose. If it
    /// fails, the store stays marked and is restored again, not used,
    /// after a machine restart.
    pub fn wait_durable(&self) -> Result<()> {
        self.restored_sync
            .as_ref()
            .map_or(Ok(()), super::unsynced::BackgroundSync::wait)
    }

    /// This open's identity (new on every [`RocksStore::open`]). Two stores
    /// restored from the same snapshot, or one directory reopened, never share
    /// it, so a file name is trusted as identity only together with it.
    pub fn incarnation(&self) -> uuid::Uuid {
        self.incarnation
    }

    /// The RocksDB handle, for snapshot code (checkpoints, live files,
    /// properties). Read through it freely; a write through it bypasses the
    /// applied offset (invariant 2) — write with
    /// [`StateStore::apply`](super::StateStore::apply), which takes `&mut`.
    /// Snapshots rely on that: a capture reads the offset and checkpoints
    /// under one shared borrow.
    pub fn db(&self) -> &DB {
        &self.db
    }

    /// What the store wrote since its last cuts (`store::written`).
    pub(crate) fn follow(&self) -> &Follow {
        &self.follow
    }

    /// Where the store lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes memtables of both column families (atomically) to SST files.
    pub fn flush(&self) -> Result<()> {
        let cfs = [self.data_cf()?, self.meta_cf()?];
        let mut fo = rocksdb::FlushOptions::default();
        fo.set_wait(true);
        self.db
            .flush_cfs_opt(&cfs, &fo)
            .map_err(|e| rocks_error("flush", &self.path, e))
    }

    fn data_cf(&self) -> Result<&rocksdb::ColumnFamily> {
        column_family(&self.db, &self.path, rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
    }

    fn meta_cf(&self) -> Result<&rocksdb::ColumnFamily> {
        column_family(&self.db, &self.path, META_CF)
    }
}

/// Column family `name` of the open store at `path` (the open created both
/// of ours: a missing one is a bug).
fn column_family<'d>(db: &'d DB, path: &Path, name: &str) -> Result<&'d rocksdb::ColumnFamily> {
    db.cf_handle(name).ok_or_else(|| {
        Error::internal(format!(
            "column family missing cf=`{name}` path=`{}`",
            path.display()
        ))
    })
}

/// Read-ahead of a scan of the whole store.
const FULL_SCAN_READAHEAD: usize = 4 << 20;

/// Where the bulk loader writes its SST files, inside the store directory
/// (the same file system: ingestion moves them).
const BULK_DIR: &str = "bulk-load";
/// The size at which the bulk loader starts a new SST file.
const BULK_SST_BYTES: u64 = 256 << 20;

/// [`RocksStore`]'s [`BulkLoader`]: sorted SST files, ingested at the end.
struct SstLoader<'a> {
    db: &'a DB,
    follow: &'a Follow,
    path: &'a Path,
    applied_offset: &'a mut Option<u64>,
    write_opts: &'a WriteOptions,
    options: &'a Options,
    dir: PathBuf,
    writer: Option<rocksdb::SstFileWriter<'a>>,
    files: Vec<PathBuf>,
    last_offset: Option<u64>,
}

impl SstLoader<'_> {
    /// Closes the current file, if any.
    fn close_file(&mut self) -> Result<()> {
        if let Some(mut w) = self.writer.take() {
            w.finish()
                .map_err(|e| rocks_error("finish SST file", &self.dir, e))?;
        }
        Ok(())
    }
}

impl BulkLoader for SstLoader<'_> {
    fn put(&mut self, key: &[u8], value: &[u8], offset: u64) -> Result<()> {
        if self
            .writer
            .as_ref()
            .is_some_and(|w| w.file_size() >= BULK_SST_BYTES)
        {
            self.close_file()?;
        }
        if self.writer.is_none() {
            let path = self.dir.join(format!("{:06}.sst", self.files.len()));
            let w = rocksdb::SstFileWriter::create(self.options);
            w.open(&path)
                .map_err(|e| rocks_error("create SST file", &path, e))?;
            self.files.push(path);
            self.writer = Some(w);
        }
        if let Some(w) = &mut self.writer {
            w.put(key, value)
                .map_err(|e| rocks_error("write SST file", &self.dir, e))?;
        }
        self.last_offset = Some(offset);
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.close_file()?;
        let Some(offset) = self.last_offset else {
            return remove_bulk_dir(&self.dir);
        };
        let cf = |name| column_family(self.db, self.path, name);
        let mut ingest = rocksdb::IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        self.db
            .ingest_external_file_cf_opts(
                cf(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)?,
                &ingest,
                self.files.clone(),
            )
            .map_err(|e| rocks_error("ingest SST files", self.path, e))?;
        // Ingested files are not followed key by key: the next cut is
        // scanned (`store::written`).
        self.follow.lock().lose();
        let mut wb = WriteBatch::default();
        wb.put_cf(cf(META_CF)?, APPLIED_OFFSET_KEY, offset.to_le_bytes());
        self.db
            .write_opt(wb, self.write_opts)
            .map_err(|e| rocks_error("write", self.path, e))?;
        self.follow.lock().wrote(self.db.latest_sequence_number());
        *self.applied_offset = Some(offset);
        remove_bulk_dir(&self.dir)
    }
}

fn remove_bulk_dir(dir: &Path) -> Result<()> {
    std::fs::remove_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot remove path=`{}`", dir.display()), e))
}

/// Bytes of scanned entries copied per shared buffer.
const SCAN_ARENA_BYTES: usize = 16 << 10;

/// Where a scan copies its entries: one shared buffer for many keys and
/// values instead of two allocations per entry (a whole-store scan of
/// small entries spent a quarter of its time in the allocator). Each
/// entry holds a reference to its buffer, which is freed with the last
/// entry: an entry kept long after the scan keeps its buffer (at most
/// [`SCAN_ARENA_BYTES`], or the entry's size) alive.
#[derive(Default)]
struct ScanArena {
    buf: bytes::BytesMut,
}

impl ScanArena {
    fn copy(&mut self, key: &[u8], value: &[u8]) -> (Bytes, Bytes) {
        let need = key.len() + value.len();
        if self.buf.capacity() - self.buf.len() < need {
            self.buf = bytes::BytesMut::with_capacity(need.max(SCAN_ARENA_BYTES));
        }
        self.buf.extend_from_slice(key);
        let key = self.buf.split().freeze();
        self.buf.extend_from_slice(value);
        let value = self.buf.split().freeze();
        (key, value)
    }
}

/// Reads `key` from `db`'s metadata column family.
fn read_meta(db: &DB, path: &Path, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let cf = db.cf_handle(META_CF).ok_or_else(|| {
        Error::corrupt(format!(
            "rocksdb store has no {META_CF} column family path=`{}`",
            path.display()
        ))
    })?;
    db.get_cf(cf, key).map_err(|e| rocks_error("get", path, e))
}

/// Reads the applied offset stored in `db`'s metadata column family.
pub(crate) fn read_applied_offset(db: &DB, path: &Path) -> Result<Option<u64>> {
    let Some(raw) = read_meta(db, path, APPLIED_OFFSET_KEY)? else {
        return Ok(None);
    };
    let bytes: [u8; 8] = raw.as_slice().try_into().map_err(|_| {
        Error::corrupt(format!(
            "applied offset has the wrong length path=`{}` length={}",
            path.display(),
            raw.len()
        ))
    })?;
    Ok(Some(u64::from_le_bytes(bytes)))
}

/// Reads the [`ChangelogBinding`] stored in `db`'s metadata column family.
pub(crate) fn read_binding(db: &DB, path: &Path) -> Result<Option<ChangelogBinding>> {
    let Some(raw) = read_meta(db, path, BINDING_KEY)? else {
        return Ok(None);
    };
    serde_json::from_slice(&raw).map(Some).map_err(|e| {
        Error::corrupt(format!(
            "the store's changelog binding cannot be parsed path=`{}`; delete the store and \
             restore it",
            path.display()
        ))
        .with_source(e)
    })
}

impl StateStore for RocksStore {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let cf = self.data_cf()?;
        let v = self
            .db
            .get_pinned_cf(cf, key)
            .map_err(|e| rocks_error("get", &self.path, e))?;
        Ok(v.map(|v| Bytes::copy_from_slice(&v)))
    }

    fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<KvIter<'a>> {
        if super::range_is_empty(start, end) {
            return Ok(Box::new(std::iter::empty()));
        }
        let cf = self.data_cf()?;
        let mut ro = ReadOptions::default();
        if let Bound::Excluded(e) = end {
            ro.set_iterate_upper_bound(e.to_vec());
        }
        if matches!((start, end), (Bound::Unbounded, Bound::Unbounded)) {
            // A scan of the whole store (a digest, a reshard, a portable
            // snapshot): read ahead in large chunks and leave the block
            // cache to the point reads it serves.
            ro.fill_cache(false);
            ro.set_readahead_size(FULL_SCAN_READAHEAD);
        }
        let mut it = self.db.raw_iterator_cf_opt(cf, ro);
        match start {
            Bound::Included(s) | Bound::Excluded(s) => it.seek(s),
            Bound::Unbounded => it.seek_to_first(),
        }
        let skip_eq = match start {
            Bound::Excluded(s) => Some(s.to_vec()),
            _ => None,
        };
        let end_incl = match end {
            Bound::Included(e) => Some(e.to_vec()),
            _ => None,
        };
        let path = self.path.clone();
        let mut done = false;
        let mut arena = ScanArena::default();
        let iter = std::iter::from_fn(move || {
            if done {
                return None;
            }
            loop {
                let Some((k, v)) = it.item() else {
                    done = true;
                    return match it.status() {
                        Ok(()) => None,
                        Err(e) => Some(Err(rocks_error("iterate", &path, e))),
                    };
                };
                if skip_eq.as_deref() == Some(k) {
                    it.next();
                    continue;
                }
                if let Some(e) = &end_incl
                    && k > e.as_slice()
                {
                    done = true;
                    return None;
                }
                let kv = arena.copy(k, v);
                it.next();
                return Some(Ok(kv));
            }
        });
        Ok(Box::new(iter))
    }

    fn apply(&mut self, batch: &[Record], applied_offset: u64) -> Result<()> {
        let data = self.data_cf()?;
        let meta = self.meta_cf()?;
        let mut wb = WriteBatch::default();
        for r in batch {
            match &r.value {
                Some(v) => wb.put_cf(data, &r.key, v),
                None => wb.delete_cf(data, &r.key),
            }
        }
        // The offset rides in the same WriteBatch as the data: RocksDB applies
        // (and recovers) a batch all-or-nothing, so they cannot disagree.
        wb.put_cf(meta, APPLIED_OFFSET_KEY, applied_offset.to_le_bytes());
        // Recorded before the write (a failed write loses the record: what
        // it left is unknown), so no written key goes unrecorded.
        let mut follow = self.follow.lock();
        follow.before_write(self.db.latest_sequence_number());
        follow.record(batch.iter().map(|r| (r.key.as_ref(), r.value.as_deref())));
        if let Err(e) = self.db.write_opt(wb, &self.write_opts) {
            follow.failed();
            return Err(rocks_error("write", &self.path, e));
        }
        follow.wrote(self.db.latest_sequence_number());
        drop(follow);
        self.applied_offset = Some(applied_offset);
        Ok(())
    }

    fn applied_offset(&self) -> Result<Option<u64>> {
        Ok(self.applied_offset)
    }

    fn approximate_size(&self) -> Result<SizeEstimate> {
        let cf = self.data_cf()?;
        let prop = |name: &str| -> Result<u64> {
            Ok(self
                .db
                .property_int_value_cf(cf, name)
                .map_err(|e| rocks_error("property", &self.path, e))?
                .unwrap_or(0))
        };
        let keys = prop("rocksdb.estimate-num-keys")?;
        let bytes =
            prop("rocksdb.estimate-live-data-size")? + prop("rocksdb.cur-size-all-mem-tables")?;
        Ok(SizeEstimate { keys, bytes })
    }

    fn binding(&self) -> Result<Option<ChangelogBinding>> {
        Ok(self.binding.clone())
    }

    /// Writes sorted SST files beside the database and ingests them (moved,
    /// not copied) at `finish`: no memtable, no WAL, no compaction of the
    /// loaded data; memory stays one SST block.
    fn bulk_loader(&mut self) -> Result<Box<dyn BulkLoader + '_>> {
        let dir = self.path.join(BULK_DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("cannot create path=`{}`", dir.display()), e))?;
        // Disjoint borrows: the SST writers borrow the options while the
        // loader keeps the database and the offset it sets at the end.
        let RocksStore {
            db,
            path,
            applied_offset,
            write_opts,
            sst_options,
            follow,
            ..
        } = self;
        Ok(Box::new(SstLoader {
            db,
            follow,
            path,
            applied_offset,
            write_opts,
            options: sst_options,
            dir,
            writer: None,
            files: Vec::new(),
            last_offset: None,
        }))
    }

    fn bind(&mut self, binding: &ChangelogBinding) -> Result<()> {
        if !super::check_rebind(self.binding.as_ref(), binding)? {
            return Ok(());
        }
        let raw = serde_json::to_vec(binding)
            .map_err(|e| Error::internal("cannot encode changelog binding").with_source(e))?;
        let mut wb = WriteBatch::default();
        wb.put_cf(self.meta_cf()?, BINDING_KEY, raw);
        // Synced through the WAL even when the store runs without one: the
        // binding must be durable before the first batch it covers (a later
        // flush would otherwise carry an offset without its binding).
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        let mut follow = self.follow.lock();
        follow.before_write(self.db.latest_sequence_number());
        self.db
            .write_opt(wb, &wo)
            .map_err(|e| rocks_error("write binding", &self.path, e))?;
        // Metadata only: no data key changed.
        follow.wrote(self.db.latest_sequence_number());
        drop(follow);
        self.binding = Some(binding.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StateStoreExt;

    #[test]
    fn a_scan_copies_entries_of_any_size_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RocksStore::open(dir.path(), &RocksOptions::default()).unwrap();
        // Small entries fill several shared buffers; some are larger than
        // one buffer, and some empty.
        let records: Vec<Record> = (0..2_000u32)
            .map(|i| {
                let len = match i % 100 {
                    0 => SCAN_ARENA_BYTES * 2 + 7,
                    1 => 0,
                    _ => (i % 37) as usize,
                };
                Record::put(format!("k{i:05}"), vec![(i % 251) as u8; len])
            })
            .collect();
        s.apply(&records, 1).unwrap();
        let all: Vec<_> = s.iter().unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(all.len(), records.len());
        for ((k, v), r) in all.iter().zip(&records) {
            assert_eq!(k, &r.key);
            assert_eq!(Some(v), r.value.as_ref());
        }
        // Entries outlive the scan (and the store).
        drop(s);
        assert_eq!(all[0].1.len(), SCAN_ARENA_BYTES * 2 + 7);
    }

    #[test]
    fn offset_survives_reopen_with_data() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = RocksStore::open(dir.path(), &RocksOptions::default()).unwrap();
            assert_eq!(s.applied_offset().unwrap(), None);
            s.apply(&[Record::put("k1", "v1"), Record::put("k2", "v2")], 7)
                .unwrap();
            s.apply(&[Record::delete("k1")], 8).unwrap();
        }
        let s = RocksStore::open(dir.path(), &RocksOptions::default()).unwrap();
        assert_eq!(s.applied_offset().unwrap(), Some(8));
        assert_eq!(s.get(b"k1").unwrap(), None);
        assert_eq!(s.get(b"k2").unwrap().as_deref(), Some(&b"v2"[..]));
        let all: Vec<_> = s.iter().unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(all, vec![(Bytes::from("k2"), Bytes::from("v2"))]);
    }

    #[test]
    fn binding_survives_reopen_even_without_wal() {
        let dir = tempfile::tempdir().unwrap();
        let b = ChangelogBinding {
            changelog: crate::changelog::ChangelogId::new("app-s-changelog", 2).unwrap(),
            lineage: crate::changelog::Lineage("l-1".into()),
        };
        let opts = RocksOptions {
            wal: false,
            ..RocksOptions::default()
        };
        {
            let mut s = RocksStore::open(dir.path(), &opts).unwrap();
            assert_eq!(s.binding().unwrap(), None);
            s.bind(&b).unwrap();
        }
        let mut s = RocksStore::open(dir.path(), &opts).unwrap();
        assert_eq!(s.binding().unwrap(), Some(b.clone()));
        let other = ChangelogBinding {
            lineage: crate::changelog::Lineage("l-2".into()),
            ..b
        };
        assert_eq!(s.bind(&other).unwrap_err().kind(), ErrorKind::Stale);
    }

    #[test]
    fn second_open_of_same_dir_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let _a = RocksStore::open(dir.path(), &RocksOptions::default()).unwrap();
        let err = RocksStore::open(dir.path(), &RocksOptions::default()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
        assert_eq!(err.reason(), Some(crate::Reason::InUse), "{err}");
    }
}
