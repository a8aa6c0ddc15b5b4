//! Content-addressed blobs (invariant 4) with verification on every
//! read (invariant 6).
//!
//! # Upload strategy
//!
//! A blob's key is the blake3 of its bytes, known only after reading them
//! all, and a stream can be read only once. So:
//!
//! * **small** blobs (below [`TransferOptions::multipart_threshold`], default
//!   8 MiB) are buffered in memory, hashed, checked with `head` (an existing
//!   blob of the same size is not uploaded again) and written with one `put`;
//! * **large** blobs are streamed, hashed on the way, as a multipart upload to
//!   a staging key `stores/<sk>/tmp/<ulid>`, then moved to
//!   `blobs/<hh>/<hash>` (`rename`: a real rename on a local filesystem, a
//!   server-side copy plus delete on S3/GCS/Azure — no bytes travel twice
//!   through the client), unless a blob with that hash already exists, in
//!   which case the staging object is just deleted. Staging objects of a
//!   crashed writer are removed by gc once older than its grace period.
//!   (S3's single-request copy is limited to 5 GiB per object.)
//!   A `file://` repository (without a bandwidth limit) does the same
//!   with plain system calls on one blocking thread: read, hash and write
//!   through one 256 KiB buffer to the staging path, fsync, rename, fsync
//!   the directory. Memory stays at the buffer, where multipart parts
//!   would hold up to `parallelism` × `part_size` per file;
//! * **immutable** files (RocksDB's SSTs, [`Repository::put_immutable_file`])
//!   may be hard-linked into a local repository instead
//!   ([`TransferOptions::link_immutable_files`]).
//!
//! Blobs are written with `PutMode::Overwrite`: the content is identical by
//! construction, so a racing second writer is harmless.

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use std::path::PathBuf;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::paths::{self, BlobHash, StoreKey};
use super::{Repository, map_store_error};
use crate::error::{Error, ErrorKind, Result};

/// Transfer tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferOptions {
    /// How many blobs move at once (and how many parts of one upload are in
    /// flight). Default 8.
    pub parallelism: usize,
    /// Blobs of at least this many bytes use the multipart staging path.
    /// Default 8 MiB.
    pub multipart_threshold: usize,
    /// Multipart part size (S3 needs at least 5 MiB). Default 8 MiB.
    pub part_size: usize,
    /// Downloads of blobs larger than this are split into ranges of this
    /// size fetched concurrently (up to `parallelism` per blob), each range
    /// hashed on its own and the hashes merged along BLAKE3's tree, so a
    /// large file is verified as it arrives without one task reading it
    /// all. Rounded down to a power of two of at least 1 KiB (BLAKE3's
    /// subtrees). Default 16 MiB.
    pub download_part_size: usize,
    /// When a restore's downloaded files are fsynced: before the restore
    /// returns, or after, in the background. Default
    /// [`RestoreSync::Background`].
    pub restore_sync: RestoreSync,
    /// In a `file://` repository, store files that their owner never
    /// modifies again (RocksDB's SSTs) as hard links to them instead of
    /// copies, when they are on the same filesystem
    /// ([`Repository::put_immutable_file`]). Default `false`.
    ///
    /// A link writes no data: a new SST costs a hash, an fsync of a file
    /// its writer already synced, and an fsync of a directory, not a copy
    /// and an fsync of its bytes. The link gets a fresh modification time
    /// (the live SST's too), as a copy would. The price is that
    /// the snapshot and the live store share those files' blocks: damage to
    /// one (a disk error, a tool writing into the file) is damage to both,
    /// where a copy would keep one good. Restore still verifies every byte,
    /// and the changelog can rebuild the store, so no data is lost, but the
    /// snapshot then no longer shortens that rebuild. Leave it off when the
    /// local repository is the one copy meant to survive the store's
    /// files; turn it on for a repository that is a fast restart point on
    /// the store's own disk.
    pub link_immutable_files: bool,
}

/// When a RocksDB restore makes its files durable.
///
/// A restored store is a cache of its changelog, so a machine crash may
/// lose it as long as it is never *used* torn. With `Background` (the
/// default) a restore publishes the store as soon as every file is written
/// and verified, marked with the kernel's boot id; a background thread
/// fsyncs the files and then removes the mark. A store still marked from an
/// earlier boot is refused on open and restored again (the runtime and
/// local-first restores do this by themselves; reused local files are
/// hashed first, as always). On the same boot the page cache holds every
/// byte, so a crash of the process changes nothing. Where there is no boot
/// id to read (platforms other than Linux) restores behave as `Immediate`.
///
/// `Immediate` fsyncs every file before the store is published: slower
/// (on a local disk the restore then waits for the whole store to be
/// written back), for callers that open restored directories with their
/// own RocksDB code instead of `RocksStore::open`, which would
/// not see the mark. `statesnap restore` into a directory
/// always syncs before it returns. The portable format always syncs too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestoreSync {
    /// Publish the store at once and fsync its files in the background.
    #[default]
    Background,
    /// fsync every file before the store is published.
    Immediate,
}

impl TransferOptions {
    /// The ranges a download of a blob of `size` bytes fetches separately
    /// (see [`download_part_size`](Self::download_part_size)), in order;
    /// `None` when it is fetched whole (one range's worth, or no
    /// parallelism to spread ranges over).
    pub fn download_ranges(&self, size: u64) -> Option<Vec<std::ops::Range<u64>>> {
        let part = ranged::part_size(self.download_part_size);
        (self.parallelism > 1 && size > part).then(|| {
            (0..size.div_ceil(part))
                .map(|i| i * part..((i + 1) * part).min(size))
                .collect()
        })
    }
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            parallelism: 8,
            multipart_threshold: 8 << 20,
            part_size: 8 << 20,
            download_part_size: 16 << 20,
            restore_sync: RestoreSync::default(),
            link_immutable_files: false,
        }
    }
}

