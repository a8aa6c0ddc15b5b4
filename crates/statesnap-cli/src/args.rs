//! Command-line arguments. Doc comments are the `--help` text.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// statesnap: durable key-value state for stream processors that recovers fast.
///
/// A store is a local cache of its changelog; snapshots copy the store's files
/// to a repository, tagged with the changelog offset they reflect. Restore is
/// the newest valid snapshot plus a replay of the changelog after it.
#[derive(Debug, Parser)]
#[command(name = "statesnap", version, about, long_about)]
pub struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the main job on embedded defaults: write through a logged store,
    /// drop it, rebuild it from the changelog, verify and report timings.
    Demo(DemoArgs),
}

/// Which store the demo uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// The in-memory store.
    Memory,
    /// RocksDB.
    #[cfg(feature = "rocksdb")]
    Rocksdb,
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Working directory (default: a fresh temporary directory, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Records to write.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Distinct keys the records are spread over.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Records per commit.
    #[arg(long, default_value_t = 10_000)]
    pub batch: u64,
    /// Store type.
    #[arg(long, value_enum, default_value_t = default_store())]
    pub store: StoreKind,
}

fn default_store() -> StoreKind {
    #[cfg(feature = "rocksdb")]
    {
        StoreKind::Rocksdb
    }
    #[cfg(not(feature = "rocksdb"))]
    {
        StoreKind::Memory
    }
}
