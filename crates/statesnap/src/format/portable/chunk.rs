//! The portable chunk codec: one chunk is one blob holding a sorted run of
//! records (puts and tombstones), zstd-compressed behind a fixed header.
//! The byte layout is documented in `docs/format.md` ("Portable snapshot
//! format"); this module is the only code that writes or reads it.
//!
//! Chunk boundaries are content-defined over the keys ([`Chunker`]), so a
//! change in one key range leaves the chunks of every other range — and
//! therefore their blake3 blob names — identical.
//!
//! Decoding never trusts a length: the header is checksummed, the claimed
//! uncompressed size is capped by [`MAX_UNCOMPRESSED_LEN`], decompression
//! output is bounded by that claim, and every record length is checked
//! against the bytes actually present.

use bytes::{Bytes, BytesMut};
use std::io::Read;

use crate::changelog::Record;
use crate::error::{Error, Result};

/// First four bytes of every chunk.
pub const MAGIC: [u8; 4] = *b"SSPC";
/// The chunk layout version this build writes and reads.
pub const VERSION: u16 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 32;
/// Largest uncompressed payload a decoder accepts (and an encoder produces).
pub const MAX_UNCOMPRESSED_LEN: u32 = 256 << 20;
/// Fixed zstd level: compression must be deterministic so that identical
/// runs give identical bytes, hence identical blob hashes.
pub const ZSTD_LEVEL: i32 = 1;

const FLAG_TOMBSTONE: u8 = 0;
const FLAG_VALUE: u8 = 1;

/// Chunk size bounds for content-defined chunking, in uncompressed payload
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    /// No boundary before a chunk holds this many bytes.
    pub min: usize,
    /// Average chunk size aimed at.
    pub target: usize,
    /// A chunk is cut once it holds this many bytes, boundary or not.
    pub max: usize,
}

impl Default for ChunkParams {
    fn default() -> Self {
        ChunkParams {
            min: 256 << 10,
            target: 1 << 20,
            max: 4 << 20,
        }
    }
}

impl ChunkParams {
    /// Checks `min <= target <= max` and `max` within the decoder's limit.
    pub fn validate(&self) -> Result<()> {
        if self.min > self.target
            || self.target > self.max
            || self.target == 0
            || self.max > MAX_UNCOMPRESSED_LEN as usize / 2
        {
            return Err(Error::config(format!(
                "invalid portable chunk sizes: need 0 < min <= target <= max <= {} min={} target={} max={}",
                MAX_UNCOMPRESSED_LEN / 2,
                self.min,
                self.target,
                self.max
            )));
        }
        Ok(())
    }
}

/// The decoded fixed header of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Layout version.
    pub version: u16,
    /// Number of records.
    pub record_count: u32,
    /// Length of the uncompressed record payload.
    pub uncompressed_len: u32,
    /// Length of the compressed payload that follows the header.
    pub compressed_len: u32,
    /// crc32c of the uncompressed record payload.
    pub records_crc: u32,
    /// crc32c of the compressed payload.
    pub payload_crc: u32,
}

/// A decoded chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Its header.
    pub header: ChunkHeader,
    /// Its records, keys strictly ascending; values share the decompressed
    /// buffer (no copy per record).
    pub records: Vec<Record>,
}

/// The 64-bit key hash that places chunk boundaries: FNV-1a over the key
/// bytes followed by the splitmix64 finaliser. Part of the format: changing
/// it changes where chunks are cut (never correctness, only sharing).
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Encoded size of one record in the uncompressed payload.
pub fn record_len(key: &[u8], value: Option<&[u8]>) -> usize {
    4 + key.len() + 1 + value.map_or(0, |v| 4 + v.len())
}

/// Builds one chunk's uncompressed payload, then seals it.
#[derive(Debug, Default)]
pub struct ChunkBuilder {
    buf: Vec<u8>,
    count: u32,
    /// The last key pushed (its buffer reused), for the order check.
    last_key: Option<Vec<u8>>,
}

