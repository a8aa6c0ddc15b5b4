//! MemoryStore (work in progress).
