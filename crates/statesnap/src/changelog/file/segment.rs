//! One segment as the changelog holds it: its file (read through a handle
//! the changelog's open-file budget may close and reopen), the length
//! readers may read up to, and a sparse index.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use super::codec::{self, Frame, HEADER_LEN};
use super::files::{OpenFiles, SegmentFile};
use crate::error::{Error, Result};
pub(crate) use crate::util::{read_exact_at, write_all_at};

/// An index entry is added when this many bytes were written since the last one.
pub(crate) const INDEX_INTERVAL_BYTES: u64 = 64 * 1024;

/// File name of the segment whose first offset is `base`.
pub(crate) fn segment_file_name(base: u64) -> String {
    format!("{base:020}.log")
}

/// Parses a segment file name back into its base offset.
pub(crate) fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A sparse index of a segment: `(offset, file position)` of its first record
/// and then of one record every [`INDEX_INTERVAL_BYTES`].
#[derive(Debug, Default)]
pub(crate) struct SparseIndex {
    pub entries: Vec<(u64, u64)>,
}

impl SparseIndex {
    /// File position to start scanning at to find `offset`.
    pub(crate) fn position_for(&self, offset: u64) -> u64 {
        let i = self.entries.partition_point(|&(o, _)| o <= offset);
        if i == 0 {
            HEADER_LEN as u64
        } else {
            self.entries[i - 1].1
        }
    }

    pub(crate) fn first_offset(&self) -> Option<u64> {
        self.entries.first().map(|&(o, _)| o)
    }
}

/// Builds a sparse index while records go by.
#[derive(Debug, Default)]
pub(crate) struct IndexBuilder {
    pub index: SparseIndex,
    last_pos: Option<u64>,
}

impl IndexBuilder {
    pub(crate) fn new() -> Self {
        IndexBuilder::default()
    }
    pub(crate) fn resume(index: SparseIndex) -> Self {
        let last_pos = index.entries.last().map(|&(_, p)| p);
        IndexBuilder { index, last_pos }
    }
    /// Notes a record at file position `pos`.
    pub(crate) fn add(&mut self, offset: u64, pos: u64) {
        let due = match self.last_pos {
            None => true,
            Some(p) => pos >= p + INDEX_INTERVAL_BYTES,
        };
        if due {
            self.index.entries.push((offset, pos));
            self.last_pos = Some(pos);
        }
    }
}

/// A segment of the log.
#[derive(Debug)]
pub(crate) struct Segment {
    pub base: u64,
    pub prev_base: Option<u64>,
    pub path: PathBuf,
    file: Arc<SegmentFile>,
    /// Bytes readers may read: header plus complete records. Only grows while
    /// the segment is active; fixed once closed.
    len: AtomicU64,
    /// `None` until the segment has been scanned (closed segments are
    /// validated and indexed lazily, on first read); always `Some` for the
    /// active segment, whose index the writer extends.
    index: RwLock<Option<Arc<SparseIndex>>>,
}

