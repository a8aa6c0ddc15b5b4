//! Crash-safe restore into a path: build the store in a hidden staging path
//! next to the target, make it durable, then swap it into place with one
//! rename. Shared by the RocksDB and portable formats.
//!
//! Names next to a target `<dir>/<name>`:
//!
//! - `.<name>.statesnap-restore-<uuid>` — a restore being built;
//! - `.<name>.statesnap-old-<uuid>` — the previous store, moved aside while
//!   the new one is switched in (put back if the switch fails).
//!
//! A crash leaves the target either as it was, or absent (between the two
//! renames), or complete — never a partly restored store at the target
//! path. Leftovers are removed by the next restore of the same target
//! ([`clean_restore_leftovers`]); paths a restore of *this* process is using
//! are registered as live and never touched.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::store::STORE_MARKER;

pub(crate) const RESTORE_MARK: &str = ".statesnap-restore-";
pub(crate) const OLD_MARK: &str = ".statesnap-old-";
/// Refuses (`config`) a target no restore may replace even when the caller
/// adopts it: a symlink, a non-directory, a mount point. `Ok(false)`: the
/// target does not exist.
pub(crate) fn check_adoptable(target: &Path) -> Result<bool> {
    let m = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err("inspect restore target", target, e)),
    };
    let refuse = |why: &str| {
        Err(Error::config(format!(
            "refusing to replace restore target path=`{}`: {why}",
            target.display()
        )))
    };
    if m.file_type().is_symlink() {
        return refuse(
            "it is a symbolic link; restore into the real directory it points to, or remove the link",
        );
    }
    if !m.is_dir() {
        return refuse("it is not a directory; move it away or choose another target");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let (parent, _) = split_target(target)?;
        if let Ok(pm) = std::fs::metadata(&parent)
            && pm.dev() != m.dev()
        {
            return refuse(
                "it is a mount point; restore into a directory inside it (e.g. `<mount>/store`)",
            );
        }
    }
    Ok(true)
}

/// Why `target` must not be replaced (or emptied) by a restore, if so:
/// a symlink (never followed: the restore would write or delete through
/// it), a mount point (it cannot be renamed, and emptying it is not ours to
/// do), a file, or a non-empty directory without the store marker (it is
/// not a store this library made: it could be anything of the user's).
pub(crate) fn check_replaceable(target: &Path) -> Result<()> {
    if !check_adoptable(target)? {
        return Ok(());
    }
    if std::fs::symlink_metadata(target.join(STORE_MARKER)).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    let mut entries =
        std::fs::read_dir(target).map_err(|e| io_err("list restore target", target, e))?;
    if entries.next().is_none() {
        return Ok(());
    }
    Err(Error::config(format!(
        "refusing to replace restore target path=`{}`: it is a non-empty directory that is not \
         a statesnap store (no `{STORE_MARKER}` file); move its contents away, or adopt it with \
         RestoreOptions::replace_unmarked (CLI: --force)",
        target.display()
    )))
}

/// Paths in use by this process (live checkpoints, restores in flight):
/// leftover cleanup never touches them.
fn live_paths() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    static LIVE: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let m = LIVE.get_or_init(|| Mutex::new(HashSet::new()));
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

pub(crate) fn register_live(p: &Path) {
    live_paths().insert(p.to_path_buf());
}

pub(crate) fn unregister_live(p: &Path) {
    live_paths().remove(p);
}

/// Removes a path (registered live) when dropped, unless disarmed.
pub(crate) struct PathGuard {
    path: PathBuf,
    pub(crate) armed: bool,
}

impl PathGuard {
    pub(crate) fn new(path: PathBuf) -> Self {
        register_live(&path);
        PathGuard { path, armed: true }
    }
}

impl Drop for PathGuard {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = remove_path(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove staging path; the next restore will");
        }
        unregister_live(&self.path);
    }
}

pub(crate) fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("cannot {what} path=`{}`", path.display()), e)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    crate::util::sync_dir(dir).map_err(|e| io_err("fsync directory", dir, e))
}

/// Removes a file or a directory tree; a missing path is fine.
pub(crate) fn remove_path(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// fsyncs every regular file and directory under `p` (or `p` itself if it
/// is a file), so a rename of `p` publishes durable contents.
pub(crate) fn sync_tree(p: &Path) -> Result<()> {
    let m = std::fs::symlink_metadata(p).map_err(|e| io_err("stat", p, e))?;
    if m.is_dir() {
        let rd = std::fs::read_dir(p).map_err(|e| io_err("list directory", p, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| io_err("list directory", p, e))?;
            sync_tree(&entry.path())?;
        }
        sync_dir(p)
    } else if m.is_file() {
        std::fs::File::open(p)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err("fsync file", p, e))
    } else {
        Ok(()) // symlinks and special files: nothing of ours to flush
    }
}