/// A blob's identity: hash and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobRef {
    /// blake3 of the bytes.
    pub hash: BlobHash,
    /// Length in bytes.
    pub size: u64,
}

impl From<&super::FileEntry> for BlobRef {
    fn from(f: &super::FileEntry) -> Self {
        BlobRef {
            hash: f.blake3,
            size: f.size,
        }
    }
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutOutcome {
    /// The stored blob.
    pub blob: BlobRef,
    /// `false` when a blob with that hash already existed and nothing was
    /// uploaded.
    pub uploaded: bool,
}

/// What `head` says about a stored blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobInfo {
    /// Stored size.
    pub size: u64,
    /// Last modified, ms since the epoch (the object store's clock).
    pub last_modified_ms: i64,
}

impl Repository {
    /// Stores `bytes` as a blob of store `sk`.
    pub async fn put_blob_bytes(&self, sk: &StoreKey, bytes: Bytes) -> Result<PutOutcome> {
        if bytes.len() >= self.transfer.multipart_threshold.max(1) {
            return self.put_blob_reader(sk, &bytes[..]).await;
        }
        let hash = BlobHash::of(&bytes);
        self.put_small(sk, hash, bytes).await
    }

    /// Stores the local file at `path` as a blob, reading it once.
    ///
    /// A file below the multipart threshold is read and hashed in one
    /// blocking call (an incremental snapshot's new files are mostly small,
    /// and each hop to the blocking pool costs a fraction of a millisecond
    /// on a busy machine); a larger one streams.
    pub async fn put_blob_file(&self, sk: &StoreKey, path: &std::path::Path) -> Result<PutOutcome> {
        let threshold = self.transfer.multipart_threshold.max(1);
        let p = path.to_owned();
        let read = blocking_io(move || {
            use std::io::{Read, Seek};
            let mut file = std::fs::File::open(&p)?;
            if file.metadata()?.len() >= threshold as u64 {
                return Ok(Err(file));
            }
            let mut buf = Vec::new();
            (&mut file).take(threshold as u64).read_to_end(&mut buf)?;
            if buf.len() >= threshold {
                // Grown past the threshold since the stat: stream it.
                file.rewind()?;
                return Ok(Err(file));
            }
            Ok(Ok((BlobHash::of(&buf), Bytes::from(buf))))
        })
        .await;
        let put = match read {
            Err(e) => {
                return Err(Error::io(
                    format!("cannot read file to upload path=`{}`", path.display()),
                    e,
                ));
            }
            Ok(Ok((hash, bytes))) => self.put_small(sk, hash, bytes).await,
            Ok(Err(file)) => match self.local.clone().filter(|_| self.limit.is_none()) {
                // A local repository copies a large file itself: one
                // blocking thread reads, hashes and writes it through one
                // buffer, instead of multipart parts held in memory.
                Some(local) => {
                    let (sk_c, staging) = (sk.clone(), paths::staging(sk, self.new_ulid()));
                    let src = LocalFile {
                        file,
                        path: path.to_owned(),
                        start: 0,
                    };
                    blocking_io(move || copy_blob(&local, &sk_c, &src, &staging))
                        .await
                        .map_err(|e| Error::io("cannot copy file into the repository", e))
                }
                None => {
                    self.put_blob_reader(sk, tokio::fs::File::from_std(file))
                        .await
                }
            },
        };
        put.map_err(|e| {
            if e.kind() == ErrorKind::Io || e.kind() == ErrorKind::Corrupt {
                Error::new(
                    e.kind(),
                    format!("{} path=`{}`", e.message(), path.display()),
                )
                .with_source(e)
            } else {
                e
            }
        })
    }

    /// Stores the local file at `path` as a blob, for a file that its owner
    /// never modifies again (RocksDB's SSTs). With
    /// [`TransferOptions::link_immutable_files`] in a `file://` repository,
    /// the blob is a hard link to the file: it is read once for its hash,
    /// fsynced (cheap when its writer already did), linked, and its
    /// directory fsynced. Everywhere else, and whenever the link cannot be
    /// made (another filesystem, hard links refused, a blob of that hash
    /// but another size in the way), this is
    /// [`put_blob_file`](Self::put_blob_file).
    ///
    /// A caller that modifies the file afterwards corrupts the blob (restore
    /// finds out and refuses it); files that may change go through
    /// `put_blob_file`.
    pub async fn put_immutable_file(
        &self,
        sk: &StoreKey,
        path: &std::path::Path,
    ) -> Result<PutOutcome> {
        let Some(local) = self
            .local
            .clone()
            .filter(|_| self.transfer.link_immutable_files)
        else {
            return self.put_blob_file(sk, path).await;
        };
        let (src, sk_c) = (path.to_owned(), sk.clone());
        let now = std::time::UNIX_EPOCH
            + std::time::Duration::from_millis(u64::try_from(self.clock.now_ms()).unwrap_or(0));
        let linked = blocking_io(move || link_blob(&local, &sk_c, &src, now)).await;
        match linked {
            Ok(Some(out)) => Ok(out),
            Ok(None) => self.put_blob_file(sk, path).await,
            Err(e) => Err(Error::io(
                format!("cannot store file by hard link path=`{}`", path.display()),
                e,
            )),
        }
    }

    /// Stores the files at `paths` with bounded parallelism; outcomes are in
    /// input order.
    pub async fn put_blob_files(
        &self,
        sk: &StoreKey,
        files: &[PathBuf],
    ) -> Result<Vec<PutOutcome>> {
        futures::stream::iter((0..files.len()).map(|i| self.put_blob_file(sk, &files[i])))
            .buffered(self.transfer.parallelism.max(1))
            .try_collect()
            .await
    }

