//! The keys a [`RocksStore`](super::rocks::RocksStore) wrote since its last
//! cuts, so a snapshot's logical digest can follow the changes instead of
//! reading the whole store again (`format::rocks`, "Contents: digest and
//! counts").
//!
//! A store's contents change only through its writes, so the contents of a
//! cut are those of an earlier cut (its *base*) with exactly the keys
//! written in between replaced — by the last value written to each, or
//! gone if that was a delete. This records those keys with their last
//! values, per interval between two cuts, and keeps the base the format
//! derives from: its checkpoint (open read-only once opened), with its
//! digest and byte count. A derivation then looks up only the base.
//!
//! Following is *lost* — the next cut is scanned in full and becomes the
//! new base — whenever this cannot vouch that it saw every write: a bulk
//! load (ingested files), a write that went around
//! [`StateStore::apply`](super::StateStore::apply) (RocksDB's sequence
//! number moved without it: a write through
//! [`RocksStore::db`](super::rocks::RocksStore::db)), or more keys than
//! [`MAX_HELD_BYTES`] holds. Each loss starts a new *generation*; a cut
//! taken in an earlier generation is neither derived nor made a base.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::digest::LogicalDigest;

/// The most bytes of keys and values (plus a per-key overhead) the record
/// may hold, per store, before following is lost: 16 MiB (a process with a
/// hundred stores holds at most 1.6 GiB, and only for stores rewriting that
/// much between two snapshots; 1 % of 1 M 100-byte pairs is 1.3 MB). A
/// store rewriting more is scanned.
pub(crate) const MAX_HELD_BYTES: usize = 16 << 20;

/// What one held key costs besides its bytes (the map's slot and the
/// `Bytes` headers), for [`MAX_HELD_BYTES`].
const PER_KEY: usize = 80;

/// The last value written to each key in an interval (`None`: deleted).
type Changes = HashMap<Bytes, Option<Bytes>>;

/// A cut whose contents are known exactly: the checkpoint the next cut's
/// digest is derived from.
pub(crate) struct Base {
    /// The cut's number ([`Written::seal`]).
    pub(crate) cut: u64,
    pub(crate) generation: u64,
    pub(crate) digest: LogicalDigest,
    pub(crate) logical_bytes: u64,
    /// The checkpoint, open read-only: opened by the scan that counted it,
    /// or after the snapshot, in the background ([`Written::base_opened`]),
    /// or by the next derivation if that comes first.
    pub(crate) db: Option<Arc<rocksdb::DB>>,
    /// Where the checkpoint is.
    pub(crate) path: PathBuf,
    /// Whatever must live as long as the base does (the format's guard of
    /// the checkpoint directory, which removes it when dropped). Declared
    /// after `db`, so the database closes before its directory goes.
    pub(crate) _hold: Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for Base {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Base")
            .field("cut", &self.cut)
            .field("generation", &self.generation)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

/// The keys written since the base, by interval between cuts (module docs).
#[derive(Debug, Default)]
pub(crate) struct Written {
    /// Keys written since the last cut, with their last values.
    open: Changes,
    /// Each later cut's interval, oldest first: (cut number, its changes).
    sealed: Vec<(u64, Changes)>,
    held_bytes: usize,
    next_cut: u64,
    generation: u64,
    /// Not recording until the next cut: following was lost since the last
    /// one, and that cut is scanned whatever the keys.
    paused: bool,
    /// RocksDB's latest sequence number after the last write recorded.
    seen_seq: u64,
    base: Option<Base>,
}

/// What a cut takes from [`Written::seal`]: its number and generation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sealed {
    pub(crate) cut: u64,
    pub(crate) generation: u64,
}

/// What a derivation needs: the base, and every key written between it and
/// the cut with its last value, sorted by key.
pub(crate) struct Derivation {
    pub(crate) base_cut: u64,
    pub(crate) base_digest: LogicalDigest,
    pub(crate) base_bytes: u64,
    /// The base's checkpoint, if open yet; else where it is, and what keeps
    /// it there while the derivation opens it.
    pub(crate) base_db: Option<Arc<rocksdb::DB>>,
    pub(crate) base_path: PathBuf,
    pub(crate) base_hold: Arc<dyn std::any::Any + Send + Sync>,
    pub(crate) changes: Vec<(Bytes, Option<Bytes>)>,
}

impl Written {
    /// Following a store just opened, whose RocksDB is at `seq`: no base
    /// yet, so its first cut is scanned.
    pub(crate) fn new(seq: u64) -> Self {
        Written {
            seen_seq: seq,
            ..Written::default()
        }
    }