impl ChunkBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        ChunkBuilder::default()
    }

    /// Appends a record; keys must be strictly ascending.
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        if let Some(last) = &self.last_key
            && key <= &last[..]
        {
            return Err(Error::internal(format!(
                "portable run is not in strictly ascending key order key_len={} record={}",
                key.len(),
                self.count
            )));
        }
        let key_len = u32::try_from(key.len())
            .map_err(|_| Error::config(format!("key too large key_len={}", key.len())))?;
        self.buf.extend_from_slice(&key_len.to_le_bytes());
        self.buf.extend_from_slice(key);
        match value {
            None => self.buf.push(FLAG_TOMBSTONE),
            Some(v) => {
                let vlen = u32::try_from(v.len())
                    .map_err(|_| Error::config(format!("value too large value_len={}", v.len())))?;
                self.buf.push(FLAG_VALUE);
                self.buf.extend_from_slice(&vlen.to_le_bytes());
                self.buf.extend_from_slice(v);
            }
        }
        self.count += 1;
        match &mut self.last_key {
            Some(last) => {
                last.clear();
                last.extend_from_slice(key);
            }
            None => self.last_key = Some(key.to_vec()),
        }
        Ok(())
    }

    /// Uncompressed payload bytes so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether no record was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Compresses the payload and prepends the header; resets the builder
    /// (keeping the last key, so a run stays ascending across chunks).
    pub fn seal(&mut self) -> Result<Bytes> {
        let uncompressed_len = u32::try_from(self.buf.len())
            .ok()
            .filter(|l| *l <= MAX_UNCOMPRESSED_LEN)
            .ok_or_else(|| {
                Error::config(format!(
                    "portable chunk too large: a single record exceeds the chunk limit \
                     uncompressed_len={} max={MAX_UNCOMPRESSED_LEN}",
                    self.buf.len()
                ))
            })?;
        let records_crc = crc32c::crc32c(&self.buf);
        let compressed = zstd::bulk::compress(&self.buf, ZSTD_LEVEL)
            .map_err(|e| Error::internal("zstd compression failed").with_source(e))?;
        let compressed_len = u32::try_from(compressed.len())
            .map_err(|_| Error::internal("compressed chunk exceeds 4 GiB"))?;
        let payload_crc = crc32c::crc32c(&compressed);
        let mut out = BytesMut::with_capacity(HEADER_LEN + compressed.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&uncompressed_len.to_le_bytes());
        out.extend_from_slice(&compressed_len.to_le_bytes());
        out.extend_from_slice(&records_crc.to_le_bytes());
        out.extend_from_slice(&payload_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&out[..HEADER_LEN - 4]);
        out.extend_from_slice(&header_crc.to_le_bytes());
        out.extend_from_slice(&compressed);
        self.buf.clear();
        self.count = 0;
        Ok(out.freeze())
    }
}

/// Splits a sorted run into content-defined chunks.
///
/// After each record, the chunk is cut if it holds at least `max` bytes, or
/// at least `min` bytes and `key_hash(key) < len(record) * 2^64 / (target -
/// min)`: each byte past `min` is a boundary candidate with probability
/// `1 / (target - min)`, so chunks average about `target` bytes whatever the
/// record sizes, and whether a key ends a chunk depends only on that key,
/// its record length and the bytes since the previous boundary.
#[derive(Debug)]
pub struct Chunker {
    params: ChunkParams,
    builder: ChunkBuilder,
}

impl Chunker {
    /// A chunker with `params` (validated).
    pub fn new(params: ChunkParams) -> Result<Self> {
        params.validate()?;
        Ok(Chunker {
            params,
            builder: ChunkBuilder::new(),
        })
    }

    /// Appends a record; returns a sealed chunk when one ends here.
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<Option<Bytes>> {
        self.builder.push(key, value)?;
        let len = self.builder.len();
        let cut = len >= self.params.max
            || (len >= self.params.min && {
                let rec = record_len(key, value) as u128;
                let span = (self.params.target - self.params.min).max(1) as u128;
                let threshold = ((rec << 64) / span).min(u128::from(u64::MAX)) as u64;
                key_hash(key) < threshold
            });
        if cut {
            Ok(Some(self.builder.seal()?))
        } else {
            Ok(None)
        }
    }

    /// Seals the last, partial chunk, if any records are pending.
    pub fn finish(&mut self) -> Result<Option<Bytes>> {
        if self.builder.is_empty() {
            Ok(None)
        } else {
            Ok(Some(self.builder.seal()?))
        }
    }
}