    /// Stores everything `reader` yields as one blob, hashing while reading.
    pub async fn put_blob_reader<R: AsyncRead + Unpin + Send>(
        &self,
        sk: &StoreKey,
        mut reader: R,
    ) -> Result<PutOutcome> {
        let threshold = self.transfer.multipart_threshold.max(1);
        let mut buf = BytesMut::with_capacity(threshold.min(1 << 20));
        // Read up to the threshold: if the stream ends first, it is small.
        while buf.len() < threshold {
            buf.reserve((threshold - buf.len()).min(1 << 20));
            let n = reader
                .read_buf(&mut buf)
                .await
                .map_err(|e| Error::io("cannot read blob source", e))?;
            if n == 0 {
                let bytes = buf.freeze();
                let hash = BlobHash::of(&bytes);
                return self.put_small(sk, hash, bytes).await;
            }
        }
        self.put_large(sk, buf, reader).await
    }

    async fn put_small(&self, sk: &StoreKey, hash: BlobHash, bytes: Bytes) -> Result<PutOutcome> {
        let size = bytes.len() as u64;
        let blob = BlobRef { hash, size };
        let key = paths::blob(sk, &hash);
        if let Some(info) = self.head_key(&key).await? {
            if info.size == size {
                return Ok(PutOutcome {
                    blob,
                    uploaded: false,
                });
            }
            tracing::warn!(key = %key, stored = info.size, expected = size, "replacing blob of wrong size");
        }
        self.throttle(size).await;
        // Durable once put returns (LocalFileSystem fsyncs; object stores ack
        // after persisting). Overwrite is safe: same key, same bytes.
        self.store
            .put(&key, PutPayload::from(bytes))
            .await
            .map_err(|e| map_store_error(e, &format!("cannot upload blob key=`{key}`")))?;
        Ok(PutOutcome {
            blob,
            uploaded: true,
        })
    }

    async fn put_large<R: AsyncRead + Unpin + Send>(
        &self,
        sk: &StoreKey,
        first: BytesMut,
        mut reader: R,
    ) -> Result<PutOutcome> {
        let staging = paths::staging(sk, self.new_ulid());
        let upload = self
            .store
            .put_multipart(&staging)
            .await
            .map_err(|e| map_store_error(e, &format!("cannot start upload key=`{staging}`")))?;
        let part_size = self.transfer.part_size.max(1);
        let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        let streamed: Result<()> = async {
            let mut chunk = first;
            loop {
                if !chunk.is_empty() {
                    hasher.update(&chunk);
                    size += chunk.len() as u64;
                    self.throttle(chunk.len() as u64).await;
                    writer
                        .wait_for_capacity(self.transfer.parallelism.max(1))
                        .await
                        .map_err(|e| {
                            map_store_error(e, &format!("cannot upload part key=`{staging}`"))
                        })?;
                    writer.put(chunk.freeze());
                }
                let mut next = BytesMut::with_capacity(part_size);
                while next.len() < part_size {
                    let n = reader
                        .read_buf(&mut next)
                        .await
                        .map_err(|e| Error::io("cannot read blob source", e))?;
                    if n == 0 {
                        break;
                    }
                }
                if next.is_empty() {
                    return Ok(());
                }
                chunk = next;
            }
        }
        .await;
        if let Err(e) = streamed {
            let _ = writer.abort().await;
            return Err(e);
        }
        if let Err(e) = writer.finish().await {
            self.delete_quietly(&staging).await;
            return Err(map_store_error(
                e,
                &format!("cannot complete upload key=`{staging}`"),
            ));
        }
        let hash = BlobHash::from(hasher.finalize());
        let blob = BlobRef { hash, size };
        let key = paths::blob(sk, &hash);
        let existing = match self.head_key(&key).await {
            Ok(x) => x,
            Err(e) => {
                self.delete_quietly(&staging).await;
                return Err(e);
            }
        };
        if existing.is_some_and(|i| i.size == size) {
            self.delete_quietly(&staging).await;
            return Ok(PutOutcome {
                blob,
                uploaded: false,
            });
        }
        // Server-side move into the content-addressed name.
        if let Err(e) = self.store.rename(&staging, &key).await {
            self.delete_quietly(&staging).await;
            if matches!(e, object_store::Error::NotFound { .. }) {
                return Err(Error::transient(format!(
                    "staged upload disappeared before it was moved into place (gc removes staging \
                     objects older than its grace period); retry from=`{staging}` to=`{key}`"
                ))
                .with_reason(crate::Reason::GcRace)
                .with_source(e));
            }
            return Err(map_store_error(
                e,
                &format!("cannot move staged blob from=`{staging}` to=`{key}`"),
            ));
        }
        Ok(PutOutcome {
            blob,
            uploaded: true,
        })
    }

    async fn delete_quietly(&self, key: &Path) {
        if let Err(e) = self.store.delete(key).await {
            tracing::debug!(key = %key, error = %e, "could not delete staging object; gc will");
        }
    }

