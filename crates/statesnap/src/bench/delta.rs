//! The in-memory store's incremental snapshot: what a delta costs after a
//! small change.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::{file_log, key, local_repo, remove, store_key, value};
use crate::error::Result;
use crate::format::StoreFormat;
use crate::format::portable::PortableFormat;
use crate::snapshot::commit_snapshot;
use crate::store::logged::LoggedStore;
use crate::store::memory::MemoryStore;

/// A `MemoryStore` of `keys` keys, snapshotted, then `changed` of its keys
/// rewritten and snapshotted again (a delta on the first).
#[derive(Debug, Clone, Serialize)]
pub struct DeltaCase {
    /// Live keys (100-byte values).
    pub keys: u64,
    /// Keys rewritten between the two snapshots.
    pub changed: u64,
    /// Bytes the full snapshot uploaded.
    pub full_bytes: u64,
    /// Bytes the delta uploaded.
    pub delta_bytes: u64,
    /// Full snapshot (capture + write + commit), seconds.
    pub full_secs: f64,
    /// Delta snapshot, seconds.
    pub delta_secs: f64,
}

impl DeltaCase {
    /// The delta's bytes as a fraction of the full snapshot's.
    pub fn fraction(&self) -> f64 {
        self.delta_bytes as f64 / self.full_bytes.max(1) as f64
    }
}

/// Builds the case under `dir` (removed afterwards): `changed_permille`
/// thousandths of the keys are rewritten (10 = 1 %).
pub async fn memory_delta(dir: &Path, keys: u64, changed_permille: u64) -> Result<DeltaCase> {
    let name = "memory-delta";
    let cdir = dir.join(name);
    let repo = local_repo(&dir.join("repo")).await?;
    let sk = store_key(name)?;
    let log = Arc::new(file_log(&cdir.join("log"), name)?);
    let format = PortableFormat::memory();
    let mut ls = LoggedStore::new(MemoryStore::new(), Arc::clone(&log))?;
    for i in 0..keys {
        ls.put(key(i), value(i));
        if ls.pending_len() == 10_000 {
            ls.commit()?;
        }
    }
    ls.commit()?;
    let started = Instant::now();
    let cut = format.capture(ls.store())?;
    let full = commit_snapshot(&format, cut, &repo, &sk, &*log, None).await?;
    let full_secs = started.elapsed().as_secs_f64();

    let changed = keys * changed_permille / 1000;
    let mut x = 12345u64;
    for _ in 0..changed {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let i = (x >> 11) % keys.max(1);
        ls.put(key(i), value(i ^ 0x5eed));
        if ls.pending_len() == 10_000 {
            ls.commit()?;
        }
    }
    ls.commit()?;
    let started = Instant::now();
    let cut = format.capture(ls.store())?;
    let delta = commit_snapshot(&format, cut, &repo, &sk, &*log, Some(&full)).await?;
    let delta_secs = started.elapsed().as_secs_f64();
    drop(ls);
    remove(&cdir)?;
    Ok(DeltaCase {
        keys,
        changed,
        full_bytes: full.stats.bytes_uploaded,
        delta_bytes: delta.stats.bytes_uploaded,
        full_secs,
        delta_secs,
    })
}
