//! The open files of one changelog. A segment's read handle is opened on
//! first use and closed again, oldest opened first, once more than
//! [`FileChangelogOptions::max_open_segments`](super::FileChangelogOptions)
//! are open: a log of many segments holds a bounded number of file
//! descriptors, however many segments it has.
//!
//! A compaction renames a new file over a segment's name while readers may
//! still hold the old segment. Just before it does, the old segment's bytes
//! get a second name (a hard link, `<name>.retired.<n>`): the old segment
//! reopens from that name from then on, and removes it when the last reader
//! lets the segment go. Open removes retired names a crash left behind. On a
//! filesystem without hard links the old segment keeps its handle open for
//! as long as it lives instead.
//!
//! Every reopen checks that it found the file the segment was created with:
//! the same device, inode and birth time where the platform tells them, and
//! at least the bytes the segment holds (a compaction's replacement is
//! always shorter). A file replaced behind the handle's back (by a writer's
//! compaction, seen from a read-only handle) is an error that says to open
//! the changelog again, never another file's bytes.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::util::lock;

/// What follows a segment's file name in a retired name.
pub(crate) const RETIRED_MARK: &str = ".retired.";

/// The open-file budget of one changelog.
#[derive(Debug)]
pub(crate) struct OpenFiles {
    max: usize,
    /// Open handles, oldest opened first (dropped segments' entries linger
    /// until the next eviction sweeps them).
    open: Mutex<VecDeque<Weak<SegmentFile>>>,
    /// Numbers retired names, unique within this handle.
    next_retired: AtomicU64,
}

impl OpenFiles {
    /// A budget of `max` open segment handles (at least one).
    pub(crate) fn new(max: usize) -> Arc<OpenFiles> {
        Arc::new(OpenFiles {
            max: max.max(1),
            open: Mutex::new(VecDeque::new()),
            next_retired: AtomicU64::new(0),
        })
    }

    /// Notes that `file` opened its handle; closes the oldest others over the budget.
    fn opened(&self, file: &Arc<SegmentFile>) {
        let mut q = lock(&self.open);
        q.push_back(Arc::downgrade(file));
        if q.len() <= self.max {
            return;
        }
        q.retain(|w| w.strong_count() > 0);
        while q.len() > self.max {
            if let Some(victim) = q.pop_front().and_then(|w| w.upgrade()) {
                victim.close();
            }
        }
    }

    /// Segment handles open now.
    #[cfg(test)]
    pub(crate) fn open_count(&self) -> usize {
        lock(&self.open)
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|f| lock(&f.state).file.is_some())
            .count()
    }
}

/// Which file a handle was opened on: device and inode (Unix), and birth
/// time where the filesystem keeps one (an inode number may be reused by a
/// file created later; a birth time is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    inode: Option<(u64, u64)>,
    born: Option<std::time::SystemTime>,
}

impl Identity {
    fn of(file: &File) -> Identity {
        file.metadata().map_or(
            Identity {
                inode: None,
                born: None,
            },
            |m| Identity::from(&m),
        )
    }

    fn from(meta: &std::fs::Metadata) -> Identity {
        Identity {
            inode: inode(meta),
            born: meta.created().ok(),
        }
    }

    /// Whether `other` is surely another file (what is unknown on either
    /// side proves nothing).
    fn differs(&self, other: &Identity) -> bool {
        fn differ<T: PartialEq>(a: Option<T>, b: Option<T>) -> bool {
            a.zip(b).is_some_and(|(a, b)| a != b)
        }
        differ(self.inode, other.inode) || differ(self.born, other.born)
    }
}

