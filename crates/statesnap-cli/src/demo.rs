//! `statesnap demo`: the main job on embedded defaults.
//!
//! A stateful workload — per-user event counts and last-seen pages over a
//! Zipf-skewed user space, with account deletions — runs through the
//! runtime (a `StateManager` and one `StateHandle`) on a file changelog and
//! a local repository, snapshotting in the background by policy. Then the
//! machine "crashes": the handle is dropped without a handoff snapshot and
//! the store directory is lost. The store is rebuilt twice, side by side:
//! by `StateManager::open` (newest snapshot + the changelog tail) and by a
//! full replay of the changelog; both are compared with each other and with
//! a model of the workload by logical digest.

use statesnap::StoreKey;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;
use statesnap::Changelog;
use statesnap::LogicalDigest;
use statesnap::format::StoreFormat;
use statesnap::{
    Error, ErrorKind, FileChangelog, RestoreOptions, RestoreReport, Result, SnapshotPolicy,
    StateManager, StateStoreExt, StoreSpec, restore_store,
};

use crate::args::{DemoArgs, StoreKind};
use crate::out::{self, Out};

/// Which store the demo runs on: how to make its spec and its format.
trait DemoStore {
    type F: StoreFormat + 'static;
    fn spec(log: FileChangelog, dir: &Path) -> Result<StoreSpec<Self::F, FileChangelog>>;
}

struct Memory;
impl DemoStore for Memory {
    type F = statesnap::PortableFormat<statesnap::MemoryStore>;
    fn spec(log: FileChangelog, dir: &Path) -> Result<StoreSpec<Self::F, FileChangelog>> {
        Ok(StoreSpec::memory(store_key()?, log, dir))
    }
}

#[cfg(feature = "rocksdb")]
struct Rocks;
#[cfg(feature = "rocksdb")]
impl DemoStore for Rocks {
    type F = statesnap::RocksFormat;
    fn spec(log: FileChangelog, dir: &Path) -> Result<StoreSpec<Self::F, FileChangelog>> {
        Ok(StoreSpec::rocksdb(store_key()?, log, dir))
    }
}

/// splitmix64: a small, fast, seeded generator (the workload must be the
/// same on every run).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf(s = 1) over `n` users by inverse CDF: user 0 is the busiest.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / k as f64;
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u) as u64
    }
}

const PAGES: [&str; 6] = ["/", "/search", "/cart", "/checkout", "/account", "/help"];

/// The demo's snapshot cadence in changelog records.
const SNAPSHOT_RECORDS: u64 = 25_000;

/// What the workload left: the model of the state, and figures.
struct Written {
    model: HashMap<Vec<u8>, Vec<u8>>,
    events: u64,
    records: u64,
    took: Duration,
    snapshots: u64,
}

/// Runs the workload through `handle`: for each event, the user's count
/// (read-modify-write) and last-seen page; 1 in 200 events deletes the
/// user's account (both keys).
fn workload<F: StoreFormat, C: statesnap::Changelog>(
    h: &mut statesnap::StateHandle<F, C>,
    users: u64,
    events: u64,
    pb: &indicatif::ProgressBar,
) -> Result<HashMap<Vec<u8>, Vec<u8>>> {
    let zipf = Zipf::new(users);
    let mut rng = Rng(42);
    let mut model = HashMap::new();
    for i in 0..events {
        let user = zipf.sample(&mut rng);
        let count_key = format!("user-{user:08}/count").into_bytes();
        let seen_key = format!("user-{user:08}/last-seen").into_bytes();
        if rng.next().is_multiple_of(200) {
            h.delete(count_key.clone());
            h.delete(seen_key.clone());
            model.remove(&count_key);
            model.remove(&seen_key);
        } else {
            let count = match h.get(&count_key)? {
                Some(v) => std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| {
                        Error::new(ErrorKind::Internal, "the demo's count is not a number")
                    })?,
                None => 0,
            } + 1;
            let page = PAGES[(rng.next() % PAGES.len() as u64) as usize];
            let seen = format!("event {i} page {page}").into_bytes();
            let count = count.to_string().into_bytes();
            h.put(count_key.clone(), count.clone());
            h.put(seen_key.clone(), seen.clone());
            model.insert(count_key, count);
            model.insert(seen_key, seen);
        }
        if (i + 1) % 1000 == 0 {
            h.commit()?;
            pb.set_position(i + 1);
        }
    }
    h.commit()?;
    pb.finish_and_clear();
    Ok(model)
}

