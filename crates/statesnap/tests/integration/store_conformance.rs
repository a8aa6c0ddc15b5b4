//! The one StateStore conformance suite, run against every store.
#![allow(clippy::unwrap_used)]

use statesnap::conformance::store;
use statesnap::store::MemoryStore;

#[test]
fn memory_store_conforms() {
    store::run_all(&mut MemoryStore::new);
}

#[cfg(feature = "rocksdb")]
#[test]
fn rocks_store_conforms() {
    use statesnap::store::{RocksOptions, RocksStore};
    let root = tempfile::tempdir().unwrap();
    let mut n = 0;
    store::run_all(&mut || {
        n += 1;
        RocksStore::open(root.path().join(format!("db{n}")), &RocksOptions::default()).unwrap()
    });
}
