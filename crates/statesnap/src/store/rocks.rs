//! RocksStore (work in progress).
