//! Bringing a store back: full changelog replay (the baseline), and — as the
//! snapshot formats land — restore from the newest valid snapshot plus a
//! replay of the tail.

pub mod replay;

pub use replay::{ReplayOptions, ReplayProgress, ReplayReport, replay};
