//! Reading a file changelog forward: large buffered chunks, records handed
//! out as zero-copy slices of the chunk they were read in.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use super::codec::{self, Frame, HEADER_LEN};
use super::segment::{IndexBuilder, Segment};
use crate::changelog::{ChangelogReader, LoggedRecord};
use crate::error::{Error, Result};

/// Bytes read from a segment in one system call.
const CHUNK_BYTES: usize = 1 << 20;

/// A reader over a snapshot of the segment list taken when it was opened. It
/// holds `Arc`s of the segments it has still to read (the first is the one
/// being read; it lets go of each as it moves past it): a compaction that
/// replaces a segment file meanwhile does not disturb it, as a replaced
/// segment keeps its old bytes under a retired name for as long as it is
/// held.
pub(crate) struct FileReader {
    segments: VecDeque<Arc<Segment>>,
    /// File position of the next frame to decode.
    pos: u64,
    chunk: Bytes,
    /// File position of `chunk[0]`.
    chunk_start: u64,
    from: u64,
    end: u64,
    last_offset: Option<u64>,
    /// Index being built while a not-yet-indexed segment is read from its
    /// start, installed when the segment has been read to its end.
    building: Option<IndexBuilder>,
    done: bool,
}

impl std::fmt::Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader")
            .field("from", &self.from)
            .field("end", &self.end)
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

impl FileReader {
    pub(crate) fn new(segments: Vec<Arc<Segment>>, from: u64, end: u64) -> Result<FileReader> {
        let mut r = FileReader {
            segments: segments.into(),
            pos: HEADER_LEN as u64,
            chunk: Bytes::new(),
            chunk_start: 0,
            from,
            end,
            last_offset: None,
            building: None,
            done: from >= end,
        };
        if r.done || r.segments.is_empty() {
            r.done = true;
            return Ok(r);
        }
        // Binary search over base offsets: the last segment starting at or before `from`.
        let i = r
            .segments
            .partition_point(|s| s.base <= from)
            .saturating_sub(1);
        r.segments.drain(..i);
        let seg = Arc::clone(&r.segments[0]);
        if from > seg.base {
            let next_base = r.segments.get(1).map(|s| s.base);
            let index = seg.ensure_index(next_base)?;
            r.pos = index.position_for(from);
        } else {
            r.start_building();
        }
        Ok(r)
    }

    fn start_building(&mut self) {
        let seg = &self.segments[0];
        self.building = if seg.index().is_none() {
            Some(IndexBuilder::new())
        } else {
            None
        };
    }

    fn next_base(&self) -> Option<u64> {
        self.segments.get(1).map(|s| s.base)
    }

    fn corrupt(&self, reason: &str) -> Error {
        self.segments[0].corrupt_at(self.pos, reason)
    }

    /// Makes `chunk` hold at least `need` bytes from `pos` (or everything up
    /// to `seg_len`).
    fn fill(&mut self, seg_len: u64, need: usize) -> Result<()> {
        let avail = seg_len - self.pos;
        let want = (need.max(CHUNK_BYTES) as u64).min(avail);
        let want = usize::try_from(want).map_err(|_| Error::internal("chunk too large"))?;
        self.chunk = self.segments[0].read_at(self.pos, want)?;
        self.chunk_start = self.pos;
        Ok(())
    }
}

/// An error may come after records a call had already moved past: the
/// changelog hands this reader out wrapped in a
/// [`FusedReader`](crate::changelog::FusedReader).
impl ChangelogReader for FileReader {
    fn next_batch(&mut self, max_records: usize) -> Result<Option<Vec<LoggedRecord>>> {
        let max_records = max_records.max(1);
        let mut out = Vec::new();
        while !self.done && out.len() < max_records {
            let seg = Arc::clone(&self.segments[0]);
            let seg_len = seg.len();
            if self.pos >= seg_len {
                if let Some(b) = self.building.take()
                    && self.next_base().is_some()
                {
                    // Read from its start to its end: the index is complete.
                    seg.set_index(b.index);
                }
                if self.segments.len() < 2 {
                    self.done = true;
                    break;
                }
                self.segments.pop_front();
                self.pos = HEADER_LEN as u64;
                self.chunk = Bytes::new();
                self.start_building();
                continue;
            }
            let in_chunk = self.pos >= self.chunk_start
                && self.pos < self.chunk_start + self.chunk.len() as u64;
            if !in_chunk {
                self.fill(seg_len, codec::FRAME_HEADER_LEN)?;
            }
            let at = (self.pos - self.chunk_start) as usize;
            match codec::decode_frame(&self.chunk, at) {
                Frame::Record(r) => {
                    let bad_order = match self.last_offset {
                        Some(l) => r.offset <= l,
                        None => r.offset < seg.base,
                    };
                    if bad_order {
                        return Err(self.corrupt(&format!(
                            "offsets do not increase offset=`{}` previous=`{}`",
                            r.offset,
                            self.last_offset.map_or(seg.base, |l| l)
                        )));
                    }
                    if self.next_base().is_some_and(|n| r.offset >= n) {
                        return Err(seg.beyond_next_base(r.offset, self.next_base()));
                    }
                    if r.offset >= self.end {
                        self.done = true;
                        break;
                    }
                    if let Some(b) = self.building.as_mut() {
                        b.add(r.offset, self.pos);
                    }
                    self.last_offset = Some(r.offset);
                    if r.offset >= self.from {
                        out.push(r.to_logged(&self.chunk));
                    }
                    self.pos = self.chunk_start + r.next as u64;
                }
                Frame::Incomplete { needed } => {
                    let chunk_end = self.chunk_start + self.chunk.len() as u64;
                    if chunk_end >= seg_len || self.pos + needed as u64 > seg_len {
                        // Readers only ever see complete records, so this is damage.
                        return Err(self.corrupt("truncated record"));
                    }
                    self.fill(seg_len, needed)?;
                }
                Frame::Invalid(reason) => return Err(self.corrupt(reason)),
            }
        }
        if out.is_empty() && self.done {
            Ok(None)
        } else {
            Ok(Some(out))
        }
    }

    fn end_offset(&self) -> u64 {
        self.end
    }
}
