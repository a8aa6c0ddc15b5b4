//! The byte layout of segment files: the segment header, the record frame,
//! and the scanner that validates a whole segment and tells a torn tail from
//! corruption before the tail. `docs/format.md` ("File changelog") documents
//! the same layout byte by byte; keep the two in step.

use std::ops::Range;
use std::path::Path;

use bytes::Bytes;

use crate::changelog::LoggedRecord;
use crate::error::{Error, Result};

/// First 8 bytes of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"SSNAPCL\0";
/// Segment format version this code writes and reads.
pub(crate) const SEGMENT_VERSION: u16 = 1;
/// Length of the segment header.
pub(crate) const HEADER_LEN: usize = 32;
/// Bytes of a record frame before its key: length, crc, offset, timestamp,
/// key length, value length.
pub(crate) const FRAME_HEADER_LEN: usize = 32;
/// The part of the frame header covered by `body_len` (everything after the crc).
const BODY_FIXED_LEN: usize = 24;
/// `value_len` of a tombstone.
const TOMBSTONE: u32 = u32::MAX;
/// `prev_base_offset` of the first segment (it has no predecessor).
const NO_PREV: u64 = u64::MAX;
/// Largest frame body accepted (and written): 1 GiB. Longer length fields are
/// treated as damage, not as a record still being written.
pub(crate) const MAX_BODY_LEN: usize = 1 << 30;

/// The fixed header at the start of every segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Offset of the first record the segment may hold; also its file name.
    pub base_offset: u64,
    /// Base offset of the segment before this one, `None` for the first.
    /// A missing middle segment breaks this chain and is reported as a gap.
    pub prev_base_offset: Option<u64>,
}

impl SegmentHeader {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&SEGMENT_MAGIC);
        h[8..10].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        // 10..12: flags, 0 in version 1.
        h[12..20].copy_from_slice(&self.base_offset.to_le_bytes());
        h[20..28].copy_from_slice(&self.prev_base_offset.unwrap_or(NO_PREV).to_le_bytes());
        let crc = crc32c::crc32c(&h[0..28]);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Parses a header; `what` names the file in error messages.
    pub(crate) fn decode(buf: &[u8], what: &Path) -> Result<SegmentHeader> {
        let p = what.display();
        if buf.len() < HEADER_LEN {
            return Err(Error::corrupt(format!(
                "changelog segment header is truncated path=`{p}` length=`{}`",
                buf.len()
            )));
        }
        if buf[0..8] != SEGMENT_MAGIC {
            return Err(Error::corrupt(format!(
                "changelog segment has a bad magic number path=`{p}` file_offset=`0`"
            )));
        }
        let stored = u32_at(buf, 28);
        let actual = crc32c::crc32c(&buf[0..28]);
        if stored != actual {
            return Err(Error::corrupt(format!(
                "changelog segment header is corrupt path=`{p}` file_offset=`0`: crc mismatch \
                 stored=`{stored:#010x}` computed=`{actual:#010x}`"
            )));
        }
        let version = u16::from_le_bytes([buf[8], buf[9]]);
        if version != SEGMENT_VERSION {
            return Err(Error::config(format!(
                "unsupported changelog segment format version path=`{p}` found=`{version}` \
                 supported=`{SEGMENT_VERSION}`"
            ))
            .with_reason(crate::Reason::UnsupportedVersion));
        }
        let flags = u16::from_le_bytes([buf[10], buf[11]]);
        if flags != 0 {
            return Err(Error::config(format!(
                "unsupported changelog segment flags path=`{p}` flags=`{flags:#06x}`"
            ))
            .with_reason(crate::Reason::UnsupportedVersion));
        }
        let prev = u64_at(buf, 20);
        Ok(SegmentHeader {
            base_offset: u64_at(buf, 12),
            prev_base_offset: (prev != NO_PREV).then_some(prev),
        })
    }
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Bytes one record takes on disk.
pub(crate) fn frame_len(key_len: usize, value_len: usize) -> usize {
    FRAME_HEADER_LEN + key_len + value_len
}