/// The demo's one store partition, `demo/users/0`.
fn store_key() -> Result<StoreKey> {
    StoreKey::new("demo", "users", 0)
}

fn log(dir: &Path) -> Result<FileChangelog> {
    let id = store_key()?.changelog_id();
    FileChangelog::open(dir.join("changelog"), id, Default::default())
}

/// The demo's repository URL: `--repo`, or `repo/` in the working
/// directory.
fn repository_url(a: &DemoArgs, dir: &Path) -> String {
    a.repo
        .clone()
        .unwrap_or_else(|| file_url(&dir.join("repo")))
}

/// `file://` URL of an absolute path.
fn file_url(p: &Path) -> String {
    url::Url::from_file_path(p).map_or_else(|()| format!("file://{}", p.display()), String::from)
}

async fn repository(a: &DemoArgs, dir: &Path) -> Result<statesnap::Repository> {
    let url = repository_url(a, dir);
    let opts = statesnap::RepositoryOptions {
        store_options: a.options.iter().cloned().collect(),
        ..Default::default()
    };
    match statesnap::Repository::open(&url, opts.clone()).await {
        Ok(r) => Ok(r),
        Err(e) if e.kind() == ErrorKind::NotFound => statesnap::Repository::init(&url, opts).await,
        Err(e) => Err(e),
    }
}

async fn run_with<K: DemoStore>(a: &DemoArgs, dir: &Path, out: Out) -> Result<serde_json::Value> {
    let repo = repository(a, dir).await?;
    let events = a.keys * a.updates_per_key;
    // Background snapshots every SNAPSHOT_RECORDS changelog records (a
    // quarter of a shorter workload), at most five a second — a cadence
    // that does not grow with the workload, as a production policy's would
    // not. The crash comes at the end, so the tail is what came after the
    // last snapshot: about as long at any history length, while a full
    // replay grows with the history.
    let every_records = SNAPSHOT_RECORDS.min(events / 4).max(1);
    let policy = SnapshotPolicy::manual()
        .every_records(every_records)
        .min_interval(Duration::from_millis(200));
    let manager = StateManager::builder(repo.clone()).policy(policy).build()?;

    let written = run_and_crash::<K>(&manager, a, dir, events, out).await?;
    let snap = rebuild_from_snapshot::<K>(&manager, dir, out).await?;
    let replay = rebuild_by_replay::<K>(&repo, dir, out).await?;
    manager.shutdown().await;

    let model_digest = LogicalDigest::of_pairs(
        written
            .model
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice())),
    );
    let equal = snap.digest == replay.digest && snap.digest == model_digest;
    let speedup = replay.time.as_secs_f64() / snap.time.as_secs_f64().max(1e-6);
    let result = json!({
        "events": written.events,
        "changelog_records": written.records,
        "live_keys": written.model.len(),
        "write_seconds": written.took.as_secs_f64(),
        "background_snapshots": written.snapshots,
        "snapshot_every_records": every_records,
        "snapshot_restore": {
            "source": snap.report.source.to_string(),
            "seconds": snap.time.as_secs_f64(),
            "bytes_downloaded": snap.report.transfer.bytes_downloaded,
            "records_replayed": snap.report.replay.records,
            "digest": snap.digest.to_string(),
        },
        "full_replay": {
            "seconds": replay.time.as_secs_f64(),
            "bytes_downloaded": replay.report.transfer.bytes_downloaded,
            "records_replayed": replay.report.replay.records,
            "digest": replay.digest.to_string(),
        },
        "model_digest": model_digest.to_string(),
        "digests_equal": equal,
        "speedup": speedup,
    });
    if !out.json {
        print_text(&written, &snap, &replay, &model_digest, speedup, out);
    }
    Ok(result)
}

/// One rebuild of the lost store: how, how long, and what it holds.
struct Rebuilt {
    report: RestoreReport,
    time: Duration,
    digest: LogicalDigest,
}