    pub(crate) async fn head_key(&self, key: &Path) -> Result<Option<BlobInfo>> {
        match self.store.head(key).await {
            Ok(m) => Ok(Some(BlobInfo {
                size: m.size,
                last_modified_ms: m.last_modified.timestamp_millis(),
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(map_store_error(
                e,
                &format!("cannot check object key=`{key}`"),
            )),
        }
    }

    /// Size and age of a stored blob, `None` if it does not exist.
    pub async fn head_blob(&self, sk: &StoreKey, hash: &BlobHash) -> Result<Option<BlobInfo>> {
        self.head_key(&paths::blob(sk, hash)).await
    }

    /// Whether every blob `files` name is present with its size, so a new
    /// snapshot may name them without uploading them again. A writer asks
    /// this before it reuses a parent's files: a blob gc swept since the
    /// parent was committed must be uploaded again from the cut, or every
    /// retry of the snapshot would fail its commit the same way.
    pub async fn blobs_present(&self, sk: &StoreKey, files: &[super::FileEntry]) -> Result<bool> {
        let wanted: Vec<(BlobHash, u64)> = files.iter().map(|f| (f.blake3, f.size)).collect();
        let found: Vec<bool> = futures::stream::iter(wanted)
            .map(|(hash, size)| async move {
                Ok::<_, Error>(
                    self.head_blob(sk, &hash)
                        .await?
                        .is_some_and(|i| i.size == size),
                )
            })
            .buffer_unordered(self.transfer.parallelism.max(1))
            .try_collect()
            .await?;
        Ok(found.into_iter().all(|b| b))
    }

    /// `get` of blob `key` (whole or a range, per `opts`): missing is
    /// not-found, a stored size other than the blob's is corrupt.
    async fn get_sized(
        &self,
        key: &Path,
        blob: &BlobRef,
        opts: object_store::GetOptions,
    ) -> Result<object_store::GetResult> {
        let res = self.store.get_opts(key, opts).await.map_err(|e| {
            if matches!(e, object_store::Error::NotFound { .. }) {
                Error::not_found(format!("blob is missing key=`{key}`")).with_source(e)
            } else {
                map_store_error(e, &format!("cannot read blob key=`{key}`"))
            }
        })?;
        if res.meta.size != blob.size {
            return Err(Error::corrupt(format!(
                "blob has the wrong size key=`{key}` expected_size={} actual_size={}",
                blob.size, res.meta.size
            )));
        }
        Ok(res)
    }

    /// Opens blob `blob` for verified streaming reads.
    pub async fn open_blob(&self, sk: &StoreKey, blob: &BlobRef) -> Result<BlobReader> {
        let key = paths::blob(sk, &blob.hash);
        self.open_range(key, blob, 0..blob.size).await
    }

    /// A verified streaming read of `range` of blob `key`. The whole blob
    /// ends by checking its hash; a part ends with its BLAKE3 subtree hash
    /// ([`BlobReader::range_hash`]) for the caller to merge.
    async fn open_range(
        &self,
        key: Path,
        blob: &BlobRef,
        range: std::ops::Range<u64>,
    ) -> Result<BlobReader> {
        use blake3::hazmat::HasherExt;
        let whole = range == (0..blob.size);
        let opts = object_store::GetOptions {
            range: (!whole).then(|| object_store::GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let res = self.get_sized(&key, blob, opts).await?;
        let mut hasher = blake3::Hasher::new();
        hasher.set_input_offset(range.start);
        let (stream, local) = match res.payload {
            object_store::GetResultPayload::File(file, path) => (
                futures::stream::empty().boxed(),
                Some(LocalFile {
                    file,
                    path,
                    start: res.range.start,
                }),
            ),
            object_store::GetResultPayload::Stream(s) => (s, None),
        };
        Ok(BlobReader {
            limit: self.limit.clone(),
            counter: self.read_counter.clone(),
            key,
            expected: *blob,
            range,
            range_hash: None,
            stream,
            local,
            hasher,
            seen: 0,
            done: false,
        })
    }

    /// Reads a blob into memory, verifying size and hash.
    pub async fn get_blob_bytes(&self, sk: &StoreKey, blob: &BlobRef) -> Result<Bytes> {
        let cap = usize::try_from(blob.size).unwrap_or(0).min(64 << 20);
        let mut out = BytesMut::with_capacity(cap);
        let mut r = self.open_blob(sk, blob).await?;
        while let Some(chunk) = r.next_chunk().await? {
            out.extend_from_slice(&chunk);
        }
        Ok(out.freeze())
    }

    /// Downloads a blob to `dest`, verifying size and hash while streaming.
    /// The bytes go to a temporary file next to `dest`, which is fsynced and
    /// renamed into place only once verified; on any failure it is removed.
    pub async fn get_blob_to_file(
        &self,
        sk: &StoreKey,
        blob: &BlobRef,
        dest: &std::path::Path,
    ) -> Result<()> {
        self.get_blob_to_file_with(sk, blob, dest, true).await
    }

    /// [`get_blob_to_file`](Self::get_blob_to_file), leaving the fsync to
    /// the caller when `sync` is false (a restore that syncs its files in
    /// the background, see [`RestoreSync`]).
    pub(crate) async fn get_blob_to_file_with(
        &self,
        sk: &StoreKey,
        blob: &BlobRef,
        dest: &std::path::Path,
        sync: bool,
    ) -> Result<()> {
        let parent = dest.parent().unwrap_or_else(|| std::path::Path::new("."));
        // Not on the blocking pool: a step there outlives a cancelled caller,
        // and could re-create a staging directory its guard just removed.
        // (Most often the directory exists: one `stat`.)
        std::fs::create_dir_all(parent).map_err(|e| {
            Error::io(
                format!("cannot create directory path=`{}`", parent.display()),
                e,
            )
        })?;
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent.join(format!(".{name}.partial-{}", self.new_ulid()));
        let res = self.download_to(sk, blob, &tmp, sync).await;
        match res {
            Ok(()) => tokio::fs::rename(&tmp, dest).await.map_err(|e| {
                Error::io(
                    format!(
                        "cannot move downloaded blob into place path=`{}`",
                        dest.display()
                    ),
                    e,
                )
            }),
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                Err(e)
            }
        }
    }

    async fn download_to(
        &self,
        sk: &StoreKey,
        blob: &BlobRef,
        tmp: &std::path::Path,
        sync: bool,
    ) -> Result<()> {
        if let Some(ranges) = self.transfer.download_ranges(blob.size) {
            return self.download_ranged(sk, blob, tmp, ranges, sync).await;
        }
        let mut r = self.open_blob(sk, blob).await?;
        let tmp_c = tmp.to_path_buf();
        let file = blocking_io(move || std::fs::File::create(tmp_c))
            .await
            .map_err(|e| Error::io(format!("cannot create file path=`{}`", tmp.display()), e))?;
        let file = std::sync::Arc::new(file);
        r.copy_to(&file, 0, tmp).await?;
        // fsync before the rename so a crash never leaves a verified name
        // pointing at unwritten bytes (unless the caller syncs later).
        if sync {
            let werr = |e| Error::io(format!("cannot fsync file path=`{}`", tmp.display()), e);
            blocking_io(move || file.sync_all()).await.map_err(werr)?;
        }
        Ok(())
    }

    /// [`download_to`](Self::download_to) in `ranges`, up to `parallelism`
    /// at once, each written at its offset and hashed as a BLAKE3 subtree;
    /// the subtree hashes are merged and compared with the blob's at the
    /// end (before the fsync, which only verified bytes get).
    async fn download_ranged(
        &self,
        sk: &StoreKey,
        blob: &BlobRef,
        tmp: &std::path::Path,
        ranges: Vec<std::ops::Range<u64>>,
        sync: bool,
    ) -> Result<()> {
        let key = paths::blob(sk, &blob.hash);
        let werr = |e| Error::io(format!("cannot write file path=`{}`", tmp.display()), e);
        let (tmp_c, size) = (tmp.to_path_buf(), blob.size);
        let file = blocking_io(move || {
            let f = std::fs::File::create(tmp_c)?;
            f.set_len(size)?;
            Ok(f)
        })
        .await
        .map_err(|e| Error::io(format!("cannot create file path=`{}`", tmp.display()), e))?;
        let file = std::sync::Arc::new(file);
        // `buffered` keeps the ranges' order: the merge needs it.
        let cvs: Vec<blake3::hazmat::ChainingValue> = futures::stream::iter(ranges)
            .map(|range| self.fetch_range(&key, blob, tmp, &file, range, sync))
            .buffered(self.transfer.parallelism.max(1))
            .try_collect()
            .await?;
        let actual = ranged::merge(&cvs).ok_or_else(|| {
            Error::internal(format!("ranged download of a one-range blob key=`{key}`"))
        })?;
        if actual != blob.hash {
            return Err(Error::corrupt(format!(
                "blob hash mismatch key=`{key}` expected=`{}` actual=`{actual}`",
                blob.hash
            )));
        }
        if sync {
            blocking_io(move || file.sync_all()).await.map_err(werr)?;
        }
        Ok(())
    }

    /// One range of a ranged download: fetched, written at its offset, and
    /// hashed as the BLAKE3 subtree it is.
    async fn fetch_range(
        &self,
        key: &Path,
        blob: &BlobRef,
        tmp: &std::path::Path,
        file: &std::sync::Arc<std::fs::File>,
        range: std::ops::Range<u64>,
        sync: bool,
    ) -> Result<blake3::hazmat::ChainingValue> {
        let start = range.start;
        let mut r = self.open_range(key.clone(), blob, range).await?;
        r.copy_to(file, start, tmp).await?;
        // Write this range back now, while the other ranges are still
        // downloading, so the fsync at the end of the blob finds little
        // left to write (the disk's work overlaps the network's).
        if sync {
            let werr = |e| Error::io(format!("cannot fsync file path=`{}`", tmp.display()), e);
            let file = file.clone();
            blocking_io(move || file.sync_data()).await.map_err(werr)?;
        }
        r.range_hash().ok_or_else(|| {
            Error::internal(format!(
                "a whole-blob read in a ranged download key=`{key}`"
            ))
        })
    }

    /// Downloads many blobs with bounded parallelism.
    pub async fn get_blobs_to_files(
        &self,
        sk: &StoreKey,
        items: &[(BlobRef, PathBuf)],
    ) -> Result<()> {
        crate::util::drain_bounded(items, self.transfer.parallelism, |(b, p)| {
            self.get_blob_to_file(sk, b, p)
        })
        .await
        .map(drop)
    }
}

/// A verified streaming read of one blob: chunks are handed out as they
/// arrive (unverified until the end), and the final call returns an error
/// instead of `None` if the size or hash does not match, so a consumer that
/// reads to the end never accepts bad bytes.
pub struct BlobReader {
    limit: Option<std::sync::Arc<super::BandwidthLimit>>,
    counter: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    key: Path,
    expected: BlobRef,
    /// The bytes of the blob this reads: all of them, or one range.
    range: std::ops::Range<u64>,
    /// A range's BLAKE3 subtree hash, once read to its verified end.
    range_hash: Option<blake3::hazmat::ChainingValue>,
    stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    /// A local repository's file, not yet turned into `stream`: a copy to
    /// a file ([`BlobReader::copy_to`]) reads it directly instead.
    local: Option<LocalFile>,
    hasher: blake3::Hasher,
    seen: u64,
    done: bool,
}

/// The open file behind a local repository's read, and where the read
/// starts in it.
struct LocalFile {
    file: std::fs::File,
    path: std::path::PathBuf,
    start: u64,
}

impl std::fmt::Debug for BlobReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobReader")
            .field("key", &self.key)
            .field("seen", &self.seen)
            .finish()
    }
}

impl BlobReader {
    /// Bytes this read must deliver.
    fn want(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// For a read of one range of a blob, once read to its end: the
    /// range's BLAKE3 subtree hash (the blob's hash is checked when the
    /// ranges are merged).
    fn range_hash(&self) -> Option<blake3::hazmat::ChainingValue> {
        self.range_hash
    }

    /// The next chunk, `None` at the verified end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        if self.done {
            return Ok(None);
        }
        if let Some(local) = self.local.take() {
            self.stream = local_stream(local, self.want());
        }
        let key = &self.key;
        match self.stream.next().await {
            Some(chunk) => {
                let chunk = chunk
                    .map_err(|e| map_store_error(e, &format!("cannot read blob key=`{key}`")))?;
                self.seen += chunk.len() as u64;
                if let Some(c) = &self.counter {
                    c.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
                if let Some(l) = &self.limit {
                    l.take(chunk.len() as u64).await;
                }
                if self.seen > self.want() {
                    return Err(Error::corrupt(format!(
                        "blob is longer than expected key=`{key}` expected_size={} range={:?}",
                        self.expected.size, self.range
                    )));
                }
                self.hasher.update(&chunk);
                Ok(Some(chunk))
            }
            None => self.finish().map(|()| None),
        }
    }

    /// The checks at the end of the read: size, then the hash (a range:
    /// its subtree hash, kept for the caller's merge).
    fn finish(&mut self) -> Result<()> {
        let key = &self.key;
        self.done = true;
        if self.seen != self.want() {
            return Err(Error::corrupt(format!(
                "blob is truncated key=`{key}` expected_size={} range={:?} got={}",
                self.expected.size, self.range, self.seen
            )));
        }
        if self.range != (0..self.expected.size) {
            use blake3::hazmat::HasherExt;
            self.range_hash = Some(self.hasher.finalize_non_root());
            return Ok(());
        }
        let actual = BlobHash::from(self.hasher.finalize());
        if actual != self.expected.hash {
            return Err(Error::corrupt(format!(
                "blob hash mismatch key=`{key}` expected=`{}` actual=`{actual}`",
                self.expected.hash
            )));
        }
        Ok(())
    }

    /// Reads the rest of the blob (or range) into `out` from position
    /// `pos`, verified as [`next_chunk`](Self::next_chunk) verifies it
    /// (`out_path` names `out` in errors). From a local repository without a
    /// bandwidth limit, one blocking task reads, hashes and writes through
    /// one small buffer that stays in the CPU's cache (handing chunks
    /// between threads cost more than the copy itself); otherwise chunks
    /// are streamed through a [`FileSink`].
    async fn copy_to(
        &mut self,
        out: &std::sync::Arc<std::fs::File>,
        pos: u64,
        out_path: &std::path::Path,
    ) -> Result<()> {
        let werr = |e| {
            Error::io(
                format!("cannot write file path=`{}`", out_path.display()),
                e,
            )
        };
        if self.limit.is_none()
            && self.seen == 0
            && let Some(local) = self.local.take()
        {
            let want = self.want();
            let mut hasher = std::mem::take(&mut self.hasher);
            let counter = self.counter.clone();
            let out = out.clone();
            let copied = tokio::task::spawn_blocking(move || {
                let r = copy_hashed(&local, want, &mut hasher, &out, pos, counter.as_deref());
                (hasher, local.path, r)
            })
            .await
            .map_err(|e| Error::internal(format!("a blob copy task failed: {e}")))?;
            let (hasher, path, r) = copied;
            self.hasher = hasher;
            self.seen = match r {
                Ok(n) => n,
                Err(CopyError::Read(e)) => {
                    return Err(Error::io(
                        format!(
                            "cannot read blob key=`{}` path=`{}`",
                            self.key,
                            path.display()
                        ),
                        e,
                    ));
                }
                Err(CopyError::Write(e)) => return Err(werr(e)),
            };
            return self.finish();
        }
        let mut w = FileSink::at(out.clone(), pos);
        while let Some(chunk) = self.next_chunk().await? {
            w.write(chunk).await.map_err(werr)?;
        }
        w.finish().await.map_err(werr)
    }
}

enum CopyError {
    Read(std::io::Error),
    Write(std::io::Error),
}

/// How much [`copy_hashed`] moves per read: small enough to stay in a
/// core's L2 cache between the read, the hash and the write.
const COPY_CHUNK: usize = 256 << 10;

/// Copies up to `want` bytes of `src` from its start to `out` at `pos`,
/// hashing them; returns how many there were (fewer at end of file).
fn copy_hashed(
    src: &LocalFile,
    want: u64,
    hasher: &mut blake3::Hasher,
    out: &std::fs::File,
    pos: u64,
    counter: Option<&std::sync::atomic::AtomicU64>,
) -> std::result::Result<u64, CopyError> {
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut done = 0u64;
    while done < want {
        let n = usize::try_from((want - done).min(COPY_CHUNK as u64)).unwrap_or(COPY_CHUNK);
        let got = crate::util::read_at(&src.file, &mut buf[..n], src.start + done)
            .map_err(CopyError::Read)?;
        if got == 0 {
            break; // shorter than its metadata said: the size check reports it
        }
        hasher.update(&buf[..got]);
        crate::util::write_all_at(out, &buf[..got], pos + done).map_err(CopyError::Write)?;
        if let Some(c) = counter {
            c.fetch_add(got as u64, std::sync::atomic::Ordering::Relaxed);
        }
        done += got as u64;
    }
    Ok(done)
}

/// [`Repository::put_immutable_file`]'s link, on a blocking thread: the
/// outcome, or `None` when the file must be copied instead.
fn link_blob(
    local: &object_store::local::LocalFileSystem,
    sk: &StoreKey,
    src: &std::path::Path,
    now: std::time::SystemTime,
) -> std::io::Result<Option<PutOutcome>> {
    use std::io::ErrorKind as K;
    // Checking that the name links the hashed file takes inode numbers.
    if cfg!(not(unix)) {
        return Ok(None);
    }
    let mut file = std::fs::File::open(src)?;
    let mut hasher = blake3::Hasher::new();
    let size = std::io::copy(&mut file, &mut hasher)?;
    let blob = BlobRef {
        hash: BlobHash::from(hasher.finalize()),
        size,
    };
    let Ok(dest) = local.path_to_filesystem(&paths::blob(sk, &blob.hash)) else {
        return Ok(None);
    };
    #[cfg(unix)]
    let hashed = file.metadata()?;
    match std::fs::metadata(&dest) {
        Ok(m) if m.len() == size => {
            return Ok(Some(PutOutcome {
                blob,
                uploaded: false,
            }));
        }
        // Another size under this hash: the copy replaces it.
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == K::NotFound => {}
        Err(e) => return Err(e),
    }
    // A fresh modification time (`now`, the repository's clock, which gc
    // reads too), as a copy would have: gc condemns only blobs older than
    // its grace period, and an SST may be hours old. (It is the live
    // file's time too; RocksDB keeps an SST's age in its properties, not in
    // its mtime.) A file whose time cannot be set is copied instead.
    if file.set_modified(now).is_err() {
        return Ok(None);
    }
    // The blob is durable once its name is: the data first (a no-op when
    // the file's writer synced it, as RocksDB does its SSTs), then the
    // directory entry.
    file.sync_all()?;
    let Some(dir) = dest.parent() else {
        return Ok(None);
    };
    let created = create_dirs(dir)?;
    match std::fs::hard_link(src, &dest) {
        Ok(()) => {}
        // A racing writer stored it first: same hash, same bytes.
        Err(e) if e.kind() == K::AlreadyExists => {
            return Ok(std::fs::metadata(&dest)
                .is_ok_and(|m| m.len() == size)
                .then_some(PutOutcome {
                    blob,
                    uploaded: false,
                }));
        }
        // Another filesystem, or links refused (`protected_hardlinks`, a
        // filesystem without them): copy.
        Err(e) => {
            tracing::debug!(path = %src.display(), error = %e, "hard link refused, copying");
            return Ok(None);
        }
    }
    // The name must be the file that was hashed: a source path replaced
    // between the hash and the link is undone and copied instead.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let linked = std::fs::metadata(&dest)?;
        if (linked.dev(), linked.ino()) != (hashed.dev(), hashed.ino()) {
            std::fs::remove_file(&dest)?;
            return Ok(None);
        }
    }
    sync_dirs(dir, created.as_deref())?;
    Ok(Some(PutOutcome {
        blob,
        uploaded: true,
    }))
}

/// A local repository's copy of a large file (`src`, read from its start)
/// to blob `sk`'s staging path `staging`, then, named by its hash, into the
/// blob space: read, hashed and written through one buffer
/// ([`copy_hashed`], as a restore copies a local blob out); fsynced before
/// the rename; its directory fsynced after. A blob of that hash and size
/// already there is kept and the copy removed.
fn copy_blob(
    local: &object_store::local::LocalFileSystem,
    sk: &StoreKey,
    src: &LocalFile,
    staging: &Path,
) -> std::io::Result<PutOutcome> {
    let tmp = local
        .path_to_filesystem(staging)
        .map_err(std::io::Error::other)?;
    if let Some(dir) = tmp.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let copied = (|| {
        let out = std::fs::File::create_new(&tmp)?;
        let mut hasher = blake3::Hasher::new();
        let size = match copy_hashed(src, u64::MAX, &mut hasher, &out, 0, None) {
            Ok(n) => n,
            Err(CopyError::Read(e) | CopyError::Write(e)) => return Err(e),
        };
        let blob = BlobRef {
            hash: BlobHash::from(hasher.finalize()),
            size,
        };
        let dest = local
            .path_to_filesystem(&paths::blob(sk, &blob.hash))
            .map_err(std::io::Error::other)?;
        if std::fs::metadata(&dest).is_ok_and(|m| m.len() == size) {
            return Ok((blob, None));
        }
        out.sync_all()?;
        Ok((blob, Some(dest)))
    })();
    let (blob, dest) = match copied {
        Ok(x) => x,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let Some(dest) = dest else {
        // The blob is there already; a leftover copy is gc's to remove.
        let _ = std::fs::remove_file(&tmp);
        return Ok(PutOutcome {
            blob,
            uploaded: false,
        });
    };
    let published = (|| {
        let dir = dest
            .parent()
            .ok_or_else(|| std::io::Error::other("blob path has no directory"))?;
        let created = create_dirs(dir)?;
        std::fs::rename(&tmp, &dest)?;
        sync_dirs(dir, created.as_deref())
    })();
    if let Err(e) = published {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(PutOutcome {
        blob,
        uploaded: true,
    })
}

/// Creates `dir` and its missing ancestors; returns the highest one it
/// created, for [`sync_dirs`].
fn create_dirs(dir: &std::path::Path) -> std::io::Result<Option<std::path::PathBuf>> {
    if dir.is_dir() {
        return Ok(None);
    }
    let created = first_missing_ancestor(dir);
    std::fs::create_dir_all(dir)?;
    Ok(created)
}

/// Makes a new entry in `dir` durable: fsyncs `dir`, then, for the
/// directories made for it (up to `created`, from [`create_dirs`]), each
/// one's entry in its parent.
fn sync_dirs(dir: &std::path::Path, created: Option<&std::path::Path>) -> std::io::Result<()> {
    crate::util::sync_dir(dir)?;
    if let Some(top) = created {
        let mut d = dir;
        while let Some(parent) = d.parent() {
            crate::util::sync_dir(parent)?;
            if d == top {
                break;
            }
            d = parent;
        }
    }
    Ok(())
}

/// The highest directory of `dir`'s path that does not exist yet.
fn first_missing_ancestor(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut top = None;
    let mut d = Some(dir);
    while let Some(p) = d.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        top = Some(p.to_path_buf());
        d = p.parent();
    }
    top
}

/// Runs blocking file I/O off the async threads.
async fn blocking_io<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// Writes a download's chunks to a file from blocking threads, in writes of
/// at least [`SINK_BYTES`] (small network chunks are gathered; chunks that
/// big already are written as they are, without a copy), at increasing
/// positions from where it starts. `std` positional writes, so the ranges
/// of one blob share one file handle.
struct FileSink {
    file: std::sync::Arc<std::fs::File>,
    pos: u64,
    buf: BytesMut,
}

const SINK_BYTES: usize = 1 << 20;

impl FileSink {
    fn at(file: std::sync::Arc<std::fs::File>, pos: u64) -> Self {
        FileSink {
            file,
            pos,
            buf: BytesMut::new(),
        }
    }

    async fn write(&mut self, chunk: Bytes) -> std::io::Result<()> {
        if self.buf.is_empty() && chunk.len() >= SINK_BYTES {
            return self.write_out(chunk).await;
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve(SINK_BYTES);
        }
        self.buf.extend_from_slice(&chunk);
        if self.buf.len() >= SINK_BYTES {
            let full = std::mem::take(&mut self.buf).freeze();
            self.write_out(full).await?;
        }
        Ok(())
    }

    async fn write_out(&mut self, bytes: Bytes) -> std::io::Result<()> {
        let (file, pos) = (self.file.clone(), self.pos);
        self.pos += bytes.len() as u64;
        blocking_io(move || crate::util::write_all_at(&file, &bytes, pos)).await
    }

    async fn finish(mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf).freeze();
            self.write_out(rest).await?;
        }
        Ok(())
    }
}