/// Appends one record frame to `out`. The caller checks the size limit.
pub(crate) fn encode_record(
    out: &mut Vec<u8>,
    offset: u64,
    timestamp_ms: i64,
    key: &[u8],
    value: Option<&[u8]>,
) {
    let value_len = value.map_or(0, <[u8]>::len);
    let body_len = BODY_FIXED_LEN + key.len() + value_len;
    let start = out.len();
    out.reserve(8 + body_len);
    // Sizes were checked against MAX_BODY_LEN by the caller, so they fit in u32.
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // crc, filled in below
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&timestamp_ms.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    let vl = value.map_or(TOMBSTONE, |v| v.len() as u32);
    out.extend_from_slice(&vl.to_le_bytes());
    out.extend_from_slice(key);
    if let Some(v) = value {
        out.extend_from_slice(v);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start..start + 4]), &out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Whether a record of this size can be written.
pub(crate) fn check_record_size(key_len: usize, value_len: usize) -> Result<()> {
    let body = BODY_FIXED_LEN
        .saturating_add(key_len)
        .saturating_add(value_len);
    if body > MAX_BODY_LEN || key_len >= TOMBSTONE as usize || value_len >= TOMBSTONE as usize {
        return Err(Error::config(format!(
            "changelog record is too large key_len=`{key_len}` value_len=`{value_len}` \
             max_bytes=`{MAX_BODY_LEN}`"
        )));
    }
    Ok(())
}

/// One decoded frame, as ranges into the buffer it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawRecord {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Range<usize>,
    pub value: Option<Range<usize>>,
    /// Position just after the frame.
    pub next: usize,
}

impl RawRecord {
    /// The record, as zero-copy slices of `buf` (which the ranges index).
    pub(crate) fn to_logged(&self, buf: &Bytes) -> LoggedRecord {
        LoggedRecord {
            offset: self.offset,
            timestamp_ms: self.timestamp_ms,
            key: buf.slice(self.key.clone()),
            value: self.value.clone().map(|v| buf.slice(v)),
        }
    }
}

/// What is at a position of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A complete frame with a valid crc and consistent lengths.
    Record(RawRecord),
    /// The buffer ends before the frame does; `needed` bytes from the frame
    /// start would complete it.
    Incomplete { needed: usize },
    /// The bytes are not a valid frame.
    Invalid(&'static str),
}

/// Decodes the frame starting at `pos` of `buf`. Never panics.
pub(crate) fn decode_frame(buf: &[u8], pos: usize) -> Frame {
    let rest = buf.len().saturating_sub(pos);
    if rest < 4 {
        return Frame::Incomplete {
            needed: FRAME_HEADER_LEN,
        };
    }
    let body_len = u32_at(buf, pos) as usize;
    if !(BODY_FIXED_LEN..=MAX_BODY_LEN).contains(&body_len) {
        return Frame::Invalid("bad length");
    }
    let total = 8 + body_len;
    if rest < total {
        return Frame::Incomplete { needed: total };
    }
    let stored = u32_at(buf, pos + 4);
    let actual = crc32c::crc32c_append(
        crc32c::crc32c(&buf[pos..pos + 4]),
        &buf[pos + 8..pos + total],
    );
    if stored != actual {
        return Frame::Invalid("crc mismatch");
    }
    let key_len = u32_at(buf, pos + 24) as usize;
    let value_len = u32_at(buf, pos + 28);
    let key_start = pos + FRAME_HEADER_LEN;
    let value_bytes = if value_len == TOMBSTONE {
        0
    } else {
        value_len as usize
    };
    if BODY_FIXED_LEN as u64 + key_len as u64 + value_bytes as u64 != body_len as u64 {
        return Frame::Invalid("lengths do not add up");
    }
    let key = key_start..key_start + key_len;
    let value = (value_len != TOMBSTONE).then(|| key.end..key.end + value_bytes);
    Frame::Record(RawRecord {
        offset: u64_at(buf, pos + 8),
        timestamp_ms: u64_at(buf, pos + 16) as i64,
        key,
        value,
        next: pos + total,
    })
}

/// A damaged end of the last segment, cut off by recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TornTail {
    /// Byte position in the file where the damage starts.
    pub position: usize,
    /// Bytes from there to the end of the file.
    pub bytes: usize,
    /// Frames the damaged bytes seem to hold (following their length fields).
    pub records: u64,
    /// Why the first damaged frame did not decode.
    pub reason: &'static str,
}

/// The outcome of validating a whole segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanEnd {
    /// Bytes of header plus valid records.
    pub valid_len: usize,
    /// Offset of the last valid record.
    pub last_offset: Option<u64>,
    /// Number of valid records.
    pub records: u64,
    /// The damaged tail, if any (only allowed by the caller for the last segment).
    pub torn: Option<TornTail>,
}