fn corrupt(what: &str) -> Error {
    Error::corrupt(format!("portable chunk is corrupt: {what}"))
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Parses and checks the fixed header of `bytes` (the whole chunk blob).
pub fn decode_header(bytes: &[u8]) -> Result<ChunkHeader> {
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(&format!(
            "truncated header len={} header_len={HEADER_LEN}",
            bytes.len()
        )));
    }
    if bytes[..4] != MAGIC {
        return Err(corrupt(&format!(
            "bad magic magic=`{}`",
            bytes[..4].escape_ascii()
        )));
    }
    let stored_crc = le_u32(bytes, HEADER_LEN - 4);
    let crc = crc32c::crc32c(&bytes[..HEADER_LEN - 4]);
    if stored_crc != crc {
        return Err(corrupt(&format!(
            "header checksum mismatch stored={stored_crc:#010x} computed={crc:#010x}"
        )));
    }
    let version = le_u16(bytes, 4);
    if version != VERSION {
        return Err(Error::config(format!(
            "unsupported portable chunk version: upgrade statesnap version={version} supported={VERSION}"
        )).with_reason(crate::Reason::UnsupportedVersion));
    }
    let flags = le_u16(bytes, 6);
    if flags != 0 {
        return Err(corrupt(&format!("unknown flags flags={flags:#06x}")));
    }
    let header = ChunkHeader {
        version,
        record_count: le_u32(bytes, 8),
        uncompressed_len: le_u32(bytes, 12),
        compressed_len: le_u32(bytes, 16),
        records_crc: le_u32(bytes, 20),
        payload_crc: le_u32(bytes, 24),
    };
    if header.uncompressed_len > MAX_UNCOMPRESSED_LEN {
        return Err(corrupt(&format!(
            "claimed uncompressed size exceeds the limit uncompressed_len={} max={MAX_UNCOMPRESSED_LEN}",
            header.uncompressed_len
        )));
    }
    // Smallest record: 4-byte key length, empty key, tombstone flag.
    if u64::from(header.record_count) * 5 > u64::from(header.uncompressed_len) {
        return Err(corrupt(&format!(
            "record count cannot fit the payload record_count={} uncompressed_len={}",
            header.record_count, header.uncompressed_len
        )));
    }
    let actual = bytes.len() - HEADER_LEN;
    if actual != header.compressed_len as usize {
        return Err(corrupt(&format!(
            "payload length does not match the header (truncated or trailing bytes) \
             compressed_len={} actual={actual}",
            header.compressed_len
        )));
    }
    Ok(header)
}

/// Decodes a whole chunk blob, checking header, both checksums, sizes,
/// record framing and key order.
pub fn decode_chunk(bytes: &[u8]) -> Result<Chunk> {
    let header = decode_header(bytes)?;
    let payload = &bytes[HEADER_LEN..];
    let crc = crc32c::crc32c(payload);
    if crc != header.payload_crc {
        return Err(corrupt(&format!(
            "payload checksum mismatch stored={:#010x} computed={crc:#010x}",
            header.payload_crc
        )));
    }
    let claimed = header.uncompressed_len as usize;
    // Grow with the output actually produced (never trust the claim for the
    // allocation), and stop one byte past the claim.
    let mut out = Vec::with_capacity(claimed.min(payload.len().saturating_mul(4) + 4096));
    let decoder = zstd::stream::read::Decoder::with_buffer(payload).map_err(|e| {
        Error::corrupt("portable chunk is corrupt: cannot start zstd decoder").with_source(e)
    })?;
    decoder
        .single_frame()
        .take(claimed as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| {
            Error::corrupt("portable chunk is corrupt: zstd payload does not decompress")
                .with_source(e)
        })?;
    if out.len() != claimed {
        return Err(corrupt(&format!(
            "uncompressed size does not match the header uncompressed_len={claimed} actual={}{}",
            out.len(),
            if out.len() > claimed { "+" } else { "" }
        )));
    }
    let crc = crc32c::crc32c(&out);
    if crc != header.records_crc {
        return Err(corrupt(&format!(
            "records checksum mismatch stored={:#010x} computed={crc:#010x}",
            header.records_crc
        )));
    }
    let records = parse_records(Bytes::from(out), header.record_count)?;
    Ok(Chunk { header, records })
}

