//! The reshard scenario: the group runs on one partition count, stops, its
//! state is resharded into another count, the input moves to a new topic
//! with that count, and the group carries on from the resharded state —
//! for each step of a layout such as 6 → 12 → 4. One single-process model
//! is fed every generation's input in turn, so each generation's outputs
//! and end state are checked against the whole history.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use statesnap::reshard::{
    FnPartitioner, Murmur2, Partitioner, ReshardOptions, SourcePartition, TargetPartition, reshard,
};
use statesnap::{KafkaChangelog, LogicalDigest, Repository, RocksFormat, StoreKey};

use super::{
    Proc, ScenarioConfig, ScenarioReport, finish, opened_by, repo_options, setup, start_two,
    wait_until,
};
use crate::Result;
use crate::app::{MoveLine, STORE, changelog_options};
use crate::model::{Model, state_key};

/// One generation of the app: a partition count and what happened in it.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Its application id (consumer group, topics, store).
    pub app_id: String,
    /// Its partition count.
    pub partitions: i32,
    /// The reshard that seeded it from the previous generation.
    pub reshard: Option<ReshardSummary>,
    /// How each partition was first opened in this generation:
    /// `(partition, source, records replayed)`.
    pub first_opens: Vec<(i32, String, u64)>,
    /// The generation's run, checked as the moving-partitions scenario's.
    pub report: ScenarioReport,
}

/// What a reshard between two generations did.
#[derive(Debug, Clone)]
pub struct ReshardSummary {
    /// Users moved.
    pub keys: u64,
    /// Key and value bytes moved.
    pub bytes: u64,
    /// Per-partition bookkeeping keys left behind (the input positions).
    pub left_behind: u64,
    /// Users per target partition.
    pub keys_per_target: Vec<u64>,
    /// How long it took.
    pub took: Duration,
}

/// Places a store key by its user, as the input's keyed producer places
/// the user's events: Kafka's murmur2 of the user name (the store key
/// without its `user/` prefix).
fn by_user() -> FnPartitioner<impl Fn(&[u8], u32) -> u32 + Send + Sync> {
    FnPartitioner::new("murmur2(user)", |key: &[u8], n| {
        Murmur2.partition(key.strip_prefix(b"user/").unwrap_or(key), n)
    })
}

/// Runs the app through `layout` (partition counts, e.g. `[6, 12, 4]`):
/// generation `g` runs on `layout[g]` partitions under the application id
/// `<app_id>-g<g>`; between two generations the group stops and the state
/// is resharded. `Err` says what failed.
pub fn run_reshard(config: &ScenarioConfig, layout: &[i32]) -> Result<Vec<Generation>> {
    let mut model = Model::default();
    let mut from = 0u64;
    let mut generations: Vec<Generation> = Vec::new();
    for (g, &partitions) in layout.iter().enumerate() {
        let generation = u32::try_from(g)?;
        let this = ScenarioConfig {
            app_id: format!("{}-g{g}", config.app_id),
            partitions,
            generation,
            dir: config.dir.join(format!("g{g}")),
            ..config.clone()
        };
        std::fs::create_dir_all(&this.dir)?;
        let reshard = match generations.last() {
            None => None,
            Some(prev) => {
                model.next_generation(u32::try_from(partitions)?);
                let prev = ScenarioConfig {
                    app_id: prev.app_id.clone(),
                    partitions: prev.partitions,
                    ..config.clone()
                };
                Some(reshard_state(&prev, &this, &model)?)
            }
        };
        let (report, sent) = run_generation(&this, from, &mut model)?;
        from += sent;
        let first_opens = first_opens(&report.moves, partitions);
        if let Some(r) = &reshard {
            check_ready(&first_opens, r)?;
        }
        generations.push(Generation {
            app_id: this.app_id.clone(),
            partitions,
            reshard,
            first_opens,
            report,
        });
    }
    Ok(generations)
}

/// One generation: `a` and `b` share the partitions, `c` joins (the
/// resharded stores move between processes too), input flows from event
/// `from` on; then the input stops and the end is checked against `model`.
/// Returns the report and how many events were fed.
fn run_generation(
    config: &ScenarioConfig,
    from: u64,
    model: &mut Model,
) -> Result<(ScenarioReport, u64)> {
    let log = |what: &str| eprintln!("[reshard g{}] {what}", config.generation);
    let setup = setup(config, from)?;
    let all = setup.all.clone();
    log(&format!(
        "a and b start on {} partitions",
        config.partitions
    ));
    let (mut a, mut b) = start_two(config, &all)?;
    log("c joins");
    let mut c = Proc::spawn(config, "c")?;
    wait_until("c to own partitions", Duration::from_secs(180), || {
        c.check_alive()?;
        Ok(!opened_by(&c).is_empty())
    })?;
    std::thread::sleep(config.settle);
    let (mut report, sent) = finish(config, setup, &mut [&mut a, &mut b, &mut c], &[], model)?;
    report.overlapping_moves = super::check_moves(&report.moves, "", &Default::default())?;
    Ok((report, sent))
}

