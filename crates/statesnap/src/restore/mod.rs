//! Bringing a store back: full changelog replay (the baseline), and restore
//! from the newest valid snapshot plus a replay of the tail, with fallback.

pub mod replay;
pub mod snapshot;

pub use replay::{ReplayOptions, ReplayProgress, ReplayReport, replay};
pub use snapshot::{RestoreOptions, RestoreReport, SkippedSnapshot, restore_store};