/// How much one read of a blob in a local repository takes.
const LOCAL_READ_BYTES: u64 = 1 << 20;

/// A local repository's file as a stream of `want` bytes from its start,
/// read with `std` on a blocking thread in [`LOCAL_READ_BYTES`] reads
/// straight into the buffer that is handed out (object_store's own file
/// stream reads 8 KiB per blocking task, and a tokio file copies every read
/// once more).
fn local_stream(
    local: LocalFile,
    want: u64,
) -> futures::stream::BoxStream<'static, object_store::Result<Bytes>> {
    futures::stream::try_unfold((local, 0u64), move |(local, done)| async move {
        if done >= want {
            return Ok(None);
        }
        let n = (want - done).min(LOCAL_READ_BYTES);
        let (local, read) = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
            let r = crate::util::read_at(&local.file, &mut buf, local.start + done).map(|got| {
                buf.truncate(got);
                buf
            });
            (local, r)
        })
        .await
        .map_err(|e| object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(e),
        })?;
        let buf = read.map_err(|e| object_store::Error::Generic {
            store: "LocalFileSystem",
            source: format!("cannot read path=`{}`: {e}", local.path.display()).into(),
        })?;
        if buf.is_empty() {
            // Shorter than its metadata said: the verifier reports it.
            return Ok(None);
        }
        let got = buf.len() as u64;
        Ok(Some((Bytes::from(buf), (local, done + got))))
    })
    .boxed()
}