/// Validates every record of a segment's bytes `buf` (including its header,
/// which the caller already parsed), calling `on_record` for each. A bad or
/// incomplete frame with no valid frame anywhere after it is a torn tail; one
/// followed by a valid frame is corruption before the tail and an error, as
/// are offsets that do not increase or lie below `base_offset`.
pub(crate) fn scan_records(
    buf: &[u8],
    base_offset: u64,
    path: &Path,
    mut on_record: impl FnMut(&RawRecord),
) -> Result<ScanEnd> {
    let mut pos = HEADER_LEN.min(buf.len());
    let mut last: Option<u64> = None;
    let mut records = 0u64;
    while pos < buf.len() {
        match decode_frame(buf, pos) {
            Frame::Record(r) => {
                check_offset(&r, last, base_offset, path, pos)?;
                on_record(&r);
                last = Some(r.offset);
                records += 1;
                pos = r.next;
            }
            Frame::Incomplete { .. } => {
                return finish_damaged(
                    buf,
                    pos,
                    last,
                    base_offset,
                    records,
                    "truncated record",
                    path,
                );
            }
            Frame::Invalid(reason) => {
                return finish_damaged(buf, pos, last, base_offset, records, reason, path);
            }
        }
    }
    Ok(ScanEnd {
        valid_len: pos,
        last_offset: last,
        records,
        torn: None,
    })
}

fn check_offset(
    r: &RawRecord,
    last: Option<u64>,
    base: u64,
    path: &Path,
    pos: usize,
) -> Result<()> {
    let bad = match last {
        Some(l) => r.offset <= l,
        None => r.offset < base,
    };
    if bad {
        return Err(Error::corrupt(format!(
            "changelog segment offsets do not increase path=`{}` file_offset=`{pos}` \
             offset=`{}` previous=`{}` base_offset=`{base}`",
            path.display(),
            r.offset,
            last.map_or_else(|| "none".to_string(), |l| l.to_string()),
        )));
    }
    Ok(())
}

fn finish_damaged(
    buf: &[u8],
    pos: usize,
    last: Option<u64>,
    base: u64,
    records: u64,
    reason: &'static str,
    path: &Path,
) -> Result<ScanEnd> {
    // Is there a valid frame anywhere after the damage? Then the damage is
    // not a torn tail (a crash only ever cuts the end), and must not be cut off.
    let min_offset = last.map_or(base, |l| l.saturating_add(1));
    for q in pos + 1..buf.len() {
        if plausible_frame(buf, q, min_offset)
            && let Frame::Record(r) = decode_frame(buf, q)
            && r.offset >= min_offset
        {
            return Err(Error::corrupt(format!(
                "changelog segment is corrupt before its tail path=`{}` file_offset=`{pos}` \
                 after_offset=`{}`: {reason}; a valid record follows at file_offset=`{q}` \
                 offset=`{}`",
                path.display(),
                last.map_or_else(|| "none".to_string(), |l| l.to_string()),
                r.offset
            )));
        }
    }
    Ok(ScanEnd {
        valid_len: pos,
        last_offset: last,
        records,
        torn: Some(TornTail {
            position: pos,
            bytes: buf.len() - pos,
            records: count_frames(buf, pos),
            reason,
        }),
    })
}

/// A cheap structural check before the CRC, so that searching damaged bytes
/// for a valid frame stays fast (a CRC is only computed where the length
/// fields add up, the frame fits and the offset is not below `min_offset`).
fn plausible_frame(buf: &[u8], q: usize, min_offset: u64) -> bool {
    if buf.len().saturating_sub(q) < FRAME_HEADER_LEN {
        return false;
    }
    let body_len = u32_at(buf, q) as u64;
    let key_len = u32_at(buf, q + 24) as u64;
    let value_len = u32_at(buf, q + 28);
    let value_bytes = if value_len == TOMBSTONE {
        0
    } else {
        u64::from(value_len)
    };
    if BODY_FIXED_LEN as u64 + key_len + value_bytes != body_len
        || body_len > (buf.len() - q - 8) as u64
    {
        return false;
    }
    u64_at(buf, q + 8) >= min_offset
}

/// How many frames the bytes from `pos` seem to hold, following length fields.
fn count_frames(buf: &[u8], mut pos: usize) -> u64 {
    let mut n = 0;
    while pos < buf.len() {
        n += 1;
        if buf.len() - pos < 4 {
            break;
        }
        let body_len = u32_at(buf, pos) as usize;
        if !(BODY_FIXED_LEN..=MAX_BODY_LEN).contains(&body_len) {
            break;
        }
        pos += 8 + body_len;
    }
    n
}

