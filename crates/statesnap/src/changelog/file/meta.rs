//! The metadata file `changelog.json`: format version, changelog id, lineage,
//! tombstone horizon and epoch history, always replaced atomically.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::changelog::{ChangelogId, Horizon};
use crate::error::{Error, Result};

/// Name of the metadata file inside a changelog directory.
pub(crate) const META_FILE: &str = "changelog.json";
/// Temporary name the metadata is written under before the rename.
pub(crate) const META_TMP: &str = "changelog.json.tmp";
/// Metadata format version this code writes (3: the horizon records
/// `superseded_before`, what compaction examined).
pub(crate) const META_VERSION: u32 = 3;
/// The first version whose horizon records `superseded_before`. An older
/// log may have been compacted without saying so: it is read as compacted
/// up to its end at open ([`Meta::assume_compacted_before`]).
pub(crate) const META_RECORDS_SUPERSEDED: u32 = 3;
/// Oldest metadata format version this code reads (version 1 had no epoch
/// history; it is upgraded on the next writer open).
pub(crate) const META_MIN_VERSION: u32 = 1;
/// Most epochs the history keeps (about 60 bytes each); see
/// [`Meta::begin_epoch`].
pub(crate) const MAX_EPOCHS: usize = 4096;

/// One writer session of the log: records from `start_offset` up to the next
/// epoch's start were appended by it (invariant 11, detection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EpochStart {
    pub epoch: u64,
    pub start_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Meta {
    pub format_version: u32,
    pub topic: String,
    pub partition: u32,
    pub lineage: String,
    pub horizon: Horizon,
    /// Epoch history, oldest first: epochs strictly increasing, start
    /// offsets non-decreasing. Empty in version 1 files.
    #[serde(default)]
    pub epochs: Vec<EpochStart>,
}

#[derive(Deserialize)]
struct VersionOnly {
    format_version: u32,
}

impl Meta {
    pub(crate) fn id(&self) -> ChangelogId {
        ChangelogId {
            topic: self.topic.clone(),
            partition: self.partition,
        }
    }

    /// Starts a new epoch at `end`, the log's end offset when a writer
    /// session first appends (invariant 11, detection).
    ///
    /// Epochs that start at or after `end` lost every record they had
    /// (recovery, or the disk, cut the log below them) and are dropped; the
    /// new epoch's number is above every number used before, so a snapshot
    /// taken in a lost stretch of history never matches the log again. An
    /// epoch per appending session, not per open: reopening an idle log
    /// does not grow the history; and not "continue the last epoch when it
    /// looks empty", because an epoch that looks empty may have lost every
    /// record it had.
    ///
    /// The history is bounded at [`MAX_EPOCHS`]: the oldest entries are
    /// dropped first, and offsets before the oldest kept epoch are then
    /// unchecked (as in a version 1 log).
    pub(crate) fn begin_epoch(&mut self, end: u64) {
        let next = self.epochs.last().map_or(1, |e| e.epoch + 1);
        self.epochs.retain(|e| e.start_offset < end);
        self.epochs.push(EpochStart {
            epoch: next,
            start_offset: end,
        });
        if self.epochs.len() > MAX_EPOCHS {
            let excess = self.epochs.len() - MAX_EPOCHS;
            self.epochs.drain(..excess);
        }
    }

    /// For metadata older than [`META_RECORDS_SUPERSEDED`]: compaction may
    /// have run up to `end` (the log's end offset at open) without recording
    /// it, so point-in-time reads below `end` are treated as overtaken by
    /// compaction (refused unless a snapshot sits exactly there). Records
    /// appended from now on are tracked exactly.
    pub(crate) fn assume_compacted_before(&mut self, end: u64) {
        if self.format_version < META_RECORDS_SUPERSEDED {
            self.horizon.superseded_before = self.horizon.superseded_before.max(end);
        }
    }

    /// The epoch that appended `offset`, if the history covers it.
    pub(crate) fn epoch_at(epochs: &[EpochStart], offset: u64) -> Option<u64> {
        let i = epochs.partition_point(|e| e.start_offset <= offset);
        i.checked_sub(1).map(|i| epochs[i].epoch)
    }

    fn check(&self, path: &Path) -> Result<()> {
        let ordered = self
            .epochs
            .windows(2)
            .all(|w| w[0].epoch < w[1].epoch && w[0].start_offset <= w[1].start_offset);
        if !ordered || self.epochs.len() > MAX_EPOCHS {
            return Err(Error::corrupt(format!(
                "changelog metadata has a malformed epoch history path=`{}` epochs={}; \
                 epochs must increase and start offsets must not decrease",
                path.display(),
                self.epochs.len()
            )));
        }
        Ok(())
    }
}