/// Removes entries of `dir` whose name passes `matches` and that no live cut
/// or restore of this process uses. Returns how many were removed.
pub(crate) fn remove_leftovers(dir: &Path, matches: impl Fn(&str) -> bool) -> Result<usize> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("list directory", dir, e)),
    };
    let mut removed = 0;
    for entry in rd {
        let entry = entry.map_err(|e| io_err("list directory", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !matches(&name) {
            continue;
        }
        let p = entry.path();
        if live_paths().contains(&p) {
            continue;
        }
        tracing::info!(path = %p.display(), "removing leftover staging path");
        remove_path(&p).map_err(|e| io_err("remove leftover staging path", &p, e))?;
        removed += 1;
    }
    Ok(removed)
}

/// The parent directory and file name of a restore target.
pub(crate) fn split_target(target: &Path) -> Result<(PathBuf, String)> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            Error::config(format!(
                "restore target has no file name path=`{}`",
                target.display()
            ))
        })?;
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Removes restore staging and moved-aside stores that crashed restores of
/// `target` left behind. Returns how many entries were removed.
pub(crate) fn clean_restore_leftovers(target: &Path) -> Result<usize> {
    let Ok((parent, name)) = split_target(target) else {
        return Ok(0);
    };
    let restore = format!(".{name}{RESTORE_MARK}");
    let old = format!(".{name}{OLD_MARK}");
    remove_leftovers(&parent, |e| e.starts_with(&restore) || e.starts_with(&old))
}

/// A fresh staging path for a restore of `target` (not created), guarded:
/// removed on drop unless disarmed. Creates the target's parent directory
/// and removes leftovers of earlier crashed restores first.
pub(crate) fn new_restore_staging(target: &Path) -> Result<(PathBuf, PathGuard)> {
    let (parent, name) = split_target(target)?;
    std::fs::create_dir_all(&parent).map_err(|e| io_err("create directory", &parent, e))?;
    clean_restore_leftovers(target)?;
    let staging = parent.join(format!(
        ".{name}{RESTORE_MARK}{}",
        uuid::Uuid::new_v4().simple()
    ));
    let guard = PathGuard::new(staging.clone());
    Ok((staging, guard))
}

/// Moves the complete, durable `staging` over `target` and opens the result
/// with `open`; if the rename or `open` fails, the previous target is put
/// back (or the target removed, if there was none) and the error returned.
pub(crate) fn swap_into_place<T>(
    staging: &Path,
    target: &Path,
    open: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let (parent, name) = split_target(target)?;
    let old = if std::fs::symlink_metadata(target).is_ok() {
        let old = parent.join(format!(
            ".{name}{OLD_MARK}{}",
            uuid::Uuid::new_v4().simple()
        ));
        register_live(&old);
        if let Err(e) = std::fs::rename(target, &old) {
            unregister_live(&old);
            return Err(io_err("move the existing store aside", target, e));
        }
        Some(old)
    } else {
        None
    };
    let put_back = |old: &Option<PathBuf>| {
        if let Some(old) = old {
            let _ = remove_path(target);
            if let Err(e) = std::fs::rename(old, target) {
                tracing::error!(from = %old.display(), to = %target.display(), error = %e, "cannot put the previous store back");
            }
            let _ = sync_dir(&parent);
            unregister_live(old);
        }
    };
    if let Err(e) = std::fs::rename(staging, target) {
        put_back(&old);
        return Err(io_err("move the restored store into place", target, e));
    }
    // The rename is the switch-over: make it durable before using it.
    if let Err(e) = sync_dir(&parent) {
        put_back(&old);
        return Err(e);
    }
    match open(target) {
        Ok(store) => {
            if let Some(old) = old {
                if let Err(e) = remove_path(&old) {
                    tracing::warn!(path = %old.display(), error = %e, "cannot remove the previous store; the next restore will");
                }
                unregister_live(&old);
            }
            Ok(store)
        }
        Err(e) => {
            if old.is_some() {
                put_back(&old);
            } else {
                let _ = remove_path(target);
                let _ = sync_dir(&parent);
            }
            Err(e)
        }
    }
}
