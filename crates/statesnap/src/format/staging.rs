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
//!
//! # Which path is the target
//!
//! A target path is taken as written, with trailing separators and `.`
//! components dropped ([`normalize_target`]): `store/`, `store/.` and
//! `store` are one target. Its last component must be a name (not `..`, not
//! a root). That last component is never followed: if it is a symbolic link
//! the target is refused, whatever follows it in the path as written
//! (`link/` and `link/.` name the link too). Links in the directories
//! above it are followed, as for any path: the target is the entry of that
//! name in the directory they lead to, and the staging paths are made
//! there, next to it.
//!
//! # Cancellation
//!
//! A staging path is owned by a [`PathGuard`]; blocking steps that work in
//! it (on tokio's blocking pool, where they run on even after the future
//! that started them is dropped) take a [`Hold`] on it. The path is removed
//! when the guard and every hold are gone, so a step still running after a
//! cancellation can never re-create what the guard removed.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::error::{Error, Result};
use crate::store::STORE_MARKER;

pub(crate) const RESTORE_MARK: &str = ".statesnap-restore-";
pub(crate) const OLD_MARK: &str = ".statesnap-old-";

/// A restore target as a restore uses it: trailing separators and `.`
/// components dropped, so that its last component is the entry a restore
/// replaces — `store/`, `store/.` and `store` are one target, and
/// `link/` names the symbolic link `link` (which restores refuse), not the
/// directory it points to. `..` components are kept as written (the
/// kernel resolves them, as for any path). Fails `config` when the last
/// component is not a name (`/`, `.`, a path ending in `..`).
pub fn normalize_target(target: &Path) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    let mut last = None;
    for c in target.components() {
        if c == Component::CurDir {
            continue;
        }
        out.push(c.as_os_str());
        last = Some(c);
    }
    match last {
        Some(Component::Normal(_)) => Ok(out),
        _ => Err(Error::config(format!(
            "restore target has no name of its own path=`{}`; give the path of the store \
             directory itself (not `/`, `.` or a path ending in `..`)",
            target.display()
        ))
        .with_reason(crate::Reason::UnsafeTarget)),
    }
}

/// Refuses (`config`) a target no restore may replace even when the caller
/// adopts it: a symlink (also when written `link/` or `link/.`), a
/// non-directory, a mount point. `Ok(false)`: the target does not exist.
pub(crate) fn check_adoptable(target: &Path) -> Result<bool> {
    let target = &normalize_target(target)?;
    let m = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err("inspect restore target", target, e)),
    };
    let refuse = |why: &str| {
        Err(Error::config(format!(
            "refusing to replace restore target path=`{}`: {why}",
            target.display()
        ))
        .with_reason(crate::Reason::UnsafeTarget))
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

tokio::task_local! {
    /// The (normalized) target a [`adopting`] scope lets restores replace
    /// although it is an unmarked, non-empty directory.
    static ADOPTED: PathBuf;
}

/// Runs `f` with `target` adopted: within it, [`check_replaceable`] lets a
/// restore replace `target` even if it is a non-empty directory without the
/// store marker (`RestoreOptions::replace_unmarked`). Nothing is written to
/// `target` to say so: the decision travels with the task to the step that
/// replaces it.
pub(crate) async fn adopting<F: std::future::Future>(target: &Path, f: F) -> F::Output {
    match normalize_target(target) {
        Ok(t) => ADOPTED.scope(t, f).await,
        // Refused by the first check anyway.
        Err(_) => f.await,
    }
}

fn is_adopted(target: &Path) -> bool {
    ADOPTED.try_with(|a| a == target).unwrap_or(false)
}

/// Why `target` must not be replaced (or emptied) by a restore, if so:
/// a symlink (never followed: the restore would write or delete through
/// it), a mount point (it cannot be renamed, and emptying it is not ours to
/// do), a file, or a non-empty directory without the store marker (it is
/// not a store this library made: it could be anything of the user's)
/// unless the caller adopted it ([`adopting`]).
pub(crate) fn check_replaceable(target: &Path) -> Result<()> {
    let target = &normalize_target(target)?;
    if !check_adoptable(target)? {
        return Ok(());
    }
    if std::fs::symlink_metadata(target.join(STORE_MARKER)).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    let mut entries =
        std::fs::read_dir(target).map_err(|e| io_err("list restore target", target, e))?;
    if entries.next().is_none() || is_adopted(target) {
        return Ok(());
    }
    Err(Error::config(format!(
        "refusing to replace restore target path=`{}`: it is a non-empty directory that is not \
         a statesnap store (no `{STORE_MARKER}` file); move its contents away, or adopt it with \
         RestoreOptions::replace_unmarked (CLI: --force)",
        target.display()
    ))
    .with_reason(crate::Reason::UnmarkedTarget))
}

/// Paths in use by this process (live checkpoints, restores in flight):
/// leftover cleanup never touches them.
fn live_paths() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    static LIVE: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    lock(LIVE.get_or_init(|| Mutex::new(HashSet::new())))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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

/// The guarded staging paths of this process, for [`hold`], by
/// [`lease_key`].
fn leases() -> std::sync::MutexGuard<'static, HashMap<PathBuf, Weak<Lease>>> {
    static LEASES: OnceLock<Mutex<HashMap<PathBuf, Weak<Lease>>>> = OnceLock::new();
    lock(LEASES.get_or_init(|| Mutex::new(HashMap::new())))
}