/// Reads and checks the metadata file; `Ok(None)` if it does not exist.
pub(crate) fn read(dir: &Path) -> Result<Option<Meta>> {
    let path = dir.join(META_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::io(
                format!("cannot read changelog metadata path=`{}`", path.display()),
                e,
            ));
        }
    };
    let version: VersionOnly = serde_json::from_slice(&bytes).map_err(|e| {
        Error::corrupt(format!(
            "changelog metadata is not valid json with a format_version path=`{}`",
            path.display()
        ))
        .with_source(e)
    })?;
    if !(META_MIN_VERSION..=META_VERSION).contains(&version.format_version) {
        return Err(Error::config(format!(
            "unsupported changelog metadata format version path=`{}` found=`{}` \
             supported=`{META_MIN_VERSION}..={META_VERSION}`; a newer statesnap wrote this log",
            path.display(),
            version.format_version,
        ))
        .with_reason(crate::Reason::UnsupportedVersion));
    }
    let meta: Meta = serde_json::from_slice(&bytes).map_err(|e| {
        Error::corrupt(format!(
            "changelog metadata is malformed path=`{}`",
            path.display()
        ))
        .with_source(e)
    })?;
    meta.check(&path)?;
    Ok(Some(meta))
}

/// Replaces the metadata file atomically: write a temporary file, fsync it,
/// rename it over the old one, fsync the directory.
pub(crate) fn write(dir: &Path, meta: &Meta) -> Result<()> {
    let tmp = dir.join(META_TMP);
    let path = dir.join(META_FILE);
    let io = |what: &str, p: &Path, e| {
        Error::io(
            format!("cannot {what} changelog metadata path=`{}`", p.display()),
            e,
        )
    };
    let mut body = serde_json::to_vec_pretty(meta)
        .map_err(|e| Error::internal("cannot encode changelog metadata").with_source(e))?;
    body.push(b'\n');
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| io("create", &tmp, e))?;
    f.write_all(&body).map_err(|e| io("write", &tmp, e))?;
    // Durability: the new contents must be on disk before the rename can expose them.
    f.sync_all().map_err(|e| io("fsync", &tmp, e))?;
    drop(f);
    // Durability: rename is the atomic commit point; readers see old or new, never half.
    fs::rename(&tmp, &path).map_err(|e| io("rename", &path, e))?;
    // Durability: the rename itself survives a crash only once the directory is synced.
    sync_dir(dir)
}

/// Fsyncs a directory so that creations, renames and deletions in it survive
/// a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    // Durability: persists the directory entries (new, renamed, removed files).
    crate::util::sync_dir(dir).map_err(|e| {
        Error::io(
            format!("cannot fsync changelog directory path=`{}`", dir.display()),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            format_version: META_VERSION,
            topic: "t".into(),
            partition: 0,
            lineage: "l".into(),
            horizon: Horizon::default(),
            epochs: Vec::new(),
        }
    }

    #[test]
    fn epochs_are_never_reused_and_the_history_is_bounded() {
        let mut m = meta();
        m.begin_epoch(0);
        m.begin_epoch(10);
        m.begin_epoch(20);
        // Everything from 5 on was lost: epochs 2 and 3 go, 4 takes over.
        m.begin_epoch(5);
        let pairs: Vec<(u64, u64)> = m.epochs.iter().map(|e| (e.epoch, e.start_offset)).collect();
        assert_eq!(pairs, vec![(1, 0), (4, 5)]);
        assert_eq!(Meta::epoch_at(&m.epochs, 4), Some(1));
        assert_eq!(Meta::epoch_at(&m.epochs, 25), Some(4));
        // A log that lost everything keeps only the new epoch.
        m.begin_epoch(0);
        assert_eq!(Meta::epoch_at(&m.epochs, 0), Some(5));
        assert_eq!(m.epochs.len(), 1);

        let mut m = meta();
        for i in 0..(MAX_EPOCHS as u64 + 10) {
            m.begin_epoch(i);
        }
        assert_eq!(m.epochs.len(), MAX_EPOCHS);
        assert_eq!(Meta::epoch_at(&m.epochs, 3), None, "dropped: unchecked");
        assert_eq!(
            Meta::epoch_at(&m.epochs, MAX_EPOCHS as u64 + 9),
            Some(MAX_EPOCHS as u64 + 10)
        );
        assert!(m.check(Path::new("x")).is_ok());
    }
}
