//! Opening and recovery of a [`FileChangelog`]: the directory lock,
//! metadata, the segment chain, and the torn-tail repair of the last segment.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use super::append::{Writer, create_segment, new_writer};
use super::codec::{self, HEADER_LEN, SegmentHeader};
use super::files::{OpenFiles, RETIRED_MARK};
use super::segment::{self, IndexBuilder, Segment, SparseIndex};
use super::{
    COMPACTING_SUFFIX, FileChangelog, FileChangelogOptions, RecoveryReport, Shared, io_err, meta,
};
use crate::changelog::{ChangelogId, Horizon, Lineage};
use crate::error::{Error, Result};

/// Name of the lock file inside a changelog directory.
const LOCK_FILE: &str = "LOCK";

impl FileChangelog {
    /// Opens the changelog in `dir` (creating it if missing and
    /// [`FileChangelogOptions::create_if_missing`]), checks that it is the
    /// log of `id`, and recovers the tail of its last segment.
    ///
    /// Errors: [`Config`](crate::ErrorKind::Config) if `dir` holds another
    /// topic/partition or an unknown format version;
    /// [`NotFound`](crate::ErrorKind::NotFound) if missing and not to be
    /// created; [`Corrupt`](crate::ErrorKind::Corrupt) for damage that is not
    /// a torn tail (a gap in the segment chain, a bad record before the tail);
    /// [`Transient`](crate::ErrorKind::Transient) if another handle holds the
    /// directory lock.
    pub fn open(
        dir: impl AsRef<Path>,
        id: ChangelogId,
        options: FileChangelogOptions,
    ) -> Result<FileChangelog> {
        Self::open_impl(dir.as_ref().to_path_buf(), id, options, false)
    }

    /// Opens the changelog in `dir` for reading only: takes no lock (a
    /// writer may hold the log open meanwhile, in this process or another),
    /// creates nothing, repairs nothing. It sees the log as it was when
    /// opened — records appended later are not visible; open again to see
    /// them — and a torn or in-progress tail is left in place and not read.
    /// For restores, plans and tools; `append` and `compact` fail (kind
    /// `config`), `flush` does nothing.
    ///
    /// It holds at most the default
    /// [`FileChangelogOptions::max_open_segments`] segments open. A segment
    /// it had to close and that the writer compacts meanwhile (only a log
    /// of more segments than that) fails its read with a
    /// [`Transient`](crate::ErrorKind::Transient) error saying to open the
    /// log again; it never reads the compacted file as the old one.
    /// [`FileChangelog::open_read_only_with`] sets the budget.
    ///
    /// Errors as [`FileChangelog::open`], and
    /// [`NotFound`](crate::ErrorKind::NotFound) if there is no log in `dir`.
    pub fn open_read_only(dir: impl AsRef<Path>, id: ChangelogId) -> Result<FileChangelog> {
        Self::open_read_only_with(dir, id, FileChangelogOptions::default())
    }

    /// [`FileChangelog::open_read_only`] with `options`, of which only
    /// [`FileChangelogOptions::max_open_segments`] and
    /// [`FileChangelogOptions::clock`] apply to a reader.
    pub fn open_read_only_with(
        dir: impl AsRef<Path>,
        id: ChangelogId,
        options: FileChangelogOptions,
    ) -> Result<FileChangelog> {
        let options = FileChangelogOptions {
            create_if_missing: false,
            ..options
        };
        Self::open_impl(dir.as_ref().to_path_buf(), id, options, true)
    }

    fn open_impl(
        dir: PathBuf,
        id: ChangelogId,
        options: FileChangelogOptions,
        read_only: bool,
    ) -> Result<FileChangelog> {
        if options.segment_bytes < (HEADER_LEN as u64) * 2 {
            return Err(Error::config(format!(
                "changelog segment_bytes is too small segment_bytes=`{}` min=`{}`",
                options.segment_bytes,
                HEADER_LEN * 2
            )));
        }
        if options.max_open_segments == 0 {
            return Err(Error::config(
                "changelog max_open_segments is 0; at least one segment must be open to read it",
            ));
        }
        ensure_dir(&dir, &options, read_only)?;
        let lock_file = if read_only {
            None
        } else {
            Some(Self::lock_dir(&dir)?)
        };

        let names = list_dir(&dir)?;
        if !read_only {
            remove_leftovers(&dir, &names)?;
        }
        let mut bases: Vec<u64> = names
            .iter()
            .filter_map(|n| segment::parse_segment_file_name(n))
            .collect();
        bases.sort_unstable();

        let meta = read_or_create_meta(&dir, &id, &bases, read_only)?;
        let files = OpenFiles::new(options.max_open_segments);
        let (segments, recovery, writer) = open_segments(&dir, &bases, read_only, &files)?;
        Self::finish(
            dir, id, options, meta, files, segments, recovery, lock_file, writer,
        )
    }