    /// Before a write, with RocksDB's sequence number now: one that moved
    /// since the last write this saw means a write went around `apply`
    /// (checked here, not only at the cut, so that the next recorded write
    /// cannot hide it).
    pub(crate) fn before_write(&mut self, seq: u64) {
        if seq != self.seen_seq {
            self.lose();
            self.seen_seq = seq;
        }
    }

    /// Records a batch about to be written: each key's new value (`None`:
    /// a delete), the last one winning as in the batch. Copied: the
    /// batch's buffers are not kept alive.
    pub(crate) fn record<'a>(
        &mut self,
        writes: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) {
        if self.paused {
            return;
        }
        for (k, v) in writes {
            let v = v.map(Bytes::copy_from_slice);
            let added = v.as_ref().map_or(0, Bytes::len);
            match self.open.get_mut(k) {
                Some(old) => {
                    let removed = old.as_ref().map_or(0, Bytes::len);
                    self.held_bytes = self.held_bytes + added - removed;
                    *old = v;
                }
                None => {
                    self.held_bytes += k.len() + added + PER_KEY;
                    self.open.insert(Bytes::copy_from_slice(k), v);
                }
            }
        }
        if self.held_bytes > MAX_HELD_BYTES {
            self.lose();
        }
    }

    /// A write that was recorded failed: what it did is unknown, so
    /// following is lost.
    pub(crate) fn failed(&mut self) {
        self.lose();
    }

    /// After a write this recorded (or one that changes no data key, such
    /// as the binding), [`Written::before_write`] called before it:
    /// RocksDB's sequence number now.
    pub(crate) fn wrote(&mut self, seq: u64) {
        self.seen_seq = seq;
    }

    /// Following is lost (module docs): forget the keys and the base, start
    /// a new generation, and record nothing until the next cut.
    pub(crate) fn lose(&mut self) {
        self.open = Changes::new();
        self.sealed = Vec::new();
        self.held_bytes = 0;
        self.base = None;
        self.generation += 1;
        self.paused = true;
    }

    /// At a cut, under the same borrow of the store as the checkpoint (no
    /// write between): closes the current interval. `seq` is RocksDB's
    /// sequence number now; one that moved past the last recorded write
    /// means a write went around `apply`, and following is lost.
    pub(crate) fn seal(&mut self, seq: u64) -> Sealed {
        if seq != self.seen_seq {
            self.lose();
            self.seen_seq = seq;
        }
        let cut = self.next_cut;
        self.next_cut += 1;
        if self.paused {
            // This cut is scanned; the next interval starts here.
            self.paused = false;
        } else {
            let keys = std::mem::take(&mut self.open);
            self.sealed.push((cut, keys));
        }
        Sealed {
            cut,
            generation: self.generation,
        }
    }