/// A segment decoded by [`decode_segment`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedSegment {
    /// The segment header.
    pub header: SegmentHeader,
    /// Every valid record, in order.
    pub records: Vec<LoggedRecord>,
    /// Bytes of header plus valid records.
    pub valid_len: u64,
    /// Bytes of a torn tail after the valid records (what recovery would cut
    /// off if this were the last segment), 0 if none.
    pub torn_tail_bytes: u64,
}

/// Decodes and validates a whole segment file's bytes. Never panics: any
/// input either decodes or yields an [`ErrorKind::Corrupt`] error (or a
/// [`ErrorKind::Config`] error for a valid header of an unknown version). A
/// torn tail is not an error here; it is reported in
/// [`DecodedSegment::torn_tail_bytes`]. This is the decoder the fuzz target
/// `segment_decoder` exercises.
///
/// [`ErrorKind::Corrupt`]: crate::ErrorKind::Corrupt
/// [`ErrorKind::Config`]: crate::ErrorKind::Config
#[doc(hidden)]
pub fn decode_segment(bytes: &[u8]) -> Result<DecodedSegment> {
    let path = Path::new("<buffer>");
    let header = SegmentHeader::decode(bytes, path)?;
    let buf = Bytes::copy_from_slice(bytes);
    let mut records = Vec::new();
    let end = scan_records(&buf, header.base_offset, path, |r| {
        records.push(r.to_logged(&buf))
    })?;
    Ok(DecodedSegment {
        header,
        records,
        valid_len: end.valid_len as u64,
        torn_tail_bytes: end.torn.map_or(0, |t| t.bytes as u64),
    })
}

/// Encodes a segment file holding `records` after `header`, exactly as the
/// changelog writes it. For fixtures, tests and fuzzing; the caller keeps
/// offsets increasing if it wants a segment that decodes. Records too large
/// for the format are skipped.
#[doc(hidden)]
pub fn encode_segment(header: SegmentHeader, records: &[LoggedRecord]) -> Vec<u8> {
    let mut out = header.encode().to_vec();
    for r in records {
        let value_len = r.value.as_ref().map_or(0, |v| v.len());
        if check_record_size(r.key.len(), value_len).is_ok() {
            encode_record(
                &mut out,
                r.offset,
                r.timestamp_ms,
                &r.key,
                r.value.as_deref(),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(records: &[(u64, Option<&[u8]>)]) -> Vec<u8> {
        let mut v = SegmentHeader {
            base_offset: 0,
            prev_base_offset: None,
        }
        .encode()
        .to_vec();
        for (o, val) in records {
            encode_record(&mut v, *o, 7, b"k", *val);
        }
        v
    }

    #[test]
    fn round_trips_puts_and_tombstones() {
        let v = segment(&[(0, Some(b"v")), (1, None), (5, Some(b""))]);
        let d = decode_segment(&v).expect("decodes");
        assert_eq!(d.records.len(), 3);
        assert_eq!(d.records[1].value, None);
        assert_eq!(d.records[2].value.as_deref(), Some(&b""[..]));
        assert_eq!(d.records[2].offset, 5);
        assert_eq!(d.torn_tail_bytes, 0);
        assert_eq!(d.valid_len, v.len() as u64);
    }

    #[test]
    fn truncated_last_frame_is_a_torn_tail() {
        let v = segment(&[(0, Some(b"v")), (1, Some(b"w"))]);
        let d = decode_segment(&v[..v.len() - 3]).expect("torn tail is not an error");
        assert_eq!(d.records.len(), 1);
        assert_eq!(d.torn_tail_bytes, (frame_len(1, 1) - 3) as u64);
    }

    #[test]
    fn bad_crc_followed_by_valid_record_is_corrupt() {
        let mut v = segment(&[(0, Some(b"v")), (1, Some(b"w")), (2, Some(b"x"))]);
        let second = HEADER_LEN + frame_len(1, 1);
        v[second + FRAME_HEADER_LEN] ^= 0xff; // the key byte of record 1
        let err = decode_segment(&v).expect_err("mid-log corruption");
        assert_eq!(err.kind(), crate::ErrorKind::Corrupt);
    }

    #[test]
    fn decreasing_offsets_are_corrupt() {
        let v = segment(&[(3, Some(b"v")), (2, Some(b"w"))]);
        let err = decode_segment(&v).expect_err("offsets go back");
        assert_eq!(err.kind(), crate::ErrorKind::Corrupt);
    }
}