    /// Takes the directory lock of a writer.
    fn lock_dir(dir: &Path) -> Result<File> {
        let lock_path = dir.join(LOCK_FILE);
        let lock_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| io_err("open changelog lock file", &lock_path, e))?;
        match lock_file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                // Transient, not config: the usual holder is the previous
                // owner of a partition still closing during a handoff.
                let holder = std::fs::read_to_string(&lock_path).unwrap_or_default();
                let holder: String = holder.trim().chars().take(200).collect();
                return Err(Error::transient(format!(
                    "changelog directory is locked by another writer path=`{}` holder=`{}`; one \
                     writer per changelog: close that handle (or wait for its process to exit) \
                     and retry, or open this one with FileChangelog::open_read_only to read",
                    dir.display(),
                    holder.escape_debug()
                ))
                .with_reason(crate::Reason::InUse));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io_err("lock changelog directory", &lock_path, e));
            }
        }
        // Who holds it, for the error a second writer gets (advisory only:
        // the lock, not this text, is what excludes).
        let me = format!("pid={}\n", std::process::id());
        if let Err(e) = lock_file
            .set_len(0)
            .and_then(|()| segment::write_all_at(&lock_file, me.as_bytes(), 0))
        {
            tracing::debug!(path = %lock_path.display(), error = %e, "cannot record the lock holder");
        }
        Ok(lock_file)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        dir: PathBuf,
        id: ChangelogId,
        options: FileChangelogOptions,
        mut meta: meta::Meta,
        files: Arc<OpenFiles>,
        segments: Vec<Arc<Segment>>,
        recovery: Option<RecoveryReport>,
        lock_file: Option<File>,
        mut writer: Writer,
    ) -> Result<FileChangelog> {
        writer.last_sync_ms = options.clock.now_ms();
        // Kept in memory until the next metadata write upgrades the file.
        meta.assume_compacted_before(writer.next_offset);
        if lock_file.is_some() {
            // Durability: what recovery kept of the active segment (maybe
            // only in the page cache after a process crash) is on disk
            // before new records follow it.
            writer
                .file
                .sync_data()
                .map_err(|e| io_err("fsync changelog segment", &writer.active.path, e))?;
            writer.synced_pos = writer.pos;
        }
        let end = writer.next_offset;
        Ok(FileChangelog {
            id,
            dir,
            lineage: Lineage(meta.lineage.clone()),
            segment_bytes: options.segment_bytes,
            fsync: options.fsync,
            clock: options.clock,
            writer: Mutex::new(writer),
            shared: RwLock::new(Shared {
                segments,
                horizon: meta.horizon,
                start: None,
                generation: 0,
            }),
            files,
            end: AtomicU64::new(end),
            compacting: Mutex::new(()),
            meta: Mutex::new(meta),
            recovery,
            _lock: lock_file,
            claims: Default::default(),
        })
    }
}

/// A writer for the last segment, before its `Arc` exists.
struct LastSegment {
    file: File,
    pos: u64,
    next_offset: u64,
    index: SparseIndex,
}

impl LastSegment {
    fn into_writer(self, seg: Arc<Segment>) -> Writer {
        new_writer(
            self.file,
            seg,
            self.pos,
            self.next_offset,
            IndexBuilder::resume(self.index),
        )
    }
}

fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let rd = fs::read_dir(dir).map_err(|e| io_err("list changelog directory", dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| io_err("list changelog directory", dir, e))?;
        if let Some(n) = entry.file_name().to_str() {
            names.push(n.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Removes what a crash may leave behind: compacted segments never renamed
/// into place (the old segment they were to replace is still there and
/// valid), retired names of replaced segments (no reader can hold them
/// after a restart), and a metadata temp file never renamed.
fn remove_leftovers(dir: &Path, names: &[String]) -> Result<()> {
    let mut removed = false;
    for n in names {
        if n.ends_with(COMPACTING_SUFFIX) || n == meta::META_TMP || n.contains(RETIRED_MARK) {
            let p = dir.join(n);
            tracing::warn!(path = %p.display(), "removing leftover of an interrupted changelog write");
            fs::remove_file(&p).map_err(|e| io_err("remove leftover file", &p, e))?;
            removed = true;
        }
    }
    if removed {
        // Durability: the removal of the leftovers is persisted before new ones may be made.
        meta::sync_dir(dir)?;
    }
    Ok(())
}

fn check_header(path: &Path, h: &SegmentHeader, base: u64, prev: Option<u64>) -> Result<()> {
    if h.base_offset != base {
        return Err(Error::corrupt(format!(
            "changelog segment header does not match its file name path=`{}` \
             header_base_offset=`{}`",
            path.display(),
            h.base_offset
        )));
    }
    if h.prev_base_offset != prev {
        let expected = match h.prev_base_offset {
            Some(p) => segment::segment_file_name(p),
            None => "none (this should be the first segment)".to_string(),
        };
        return Err(Error::corrupt(format!(
            "changelog has a gap: a segment is missing before path=`{}` expected_previous=`{}` \
             found_previous=`{}`",
            path.display(),
            expected,
            prev.map_or_else(|| "none".to_string(), segment::segment_file_name)
        )));
    }
    Ok(())
}

/// Checks that the changelog directory exists, creating it (and making
/// its entry durable) when missing, writable and
/// [`FileChangelogOptions::create_if_missing`].
fn ensure_dir(dir: &Path, options: &FileChangelogOptions, read_only: bool) -> Result<()> {
    if !dir.exists() {
        if read_only {
            return Err(Error::not_found(format!(
                "changelog directory does not exist path=`{}`; nothing to read",
                dir.display()
            )));
        }
        if !options.create_if_missing {
            return Err(Error::not_found(format!(
                "changelog directory does not exist path=`{}`; set create_if_missing to \
                 create it",
                dir.display()
            )));
        }
        fs::create_dir_all(dir).map_err(|e| io_err("create changelog directory", dir, e))?;
        if let Some(parent) = dir.parent()
            && !parent.as_os_str().is_empty()
        {
            // Durability: the new directory's entry in its parent survives a crash.
            meta::sync_dir(parent)?;
        }
    }
    Ok(())
}

/// The directory's metadata, checked to be the log of `id`; a writer
/// creates it for a new log (one without segments).
fn read_or_create_meta(
    dir: &Path,
    id: &ChangelogId,
    bases: &[u64],
    read_only: bool,
) -> Result<meta::Meta> {
    Ok(match meta::read(dir)? {
        Some(m) => {
            let found = m.id();
            if found != *id {
                return Err(Error::config(format!(
                    "changelog directory belongs to another changelog path=`{}` \
                     expected=`{id}` found=`{found}`",
                    dir.display()
                ))
                .with_reason(crate::Reason::OtherChangelog));
            }
            m
        }
        None if read_only => {
            return Err(Error::not_found(format!(
                "no changelog in directory path=`{}` (no `{}`); nothing to read",
                dir.display(),
                meta::META_FILE
            )));
        }
        None => {
            if !bases.is_empty() {
                return Err(Error::corrupt(format!(
                    "changelog directory has segments but no metadata file path=`{}` \
                     missing=`{}`",
                    dir.display(),
                    meta::META_FILE
                )));
            }
            let m = meta::Meta {
                format_version: meta::META_VERSION,
                topic: id.topic.clone(),
                partition: id.partition,
                lineage: uuid::Uuid::new_v4().to_string(),
                horizon: Horizon::default(),
                epochs: Vec::new(),
            };
            meta::write(dir, &m)?;
            m
        }
    })
}

/// Opens the segment chain `bases` (a writer of a new log creates the
/// first segment): the closed segments, then the last one with its torn
/// tail recovered, and the writer positioned after it.
fn open_segments(
    dir: &Path,
    bases: &[u64],
    read_only: bool,
    files: &Arc<OpenFiles>,
) -> Result<(Vec<Arc<Segment>>, Option<RecoveryReport>, Writer)> {
    let mut recovery = None;
    let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(bases.len().max(1));
    let writer = match bases.split_last() {
        None if read_only => {
            return Err(Error::corrupt(format!(
                "changelog directory has metadata but no segment path=`{}`",
                dir.display()
            )));
        }
        None => {
            let (seg, file) = create_segment(dir, 0, None, files)?;
            // Durability: the first segment's directory entry must survive.
            meta::sync_dir(dir)?;
            let seg = Arc::new(seg);
            segments.push(Arc::clone(&seg));
            new_writer(file, seg, HEADER_LEN as u64, 0, IndexBuilder::new())
        }
        Some((&last, closed)) => {
            let mut prev: Option<u64> = None;
            for &base in closed {
                let path = dir.join(segment::segment_file_name(base));
                segments.push(Arc::new(open_closed_segment(&path, base, prev, files)?));
                prev = Some(base);
            }
            let path = dir.join(segment::segment_file_name(last));
            let (seg, w, rep) = open_last_segment(&path, last, prev, read_only, files)?;
            recovery = rep;
            let seg = Arc::new(seg);
            segments.push(Arc::clone(&seg));
            w.into_writer(seg)
        }
    };
    Ok((segments, recovery, writer))
}

fn open_closed_segment(
    path: &Path,
    base: u64,
    prev: Option<u64>,
    files: &Arc<OpenFiles>,
) -> Result<Segment> {
    let file = File::open(path).map_err(|e| io_err("open changelog segment", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| io_err("stat changelog segment", path, e))?
        .len();
    let mut hb = vec![0u8; HEADER_LEN.min(usize::try_from(len).unwrap_or(HEADER_LEN))];
    segment::read_exact_at(&file, &mut hb, 0)
        .map_err(|e| io_err("read changelog segment header", path, e))?;
    let h = SegmentHeader::decode(&hb, path)?;
    check_header(path, &h, base, prev)?;
    Ok(Segment::new(
        base,
        prev,
        path.to_path_buf(),
        file,
        len,
        None,
        files,
    ))
}

/// Opens the last segment, validates it completely and cuts a torn tail.
fn open_last_segment(
    path: &Path,
    base: u64,
    prev: Option<u64>,
    read_only: bool,
    files: &Arc<OpenFiles>,
) -> Result<(Segment, LastSegment, Option<RecoveryReport>)> {
    let file = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
        .map_err(|e| io_err("open changelog segment", path, e))?;
    let bytes = fs::read(path).map_err(|e| io_err("read changelog segment", path, e))?;
    let mut report = None;
    let (valid_len, next_offset, index) = if bytes.len() < HEADER_LEN && read_only {
        // A segment being created (or torn): nothing in it to read.
        (HEADER_LEN as u64, base, SparseIndex::default())
    } else if bytes.len() < HEADER_LEN {
        // A crash while a new segment was being created: rewrite its header.
        let header = SegmentHeader {
            base_offset: base,
            prev_base_offset: prev,
        }
        .encode();
        segment::write_all_at(&file, &header, 0)
            .map_err(|e| io_err("write changelog segment header", path, e))?;
        report = Some(RecoveryReport {
            segment: path.to_path_buf(),
            file_offset: 0,
            bytes_truncated: bytes.len() as u64,
            records_dropped: 0,
            reason: "truncated segment header".to_string(),
            next_offset: base,
        });
        (HEADER_LEN as u64, base, SparseIndex::default())
    } else {
        let h = SegmentHeader::decode(&bytes, path)?;
        check_header(path, &h, base, prev)?;
        let mut b = IndexBuilder::new();
        let end = codec::scan_records(&bytes, base, path, |r| {
            b.add(r.offset, (r.key.start - codec::FRAME_HEADER_LEN) as u64);
        })?;
        let next = end.last_offset.map_or(base, |l| l + 1);
        if let Some(t) = end.torn.filter(|_| !read_only) {
            file.set_len(t.position as u64)
                .map_err(|e| io_err("truncate torn changelog tail", path, e))?;
            report = Some(RecoveryReport {
                segment: path.to_path_buf(),
                file_offset: t.position as u64,
                bytes_truncated: t.bytes as u64,
                records_dropped: t.records,
                reason: t.reason.to_string(),
                next_offset: next,
            });
        }
        (end.valid_len as u64, next, b.index)
    };
    if let Some(r) = &report {
        // Durability: the repaired tail is on disk before new records are appended after it.
        file.sync_all()
            .map_err(|e| io_err("fsync changelog segment", path, e))?;
        tracing::warn!(
            path = %r.segment.display(),
            file_offset = r.file_offset,
            bytes_truncated = r.bytes_truncated,
            records_dropped = r.records_dropped,
            reason = %r.reason,
            "changelog recovery cut a torn tail off the last segment"
        );
    }
    let read = File::open(path).map_err(|e| io_err("open changelog segment", path, e))?;
    let seg = Segment::new(
        base,
        prev,
        path.to_path_buf(),
        read,
        valid_len,
        Some(SparseIndex {
            entries: index.entries.clone(),
        }),
        files,
    );
    Ok((
        seg,
        LastSegment {
            file,
            pos: valid_len,
            next_offset,
            index,
        },
        report,
    ))
}
