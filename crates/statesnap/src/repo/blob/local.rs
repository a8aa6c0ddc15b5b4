//! A local (`file://`) repository's own ways to store a file: a hard link
//! to an immutable file, or a blocking copy of a large one.

use object_store::path::Path;

use super::reader::{CopyError, LocalFile, copy_hashed};
use super::{BlobRef, PutOutcome};
use crate::repo::paths::{self, BlobHash, StoreKey};

/// [`Blobs::put_immutable_file`](super::Blobs::put_immutable_file)'s link,
/// on a blocking thread: the outcome, or `None` when the file must be
/// copied instead.
pub(super) fn link_blob(
    local: &object_store::local::LocalFileSystem,
    sk: &StoreKey,
    src: &std::path::Path,
    now: std::time::SystemTime,
) -> std::io::Result<Option<PutOutcome>> {
    use std::io::ErrorKind as K;
    // Checking that the name links the hashed file takes inode numbers.
    if cfg!(not(unix)) {
        return Ok(None);
    }
    let mut file = std::fs::File::open(src)?;
    let mut hasher = blake3::Hasher::new();
    let size = std::io::copy(&mut file, &mut hasher)?;
    let blob = BlobRef {
        hash: BlobHash::from(hasher.finalize()),
        size,
    };
    let Ok(dest) = local.path_to_filesystem(&paths::blob(sk, &blob.hash)) else {
        return Ok(None);
    };
    #[cfg(unix)]
    let hashed = file.metadata()?;
    match std::fs::metadata(&dest) {
        Ok(m) if m.len() == size => {
            return Ok(Some(PutOutcome {
                blob,
                uploaded: false,
            }));
        }
        // Another size under this hash: the copy replaces it.
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == K::NotFound => {}
        Err(e) => return Err(e),
    }
    // A fresh modification time (`now`, the repository's clock, which gc
    // reads too), as a copy would have: gc condemns only blobs older than
    // its grace period, and an SST may be hours old. (It is the live
    // file's time too; RocksDB keeps an SST's age in its properties, not in
    // its mtime.) A file whose time cannot be set is copied instead.
    if file.set_modified(now).is_err() {
        return Ok(None);
    }
    // The blob is durable once its name is: the data first (a no-op when
    // the file's writer synced it, as RocksDB does its SSTs), then the
    // directory entry.
    file.sync_all()?;
    let Some(dir) = dest.parent() else {
        return Ok(None);
    };
    let created = create_dirs(dir)?;
    match std::fs::hard_link(src, &dest) {
        Ok(()) => {}
        // A racing writer stored it first: same hash, same bytes.
        Err(e) if e.kind() == K::AlreadyExists => {
            return Ok(std::fs::metadata(&dest)
                .is_ok_and(|m| m.len() == size)
                .then_some(PutOutcome {
                    blob,
                    uploaded: false,
                }));
        }
        // Another filesystem, or links refused (`protected_hardlinks`, a
        // filesystem without them): copy.
        Err(e) => {
            tracing::debug!(path = %src.display(), error = %e, "hard link refused, copying");
            return Ok(None);
        }
    }
    // The name must be the file that was hashed: a source path replaced
    // between the hash and the link is undone and copied instead.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let linked = std::fs::metadata(&dest)?;
        if (linked.dev(), linked.ino()) != (hashed.dev(), hashed.ino()) {
            std::fs::remove_file(&dest)?;
            return Ok(None);
        }
    }
    sync_dirs(dir, created.as_deref())?;
    Ok(Some(PutOutcome {
        blob,
        uploaded: true,
    }))
}

/// A local repository's copy of a large file (`src`, read from its start)
/// to blob `sk`'s staging path `staging`, then, named by its hash, into the
/// blob space: read, hashed and written through one buffer
/// ([`copy_hashed`], as a restore copies a local blob out); fsynced before
/// the rename; its directory fsynced after. A blob of that hash and size
/// already there is kept and the copy removed.
pub(super) fn copy_blob(
    local: &object_store::local::LocalFileSystem,
    sk: &StoreKey,
    src: &LocalFile,
    staging: &Path,
) -> std::io::Result<PutOutcome> {
    let tmp = local
        .path_to_filesystem(staging)
        .map_err(std::io::Error::other)?;
    if let Some(dir) = tmp.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let copied = (|| {
        let out = std::fs::File::create_new(&tmp)?;
        let mut hasher = blake3::Hasher::new();
        let size = match copy_hashed(src, u64::MAX, &mut hasher, &out, 0, None) {
            Ok(n) => n,
            Err(CopyError::Read(e) | CopyError::Write(e)) => return Err(e),
        };
        let blob = BlobRef {
            hash: BlobHash::from(hasher.finalize()),
            size,
        };
        let dest = local
            .path_to_filesystem(&paths::blob(sk, &blob.hash))
            .map_err(std::io::Error::other)?;
        if std::fs::metadata(&dest).is_ok_and(|m| m.len() == size) {
            return Ok((blob, None));
        }
        out.sync_all()?;
        Ok((blob, Some(dest)))
    })();
    let (blob, dest) = match copied {
        Ok(x) => x,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let Some(dest) = dest else {
        // The blob is there already; a leftover copy is gc's to remove.
        let _ = std::fs::remove_file(&tmp);
        return Ok(PutOutcome {
            blob,
            uploaded: false,
        });
    };
    let published = (|| {
        let dir = dest
            .parent()
            .ok_or_else(|| std::io::Error::other("blob path has no directory"))?;
        let created = create_dirs(dir)?;
        std::fs::rename(&tmp, &dest)?;
        sync_dirs(dir, created.as_deref())
    })();
    if let Err(e) = published {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(PutOutcome {
        blob,
        uploaded: true,
    })
}

/// Creates `dir` and its missing ancestors; returns the highest one it
/// created, for [`sync_dirs`].
fn create_dirs(dir: &std::path::Path) -> std::io::Result<Option<std::path::PathBuf>> {
    if dir.is_dir() {
        return Ok(None);
    }
    let created = first_missing_ancestor(dir);
    std::fs::create_dir_all(dir)?;
    Ok(created)
}

/// Makes a new entry in `dir` durable: fsyncs `dir`, then, for the
/// directories made for it (up to `created`, from [`create_dirs`]), each
/// one's entry in its parent.
fn sync_dirs(dir: &std::path::Path, created: Option<&std::path::Path>) -> std::io::Result<()> {
    crate::util::sync_dir(dir)?;
    if let Some(top) = created {
        let mut d = dir;
        while let Some(parent) = d.parent() {
            crate::util::sync_dir(parent)?;
            if d == top {
                break;
            }
            d = parent;
        }
    }
    Ok(())
}

/// The highest directory of `dir`'s path that does not exist yet.
fn first_missing_ancestor(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut top = None;
    let mut d = Some(dir);
    while let Some(p) = d.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        top = Some(p.to_path_buf());
        d = p.parent();
    }
    top
}
