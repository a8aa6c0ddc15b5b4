//! Content-addressed blobs (design invariant 4) with verification on every
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
//!
//! Blobs are written with `PutMode::Overwrite`: the content is identical by
//! construction, so a racing second writer is harmless.

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use std::path::PathBuf;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

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
    pub async fn put_blob_file(&self, sk: &StoreKey, path: &std::path::Path) -> Result<PutOutcome> {
        let file = tokio::fs::File::open(path).await.map_err(|e| {
            Error::io(
                format!("cannot open file to upload path=`{}`", path.display()),
                e,
            )
        })?;
        self.put_blob_reader(sk, file).await.map_err(|e| {
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
        Ok(BlobReader {
            limit: self.limit.clone(),
            counter: self.read_counter.clone(),
            key,
            expected: *blob,
            range,
            range_hash: None,
            stream: payload_stream(res),
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
        let parent = dest.parent().unwrap_or_else(|| std::path::Path::new("."));
        tokio::fs::create_dir_all(parent).await.map_err(|e| {
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
        let res = self.download_to(sk, blob, &tmp).await;
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
    ) -> Result<()> {
        if let Some(ranges) = self.transfer.download_ranges(blob.size) {
            return self.download_ranged(sk, blob, tmp, ranges).await;
        }
        let mut r = self.open_blob(sk, blob).await?;
        let file = tokio::fs::File::create(tmp)
            .await
            .map_err(|e| Error::io(format!("cannot create file path=`{}`", tmp.display()), e))?;
        let mut w = tokio::io::BufWriter::with_capacity(1 << 20, file);
        let werr = |e| Error::io(format!("cannot write file path=`{}`", tmp.display()), e);
        while let Some(chunk) = r.next_chunk().await? {
            w.write_all(&chunk).await.map_err(werr)?;
        }
        w.flush().await.map_err(werr)?;
        // fsync before the rename so a crash never leaves a verified name
        // pointing at unwritten bytes.
        w.get_mut().sync_all().await.map_err(werr)
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
    ) -> Result<()> {
        let key = paths::blob(sk, &blob.hash);
        let werr = |e| Error::io(format!("cannot write file path=`{}`", tmp.display()), e);
        let file = tokio::fs::File::create(tmp)
            .await
            .map_err(|e| Error::io(format!("cannot create file path=`{}`", tmp.display()), e))?;
        file.set_len(blob.size).await.map_err(werr)?;
        // `buffered` keeps the ranges' order: the merge needs it.
        let cvs: Vec<blake3::hazmat::ChainingValue> = futures::stream::iter(ranges)
            .map(|range| self.fetch_range(&key, blob, tmp, range))
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
        file.sync_all().await.map_err(werr)
    }

    /// One range of a ranged download: fetched, written at its offset, and
    /// hashed as the BLAKE3 subtree it is.
    async fn fetch_range(
        &self,
        key: &Path,
        blob: &BlobRef,
        tmp: &std::path::Path,
        range: std::ops::Range<u64>,
    ) -> Result<blake3::hazmat::ChainingValue> {
        use tokio::io::AsyncSeekExt;
        let start = range.start;
        let mut r = self.open_range(key.clone(), blob, range).await?;
        let werr = |e| Error::io(format!("cannot write file path=`{}`", tmp.display()), e);
        let mut f = tokio::fs::OpenOptions::new()
            .write(true)
            .open(tmp)
            .await
            .map_err(werr)?;
        f.seek(std::io::SeekFrom::Start(start))
            .await
            .map_err(werr)?;
        let mut w = tokio::io::BufWriter::with_capacity(1 << 20, f);
        while let Some(chunk) = r.next_chunk().await? {
            w.write_all(&chunk).await.map_err(werr)?;
        }
        w.flush().await.map_err(werr)?;
        // Write this range back now, while the other ranges are still
        // downloading, so the fsync at the end of the blob finds little
        // left to write (the disk's work overlaps the network's).
        w.get_mut().sync_data().await.map_err(werr)?;
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
    hasher: blake3::Hasher,
    seen: u64,
    done: bool,
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
            None => {
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
                    return Ok(None);
                }
                let actual = BlobHash::from(self.hasher.finalize());
                if actual != self.expected.hash {
                    return Err(Error::corrupt(format!(
                        "blob hash mismatch key=`{key}` expected=`{}` actual=`{actual}`",
                        self.expected.hash
                    )));
                }
                Ok(None)
            }
        }
    }
}

/// The object's bytes as a stream. A local file is read with 1 MiB reads
/// (object_store's own file stream uses 8 KiB chunks, each a blocking task,
/// which caps local restores far below disk bandwidth).
fn payload_stream(
    res: object_store::GetResult,
) -> futures::stream::BoxStream<'static, object_store::Result<Bytes>> {
    match res.payload {
        object_store::GetResultPayload::File(file, path) => {
            let len = res.range.end - res.range.start;
            let start = res.range.start;
            let file = tokio::fs::File::from_std(file);
            futures::stream::try_unfold(
                (file, path, start, len, false),
                |(mut f, path, start, left, seeked)| async move {
                    let io_err =
                        |e: std::io::Error, path: &std::path::Path| object_store::Error::Generic {
                            store: "LocalFileSystem",
                            source: format!("cannot read path=`{}`: {e}", path.display()).into(),
                        };
                    if !seeked && start > 0 {
                        use tokio::io::AsyncSeekExt;
                        f.seek(std::io::SeekFrom::Start(start))
                            .await
                            .map_err(|e| io_err(e, &path))?;
                    }
                    if left == 0 {
                        return Ok(None);
                    }
                    let want = usize::try_from(left.min(1 << 20)).unwrap_or(1 << 20);
                    let mut buf = BytesMut::with_capacity(want);
                    while buf.len() < want {
                        let n = f.read_buf(&mut buf).await.map_err(|e| io_err(e, &path))?;
                        if n == 0 {
                            break;
                        }
                    }
                    if buf.is_empty() {
                        // Shorter than its metadata said: the verifier reports it.
                        return Ok(None);
                    }
                    let got = buf.len() as u64;
                    Ok(Some((
                        buf.freeze(),
                        (f, path, start, left - got.min(left), true),
                    )))
                },
            )
            .boxed()
        }
        object_store::GetResultPayload::Stream(s) => s,
    }
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