impl Segment {
    pub(crate) fn new(
        base: u64,
        prev_base: Option<u64>,
        path: PathBuf,
        file: File,
        len: u64,
        index: Option<SparseIndex>,
        files: &Arc<OpenFiles>,
    ) -> Segment {
        Segment {
            base,
            prev_base,
            file: SegmentFile::new(path.clone(), file, files),
            path,
            len: AtomicU64::new(len),
            index: RwLock::new(index.map(Arc::new)),
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// Publishes bytes written by the writer (complete records only).
    pub(crate) fn set_len(&self, len: u64) {
        self.len.store(len, Ordering::Release);
    }

    pub(crate) fn has_records(&self) -> bool {
        self.len() > HEADER_LEN as u64
    }

    pub(crate) fn index(&self) -> Option<Arc<SparseIndex>> {
        match self.index.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub(crate) fn set_index(&self, index: SparseIndex) {
        let mut g = match self.index.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *g = Some(Arc::new(index));
    }

    /// Extends the index of the active segment with entries the writer built.
    pub(crate) fn extend_index(&self, entries: &[(u64, u64)]) {
        if entries.is_empty() {
            return;
        }
        let mut g = match self.index.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let mut idx = SparseIndex {
            entries: g.as_ref().map(|i| i.entries.clone()).unwrap_or_default(),
        };
        idx.entries.extend_from_slice(entries);
        *g = Some(Arc::new(idx));
    }

    /// Reads `len` bytes at `pos` (within what readers may see).
    pub(crate) fn read_at(&self, pos: u64, len: usize) -> Result<Bytes> {
        let mut buf = vec![0u8; len];
        let file = self.file.get(&self.path, self.len())?;
        read_exact_at(&file, &mut buf, pos).map_err(|e| {
            Error::io(
                format!(
                    "cannot read changelog segment path=`{}` file_offset=`{pos}` length=`{len}`",
                    self.path.display()
                ),
                e,
            )
        })?;
        Ok(Bytes::from(buf))
    }

    /// Gives the segment's bytes a name of their own before compaction
    /// renames a new file over its path (see the `files` module).
    pub(crate) fn retire(&self) -> Result<()> {
        self.file.retire(&self.path, self.len())
    }

    /// Reads the whole visible segment.
    pub(crate) fn read_all(&self) -> Result<Bytes> {
        let len = usize::try_from(self.len()).map_err(|_| {
            Error::internal(format!("segment too large path=`{}`", self.path.display()))
        })?;
        self.read_at(0, len)
    }

    /// Validates every record of the segment, builds its index and returns it.
    /// `next_base` bounds the offsets the segment may hold.
    pub(crate) fn ensure_index(&self, next_base: Option<u64>) -> Result<Arc<SparseIndex>> {
        if let Some(i) = self.index() {
            return Ok(i);
        }
        let buf = self.read_all()?;
        let mut b = IndexBuilder::new();
        let mut bound_err = None;
        let end = codec::scan_records(&buf, self.base, &self.path, |r| {
            if bound_err.is_none() && next_base.is_some_and(|n| r.offset >= n) {
                bound_err = Some(r.offset);
            }
            b.add(r.offset, (r.key.start - codec::FRAME_HEADER_LEN) as u64);
        })?;
        if let Some(o) = bound_err {
            return Err(self.beyond_next_base(o, next_base));
        }
        if let Some(t) = end.torn {
            // Only the last segment may have a torn tail, and recovery cut it.
            return Err(Error::corrupt(format!(
                "changelog segment is corrupt before its tail path=`{}` file_offset=`{}`: {} \
                 in a closed segment",
                self.path.display(),
                t.position,
                t.reason
            )));
        }
        self.set_index(b.index);
        self.index()
            .ok_or_else(|| Error::internal("segment index vanished"))
    }

    pub(crate) fn beyond_next_base(&self, offset: u64, next_base: Option<u64>) -> Error {
        Error::corrupt(format!(
            "changelog segment holds an offset at or beyond the next segment's base \
             path=`{}` offset=`{offset}` next_base_offset=`{}`",
            self.path.display(),
            next_base.map_or_else(|| "none".to_string(), |n| n.to_string())
        ))
    }

    /// Offset of the first record, `None` if the segment is empty.
    pub(crate) fn first_offset(&self) -> Result<Option<u64>> {
        if !self.has_records() {
            return Ok(None);
        }
        if let Some(o) = self.index().and_then(|i| i.first_offset()) {
            return Ok(Some(o));
        }
        let avail = self.len() - HEADER_LEN as u64;
        let mut want = avail.min(4096);
        loop {
            let want_usize = usize::try_from(want).unwrap_or(usize::MAX);
            let buf = self.read_at(HEADER_LEN as u64, want_usize)?;
            match codec::decode_frame(&buf, 0) {
                Frame::Record(r) => return Ok(Some(r.offset)),
                Frame::Incomplete { needed }
                    if (needed as u64) <= avail && needed as u64 > want =>
                {
                    want = needed as u64;
                }
                Frame::Incomplete { .. } => {
                    return Err(self.corrupt_at(HEADER_LEN as u64, "truncated record"));
                }
                Frame::Invalid(reason) => return Err(self.corrupt_at(HEADER_LEN as u64, reason)),
            }
        }
    }

    pub(crate) fn corrupt_at(&self, pos: u64, reason: &str) -> Error {
        Error::corrupt(format!(
            "changelog segment is corrupt path=`{}` file_offset=`{pos}`: {reason}",
            self.path.display()
        ))
    }
}
