//! Time to ready of a moved partition: a handoff snapshot and its restore
//! vs a full changelog replay (what Kafka Streams does for a moved
//! partition without a warm standby).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use statesnap::restore::Source;
use statesnap::runtime::SnapshotPolicy;
use statesnap::{Repository, StateManager};

use crate::Result;
use crate::app::{changelog_options, store_spec};
use crate::model::{UserState, state_key};

/// What to measure.
#[derive(Debug, Clone)]
pub struct HandoffConfig {
    /// Kafka bootstrap servers.
    pub bootstrap: String,
    /// Repository URL for the handoff (created).
    pub repo: String,
    /// Scratch directory (the owners' stores, the empty repository of the
    /// replay run).
    pub dir: PathBuf,
    /// Application id (fresh per run: its changelog topic is new).
    pub app_id: String,
    /// Keys (users) in the partition.
    pub keys: u64,
}

/// The measured figures.
#[derive(Debug, Clone)]
pub struct HandoffResult {
    /// Keys in the partition.
    pub keys: u64,
    /// Changelog records.
    pub records: u64,
    /// Loading them (commits of 10 000).
    pub load: Duration,
    /// The old owner's `close()`: the handoff snapshot.
    pub close: Duration,
    /// Bytes the handoff snapshot uploaded.
    pub snapshot_bytes: u64,
    /// The new owner's `open()` from the handoff snapshot, until ready.
    pub handoff_open: Duration,
    /// Records it replayed (0 expected).
    pub handoff_replayed: u64,
    /// Where the handoff open's time went.
    pub handoff_breakdown: String,
    /// The new owner's `open()` with no snapshot: full changelog replay.
    pub replay_open: Duration,
    /// Records that replayed.
    pub replay_records: u64,
}

impl HandoffResult {
    /// Time to ready, full replay ÷ handoff (open only).
    pub fn speedup(&self) -> f64 {
        self.replay_open.as_secs_f64() / self.handoff_open.as_secs_f64().max(1e-9)
    }

    /// Time to ready counting the old owner's close as well.
    pub fn speedup_with_close(&self) -> f64 {
        self.replay_open.as_secs_f64() / (self.handoff_open + self.close).as_secs_f64().max(1e-9)
    }
}

impl std::fmt::Display for HandoffResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "moved partition: {} keys, {} changelog records (load {:.2} s)",
            self.keys,
            self.records,
            self.load.as_secs_f64()
        )?;
        writeln!(
            f,
            "  handoff: close (snapshot, {:.1} MB) {:.3} s + open {:.3} s, {} records replayed",
            self.snapshot_bytes as f64 / 1e6,
            self.close.as_secs_f64(),
            self.handoff_open.as_secs_f64(),
            self.handoff_replayed
        )?;
        writeln!(f, "    ({})", self.handoff_breakdown)?;
        writeln!(
            f,
            "  full changelog replay: open {:.3} s, {} records replayed",
            self.replay_open.as_secs_f64(),
            self.replay_records
        )?;
        write!(
            f,
            "  time to ready: handoff is {:.1}x faster ({:.1}x counting the close)",
            self.speedup(),
            self.speedup_with_close()
        )
    }
}

/// Loads a partition, hands it off, and opens it both ways.
/// Writes `keys` users' states through `h`, committing every 10 000;
/// returns the changelog records committed.
fn load_users<C: statesnap::Changelog>(
    h: &mut statesnap::StateHandle<statesnap::RocksFormat, C>,
    keys: u64,
) -> Result<u64> {
    let mut records = 0;
    for i in 0..keys {
        let user = format!("u{i:09}");
        let s = UserState {
            views: i % 97 + 1,
            last_seen_ms: 1_700_000_000_000 + i as i64,
            sessions: i % 7 + 1,
            session_start_ms: 1_700_000_000_000,
            session_views: i % 13 + 1,
            generation: 0,
            last_offset: i as i64,
        };
        h.put(state_key(&user), serde_json::to_vec(&s)?);
        if (i + 1) % 10_000 == 0 || i + 1 == keys {
            records += h.commit()?.map_or(0, |c| c.records as u64);
        }
    }
    Ok(records)
}

pub async fn handoff(config: &HandoffConfig) -> Result<HandoffResult> {
    std::fs::create_dir_all(&config.dir)?;
    let kafka = changelog_options(&config.bootstrap, 1);
    let repo = Repository::init(&config.repo, Default::default()).await?;
    let owner = StateManager::builder(repo.clone())
        .policy(SnapshotPolicy::manual().close_deadline(Duration::from_secs(600)))
        .build()?;
    let mut h = owner
        .open(store_spec(
            &config.app_id,
            &kafka,
            0,
            config.dir.join("owner-1"),
        )?)
        .await?;
    let started = Instant::now();
    let records = load_users(&mut h, config.keys)?;
    let load = started.elapsed();
    let closed = h.close().await?;
    let close = closed.duration;
    let snapshot_bytes = owner
        .repository()
        .catalog()
        .latest(&statesnap::StoreKey::new(
            &config.app_id,
            crate::app::STORE,
            0,
        )?)
        .await?
        .map_or(0, |s| s.manifest.stats.bytes_uploaded);
    owner.shutdown().await;

    let next = StateManager::builder(repo).build()?;
    let started = Instant::now();
    let spec = store_spec(&config.app_id, &kafka, 0, config.dir.join("owner-2"))?;
    let connect = started.elapsed();
    let h = next.open(spec).await?;
    let handoff_open = started.elapsed();
    let r = h.report();
    let handoff_breakdown = format!(
        "connect to the changelog {:.3} s, snapshot {:.3} s (transfer {:.3} s, open {:.3} s), \
         tail {:.3} s, the rest (plan: listing, log end and horizon) {:.3} s",
        connect.as_secs_f64(),
        r.snapshot_duration.as_secs_f64(),
        r.transfer.transfer.as_secs_f64(),
        r.transfer.open.as_secs_f64(),
        r.replay.duration.as_secs_f64(),
        (handoff_open.saturating_sub(connect + r.snapshot_duration + r.replay.duration))
            .as_secs_f64()
    );
    if !matches!(h.report().source, Source::Snapshot { .. }) {
        return Err(format!(
            "the new owner did not open from the handoff snapshot: {}",
            h.report().source
        )
        .into());
    }
    let handoff_replayed = h.report().replay.records;
    h.abandon().await;
    next.shutdown().await;

    let empty = format!("file://{}", config.dir.join("empty-repo").display());
    let replayer =
        StateManager::builder(Repository::init(&empty, Default::default()).await?).build()?;
    let started = Instant::now();
    let h = replayer
        .open(store_spec(
            &config.app_id,
            &kafka,
            0,
            config.dir.join("owner-3"),
        )?)
        .await?;
    let replay_open = started.elapsed();
    let replay_records = h.report().replay.records;
    h.abandon().await;
    replayer.shutdown().await;
    Ok(HandoffResult {
        keys: config.keys,
        records,
        load,
        close,
        snapshot_bytes,
        handoff_open,
        handoff_replayed,
        handoff_breakdown,
        replay_open,
        replay_records,
    })
}
