//! Uploads: small blobs in one `put`, large ones through a staging key
//! (or, in a local repository, one blocking copy), immutable files by hard
//! link where allowed.

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use std::path::PathBuf;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::Blobs;
use super::local::{copy_blob, link_blob};
use super::reader::LocalFile;
use super::{BlobRef, PutOutcome, blocking_io};
use crate::error::{Error, ErrorKind, Result};
use crate::repo::map_store_error;
use crate::repo::paths::{self, BlobHash, StoreKey};

impl<'a> Blobs<'a> {
    /// Stores `bytes` as a blob of store `sk`.
    pub async fn put_blob_bytes(self, sk: &StoreKey, bytes: Bytes) -> Result<PutOutcome> {
        if bytes.len() >= self.repo.transfer.multipart_threshold.max(1) {
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
    pub async fn put_blob_file(self, sk: &StoreKey, path: &std::path::Path) -> Result<PutOutcome> {
        let threshold = self.repo.transfer.multipart_threshold.max(1);
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
            Ok(Err(file)) => match self
                .repo
                .local
                .clone()
                .filter(|_| self.repo.limit.is_none())
            {
                // A local repository copies a large file itself: one
                // blocking thread reads, hashes and writes it through one
                // buffer, instead of multipart parts held in memory.
                Some(local) => {
                    let (sk_c, staging) = (sk.clone(), paths::staging(sk, self.repo.new_ulid()));
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
    /// [`TransferOptions::link_immutable_files`](super::TransferOptions::link_immutable_files)
    /// in a `file://` repository, the blob is a hard link to the file: it
    /// is read once for its hash, fsynced (cheap when its writer already
    /// did), linked, and its
    /// directory fsynced. Everywhere else, and whenever the link cannot be
    /// made (another filesystem, hard links refused, a blob of that hash
    /// but another size in the way), this is
    /// [`put_blob_file`](Self::put_blob_file).
    ///
    /// A caller that modifies the file afterwards corrupts the blob (restore
    /// finds out and refuses it); files that may change go through
    /// `put_blob_file`.
    pub async fn put_immutable_file(
        self,
        sk: &StoreKey,
        path: &std::path::Path,
    ) -> Result<PutOutcome> {
        let Some(local) = self
            .repo
            .local
            .clone()
            .filter(|_| self.repo.transfer.link_immutable_files)
        else {
            return self.put_blob_file(sk, path).await;
        };
        let (src, sk_c) = (path.to_owned(), sk.clone());
        let now = std::time::UNIX_EPOCH
            + std::time::Duration::from_millis(
                u64::try_from(self.repo.clock.now_ms()).unwrap_or(0),
            );
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
    pub async fn put_blob_files(self, sk: &StoreKey, files: &[PathBuf]) -> Result<Vec<PutOutcome>> {
        futures::stream::iter((0..files.len()).map(|i| self.put_blob_file(sk, &files[i])))
            .buffered(self.repo.transfer.parallelism.max(1))
            .try_collect()
            .await
    }

    /// Stores everything `reader` yields as one blob, hashing while reading.
    pub async fn put_blob_reader<R: AsyncRead + Unpin + Send>(
        self,
        sk: &StoreKey,
        mut reader: R,
    ) -> Result<PutOutcome> {
        let threshold = self.repo.transfer.multipart_threshold.max(1);
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

    async fn put_small(self, sk: &StoreKey, hash: BlobHash, bytes: Bytes) -> Result<PutOutcome> {
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
        self.repo.throttle(size).await;
        // Durable once put returns (LocalFileSystem fsyncs; object stores ack
        // after persisting). Overwrite is safe: same key, same bytes.
        self.repo
            .store
            .put(&key, PutPayload::from(bytes))
            .await
            .map_err(|e| map_store_error(e, &format!("cannot upload blob key=`{key}`")))?;
        Ok(PutOutcome {
            blob,
            uploaded: true,
        })
    }

    async fn put_large<R: AsyncRead + Unpin + Send>(
        self,
        sk: &StoreKey,
        first: BytesMut,
        mut reader: R,
    ) -> Result<PutOutcome> {
        let staging = paths::staging(sk, self.repo.new_ulid());
        let upload = self
            .repo
            .store
            .put_multipart(&staging)
            .await
            .map_err(|e| map_store_error(e, &format!("cannot start upload key=`{staging}`")))?;
        let part_size = self.repo.transfer.part_size.max(1);
        let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        let streamed: Result<()> = async {
            let mut chunk = first;
            loop {
                if !chunk.is_empty() {
                    hasher.update(&chunk);
                    size += chunk.len() as u64;
                    self.repo.throttle(chunk.len() as u64).await;
                    writer
                        .wait_for_capacity(self.repo.transfer.parallelism.max(1))
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
        if let Err(e) = self.repo.store.rename(&staging, &key).await {
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

    async fn delete_quietly(self, key: &Path) {
        if let Err(e) = self.repo.store.delete(key).await {
            tracing::debug!(key = %key, error = %e, "could not delete staging object; gc will");
        }
    }
}