    /// What deriving `cut`'s digest needs, if it can be derived: a base of
    /// its generation, taken before it, and at most `max_keys` keys
    /// written in between (the last value of each: later intervals
    /// override earlier ones). `None`: scan it.
    pub(crate) fn derivation(
        &self,
        cut: Sealed,
        max_keys: impl Fn(u64) -> usize,
    ) -> Option<Derivation> {
        let base = self.base.as_ref()?;
        if cut.generation != self.generation
            || base.generation != self.generation
            || base.cut >= cut.cut
        {
            return None;
        }
        let between = self
            .sealed
            .iter()
            .filter(|(c, _)| *c > base.cut && *c <= cut.cut);
        let mut last: HashMap<&Bytes, &Option<Bytes>> = HashMap::new();
        let limit = max_keys(base.digest.keys());
        for (_, changes) in between {
            last.extend(changes.iter());
            if last.len() > limit {
                return None;
            }
        }
        let mut changes: Vec<(Bytes, Option<Bytes>)> = last
            .into_iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        changes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Some(Derivation {
            base_cut: base.cut,
            base_digest: base.digest,
            base_bytes: base.logical_bytes,
            base_db: base.db.clone(),
            base_path: base.path.clone(),
            base_hold: Arc::clone(&base._hold),
            changes,
        })
    }

    /// Makes `base` (a cut whose contents are now known exactly) the base,
    /// if it is of the current generation and newer than the base: the
    /// intervals up to it are no longer needed. Returns what is no longer
    /// needed — the base it replaced, or `base` itself if refused — for the
    /// caller to drop where closing a database may block.
    pub(crate) fn set_base(&mut self, base: Base) -> Option<Base> {
        if base.generation != self.generation
            || self.base.as_ref().is_some_and(|b| b.cut >= base.cut)
        {
            return Some(base);
        }
        let cut = base.cut;
        self.sealed.retain(|(c, _)| *c > cut);
        self.held_bytes = self
            .sealed
            .iter()
            .flat_map(|(_, s)| s.iter())
            .chain(self.open.iter())
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Bytes::len) + PER_KEY)
            .sum();
        self.base.replace(base)
    }

    /// The base of cut `cut` was opened (read-only): kept if that is still
    /// the base and was not open yet. Returns the handle if not kept, for
    /// the caller to close.
    pub(crate) fn base_opened(
        &mut self,
        cut: u64,
        db: Arc<rocksdb::DB>,
    ) -> Option<Arc<rocksdb::DB>> {
        match &mut self.base {
            Some(b) if b.cut == cut && b.db.is_none() => {
                b.db = Some(db);
                None
            }
            _ => Some(db),
        }
    }

    /// The base's cut number, if there is a base.
    #[cfg(test)]
    pub(crate) fn base_cut(&self) -> Option<u64> {
        self.base.as_ref().map(|b| b.cut)
    }
}

/// A store's [`Written`], shared with the cuts taken of it.
#[derive(Debug, Clone)]
pub(crate) struct Follow(Arc<Mutex<Written>>);

impl Follow {
    pub(crate) fn new(seq: u64) -> Self {
        Follow(Arc::new(Mutex::new(Written::new(seq))))
    }

    /// A handle that does not keep the record (and its base) alive.
    pub(crate) fn downgrade(&self) -> std::sync::Weak<Mutex<Written>> {
        Arc::downgrade(&self.0)
    }

