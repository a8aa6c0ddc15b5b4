//! [`BlobReader`], the verified streaming read of a blob, and the local
//! repository's direct file copies behind it.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use object_store::path::Path;

use super::{BlobRef, blocking_io};
use crate::error::{Error, Result};
use crate::repo::map_store_error;
use crate::repo::paths::BlobHash;

/// A verified streaming read of one blob: chunks are handed out as they
/// arrive (unverified until the end), and the final call returns an error
/// instead of `None` if the size or hash does not match, so a consumer that
/// reads to the end never accepts bad bytes.
pub struct BlobReader {
    pub(super) limit: Option<std::sync::Arc<crate::repo::BandwidthLimit>>,
    pub(super) counter: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    pub(super) key: Path,
    pub(super) expected: BlobRef,
    /// The bytes of the blob this reads: all of them, or one range.
    pub(super) range: std::ops::Range<u64>,
    /// A range's BLAKE3 subtree hash, once read to its verified end.
    pub(super) range_hash: Option<blake3::hazmat::ChainingValue>,
    pub(super) stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    /// A local repository's file, not yet turned into `stream`: a copy to
    /// a file ([`BlobReader::copy_to`]) reads it directly instead.
    pub(super) local: Option<LocalFile>,
    pub(super) hasher: blake3::Hasher,
    pub(super) seen: u64,
    pub(super) done: bool,
}

/// The open file behind a local repository's read, and where the read
/// starts in it.
pub(super) struct LocalFile {
    pub(super) file: std::fs::File,
    pub(super) path: std::path::PathBuf,
    pub(super) start: u64,
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
    pub(super) fn range_hash(&self) -> Option<blake3::hazmat::ChainingValue> {
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
    pub(super) async fn copy_to(
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
            let copied = crate::util::blocking(move || {
                let r = copy_hashed(&local, want, &mut hasher, &out, pos, counter.as_deref());
                Ok((hasher, local.path, r))
            })
            .await?;
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

pub(super) enum CopyError {
    Read(std::io::Error),
    Write(std::io::Error),
}

/// How much [`copy_hashed`] moves per read: small enough to stay in a
/// core's L2 cache between the read, the hash and the write.
const COPY_CHUNK: usize = 256 << 10;

/// Copies up to `want` bytes of `src` from its start to `out` at `pos`,
/// hashing them; returns how many there were (fewer at end of file).
pub(super) fn copy_hashed(
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
        let (local, read) = crate::util::blocking_io(move || {
            let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
            let r = crate::util::read_at(&local.file, &mut buf, local.start + done).map(|got| {
                buf.truncate(got);
                buf
            });
            Ok((local, r))
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
