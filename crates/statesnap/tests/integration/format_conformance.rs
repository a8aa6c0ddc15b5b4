//! The StoreFormat conformance suite (`statesnap::conformance::format`) on
//! every format this crate ships: portable over `MemoryStore`, portable over
//! `RocksStore`, and the RocksDB format.
#![allow(clippy::unwrap_used)]

use statesnap::conformance::format::run_all;
use statesnap::format::portable::PortableFormat;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portable_over_memory_conforms() {
    run_all(&PortableFormat::memory, true).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portable_over_rocksdb_conforms() {
    use statesnap::format::portable::chunk::ChunkParams;
    use statesnap::store::RocksStore;
    // Small chunks: the suite's stores are a few KiB, one default chunk, and
    // a cut of a RocksDB store is always written in full (no delta), so
    // reuse shows only when the store spans several chunks.
    let make = || {
        PortableFormat::new(|p: &std::path::Path| RocksStore::open(p, &Default::default()))
            .with_chunking(ChunkParams {
                min: 32,
                target: 256,
                max: 1024,
            })
            .unwrap()
    };
    run_all(&make, true).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_format_conforms() {
    use statesnap::format::rocks::RocksFormat;
    use statesnap::store::RocksOptions;
    run_all(&|| RocksFormat::new(RocksOptions::default()), true).await;
}