fn parse_records(buf: Bytes, count: u32) -> Result<Vec<Record>> {
    let mut records = Vec::with_capacity((count as usize).min(buf.len() / 5));
    let mut at = 0usize;
    let take_len = |at: &mut usize, what: &str| -> Result<usize> {
        let end = at
            .checked_add(4)
            .filter(|e| *e <= buf.len())
            .ok_or_else(|| {
                corrupt(&format!(
                    "record framing runs past the payload field={what} offset={at}"
                ))
            })?;
        let v = le_u32(&buf, *at) as usize;
        *at = end;
        if v > buf.len() - *at {
            return Err(corrupt(&format!(
                "length prefix exceeds the payload field={what} len={v} remaining={}",
                buf.len() - *at
            )));
        }
        Ok(v)
    };
    for i in 0..count {
        let klen = take_len(&mut at, "key_len")?;
        let key = buf.slice(at..at + klen);
        at += klen;
        let flag = *buf.get(at).ok_or_else(|| {
            corrupt(&format!(
                "record framing runs past the payload field=flag offset={at}"
            ))
        })?;
        at += 1;
        let value = match flag {
            FLAG_TOMBSTONE => None,
            FLAG_VALUE => {
                let vlen = take_len(&mut at, "value_len")?;
                let v = buf.slice(at..at + vlen);
                at += vlen;
                Some(v)
            }
            other => {
                return Err(corrupt(&format!(
                    "unknown record flag flag={other} record={i}"
                )));
            }
        };
        if let Some(prev) = records.last().map(|r: &Record| &r.key)
            && key <= *prev
        {
            return Err(corrupt(&format!(
                "keys are not strictly ascending record={i}"
            )));
        }
        records.push(Record { key, value });
    }
    if at != buf.len() {
        return Err(corrupt(&format!(
            "trailing bytes after the last record record_count={count} trailing={}",
            buf.len() - at
        )));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(records: &[Record]) -> Bytes {
        let mut b = ChunkBuilder::new();
        for r in records {
            b.push(&r.key, r.value.as_deref()).unwrap();
        }
        b.seal().unwrap()
    }

    #[test]
    fn round_trip_with_tombstones_and_empty_key() {
        let recs = vec![
            Record::put("", "empty key"),
            Record::delete("a"),
            Record::put("b", ""),
            Record::put("c", vec![7u8; 1000]),
        ];
        let blob = encode(&recs);
        let c = decode_chunk(&blob).unwrap();
        assert_eq!(c.records, recs);
        assert_eq!(c.header.record_count, 4);
        // Deterministic: same run, same bytes.
        assert_eq!(encode(&recs), blob);
    }

    #[test]
    fn key_hash_is_stable() {
        // Part of the format: boundaries move if this changes.
        assert_ne!(key_hash(b"a"), key_hash(b"b"));
        assert_eq!(key_hash(b"statesnap"), 4_782_211_798_574_117_156);
    }

    #[test]
    fn chunker_cuts_between_min_and_max() {
        let params = ChunkParams {
            min: 1000,
            target: 4000,
            max: 16000,
        };
        let mut ch = Chunker::new(params).unwrap();
        let mut chunks = Vec::new();
        for i in 0..20_000u32 {
            let k = Bytes::from(format!("key{i:08}"));
            if let Some(c) = ch.push(&k, Some(b"0123456789")).unwrap() {
                chunks.push(c);
            }
        }
        chunks.extend(ch.finish().unwrap());
        let n = chunks.len();
        assert!(n > 20, "too few chunks: {n}");
        for c in &chunks[..n - 1] {
            let h = decode_header(c).unwrap();
            assert!(h.uncompressed_len >= 1000 && h.uncompressed_len <= 16_100);
        }
        let avg = chunks
            .iter()
            .map(|c| decode_header(c).unwrap().uncompressed_len as usize)
            .sum::<usize>()
            / n;
        assert!((2000..8000).contains(&avg), "avg={avg}");
    }
}