    /// The record behind `weak`, if its store (or a cut of it) still holds it.
    pub(crate) fn upgrade(weak: &std::sync::Weak<Mutex<Written>>) -> Option<Follow> {
        weak.upgrade().map(Follow)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Written> {
        // A panic while holding it leaves plain sets behind: usable.
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(w: &Written, cut: Sealed) -> Option<Vec<Bytes>> {
        w.derivation(cut, |_| usize::MAX)
            .map(|d| d.changes.into_iter().map(|(k, _)| k).collect())
    }

    fn put(k: &'static [u8]) -> (&'static [u8], Option<&'static [u8]>) {
        (k, Some(b"v"))
    }

    #[test]
    fn intervals_accumulate_until_a_base_passes_them() {
        let mut w = Written::new(0);
        w.record([put(b"a")]);
        w.wrote(1);
        let c0 = w.seal(1);
        // No base yet: the first cut is scanned.
        assert!(keys(&w, c0).is_none());
        w.record([put(b"b"), put(b"c")]);
        w.wrote(2);
        let c1 = w.seal(2);
        w.record([put(b"c"), put(b"d")]);
        w.wrote(3);
        let c2 = w.seal(3);
        assert!(keys(&w, c1).is_none());
        // c0 known (scanned): c1 and c2 derive from it, c2 over both
        // intervals even if c1 failed.
        assert_eq!(w.base_cut(), None);
        assert!(set(&mut w, c0));
        assert_eq!(
            keys(&w, c1).unwrap(),
            vec![Bytes::from("b"), Bytes::from("c")]
        );
        assert_eq!(
            keys(&w, c2).unwrap(),
            vec![Bytes::from("b"), Bytes::from("c"), Bytes::from("d")]
        );
        // c2 becomes the base: c1 is older, never one again.
        assert!(set(&mut w, c2));
        assert!(!set(&mut w, c1));
        assert!(keys(&w, c1).is_none());
    }

    #[test]
    fn a_write_around_apply_or_too_many_keys_loses_the_base() {
        let mut w = Written::new(0);
        let c0 = w.seal(0);
        assert!(set(&mut w, c0));
        w.record([put(b"a")]);
        w.wrote(1);
        // RocksDB moved to 5 without a recorded write, and a recorded write
        // followed: it must not hide the other.
        w.before_write(5);
        w.record([put(b"z")]);
        w.wrote(6);
        let c1 = w.seal(6);
        assert!(keys(&w, c1).is_none());
        assert!(!set(&mut w, c0), "a base of the old generation");
        // The cut after the loss is scanned and may become the base.
        assert!(set(&mut w, c1));
        w.before_write(6);
        w.record([put(b"b")]);
        w.wrote(7);
        let c2 = w.seal(7);
        assert_eq!(keys(&w, c2).unwrap(), vec![Bytes::from("b")]);
        // Too many keys: lost, and nothing recorded until the next cut.
        let big = vec![0u8; MAX_HELD_BYTES];
        w.record([(big.as_slice(), None)]);
        w.record([put(b"c")]);
        w.wrote(8);
        let c3 = w.seal(8);
        assert!(keys(&w, c3).is_none());
        assert_eq!(w.held_bytes, 0);
    }

    /// Whether `cut` became the base.
    fn set(w: &mut Written, cut: Sealed) -> bool {
        w.set_base(test_base(cut));
        w.base_cut() == Some(cut.cut)
    }

    #[test]
    fn the_last_value_written_wins_across_intervals() {
        let mut w = Written::new(0);
        let c0 = w.seal(0);
        assert!(set(&mut w, c0));
        w.record([(&b"a"[..], Some(&b"1"[..])), (&b"b"[..], Some(&b"1"[..]))]);
        w.wrote(1);
        w.seal(1);
        w.record([
            (&b"a"[..], None),
            (&b"b"[..], Some(&b"2"[..])),
            (&b"b"[..], Some(&b"333"[..])),
        ]);
        w.wrote(2);
        let c2 = w.seal(2);
        let d = w.derivation(c2, |_| usize::MAX).unwrap();
        assert_eq!(
            d.changes,
            vec![
                (Bytes::from("a"), None),
                (Bytes::from("b"), Some(Bytes::from("333")))
            ]
        );
        // Held: each interval's keys once, with its last values.
        assert_eq!(
            w.held_bytes,
            (1 + 1 + PER_KEY) * 2 + (1 + PER_KEY) + (1 + 3 + PER_KEY)
        );
        // More keys than allowed: scanned instead.
        assert!(w.derivation(c2, |_| 1).is_none());
    }

    fn test_base(cut: Sealed) -> Base {
        let dir = tempfile::tempdir().unwrap();
        let db = rocksdb::DB::open_default(dir.path()).unwrap();
        Base {
            cut: cut.cut,
            generation: cut.generation,
            digest: LogicalDigest::new(),
            logical_bytes: 0,
            path: dir.path().to_path_buf(),
            db: Some(Arc::new(db)),
            _hold: Arc::new(dir),
        }
    }
}
