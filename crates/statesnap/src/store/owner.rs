//! One owner per store directory.
//!
//! A restore may replace, empty or rebuild its target directory, so before
//! any step of an open or a restore changes a directory it takes the
//! directory's ownership lock; a live [`StateHandle`](crate::StateHandle)
//! keeps it until it is closed. A second opener — another handle of the
//! same process, another process, the CLI's `restore` — is refused with a
//! `transient` error *before it reads or writes anything*, and the live
//! owner's files are left alone.
//!
//! The lock is an advisory `flock` on a file next to the directory,
//! `<parent>/.<name>.statesnap-lock` (not inside it: a restore swaps the
//! directory itself, and a lock inside would move with the old one). Such
//! locks conflict between two opens of the file in one process too, and
//! the kernel drops them when their process dies, so a crashed owner never
//! blocks the next one. The owner removes the file when it lets go; a
//! contender that locked a file removed under it sees that the path no
//! longer names what it locked, and tries again.

use std::fs::{File, OpenOptions};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Suffix of the lock file next to a store directory.
pub(crate) const LOCK_SUFFIX: &str = ".statesnap-lock";

/// How often [`DirLock::acquire`] retries a lock file its previous holder
/// removed while we waited (each retry means another owner came and went).
const MAX_ATTEMPTS: usize = 64;

/// Ownership of one store directory, released on drop.
#[derive(Debug)]
pub(crate) struct DirLock {
    path: PathBuf,
    file: Option<File>,
}

/// The directory `dir` names, absolute, without `.` components or trailing
/// separators (symlinks are not resolved: a restore refuses them itself),
/// split into its parent and its name.
pub(crate) fn split_dir(dir: &Path) -> Result<(PathBuf, std::ffi::OsString)> {
    let abs = std::path::absolute(dir).map_err(|e| {
        Error::io(
            format!(
                "cannot make store directory path absolute path=`{}`",
                dir.display()
            ),
            e,
        )
    })?;
    let normal: PathBuf = abs.components().collect();
    match (normal.parent(), normal.components().next_back()) {
        (Some(parent), Some(Component::Normal(name))) => {
            Ok((parent.to_path_buf(), name.to_os_string()))
        }
        _ => Err(Error::config(format!(
            "store directory must name a directory below a parent path=`{}`; give a path \
             such as `/var/lib/app/state/store-0` (not `/`, and not ending in `..`)",
            dir.display()
        ))),
    }
}

/// The path two specs naming the same directory share: the parent
/// resolved (symlinks and `..` followed, when it exists) joined with the
/// directory's name.
pub(crate) fn canonical_dir(dir: &Path) -> Result<PathBuf> {
    let (parent, name) = split_dir(dir)?;
    let parent = std::fs::canonicalize(&parent).unwrap_or(parent);
    Ok(parent.join(name))
}

impl DirLock {
    /// Takes ownership of store directory `dir` (which need not exist; its
    /// parent is created). Fails `transient` when another handle or process owns
    /// it: close that handle, or wait for its process to end, and retry.
    pub(crate) fn acquire(dir: &Path) -> Result<DirLock> {
        let (parent, name) = split_dir(dir)?;
        std::fs::create_dir_all(&parent).map_err(|e| {
            Error::io(
                format!(
                    "cannot create the parent of store directory path=`{}`",
                    parent.display()
                ),
                e,
            )
        })?;
        let mut lock_name = std::ffi::OsString::from(".");
        lock_name.push(&name);
        lock_name.push(LOCK_SUFFIX);
        let path = parent.join(lock_name);
        let io = |what: &str, e| {
            Error::io(
                format!(
                    "cannot {what} store directory lock path=`{}` dir=`{}`",
                    path.display(),
                    dir.display()
                ),
                e,
            )
        };
        for _ in 0..MAX_ATTEMPTS {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| io("open", e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let holder: String = holder.trim().chars().take(200).collect();
                    return Err(Error::transient(format!(
                        "store directory is in use by another handle or process dir=`{}` \
                         lock=`{}` holder=`{}`; nothing was changed: close that handle (or wait \
                         for its process to end) and open again",
                        dir.display(),
                        path.display(),
                        holder.escape_debug()
                    ))
                    .with_reason(crate::Reason::InUse));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", e)),
            }
            // The previous holder removes the file as it lets go: if it did
            // so after we opened it, we hold a lock on a file nobody sees.
            if same_file(&file, &path) {
                let me = format!("pid={}\n", std::process::id());
                if let Err(e) = file
                    .set_len(0)
                    .and_then(|()| std::io::Write::write_all(&mut &file, me.as_bytes()))
                {
                    tracing::debug!(path = %path.display(), error = %e, "cannot record the lock holder");
                }
                return Ok(DirLock {
                    path,
                    file: Some(file),
                });
            }
        }
        Err(Error::transient(format!(
            "store directory changed owners {MAX_ATTEMPTS} times while this open waited dir=`{}`; \
             retry",
            dir.display()
        ))
        .with_reason(crate::Reason::InUse))
    }
}

#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Remove the name while still holding the lock, then unlock by
        // closing: a contender that opened the old file sees it is gone.
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::debug!(path = %self.path.display(), error = %e, "cannot remove store directory lock");
        }
        drop(self.file.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn one_owner_per_directory_whatever_the_spelling() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("store");
        let held = DirLock::acquire(&dir).expect("first owner");
        std::fs::create_dir(&dir).expect("mkdir");
        let spellings = [
            dir.clone(),
            tmp.path().join("store/"),
            tmp.path().join("store/."),
            tmp.path().join("./store"),
        ];
        for s in &spellings {
            let e = DirLock::acquire(s).expect_err("second owner");
            assert_eq!(e.kind(), ErrorKind::Transient, "{}", s.display());
        }
        // Nothing was written into the directory.
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 0);
        drop(held);
        let again = DirLock::acquire(&tmp.path().join("store/")).expect("free again");
        drop(again);
        // The lock file goes with its owner.
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("store")]);
    }

    #[test]
    fn a_root_or_dotdot_is_no_store_directory() {
        for bad in ["/", "/tmp/.."] {
            let e = DirLock::acquire(Path::new(bad)).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}");
        }
    }

    #[test]
    fn canonical_dir_joins_every_spelling() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("a")).expect("mkdir");
        let want = canonical_dir(&tmp.path().join("a/s")).expect("canonical");
        for s in ["a/s/", "a/./s", "a/../a/s", "./a/s/."] {
            assert_eq!(canonical_dir(&tmp.path().join(s)).expect(s), want, "{s}");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(tmp.path().join("a"), tmp.path().join("link"))
                .expect("symlink");
            assert_eq!(
                canonical_dir(&tmp.path().join("link/s")).expect("link"),
                want
            );
        }
    }
}
