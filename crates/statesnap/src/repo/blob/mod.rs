//! Content-addressed blobs (invariant 4) with verification on every
//! read (invariant 6).
//!
//! # Upload strategy
//!
//! A blob's key is the blake3 of its bytes, known only after reading them
//! all, and a stream can be read only once. So:
//!
//! * **small** blobs (below [`TransferOptions::multipart_threshold`], default
//!   8 MiB) are buffered in memory, hashed, checked with `head` (an existing
//!   blob of the same size is not uploaded again) and written with one `put`;
//! * **large** blobs are streamed, hashed on the way, as a multipart upload to
//!   a staging key `stores/<sk>/tmp/<ulid>`, then moved to
//!   `blobs/<hh>/<hash>` (`rename`: a real rename on a local filesystem, a
//!   server-side copy plus delete on S3/GCS/Azure — no bytes travel twice
//!   through the client), unless a blob with that hash already exists, in
//!   which case the staging object is just deleted. Staging objects of a
//!   crashed writer are removed by gc once older than its grace period.
//!   (S3's single-request copy is limited to 5 GiB per object.)
//!   A `file://` repository (without a bandwidth limit) does the same
//!   with plain system calls on one blocking thread: read, hash and write
//!   through one 256 KiB buffer to the staging path, fsync, rename, fsync
//!   the directory. Memory stays at the buffer, where multipart parts
//!   would hold up to `parallelism` × `part_size` per file;
//! * **immutable** files (RocksDB's SSTs, [`Blobs::put_immutable_file`])
//!   may be hard-linked into a local repository instead
//!   ([`TransferOptions::link_immutable_files`]).
//!
//! Blobs are written with `PutMode::Overwrite`: the content is identical by
//! construction, so a racing second writer is harmless.

mod get;
mod local;
mod put;
mod ranged;
mod reader;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;

use crate::error::{Error, Result};
use crate::repo::paths::{self, BlobHash, StoreKey};
use crate::repo::{Repository, map_store_error};
use crate::util::blocking_io;

pub use reader::BlobReader;

/// Transfer tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferOptions {
    /// How many blobs move at once (and how many parts of one upload are in
    /// flight). Default 8.
    pub parallelism: usize,
    /// Blobs of at least this many bytes use the multipart staging path.
    /// Default 8 MiB.
    pub multipart_threshold: usize,
    /// Multipart part size (S3 needs at least 5 MiB). Default 8 MiB.
    pub part_size: usize,
    /// Downloads of blobs larger than this are split into ranges of this
    /// size fetched concurrently (up to `parallelism` per blob), each range
    /// hashed on its own and the hashes merged along BLAKE3's tree, so a
    /// large file is verified as it arrives without one task reading it
    /// all. Rounded down to a power of two of at least 1 KiB (BLAKE3's
    /// subtrees). Default 16 MiB.
    pub download_part_size: usize,
    /// When a restore's downloaded files are fsynced: before the restore
    /// returns, or after, in the background. Default
    /// [`RestoreSync::Background`].
    pub restore_sync: RestoreSync,
    /// In a `file://` repository, store files that their owner never
    /// modifies again (RocksDB's SSTs) as hard links to them instead of
    /// copies, when they are on the same filesystem
    /// ([`Blobs::put_immutable_file`]). Default `false`.
    ///
    /// A link writes no data: a new SST costs a hash, an fsync of a file
    /// its writer already synced, and an fsync of a directory, not a copy
    /// and an fsync of its bytes. The link gets a fresh modification time
    /// (the live SST's too), as a copy would. The price is that
    /// the snapshot and the live store share those files' blocks: damage to
    /// one (a disk error, a tool writing into the file) is damage to both,
    /// where a copy would keep one good. Restore still verifies every byte,
    /// and the changelog can rebuild the store, so no data is lost, but the
    /// snapshot then no longer shortens that rebuild. Leave it off when the
    /// local repository is the one copy meant to survive the store's
    /// files; turn it on for a repository that is a fast restart point on
    /// the store's own disk.
    pub link_immutable_files: bool,
}