/// BLAKE3 over ranges: the range size, and the merge of the ranges'
/// subtree hashes into the blob's hash.
mod ranged {
    use blake3::hazmat::{ChainingValue, Mode, merge_subtrees_non_root, merge_subtrees_root};

    use super::BlobHash;

    /// `size` rounded down to a power of two of at least one BLAKE3 chunk
    /// (1 KiB): every range but the last is then a whole, aligned subtree.
    pub(super) fn part_size(size: usize) -> u64 {
        let size = (size as u64).max(blake3::CHUNK_LEN as u64);
        1 << (63 - size.leading_zeros())
    }

    /// The hash of a blob from the chaining values of its ranges, in order:
    /// all but the last a full range of one power-of-two size, the last of
    /// any non-zero length up to it. `None` for fewer than two ranges (a
    /// single range is the root itself: hash it as a whole).
    pub(super) fn merge(cvs: &[ChainingValue]) -> Option<BlobHash> {
        let (last, full) = cvs.split_last()?;
        if full.is_empty() {
            return None;
        }
        // As BLAKE3's own hasher does: whole subtrees on a stack, two of
        // equal size merged as soon as a third range follows them (here:
        // always, since the last range comes after every full one).
        let mut stack: Vec<ChainingValue> = Vec::new();
        for (i, cv) in full.iter().enumerate() {
            stack.push(*cv);
            let mut done = i + 1;
            while done % 2 == 0 {
                let right = stack.pop()?;
                let left = stack.pop()?;
                stack.push(merge_subtrees_non_root(&left, &right, Mode::Hash));
                done /= 2;
            }
        }
        // Then from the right: the last range joins the smallest subtree,
        // that the next, and the largest makes the root.
        let mut right = *last;
        while let Some(left) = stack.pop() {
            if stack.is_empty() {
                return Some(BlobHash::from(merge_subtrees_root(
                    &left,
                    &right,
                    Mode::Hash,
                )));
            }
            right = merge_subtrees_non_root(&left, &right, Mode::Hash);
        }
        None
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use blake3::hazmat::HasherExt;

        fn by_ranges(data: &[u8], part: u64) -> Option<BlobHash> {
            let cvs: Vec<ChainingValue> = data
                .chunks(part as usize)
                .enumerate()
                .map(|(i, c)| {
                    blake3::Hasher::new()
                        .set_input_offset(i as u64 * part)
                        .update(c)
                        .finalize_non_root()
                })
                .collect();
            merge(&cvs)
        }

        /// Every length from two ranges up, around every boundary that
        /// changes the tree's shape, for several range sizes.
        #[test]
        fn merged_range_hashes_equal_the_whole_hash() {
            let data: Vec<u8> = (0..(80u32 << 10))
                .map(|i| (i * 7 + i / 251) as u8)
                .collect();
            for part in [1024u64, 2048, 4096, 8192] {
                let mut lens: Vec<u64> = (1..=9u64)
                    .flat_map(|n| [n * part - 1, n * part, n * part + 1, n * part + 700])
                    .filter(|l| *l > part)
                    .collect();
                lens.extend([part + 1, 2 * part, 4 * part + 1023, 80 << 10]);
                for len in lens {
                    let d = &data[..len as usize];
                    assert_eq!(
                        by_ranges(d, part),
                        Some(BlobHash::from(blake3::hash(d))),
                        "part={part} len={len}"
                    );
                }
            }
        }

        #[test]
        fn one_range_is_refused_and_sizes_round_down_to_powers_of_two() {
            let cv = blake3::Hasher::new().update(b"x").finalize_non_root();
            assert_eq!(merge(&[cv]), None);
            assert_eq!(merge(&[]), None);
            assert_eq!(part_size(16 << 20), 16 << 20);
            assert_eq!(part_size((16 << 20) + 5), 16 << 20);
            assert_eq!(part_size(3000), 2048);
            assert_eq!(part_size(1), 1024);
        }
    }
}
