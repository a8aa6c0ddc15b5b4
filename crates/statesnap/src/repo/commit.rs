//! Committing a snapshot: the manifest is written last, with a conditional
//! create, after every blob it names is stored and re-checked (design
//! invariants 3 and 8). See `docs/gc.md` for why the re-check happens in this
//! order and why the commit has a time budget.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{PutMode, PutOptions, PutPayload};
use std::collections::BTreeMap;

use super::manifest::{
    FileEntry, InlineFile, MAX_INLINE_TOTAL, Manifest, ManifestDraft, ManifestExtras,
    validate_file_path,
};
use super::paths::{BlobHash, SnapshotId, StoreKey};
use super::{Repository, gc, map_store_error};
use crate::error::{Error, ErrorKind, Result};

fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Repository {
    /// Commits a snapshot: assigns an id and `created_at` from the clock,
    /// re-checks every blob, and writes the manifest with `PutMode::Create`.
    pub async fn commit(&self, draft: ManifestDraft) -> Result<Manifest> {
        self.commit_with(draft, ManifestExtras::default()).await
    }

    pub(crate) async fn commit_with(
        &self,
        draft: ManifestDraft,
        extras: ManifestExtras,
    ) -> Result<Manifest> {
        let now = self.clock.now_ms();
        let id = SnapshotId(self.new_ulid());
        let manifest = Manifest::from_draft_with(draft, extras, id, now)?;
        self.commit_manifest(&manifest).await?;
        Ok(manifest)
    }

    /// Commits an already built (and sealed) manifest. A second commit of
    /// the same manifest fails with [`ErrorKind::AlreadyExists`].
    ///
    /// Steps, in this order (the order is part of the gc safety argument):
    /// 1. read the clock (`t0`), 2. read gc condemnation records,
    /// 3. `head` every blob: missing or wrong size → stale,
    /// 4. refuse if more than `max_commit_duration` passed since `t0`, or a
    ///    named blob was condemned more than `max_commit_duration` ago,
    /// 5. conditional create of the manifest.
    ///
    /// Hidden: writers commit through [`SnapshotWriter::commit`] or
    /// [`Repository::commit`]; this is for tests that commit hand-built
    /// manifests.
    #[doc(hidden)]
    pub async fn commit_manifest(&self, manifest: &Manifest) -> Result<()> {
        manifest.validate()?;
        let sk = &manifest.store_key;
        let key = manifest.key();
        let budget = ms(self.max_commit_duration);
        let t0 = self.clock.now_ms();
        let condemned = gc::condemned_blobs(self, sk).await?;
        let blobs = manifest.blobs();
        futures::stream::iter(
            (0..blobs.len()).map(|i| self.recheck_blob(sk, blobs[i].0, blobs[i].1, &key)),
        )
        .buffer_unordered(self.transfer.parallelism.max(1))
        .try_collect::<()>()
        .await?;
        let now = self.clock.now_ms();
        if now.saturating_sub(t0) > budget {
            return Err(Error::stale(format!(
                "snapshot commit took longer than its budget; retry the snapshot key=`{key}` \
                 elapsed_ms={} max_commit_ms={budget}",
                now - t0
            ))
            .with_reason(crate::Reason::GcRace));
        }
        for (hash, _) in &blobs {
            if let Some(&at) = condemned.get(hash)
                && now.saturating_sub(at) > budget
            {
                return Err(Error::stale(format!(
                    "blob is condemned by gc and will be deleted; retry the snapshot after the \
                         next gc run key=`{key}` blob=`{hash}` condemned_at={at}"
                ))
                .with_reason(crate::Reason::GcRace));
            }
        }
        let body = manifest.encode()?;
        // The commit point: a snapshot exists iff this create succeeds.
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        self.store
            .put_opts(&key, PutPayload::from(body), opts)
            .await
            .map_err(|e| {
                let err =
                    map_store_error(e, &format!("cannot commit snapshot manifest key=`{key}`"));
                if err.kind() == ErrorKind::AlreadyExists {
                    Error::new(
                        ErrorKind::AlreadyExists,
                        format!("snapshot manifest already exists key=`{key}`"),
                    )
                    .with_reason(crate::Reason::AlreadyExists)
                    .with_source(err)
                } else {
                    err
                }
            })?;
        Ok(())
    }

    async fn recheck_blob(
        &self,
        sk: &StoreKey,
        hash: BlobHash,
        size: u64,
        manifest_key: &object_store::path::Path,
    ) -> Result<()> {
        match self.blobs().head_blob(sk, &hash).await? {
            None => Err(Error::stale(format!(
                "blob named by the snapshot is missing (a reused blob was garbage-collected?); retry \
                 the snapshot key=`{manifest_key}` blob=`{hash}`"
            )).with_reason(crate::Reason::GcRace)),
            Some(info) if info.size != size => Err(Error::stale(format!(
                "blob named by the snapshot has the wrong size; retry the snapshot \
                 key=`{manifest_key}` blob=`{hash}` expected_size={size} actual_size={}",
                info.size
            )).with_reason(crate::Reason::GcRace)),
            Some(_) => Ok(()),
        }
    }
}

/// Collects the files of one snapshot — uploaded now or reused from the
/// parent — and commits them.
#[derive(Debug)]
pub struct SnapshotWriter {
    repo: Repository,
    store_key: StoreKey,
    files: Vec<FileEntry>,
    inline: Vec<InlineFile>,
    paths: BTreeMap<String, ()>,
    bytes_uploaded: u64,
    bytes_reused: u64,
}