/// When a RocksDB restore makes its files durable.
///
/// A restored store is a cache of its changelog, so a machine crash may
/// lose it as long as it is never *used* torn. With `Background` (the
/// default) a restore publishes the store as soon as every file is written
/// and verified, marked with the kernel's boot id; a background thread
/// fsyncs the files and then removes the mark. A store still marked from an
/// earlier boot is refused on open and restored again (the runtime and
/// local-first restores do this by themselves; reused local files are
/// hashed first, as always). On the same boot the page cache holds every
/// byte, so a crash of the process changes nothing. Where there is no boot
/// id to read (platforms other than Linux) restores behave as `Immediate`.
///
/// `Immediate` fsyncs every file before the store is published: slower
/// (on a local disk the restore then waits for the whole store to be
/// written back), for callers that open restored directories with their
/// own RocksDB code instead of `RocksStore::open`, which would
/// not see the mark. `statesnap restore` into a directory
/// always syncs before it returns. The portable format always syncs too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestoreSync {
    /// Publish the store at once and fsync its files in the background.
    #[default]
    Background,
    /// fsync every file before the store is published.
    Immediate,
}

impl TransferOptions {
    /// The ranges a download of a blob of `size` bytes fetches separately
    /// (see [`download_part_size`](Self::download_part_size)), in order;
    /// `None` when it is fetched whole (one range's worth, or no
    /// parallelism to spread ranges over).
    pub fn download_ranges(&self, size: u64) -> Option<Vec<std::ops::Range<u64>>> {
        let part = ranged::part_size(self.download_part_size);
        (self.parallelism > 1 && size > part).then(|| {
            (0..size.div_ceil(part))
                .map(|i| i * part..((i + 1) * part).min(size))
                .collect()
        })
    }
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            parallelism: 8,
            multipart_threshold: 8 << 20,
            part_size: 8 << 20,
            download_part_size: 16 << 20,
            restore_sync: RestoreSync::default(),
            link_immutable_files: false,
        }
    }
}

/// A blob's identity: hash and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobRef {
    /// blake3 of the bytes.
    pub hash: BlobHash,
    /// Length in bytes.
    pub size: u64,
}

impl From<&super::FileEntry> for BlobRef {
    fn from(f: &super::FileEntry) -> Self {
        BlobRef {
            hash: f.blake3,
            size: f.size,
        }
    }
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutOutcome {
    /// The stored blob.
    pub blob: BlobRef,
    /// `false` when a blob with that hash already existed and nothing was
    /// uploaded.
    pub uploaded: bool,
}

/// What `head` says about a stored blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobInfo {
    /// Stored size.
    pub size: u64,
    /// Last modified, ms since the epoch (the object store's clock).
    pub last_modified_ms: i64,
}

/// The blobs of a [`Repository`] ([`Repository::blobs`]): put, get and
/// head of content-addressed blobs, and transfers of many at once.
#[derive(Debug, Clone, Copy)]
pub struct Blobs<'a> {
    pub(crate) repo: &'a Repository,
}

impl<'a> Blobs<'a> {
    pub(crate) async fn head_key(self, key: &Path) -> Result<Option<BlobInfo>> {
        match self.repo.store.head(key).await {
            Ok(m) => Ok(Some(BlobInfo {
                size: m.size,
                last_modified_ms: m.last_modified.timestamp_millis(),
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(map_store_error(
                e,
                &format!("cannot check object key=`{key}`"),
            )),
        }
    }

    /// Size and age of a stored blob, `None` if it does not exist.
    pub async fn head_blob(self, sk: &StoreKey, hash: &BlobHash) -> Result<Option<BlobInfo>> {
        self.head_key(&paths::blob(sk, hash)).await
    }

    /// Whether every blob `files` name is present with its size, so a new
    /// snapshot may name them without uploading them again. A writer asks
    /// this before it reuses a parent's files: a blob gc swept since the
    /// parent was committed must be uploaded again from the cut, or every
    /// retry of the snapshot would fail its commit the same way.
    pub async fn blobs_present(self, sk: &StoreKey, files: &[super::FileEntry]) -> Result<bool> {
        let wanted: Vec<(BlobHash, u64)> = files.iter().map(|f| (f.blake3, f.size)).collect();
        let found: Vec<bool> = futures::stream::iter(wanted)
            .map(|(hash, size)| async move {
                Ok::<_, Error>(
                    self.head_blob(sk, &hash)
                        .await?
                        .is_some_and(|i| i.size == size),
                )
            })
            .buffer_unordered(self.repo.transfer.parallelism.max(1))
            .try_collect()
            .await?;
        Ok(found.into_iter().all(|b| b))
    }
}
