//! Restored files left to reach the disk in the background.
//!
//! A restored store is a cache of its changelog: if a machine crash loses
//! it, a restore builds it again and nothing is lost. What must never
//! happen is a store that *looks* restored but holds files the disk never
//! received. Waiting for every file's fsync before the store is published
//! gives that, at the cost of most of a local restore's time (the disk
//! writes back the whole store while the restore waits).
//!
//! A restore may instead publish the store with a **marker**,
//! `.statesnap-unsynced-<id>`, holding the running kernel's boot id, and
//! fsync its files afterwards on a background thread, which removes the
//! marker once they are durable. A crash of the process loses nothing the
//! kernel was given, so on the same boot the store is sound and opening it
//! starts the sync again. A marker naming **another boot** means the
//! machine restarted before the files were known to be on disk: opening
//! that store is refused (`corrupt`, saying why), and a restore replaces
//! it — reusing only local files whose bytes still hash to the manifest's.
//!
//! The marker is written before the staging directory's fsync, so it is
//! durable whenever the rename that publishes the store is. An empty or
//! unreadable marker counts as another boot's; one that disappears while
//! it is read was removed by a sync that finished meanwhile. Without a
//! boot id (a platform other than Linux) restores sync before they return.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::util::sync_dir;

/// The name prefix of the marker files (the rest is a unique id, so a sync
/// only ever removes the marker it was started for).
pub const UNSYNCED_PREFIX: &str = ".statesnap-unsynced-";

/// The running kernel's boot id (Linux), or `None` where there is none to
/// read, in which case restores sync before they return.
pub(crate) fn boot_id() -> Option<&'static str> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let id = id.trim();
        (!id.is_empty()).then(|| id.to_owned())
    })
    .as_deref()
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("cannot {what} path=`{}`", path.display()), e)
}

/// Writes a marker for this boot into `dir` (not fsynced: the caller's
/// fsync of `dir`, which it does before publishing it, makes the entry
/// durable, and a marker whose contents were lost reads as another boot's).
pub(crate) fn mark(dir: &Path, boot: &str) -> Result<()> {
    let p = dir.join(format!(
        "{UNSYNCED_PREFIX}{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&p, format!("{boot}\n")).map_err(|e| io_err("write unsynced marker", &p, e))
}

/// The markers in `dir` and, for the first whose boot is not this one, the
/// boot it names (`""`: empty or unreadable).
fn markers(dir: &Path) -> Result<(Vec<PathBuf>, Option<String>)> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), None)),
        Err(e) => return Err(io_err("list store directory", dir, e)),
    };
    let mut found = Vec::new();
    let mut foreign = None;
    for entry in rd {
        let entry = entry.map_err(|e| io_err("list store directory", dir, e))?;
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(UNSYNCED_PREFIX)
        {
            continue;
        }
        let p = entry.path();
        let recorded = match std::fs::read_to_string(&p) {
            Ok(r) => r,
            // Removed since the listing: the sync it stood for has ended.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => String::new(),
        };
        let recorded = recorded.trim();
        if foreign.is_none() && Some(recorded) != boot_id() {
            foreign = Some(recorded.to_owned());
        }
        found.push(p);
    }
    Ok((found, foreign))
}

/// Refuses (`corrupt`) a store directory restored on an earlier boot whose
/// files were never confirmed on disk; otherwise returns the markers of
/// this boot still in it (their sync is to be started again).
pub(crate) fn check(dir: &Path) -> Result<Vec<PathBuf>> {
    let (found, foreign) = markers(dir)?;
    if let Some(recorded) = foreign {
        let recorded = if recorded.is_empty() {
            "unknown".to_owned()
        } else {
            recorded
        };
        return Err(Error::corrupt(format!(
            "store was restored with its files left to reach the disk in the background, and \
             the machine restarted before they had (restored on boot `{recorded}`, running boot \
             `{}`): its files may be incomplete path=`{}`; restore it again (the runtime and a \
             local-first restore do so by themselves), or remove the directory",
            boot_id().unwrap_or("unknown"),
            dir.display()
        )));
    }
    Ok(found)
}