/// How [`leases`] names a path: normalized and absolute, so that `./x`,
/// `x` and `$PWD/x` are one, and a guarded directory is an ancestor of the
/// paths inside it however they are spelled.
fn lease_key(p: &Path) -> PathBuf {
    let p = normalize_target(p).unwrap_or_else(|_| p.to_path_buf());
    std::path::absolute(&p).unwrap_or(p)
}

/// A guarded path: removed (unless disarmed) when its guard and every
/// [`Hold`] on it are gone.
#[derive(Debug)]
struct Lease {
    path: PathBuf,
    armed: AtomicBool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed.load(Ordering::SeqCst)
            && let Err(e) = remove_path(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove staging path; the next restore will");
        }
        let key = lease_key(&self.path);
        let mut leases = leases();
        if leases.get(&key).is_some_and(|w| w.strong_count() == 0) {
            leases.remove(&key);
        }
        drop(leases);
        unregister_live(&self.path);
    }
}

/// Removes a path (registered live) when it and every [`Hold`] taken on it
/// are dropped, unless disarmed.
#[derive(Debug)]
pub(crate) struct PathGuard {
    lease: Arc<Lease>,
}

impl PathGuard {
    pub(crate) fn new(path: PathBuf) -> Self {
        register_live(&path);
        let lease = Arc::new(Lease {
            path: path.clone(),
            armed: AtomicBool::new(true),
        });
        leases().insert(lease_key(&path), Arc::downgrade(&lease));
        PathGuard { lease }
    }

    /// Keeps the path: it became the store (it was renamed into place).
    pub(crate) fn disarm(&self) {
        self.lease.armed.store(false, Ordering::SeqCst);
    }
}

/// Keeps guarded paths from being removed while a blocking step that works
/// in them runs (see the module docs, "Cancellation"). Drop it after
/// whatever the step made there (an open store) is closed.
#[derive(Debug, Default)]
#[must_use]
pub(crate) struct Hold {
    /// Kept for their drop only.
    _leases: Vec<Arc<Lease>>,
}

/// A [`Hold`] on every guarded path (a [`PathGuard`] of this process) that
/// is one of `paths` or holds one of them (an ancestor: a scratch directory
/// the step works somewhere inside). Take it in the task, before the
/// blocking step starts, and move it into the step.
pub(crate) fn hold(paths: &[&Path]) -> Hold {
    let leases = leases();
    let mut held: Vec<Arc<Lease>> = Vec::new();
    for p in paths {
        let key = lease_key(p);
        for a in key.ancestors() {
            if let Some(l) = leases.get(a).and_then(Weak::upgrade)
                && !held.iter().any(|h| Arc::ptr_eq(h, &l))
            {
                held.push(l);
            }
        }
    }
    Hold { _leases: held }
}

/// Runs `f` on the blocking pool with `held` kept until whatever `f`
/// returned is dropped (also when the caller is cancelled and nobody takes
/// the result).
pub(crate) async fn blocking_held<T: Send + 'static>(
    held: Hold,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    // A tuple drops its fields in order: the result (an open store) first,
    // then the hold, which may remove the path the store was in.
    let (r, held) = crate::util::blocking(move || Ok((f(), held))).await?;
    drop(held);
    r
}

pub(crate) fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("cannot {what} path=`{}`", path.display()), e)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    crate::util::sync_dir(dir).map_err(|e| io_err("fsync directory", dir, e))
}

/// Removes a file or a directory tree; a missing path is fine. A tree that
/// changes while it is removed (a cancelled step's last write or rename,
/// finishing on another thread) is removed again, a few times.
pub(crate) fn remove_path(p: &Path) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        let r = match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
            Ok(_) => std::fs::remove_file(p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => Err(e),
        };
        let Err(e) = r else { return Ok(()) };
        let gone = matches!(std::fs::symlink_metadata(p), Err(m) if m.kind() == std::io::ErrorKind::NotFound);
        if gone {
            return Ok(());
        }
        let raced = matches!(
            e.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty
        );
        if !raced || tries >= 8 {
            return Err(e);
        }
        tries += 1;
        std::thread::yield_now();
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

/// The parent directory and file name of a restore target
/// ([`normalize_target`]d).
pub(crate) fn split_target(target: &Path) -> Result<(PathBuf, String)> {
    let target = &normalize_target(target)?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            Error::config(format!(
                "restore target has no file name path=`{}`",
                target.display()
            ))
            .with_reason(crate::Reason::UnsafeTarget)
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
    let target = &normalize_target(target)?;
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