/// Reshards the store of generation `prev` into generation `next`'s
/// partitions, its changelog a new topic of `next`'s, and checks the moved
/// state against `model` (already moved to `next`'s layout): the union of
/// the targets and each target, digest for digest.
fn reshard_state(
    prev: &ScenarioConfig,
    next: &ScenarioConfig,
    model: &Model,
) -> Result<ReshardSummary> {
    eprintln!(
        "[reshard] {} partitions of `{}` into {} of `{}`",
        prev.partitions, prev.app_id, next.partitions, next.app_id
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (source_keys, source_logs) = store_partitions(prev)?;
    let (target_keys, target_logs) = store_partitions(next)?;
    let options = ReshardOptions {
        partitioner: Arc::new(by_user()),
        ..ReshardOptions::default()
    };
    let started = Instant::now();
    let report = runtime.block_on(async {
        let repo = Repository::open(&prev.repo, repo_options(prev)).await?;
        let format = RocksFormat::default();
        reshard(
            &repo,
            &format,
            &SourcePartition::zip(&source_keys, &source_logs),
            &format,
            &TargetPartition::zip(&target_keys, &target_logs),
            &next.dir.join("reshard-scratch"),
            &options,
        )
        .await
    })?;
    let took = started.elapsed();
    let expected = model_digests(model, next.partitions);
    let mut union = LogicalDigest::new();
    expected.values().for_each(|d| union.merge(d));
    if report.digest != union {
        return Err(format!(
            "the reshard moved {} (digest {}), the model holds {} users (digest {union})",
            report.keys,
            report.digest,
            union.keys()
        )
        .into());
    }
    for (j, t) in report.targets.iter().enumerate() {
        let want = expected
            .get(&i32::try_from(j)?)
            .cloned()
            .unwrap_or_default();
        if t.digest != want {
            return Err(format!(
                "target {j} holds {} (digest {}), the model places {} users there (digest {want})",
                t.keys,
                t.digest,
                want.keys()
            )
            .into());
        }
    }
    Ok(ReshardSummary {
        keys: report.keys,
        bytes: report.bytes,
        left_behind: report.sources.iter().map(|s| s.left_behind).sum(),
        keys_per_target: report.targets.iter().map(|t| t.keys).collect(),
        took,
    })
}

/// The store partitions of `config`'s application and their changelogs
/// (the Kafka topic `<app>-users-changelog`, created with the count).
fn store_partitions(config: &ScenarioConfig) -> Result<(Vec<StoreKey>, Vec<KafkaChangelog>)> {
    let kafka = changelog_options(&config.bootstrap, config.partitions);
    let mut keys = Vec::new();
    let mut logs = Vec::new();
    for p in 0..u32::try_from(config.partitions)? {
        let key = StoreKey::new(&config.app_id, STORE, p)?;
        logs.push(KafkaChangelog::open(key.changelog_id(), kafka.clone())?);
        keys.push(key);
    }
    Ok((keys, logs))
}

/// The logical digest of each partition's users in `model`, as the app
/// stores them (`user/<name>` → the state's JSON).
fn model_digests(model: &Model, partitions: i32) -> BTreeMap<i32, LogicalDigest> {
    let mut out: BTreeMap<i32, LogicalDigest> =
        (0..partitions).map(|p| (p, LogicalDigest::new())).collect();
    for (p, users) in &model.states {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = users
            .iter()
            .map(|(u, s)| (state_key(u), serde_json::to_vec(s).unwrap_or_default()))
            .collect();
        let d = LogicalDigest::of_pairs(pairs.iter().map(|(k, v)| (&k[..], &v[..])));
        out.entry(*p).or_default().merge(&d);
    }
    out
}

/// The first open of each partition, in time order of `moves`.
fn first_opens(moves: &[MoveLine], partitions: i32) -> Vec<(i32, String, u64)> {
    (0..partitions)
        .filter_map(|p| {
            moves
                .iter()
                .find(|m| m.partition == p && m.event == "opened")
                .map(|m| {
                    (
                        p,
                        m.source.clone().unwrap_or_default(),
                        m.records_replayed.unwrap_or(0),
                    )
                })
        })
        .collect()
}

/// The resharded partitions were ready to run: each first open came from
/// the reshard's snapshot and replayed nothing (a target no user went to
/// has no snapshot: its empty log is its state).
fn check_ready(first_opens: &[(i32, String, u64)], r: &ReshardSummary) -> Result<()> {
    if first_opens.len() != r.keys_per_target.len() {
        return Err(format!(
            "{} of {} resharded partitions were opened: {first_opens:?}",
            first_opens.len(),
            r.keys_per_target.len()
        )
        .into());
    }
    for ((p, source, replayed), keys) in first_opens.iter().zip(&r.keys_per_target) {
        let expected = if *keys > 0 { "snapshot" } else { "replay" };
        if source != expected || *replayed != 0 {
            return Err(format!(
                "resharded partition {p} ({keys} users) first opened from {source} replaying \
                 {replayed} records, expected the reshard's {expected} and 0"
            )
            .into());
        }
    }
    Ok(())
}

/// The scenario's report: each generation's moves and checks, and the
/// reshards between them.
pub fn reshard_table(generations: &[Generation]) -> String {
    let mut out = String::new();
    for (g, step) in generations.iter().enumerate() {
        if let Some(r) = &step.reshard {
            out.push_str(&format!(
                "\n== reshard into {} partitions: {} users ({} bytes) in {:.2} s, {} input \
                 positions left behind; users per partition {:?}\n",
                step.partitions,
                r.keys,
                r.bytes,
                r.took.as_secs_f64(),
                r.left_behind,
                r.keys_per_target
            ));
        }
        out.push_str(&format!(
            "\n== generation {g}: `{}` on {} partitions; first opens (partition, source, \
             replayed): {:?}\n{}\n",
            step.app_id,
            step.partitions,
            step.first_opens,
            super::table(&step.report)
        ));
    }
    out
}

/// The working directories a failed run's logs are in, for the tests.
pub fn generation_dirs(dir: &Path, layout: &[i32]) -> Vec<std::path::PathBuf> {
    (0..layout.len())
        .map(|g| dir.join(format!("g{g}")))
        .collect()
}
