//! Downloads: verified reads into memory or into files, large blobs in
//! ranges fetched concurrently.

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use std::path::PathBuf;

use super::Blobs;
use super::reader::{BlobReader, LocalFile};
use super::{BlobRef, blocking_io, ranged};
use crate::error::{Error, Result};
use crate::repo::map_store_error;
use crate::repo::paths::{self, StoreKey};

impl<'a> Blobs<'a> {
    /// `get` of blob `key` (whole or a range, per `opts`): missing is
    /// not-found, a stored size other than the blob's is corrupt.
    async fn get_sized(
        self,
        key: &Path,
        blob: &BlobRef,
        opts: object_store::GetOptions,
    ) -> Result<object_store::GetResult> {
        let res = self.repo.store.get_opts(key, opts).await.map_err(|e| {
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
    pub async fn open_blob(self, sk: &StoreKey, blob: &BlobRef) -> Result<BlobReader> {
        let key = paths::blob(sk, &blob.hash);
        self.open_range(key, blob, 0..blob.size).await
    }

    /// A verified streaming read of `range` of blob `key`. The whole blob
    /// ends by checking its hash; a part ends with its BLAKE3 subtree hash
    /// ([`BlobReader::range_hash`]) for the caller to merge.
    async fn open_range(
        self,
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
            limit: self.repo.limit.clone(),
            counter: self.repo.read_counter.clone(),
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
    pub async fn get_blob_bytes(self, sk: &StoreKey, blob: &BlobRef) -> Result<Bytes> {
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
        self,
        sk: &StoreKey,
        blob: &BlobRef,
        dest: &std::path::Path,
    ) -> Result<()> {
        self.get_blob_to_file_with(sk, blob, dest, true).await
    }

    /// [`get_blob_to_file`](Self::get_blob_to_file), leaving the fsync to
    /// the caller when `sync` is false (a restore that syncs its files in
    /// the background, see [`RestoreSync`](super::RestoreSync)).
    pub(crate) async fn get_blob_to_file_with(
        self,
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
        let tmp = parent.join(format!(".{name}.partial-{}", self.repo.new_ulid()));
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
        self,
        sk: &StoreKey,
        blob: &BlobRef,
        tmp: &std::path::Path,
        sync: bool,
    ) -> Result<()> {
        if let Some(ranges) = self.repo.transfer.download_ranges(blob.size) {
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
        self,
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
            .buffered(self.repo.transfer.parallelism.max(1))
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
        self,
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
        self,
        sk: &StoreKey,
        items: &[(BlobRef, PathBuf)],
    ) -> Result<()> {
        crate::util::drain_bounded(items, self.repo.transfer.parallelism, |(b, p)| {
            self.get_blob_to_file(sk, b, p)
        })
        .await
        .map(drop)
    }
}