#[cfg(unix)]
fn inode(m: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn inode(_m: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// Where one segment's bytes are, and the handle they are read through
/// while it is open.
#[derive(Debug)]
pub(crate) struct SegmentFile {
    files: Arc<OpenFiles>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The segment's own name, or its retired name once compaction replaced it.
    path: PathBuf,
    file: Option<Arc<File>>,
    identity: Identity,
    /// `path` is a retired name, removed when the segment is dropped.
    retired: bool,
    /// Never closed for the budget: replaced without a retired name.
    pinned: bool,
}

impl SegmentFile {
    /// A segment file read through `file`, open now and counted in `files`.
    pub(crate) fn new(path: PathBuf, file: File, files: &Arc<OpenFiles>) -> Arc<SegmentFile> {
        let this = Arc::new(SegmentFile {
            files: Arc::clone(files),
            state: Mutex::new(State {
                path,
                identity: Identity::of(&file),
                file: Some(Arc::new(file)),
                retired: false,
                pinned: false,
            }),
        });
        files.opened(&this);
        this
    }

    /// The read handle, opened again if the budget closed it. `name` is the
    /// segment's own path, for errors; `len` the bytes the segment holds.
    pub(crate) fn get(self: &Arc<Self>, name: &Path, len: u64) -> Result<Arc<File>> {
        let file = {
            let mut s = lock(&self.state);
            if let Some(f) = &s.file {
                return Ok(Arc::clone(f));
            }
            let f = s.reopen(name, len)?;
            s.file = Some(Arc::clone(&f));
            f
        };
        self.files.opened(self);
        Ok(file)
    }

    /// Closes the handle for the budget (reads in flight keep their `Arc`).
    fn close(&self) {
        let mut s = lock(&self.state);
        if !s.pinned {
            s.file = None;
        }
    }

    /// Called by compaction before it renames a new file over `name`: gives
    /// these bytes a retired name to be read from from now on (or, failing
    /// that, keeps them open for the segment's life). Once done, doing it
    /// again does nothing.
    pub(crate) fn retire(&self, name: &Path, len: u64) -> Result<()> {
        let mut s = lock(&self.state);
        if s.retired || s.pinned {
            return Ok(());
        }
        let n = self.files.next_retired.fetch_add(1, Ordering::Relaxed);
        let mut retired = name.as_os_str().to_owned();
        retired.push(format!("{RETIRED_MARK}{n}"));
        let retired = PathBuf::from(retired);
        match std::fs::hard_link(&s.path, &retired) {
            Ok(()) => {
                s.path = retired;
                s.retired = true;
            }
            Err(e) => {
                tracing::debug!(path = %name.display(), error = %e,
                    "no retired name for a compacted segment; keeping its old file open instead");
                if s.file.is_none() {
                    let f = s.reopen(name, len)?;
                    s.file = Some(f);
                }
                s.pinned = true;
            }
        }
        Ok(())
    }
}

impl State {
    /// Opens `path` again, refusing a file that is not the one the segment
    /// was made with: another identity, or shorter than the `len` bytes the
    /// segment holds (a compaction's replacement is always shorter).
    fn reopen(&self, name: &Path, len: u64) -> Result<Arc<File>> {
        let f = File::open(&self.path).map_err(|e| {
            Error::io(
                format!(
                    "cannot open changelog segment path=`{}`",
                    self.path.display()
                ),
                e,
            )
        })?;
        let meta = f.metadata().map_err(|e| {
            Error::io(
                format!(
                    "cannot stat changelog segment path=`{}`",
                    self.path.display()
                ),
                e,
            )
        })?;
        if self.identity.differs(&Identity::from(&meta)) || meta.len() < len {
            return Err(Error::transient(format!(
                "changelog segment was replaced while this handle was open path=`{}` (a \
                 writer compacted it, or something else rewrote it); open the changelog \
                 again to read the log as it is now",
                name.display()
            )));
        }
        Ok(Arc::new(f))
    }
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        let s = lock(&self.state);
        if s.retired
            && let Err(e) = std::fs::remove_file(&s.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %s.path.display(), error = %e,
                "cannot remove a retired changelog segment; the next open removes it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment_file(dir: &Path, name: &str, files: &Arc<OpenFiles>) -> Arc<SegmentFile> {
        let path = dir.join(name);
        std::fs::write(&path, name).unwrap();
        SegmentFile::new(path.clone(), File::open(&path).unwrap(), files)
    }

    fn read(f: &Arc<SegmentFile>, name: &Path) -> String {
        let file = f.get(name, 0).unwrap();
        let mut buf = vec![0u8; usize::try_from(file.metadata().unwrap().len()).unwrap()];
        crate::util::read_exact_at(&file, &mut buf, 0).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn handles_over_the_budget_are_closed_oldest_first_and_reopen_on_use() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::new(2);
        let segs: Vec<_> = (0..5)
            .map(|i| segment_file(dir.path(), &format!("s{i}"), &files))
            .collect();
        assert_eq!(files.open_count(), 2);
        assert!(lock(&segs[0].state).file.is_none());
        assert!(lock(&segs[4].state).file.is_some());
        for (i, s) in segs.iter().enumerate() {
            let name = dir.path().join(format!("s{i}"));
            assert_eq!(read(s, &name), format!("s{i}"));
            assert!(files.open_count() <= 2);
        }
        drop(segs);
        assert_eq!(files.open_count(), 0);
    }

    #[test]
    fn a_retired_segment_reads_its_old_bytes_and_removes_its_name_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::new(1);
        let name = dir.path().join("s0");
        let old = segment_file(dir.path(), "s0", &files);
        old.retire(&name, 2).unwrap();
        old.retire(&name, 2).unwrap(); // a second time: nothing more
        let retired_names = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| {
                    let n = e.as_ref().unwrap().file_name();
                    n.to_string_lossy().contains(RETIRED_MARK)
                })
                .count()
        };
        assert_eq!(retired_names(), 1);
        // A compaction's new file over the name.
        let tmp = dir.path().join("s0.new");
        std::fs::write(&tmp, "compacted").unwrap();
        std::fs::rename(&tmp, &name).unwrap();
        let other = segment_file(dir.path(), "s1", &files); // closes `old`'s handle
        assert!(lock(&old.state).file.is_none());
        assert_eq!(read(&old, &name), "s0");
        let retired = lock(&old.state).path.clone();
        assert!(retired.exists());
        drop(old);
        assert!(!retired.exists());
        assert_eq!(retired_names(), 0);
        assert_eq!(std::fs::read_to_string(&name).unwrap(), "compacted");
        drop(other);
    }

    #[test]
    #[cfg(unix)]
    fn a_file_replaced_behind_a_closed_handle_is_an_error_not_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::new(1);
        let name = dir.path().join("s0");
        let seg = segment_file(dir.path(), "s0", &files);
        let tmp = dir.path().join("s0.new");
        std::fs::write(&tmp, "other bytes").unwrap();
        std::fs::rename(&tmp, &name).unwrap();
        let _other = segment_file(dir.path(), "s1", &files);
        let err = seg.get(&name, 2).unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(
            err.to_string().contains("open the changelog again"),
            "{err}"
        );
    }
}