impl SnapshotWriter {
    /// A writer for store `store_key`.
    pub fn new(repo: &Repository, store_key: StoreKey) -> Self {
        SnapshotWriter {
            repo: repo.clone(),
            store_key,
            files: Vec::new(),
            inline: Vec::new(),
            paths: BTreeMap::new(),
            bytes_uploaded: 0,
            bytes_reused: 0,
        }
    }

    fn claim(&mut self, path: &str) -> Result<()> {
        validate_file_path(path)?;
        if self.paths.insert(path.to_owned(), ()).is_some() {
            return Err(Error::config(format!(
                "file added twice to snapshot path=`{}`",
                path.escape_debug()
            )));
        }
        Ok(())
    }

    /// Uploads the local file `local` as snapshot file `path`.
    pub async fn put_file(&mut self, path: &str, local: &std::path::Path) -> Result<FileEntry> {
        self.claim(path)?;
        let out = self
            .repo
            .blobs()
            .put_blob_file(&self.store_key, local)
            .await?;
        Ok(self.add(path, out))
    }

    /// Uploads `bytes` as snapshot file `path`.
    pub async fn put_bytes(&mut self, path: &str, bytes: Bytes) -> Result<FileEntry> {
        self.claim(path)?;
        let out = self
            .repo
            .blobs()
            .put_blob_bytes(&self.store_key, bytes)
            .await?;
        Ok(self.add(path, out))
    }

    /// Records a blob stored by the caller (e.g. uploads run concurrently
    /// with [`Blobs::put_blob_file`](super::Blobs::put_blob_file)) as snapshot
    /// file `path`; counted as uploaded or reused per `out.uploaded`.
    /// Commit re-checks it.
    pub fn add_uploaded(&mut self, path: &str, out: super::PutOutcome) -> Result<FileEntry> {
        self.claim(path)?;
        Ok(self.add(path, out))
    }

    fn add(&mut self, path: &str, out: super::PutOutcome) -> FileEntry {
        if out.uploaded {
            self.bytes_uploaded += out.blob.size;
        } else {
            self.bytes_reused += out.blob.size;
        }
        let e = FileEntry {
            path: path.to_owned(),
            size: out.blob.size,
            blake3: out.blob.hash,
        };
        self.files.push(e.clone());
        e
    }

    /// Carries `bytes` as snapshot file `path` inside the manifest (an
    /// [`InlineFile`]): nothing is uploaded until the commit, which writes
    /// it with the manifest. At most [`MAX_INLINE_FILE`](super::MAX_INLINE_FILE)
    /// bytes per file and [`MAX_INLINE_TOTAL`] per snapshot (config error
    /// beyond: upload such files with [`SnapshotWriter::put_bytes`]); see
    /// [`SnapshotWriter::inline_room`]. Counted as uploaded, and drawn from
    /// the repository's bandwidth limit like any upload.
    pub async fn put_inline(&mut self, path: &str, bytes: &[u8]) -> Result<()> {
        let size = bytes.len() as u64;
        if size > self.inline_room() {
            return Err(Error::config(format!(
                "too many bytes to carry in one manifest path=`{}` size={size} \
                 already_inline={} max_total={MAX_INLINE_TOTAL}",
                path.escape_debug(),
                MAX_INLINE_TOTAL - self.inline_room()
            )));
        }
        let file = InlineFile::new(path, bytes)?;
        self.claim(path)?;
        self.repo.throttle(size).await;
        self.bytes_uploaded += size;
        self.inline.push(file);
        Ok(())
    }

    /// Inline bytes this snapshot may still carry.
    pub fn inline_room(&self) -> u64 {
        let used: u64 = self.inline.iter().map(|f| f.size).sum();
        MAX_INLINE_TOTAL.saturating_sub(used)
    }

    /// Reuses a file of an earlier snapshot without uploading it; commit
    /// re-checks that the blob still exists.
    pub fn reuse(&mut self, entry: FileEntry) -> Result<()> {
        self.claim(&entry.path)?;
        self.bytes_reused += entry.size;
        self.files.push(entry);
        Ok(())
    }

    /// Bytes uploaded so far (not counting reused blobs).
    pub fn bytes_uploaded(&self) -> u64 {
        self.bytes_uploaded
    }

    /// Files so far.
    pub fn files(&self) -> &[FileEntry] {
        &self.files
    }

    /// Commits: the draft's files are replaced by the writer's, its
    /// `bytes_uploaded`/`bytes_reused` by what the writer measured.
    pub async fn commit(self, draft: ManifestDraft) -> Result<Manifest> {
        self.commit_with(draft, ManifestExtras::default()).await
    }

    pub(crate) async fn commit_with(
        self,
        mut draft: ManifestDraft,
        mut extras: ManifestExtras,
    ) -> Result<Manifest> {
        if draft.store_key != self.store_key {
            return Err(Error::config(format!(
                "draft is for another store writer_store_key=`{}` draft_store_key=`{}`",
                self.store_key, draft.store_key
            )));
        }
        draft.files = self.files;
        extras.inline_files = self.inline;
        draft.stats.bytes_uploaded = self.bytes_uploaded;
        draft.stats.bytes_reused = self.bytes_reused;
        self.repo.commit_with(draft, extras).await
    }
}