/// Whether `dir` holds any marker (of any boot).
pub(crate) fn is_marked(dir: &Path) -> Result<bool> {
    Ok(!markers(dir)?.0.is_empty())
}

/// fsyncs every file under `dir` (recursively) and every directory, then
/// removes `markers` and fsyncs `dir` once more. Files and directories that
/// vanish meanwhile are skipped (a store's own deletions: RocksDB removes a
/// file only after the manifest that drops it is synced); a `dir` that is
/// gone (replaced or removed) has nothing left to make durable.
pub(crate) fn sync_and_clear(dir: &Path, markers: &[PathBuf]) -> Result<()> {
    fn tree(p: &Path) -> std::io::Result<()> {
        let rd = match std::fs::read_dir(p) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in rd {
            let entry = entry?;
            let ft = match entry.file_type() {
                Ok(ft) => ft,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let r = if ft.is_dir() {
                tree(&entry.path())
            } else if ft.is_file() {
                std::fs::File::open(entry.path()).and_then(|f| f.sync_all())
            } else {
                Ok(())
            };
            match r {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        match sync_dir(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
    tree(dir).map_err(|e| io_err("fsync restored store", dir, e))?;
    for m in markers {
        match std::fs::remove_file(m) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err("remove unsynced marker", m, e));
            }
            _ => {}
        }
    }
    match sync_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io_err("fsync directory", dir, e))
        }
        _ => Ok(()),
    }
}

/// The background fsync of a store's restored files, started by
/// [`BackgroundSync::spawn`]; [`wait`](Self::wait) blocks until it ends.
#[derive(Debug)]
pub(crate) struct BackgroundSync {
    handle: Mutex<Option<std::thread::JoinHandle<Result<()>>>>,
}

impl BackgroundSync {
    /// Starts syncing `dir` and then removing `markers`.
    pub(crate) fn spawn(dir: PathBuf, markers: Vec<PathBuf>) -> Result<Self> {
        let handle = std::thread::Builder::new()
            .name("statesnap-sync".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let r = sync_and_clear(&dir, &markers);
                match &r {
                    Ok(()) => tracing::debug!(
                        path = %dir.display(),
                        secs = started.elapsed().as_secs_f64(),
                        "restored store is durable"
                    ),
                    Err(e) => tracing::warn!(
                        path = %dir.display(),
                        error = %e,
                        "cannot make a restored store durable: it stays marked, so after a \
                         machine restart it is restored again rather than used"
                    ),
                }
                r
            })
            .map_err(|e| Error::io("cannot start the restored store's sync thread", e))?;
        Ok(BackgroundSync {
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Blocks until the sync has ended and returns its result (`Ok` again
    /// on later calls).
    pub(crate) fn wait(&self) -> Result<()> {
        let handle = match self.handle.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        match handle {
            None => Ok(()),
            Some(h) => h.join().unwrap_or_else(|_| {
                Err(Error::internal("the restored store's sync thread panicked"))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_of_this_boot_is_synced_and_removed_and_another_boots_refused() {
        let Some(boot) = boot_id() else {
            return; // no boot id on this platform: restores sync before returning
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), b"a").unwrap();
        std::fs::write(dir.path().join("b"), b"b").unwrap();
        mark(dir.path(), boot).unwrap();
        assert!(is_marked(dir.path()).unwrap());
        let found = check(dir.path()).unwrap();
        assert_eq!(found.len(), 1);
        BackgroundSync::spawn(dir.path().to_path_buf(), found)
            .unwrap()
            .wait()
            .unwrap();
        assert!(!is_marked(dir.path()).unwrap());
        assert!(check(dir.path()).unwrap().is_empty());

        mark(dir.path(), "a-boot-before-a-crash").unwrap();
        let e = check(dir.path()).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Corrupt, "{e}");
    }

    #[test]
    fn an_empty_marker_counts_as_another_boots() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(format!("{UNSYNCED_PREFIX}x")), b"").unwrap();
        let e = check(dir.path()).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Corrupt, "{e}");
    }

    #[test]
    fn a_sync_of_a_directory_that_is_gone_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        sync_and_clear(&gone, &[gone.join(format!("{UNSYNCED_PREFIX}x"))]).unwrap();
    }
}
