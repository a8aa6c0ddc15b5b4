//! The portable format: any store that can iterate in key order snapshots as
//! sorted, content-defined chunks ([`chunk`]), and any store restores from
//! them.
//!
//! * **Capture** ([`PortableSource::portable_cut`]) runs on the caller's
//!   thread. For [`MemoryStore`] it is an O(1) clone of the persistent map
//!   plus its applied offset; other stores materialise their contents
//!   ([`PortableCut::materialize`]).
//! * **Write** serialises and compresses on a blocking thread
//!   (`tokio::task::spawn_blocking`) while uploads run on the runtime, so
//!   neither the processing thread nor the async workers do the CPU work.
//! * **Layers.** A snapshot is a full sorted run (layer 0) followed by zero
//!   or more *delta* layers: the keys written or deleted since the previous
//!   layer's cut (tombstones included), computed with `OrdMap::diff` against
//!   the last cut this format wrote — kept in memory, so only a
//!   [`MemoryStore`] in the same process produces deltas. A delta snapshot
//!   reuses its parent's files and lists its parent and all the parent's
//!   dependencies in `depends_on`, so retention keeps the whole chain.
//!   [`DeltaPolicy`] bounds the chain.
//! * **Restore** builds the store with the factory given to
//!   [`PortableFormat::new`] — any store type, not necessarily the one that
//!   wrote the snapshot — then merges the layers (newest wins, tombstones
//!   drop the key) and applies the result in batches at the snapshot's
//!   offset. The store is built at a hidden staging path next to the
//!   target (`.<name>.statesnap-restore-<uuid>`), closed, fsynced and only
//!   then renamed over the target (the old target moved aside first and put
//!   back on failure), and reopened with the factory: a crash or an error
//!   mid-restore leaves the target as it was, never a partial store that
//!   already claims the snapshot's offset (`tests/integration/portable_restore_crash.rs`
//!   kills a restore at 17 points). A factory that creates nothing at the
//!   path it is given (an in-memory store) gets the loaded store directly.
//!   The factory must open the store *at* the path it is given.
//!
//! Snapshot file paths are `layer-LLLL/chunk-CCCCCC.sspc`; the manifest's
//! `format_metadata` lists the layers (see `docs/format.md`).
//!
//! The code is split by concern: `cut` (what is captured), `meta` (the
//! layers recorded in the manifest and the delta policy), `write` (full and
//! delta snapshots) and `restore` (the streaming restore).

/// The chunk codec, public for the fuzz targets and tests only.
#[doc(hidden)]
pub mod chunk;
mod cut;
mod meta;
mod restore;
mod write;

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use self::chunk::ChunkParams;
use self::cut::CutContents;
use self::restore::remove_path;
use self::write::LastWrite;
use super::staging;
use super::{FormatOutput, RestoreContext, RestoreStats, StoreFormat, WriteContext};
use crate::changelog::ChangelogBinding;
use crate::digest::LogicalDigest;
use crate::error::Result;
use crate::repo::{Manifest, StoreFormatId};
use crate::store::memory::MemoryStore;

pub use self::cut::{PortableCut, PortableSource};
pub use self::meta::{DeltaPolicy, LayerKind, LayerMeta, MAX_LAYERS, PortableMetadata, chunk_path};
pub use self::restore::RESTORE_DECODE_BUDGET;

/// Format name recorded in manifests.
pub const FORMAT_NAME: &str = "portable";
/// Format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

type Factory<S> = dyn Fn(&Path) -> Result<S> + Send + Sync;

/// The portable [`StoreFormat`] for any [`PortableSource`] store `S`.
pub struct PortableFormat<S> {
    factory: Arc<Factory<S>>,
    chunking: ChunkParams,
    policy: DeltaPolicy,
    decode_budget: u64,
    last: Mutex<Option<LastWrite>>,
    /// The last memory cut whose digest was computed, with that digest:
    /// the next one follows the changes instead of rescanning.
    digested: Arc<Mutex<Option<(crate::store::memory::MemoryMap, LogicalDigest)>>>,
}