/// Steps 1 and 2: the application runs, then the crash: no handoff
/// snapshot, and the local store is lost.
async fn run_and_crash<K: DemoStore>(
    manager: &StateManager,
    a: &DemoArgs,
    dir: &Path,
    events: u64,
    out: Out,
) -> Result<Written> {
    // 1. The application runs.
    let mut h = manager
        .open(K::spec(log(dir)?, &dir.join("store"))?)
        .await?;
    let pb = out.progress(events, "events", false);
    let started = Instant::now();
    let model = workload(&mut h, a.keys, events, &pb)?;
    let took = started.elapsed();
    let status = h.wait_for_snapshot().await;
    let written = Written {
        model,
        events,
        records: h.changelog().end_offset()?,
        took,
        snapshots: status.snapshots_taken,
    };
    // 2. The crash: no handoff snapshot, and the local store is lost.
    h.abandon().await;
    std::fs::remove_dir_all(dir.join("store")).or_else(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Ok(()),
        _ => Err(Error::new(ErrorKind::Io, "cannot remove the demo store").with_source(e)),
    })?;
    Ok(written)
}

/// 3a. Rebuilt the way the runtime does: newest snapshot + tail.
async fn rebuild_from_snapshot<K: DemoStore>(
    manager: &StateManager,
    dir: &Path,
    out: Out,
) -> Result<Rebuilt> {
    let spinner = out.spinner("restoring from the newest snapshot + changelog tail");
    let h = manager
        .open(K::spec(log(dir)?, &dir.join("restored-from-snapshot"))?)
        .await?;
    spinner.finish_and_clear();
    let snap_report = h.report().clone();
    let snap_time = h.opened_in();
    let snap_digest = h.store().logical_digest()?;
    h.abandon().await;
    Ok(Rebuilt {
        report: snap_report,
        time: snap_time,
        digest: snap_digest,
    })
}

/// 3b. Rebuilt by replaying the whole changelog.
async fn rebuild_by_replay<K: DemoStore>(
    repo: &statesnap::Repository,
    dir: &Path,
    out: Out,
) -> Result<Rebuilt> {
    let spinner = out.spinner("rebuilding by full changelog replay");
    let spec = K::spec(log(dir)?, &dir.join("restored-by-replay"))?;
    let started = Instant::now();
    let (store, replay_report) = restore_store(
        &spec.format,
        repo,
        &spec.store_key,
        &spec.changelog,
        &spec.dir,
        &RestoreOptions {
            full_replay: true,
            ..RestoreOptions::default()
        },
    )
    .await?;
    let replay_time = started.elapsed();
    spinner.finish_and_clear();
    let replay_digest = store.logical_digest()?;
    drop(store);
    Ok(Rebuilt {
        report: replay_report,
        time: replay_time,
        digest: replay_digest,
    })
}

/// The text report: the workload, the two rebuilds side by side, the verdict.
fn print_text(
    written: &Written,
    snap: &Rebuilt,
    replay: &Rebuilt,
    model_digest: &LogicalDigest,
    speedup: f64,
    out: Out,
) {
    let equal = snap.digest == replay.digest && snap.digest == *model_digest;
    crate::outln!(
        "ran {} events ({} changelog records, {} live keys) in {} with {} background snapshots",
        written.events,
        written.records,
        written.model.len(),
        out::secs(written.took),
        written.snapshots
    );
    crate::outln!("crash: the store directory is gone; rebuilding it two ways");
    let mut t = out.table(&[
        "rebuilt from",
        "time",
        "downloaded",
        "records replayed",
        "logical digest",
    ]);
    for (name, run) in [
        ("newest snapshot + tail", snap),
        ("full changelog replay", replay),
    ] {
        t.add_row(vec![
            name.to_owned(),
            out::secs(run.time),
            out::bytes(run.report.transfer.bytes_downloaded),
            run.report.replay.records.to_string(),
            short_digest(&run.digest),
        ]);
    }
    crate::outln!("{t}");
    crate::outln!("the snapshot restore used {}", snap.report.source);
    crate::outln!("speed-up: snapshot + tail was {speedup:.1}x faster than full replay");
    if equal {
        crate::outln!("digests equal: both rebuilt stores equal the workload's model, key for key");
    } else {
        crate::outln!("DIGESTS DIFFER (model {model_digest}): this is a bug, please report it");
    }
}

/// `live keys:` and the first 16 hex digits: enough to tell digests apart
/// at a glance (`--json` prints them whole).
fn short_digest(d: &LogicalDigest) -> String {
    let full = d.to_string();
    match full.split_once(':') {
        Some((n, hex)) => format!("{n} keys, {}…", &hex[..hex.len().min(16)]),
        None => full,
    }
}

