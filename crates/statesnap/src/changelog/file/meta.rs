//! The metadata file `changelog.json`: format version, changelog id, lineage
//! and tombstone horizon, always replaced atomically.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::changelog::{ChangelogId, Horizon};
use crate::error::{Error, Result};

/// Name of the metadata file inside a changelog directory.
pub(crate) const META_FILE: &str = "changelog.json";
/// Temporary name the metadata is written under before the rename.
pub(crate) const META_TMP: &str = "changelog.json.tmp";
/// Metadata format version this code writes and reads.
pub(crate) const META_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Meta {
    pub format_version: u32,
    pub topic: String,
    pub partition: u32,
    pub lineage: String,
    pub horizon: Horizon,
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
    if version.format_version != META_VERSION {
        return Err(Error::config(format!(
            "unsupported changelog metadata format version path=`{}` found=`{}` supported=`{}`",
            path.display(),
            version.format_version,
            META_VERSION
        )));
    }
    let meta: Meta = serde_json::from_slice(&bytes).map_err(|e| {
        Error::corrupt(format!(
            "changelog metadata is malformed path=`{}`",
            path.display()
        ))
        .with_source(e)
    })?;
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
    #[cfg(unix)]
    {
        let d = File::open(dir).map_err(|e| {
            Error::io(
                format!("cannot open changelog directory path=`{}`", dir.display()),
                e,
            )
        })?;
        // Durability: persists the directory entries (new, renamed, removed files).
        d.sync_all().map_err(|e| {
            Error::io(
                format!("cannot fsync changelog directory path=`{}`", dir.display()),
                e,
            )
        })?;
    }
    #[cfg(not(unix))]
    let _ = dir; // Directories cannot be fsynced portably elsewhere.
    Ok(())
}