impl<S> fmt::Debug for PortableFormat<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortableFormat")
            .field("store", &std::any::type_name::<S>())
            .field("chunking", &self.chunking)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl PortableFormat<MemoryStore> {
    /// The portable format restoring into [`MemoryStore`]s.
    pub fn memory() -> Self {
        PortableFormat::new(|_: &Path| Ok(MemoryStore::new()))
    }
}

impl<S> PortableFormat<S> {
    /// A portable format whose restores build an empty store with `factory`
    /// (called with the target path, after anything there was removed).
    pub fn new(factory: impl Fn(&Path) -> Result<S> + Send + Sync + 'static) -> Self {
        PortableFormat {
            factory: Arc::new(factory),
            chunking: ChunkParams::default(),
            policy: DeltaPolicy::default(),
            decode_budget: RESTORE_DECODE_BUDGET,
            last: Mutex::new(None),
            digested: Arc::new(Mutex::new(None)),
        }
    }

    /// Other chunk sizes (validated). Changing them changes where chunks are
    /// cut, so the next snapshot shares nothing with earlier ones.
    pub fn with_chunking(mut self, params: ChunkParams) -> Result<Self> {
        params.validate()?;
        self.chunking = params;
        Ok(self)
    }

    /// Another delta policy.
    pub fn with_delta_policy(mut self, policy: DeltaPolicy) -> Self {
        self.policy = policy;
        self
    }
}

impl<S: PortableSource + 'static> StoreFormat for PortableFormat<S> {
    type Store = S;
    type Cut = PortableCut;

    fn id(&self) -> StoreFormatId {
        StoreFormatId {
            name: FORMAT_NAME.to_owned(),
            version: FORMAT_VERSION,
        }
    }

    fn capture(&self, store: &S) -> Result<PortableCut> {
        store.portable_cut()
    }

    fn cut_offset(&self, cut: &PortableCut) -> Option<u64> {
        cut.applied_offset
    }

    fn cut_binding(&self, cut: &PortableCut) -> Option<ChangelogBinding> {
        cut.binding.clone()
    }

    /// For a memory cut, the digest of the previous digested cut adjusted
    /// by the pairs that changed since (`OrdMap::diff` skips what the two
    /// maps share), when fewer than half the keys changed; otherwise, and
    /// for other cuts, a scan.
    /// A scan of the cut on a blocking thread; for a memory cut, the
    /// changes since the last digested cut when they are few.
    fn cut_digest(
        &self,
        cut: &PortableCut,
    ) -> impl Future<Output = Result<Option<LogicalDigest>>> + Send {
        let (cut, digested) = (cut.clone(), Arc::clone(&self.digested));
        crate::util::blocking(move || {
            let CutContents::Memory(map, _) = &cut.contents else {
                return Ok(Some(cut.logical_digest()));
            };
            let lock = || digested.lock().unwrap_or_else(|p| p.into_inner());
            let previous = lock().clone();
            let digest = previous
                .and_then(|(old, d)| cut::follow_digest(d, &old, map))
                .unwrap_or_else(|| cut.logical_digest());
            *lock() = Some((map.clone(), digest));
            Ok(Some(digest))
        })
    }

    fn digest_by_default(&self) -> bool {
        true
    }

    fn write(
        &self,
        cut: PortableCut,
        ctx: WriteContext<'_>,
    ) -> impl Future<Output = Result<FormatOutput>> + Send {
        self.write_impl(cut, ctx)
    }

    fn restore(
        &self,
        manifest: &Manifest,
        ctx: RestoreContext<'_>,
    ) -> impl Future<Output = Result<(S, RestoreStats)>> + Send {
        self.restore_impl(manifest, ctx)
    }

    fn create_empty(&self, target: &Path) -> Result<S> {
        staging::check_replaceable(target)?;
        staging::clean_restore_leftovers(target)?;
        remove_path(target)?;
        (self.factory)(target)
    }
}