/// The demo's directory: `--dir` (relative to the current directory), or
/// a fresh `statesnap-demo-*` in the system's temporary directory.
fn demo_dir(a: &DemoArgs) -> Result<PathBuf> {
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            let t = tempfile::Builder::new()
                .prefix("statesnap-demo-")
                .tempdir()
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Io,
                        "cannot create the demo directory in the system's temporary directory; \
                         set TMPDIR to a writable one or give --dir",
                    )
                    .with_source(e)
                })?;
            // Removed by the demo itself at the end (unless --keep).
            t.keep()
        }
    };
    // Absolute: the local repository's `file://` URL is made from it.
    let dir = std::path::absolute(&dir).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!("cannot resolve the demo directory path=`{}`", dir.display()),
        )
        .with_source(e)
    })?;
    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "the demo directory is not empty path=`{}`; give a new one with --dir",
                dir.display()
            ),
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!("cannot create the demo directory path=`{}`", dir.display()),
        )
        .with_source(e)
    })?;
    Ok(dir)
}

pub async fn run(a: &DemoArgs, out: Out) -> Result<ExitCode> {
    if a.keys == 0 || a.updates_per_key == 0 {
        return Err(Error::new(
            ErrorKind::Config,
            "--keys and --updates-per-key must be at least 1",
        ));
    }
    let dir = demo_dir(a)?;
    if !a.keep {
        crate::signal::remove_on_cancel(dir.clone());
    }
    if !out.json {
        crate::outln!(
            "statesnap demo: {} users x {} events each (Zipf-skewed), {:?} store, in {}{}",
            a.keys,
            a.updates_per_key,
            a.store,
            dir.display(),
            if a.keep {
                ""
            } else {
                " (removed at the end; --keep keeps it)"
            }
        );
    }
    let result = match a.store {
        StoreKind::Memory => run_with::<Memory>(a, &dir, out).await,
        #[cfg(feature = "rocksdb")]
        StoreKind::Rocksdb => run_with::<Rocks>(a, &dir, out).await,
    };
    if !a.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let mut result = result?;
    let equal = result["digests_equal"] == true;
    if a.keep {
        let next = next_steps(a, &dir);
        if out.json {
            result["kept"] = next.json();
        } else {
            next.print();
        }
    }
    if out.json {
        out.json(&result);
    }
    Ok(if equal {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(out::exit_code(ErrorKind::Internal))
    })
}

/// What `--keep` leaves to look at, and commands to try on it.
struct NextSteps {
    dir: PathBuf,
    repository: String,
    changelog: String,
    store: &'static str,
    /// Each command's arguments after `statesnap`.
    commands: Vec<Vec<String>>,
}

fn next_steps(a: &DemoArgs, dir: &Path) -> NextSteps {
    let repository = repository_url(a, dir);
    let changelog = file_url(&dir.join("changelog"));
    let store = "demo/users/0";
    let mut repo_args = vec!["--repo".to_owned(), repository.clone()];
    for (k, v) in &a.options {
        repo_args.push("-o".to_owned());
        repo_args.push(format!("{k}={v}"));
    }
    let cmd = |words: &[&str]| -> Vec<String> {
        let mut c: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        c.extend(repo_args.iter().cloned());
        c
    };
    let target = dir.join("restored-by-cli").display().to_string();
    let commands = vec![
        cmd(&["list", store, "--changelog", &changelog]),
        cmd(&["verify", store, "--deep"]),
        cmd(&["restore", store, "--changelog", &changelog, "--to", &target]),
    ];
    NextSteps {
        dir: dir.to_path_buf(),
        repository,
        changelog,
        store,
        commands,
    }
}

impl NextSteps {
    fn json(&self) -> serde_json::Value {
        json!({
            "dir": self.dir.display().to_string(),
            "repository": self.repository,
            "changelog": self.changelog,
            "store": self.store,
            "commands": self.commands.iter().map(|c| {
                let mut argv = vec!["statesnap".to_owned()];
                argv.extend(c.iter().cloned());
                argv
            }).collect::<Vec<_>>(),
        })
    }

    fn print(&self) {
        crate::outln!();
        crate::outln!("kept in {}:", self.dir.display());
        crate::outln!("  repository  {}", self.repository);
        crate::outln!("  changelog   {}", self.changelog);
        crate::outln!("  store       {}", self.store);
        crate::outln!("try next:");
        for c in &self.commands {
            let words: Vec<String> = c.iter().map(|w| shell_word(w)).collect();
            crate::outln!("  statesnap {}", words.join(" "));
        }
    }
}

/// `w` as one shell word: as is when it is safe, else single-quoted.
fn shell_word(w: &str) -> String {
    let safe = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:=%+,@".contains(c));
    if safe {
        w.to_owned()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}
