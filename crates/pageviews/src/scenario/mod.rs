//! The moving-partitions scenario: several processes of the app share the
//! input's partitions while input keeps flowing — two start, a third
//! joins, one leaves gracefully, one is SIGKILLed, the first comes back —
//! and the end result is checked against a single-process model. Its
//! variants: a server outage, a kill during a handoff, and a change of the
//! partition count through a reshard of the state ([`run_reshard`]).
//!
//! `pageviews scenario` runs it against a running broker and repository
//! and prints the per-move report; the crate's integration test runs it
//! against the servers the test script starts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use statesnap::Repository;

use crate::Result;
use crate::app::{MoveLine, STORE, changelog_options};
use crate::kafka::{committed_offsets, create_topics, end_offsets, group_client};
use crate::model::{Model, events};

mod check;
mod reshard;
pub use check::{check_moves, classify, table, verify};
pub use reshard::{Generation, ReshardSummary, generation_dirs, reshard_table, run_reshard};

/// What to run against.
#[derive(Debug, Clone)]
pub struct ScenarioConfig {
    /// The `pageviews` binary the processes run.
    pub bin: PathBuf,
    /// Kafka bootstrap servers.
    pub bootstrap: String,
    /// Repository URL (created if missing).
    pub repo: String,
    /// Working directory: each process's stores, logs and move reports.
    pub dir: PathBuf,
    /// Application id (consumer group; topic and store prefix). Use a fresh
    /// one per run.
    pub app_id: String,
    /// Input partitions.
    pub partitions: i32,
    /// The input generation the processes are told (0; each reshard of
    /// [`run_reshard`] moves to the next).
    pub generation: u32,
    /// Distinct users.
    pub users: u64,
    /// Input events per second while the processes come and go.
    pub rate: u64,
    /// Seconds each phase lets the group settle and process.
    pub settle: Duration,
    /// Consumer group session timeout of the processes.
    pub session_timeout: Duration,
    /// Extra environment for the processes.
    pub env: Vec<(String, String)>,
    /// Warm standbys per partition the processes keep (`--standbys`, 0 or
    /// 1).
    pub standbys: u32,
}

/// What the scenario saw and checked.
#[derive(Debug, Clone, Default)]
pub struct ScenarioReport {
    /// Every partition move of every process, in time order.
    pub moves: Vec<MoveLine>,
    /// Input records.
    pub input_records: usize,
    /// Output records, and how many were repeats of an earlier one.
    pub output_records: usize,
    /// Repeated outputs (identical to the first).
    pub output_repeats: usize,
    /// Users whose final state was compared.
    pub users_checked: usize,
    /// How each partition's final handoff opened for the check:
    /// `(partition, source, records replayed)`.
    pub final_opens: Vec<(i32, String, u64)>,
    /// Processes SIGKILLed, by name.
    pub killed: Vec<String>,
    /// Graceful moves whose next owner began opening before the old owner's
    /// handoff ended (the broker did not wait for the revoke).
    pub overlapping_moves: usize,
    /// How the killed process's partitions came back: `(partition, kind,
    /// records replayed)`, kind as in [`classify`].
    pub killed_reopens: Vec<(i32, String, u64)>,
    /// What every move is, for the report: `local`, `handoff snapshot`,
    /// `older snapshot`, `replay`, or the event for closes.
    pub classified: Vec<(MoveLine, String)>,
}

/// A running process of the app.
#[derive(Debug)]
struct Proc {
    name: String,
    child: Child,
    report: PathBuf,
}

impl Proc {
    fn spawn(config: &ScenarioConfig, name: &str) -> Result<Proc> {
        let data = config.dir.join(name.trim_end_matches(char::is_numeric));
        std::fs::create_dir_all(&data)?;
        let report = config.dir.join(format!("{name}.moves.jsonl"));
        let log = std::fs::File::create(config.dir.join(format!("{name}.log")))?;
        let mut cmd = Command::new(&config.bin);
        cmd.arg("run")
            .args(["--name", name])
            .args(["--bootstrap", &config.bootstrap])
            .args(["--repo", &config.repo])
            .args(["--app-id", &config.app_id])
            .args(["--input", &input_topic(&config.app_id)])
            .args(["--output", &output_topic(&config.app_id)])
            .args(["--partitions", &config.partitions.to_string()])
            .args(["--input-generation", &config.generation.to_string()])
            .args(["--standbys", &config.standbys.to_string()])
            .arg("--data-dir")
            .arg(&data)
            .arg("--report")
            .arg(&report)
            .args(["--snapshot-every-ms", "1000"])
            .args([
                "--session-timeout-ms",
                &config.session_timeout.as_millis().to_string(),
            ])
            .env(
                "RUST_LOG",
                std::env::var("PAGEVIEWS_RUST_LOG").unwrap_or_else(|_| "info,rdkafka=warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (k, v) in &config.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn()?;
        Ok(Proc {
            name: name.to_owned(),
            child,
            report,
        })
    }

    fn moves(&self) -> Vec<MoveLine> {
        read_moves(&self.report)
    }

    /// SIGTERM, then waits for a clean exit.
    fn stop(&mut self, within: Duration) -> Result<()> {
        self.terminate()?;
        self.wait_exit(within)
    }

    /// SIGTERM: the process hands its partitions off and leaves the group.
    fn terminate(&mut self) -> Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        if !status.success() {
            return Err(format!("kill -TERM {} failed", self.name).into());
        }
        Ok(())
    }

    /// Waits for a clean exit.
    fn wait_exit(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                return Err(format!("{} exited with {status}", self.name).into());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err(format!("{} did not stop within {within:?}", self.name).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            return Err(format!("{} exited early with {status}", self.name).into());
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_moves(path: &Path) -> Vec<MoveLine> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The input topic of `app_id`.
pub fn input_topic(app_id: &str) -> String {
    format!("{app_id}-pageviews")
}

/// The output topic of `app_id`.
pub fn output_topic(app_id: &str) -> String {
    format!("{app_id}-user-activity")
}

/// Feeds the input topic at a steady rate on a thread of its own, keyed
/// by user and placed as the Java client places keyed records (murmur2, so
/// that a reshard by [`statesnap::reshard::Murmur2`] puts each user's state
/// where the user's events go).
#[derive(Debug)]
pub struct Feeder {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<Result<u64>>>,
}

impl Feeder {
    /// Starts feeding `rate` events per second over `users` users, events
    /// `from, from + 1, …` of the deterministic stream ([`events`]).
    pub fn start(bootstrap: &str, topic: &str, users: u64, rate: u64, from: u64) -> Result<Feeder> {
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "300000")
            .create()?;
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (stop2, sent2, topic) = (stop.clone(), sent.clone(), topic.to_owned());
        let thread = std::thread::spawn(move || -> Result<u64> {
            let started = Instant::now();
            let mut i = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                let due = started.elapsed().as_secs_f64() * rate as f64;
                while (i as f64) < due {
                    let e = &events(42, users, from + i, 1, 1_700_000_000_000)[0];
                    let payload = serde_json::to_vec(e)?;
                    let mut r = BaseRecord::to(&topic)
                        .key(e.user.as_bytes())
                        .payload(&payload);
                    loop {
                        match producer.send(r) {
                            Ok(()) => break,
                            Err((_, back)) => {
                                r = back;
                                std::thread::sleep(Duration::from_millis(5));
                            }
                        }
                    }
                    i += 1;
                    sent2.store(i, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            producer.flush(Duration::from_secs(120))?;
            Ok(i)
        });
        Ok(Feeder {
            stop,
            sent,
            thread: Some(thread),
        })
    }

    /// Events this feeder sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops, waits until the broker has every event, returns how many this
    /// feeder sent.
    pub fn finish(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err("the feeder thread panicked".into()),
            None => Ok(self.sent()),
        }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Repository options for this process: an `AWS_ENDPOINT_URL` in the
/// processes' environment overrides this process's own.
fn repo_options(config: &ScenarioConfig) -> statesnap::RepositoryOptions {
    let mut options = statesnap::RepositoryOptions::default();
    for (k, v) in &config.env {
        if k == "AWS_ENDPOINT_URL" {
            options.store_options.insert("endpoint".into(), v.clone());
        }
    }
    options
}

/// Creates the topics and the repository of a run.
pub async fn prepare(config: &ScenarioConfig) -> Result<()> {
    let (input, output) = (input_topic(&config.app_id), output_topic(&config.app_id));
    create_topics(
        &config.bootstrap,
        &[(&input, config.partitions), (&output, config.partitions)],
    )
    .await?;
    // The changelog topic, compacted, created by the changelog itself.
    let kafka = changelog_options(&config.bootstrap, config.partitions);
    drop(statesnap::KafkaChangelog::open(
        statesnap::StoreKey::new(&config.app_id, STORE, 0)?.changelog_id(),
        kafka,
    )?);
    match Repository::init(&config.repo, repo_options(config)).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == statesnap::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out after {within:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the group has consumed the input to its end.
fn wait_consumed(config: &ScenarioConfig, procs: &mut [&mut Proc], within: Duration) -> Result<()> {
    let input = input_topic(&config.app_id);
    let ends = end_offsets(&config.bootstrap, &input)?;
    let client = group_client(&config.bootstrap, &config.app_id)?;
    wait_until("the group to consume the whole input", within, || {
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        let committed = committed_offsets(&client, &input, ends.keys().copied())?;
        Ok(ends
            .iter()
            .all(|(p, end)| committed.get(p).is_some_and(|c| c >= end)))
    })
}

fn opened_by(p: &Proc) -> BTreeSet<i32> {
    let mut held = BTreeSet::new();
    for m in p.moves() {
        match m.event.as_str() {
            "opened" => {
                held.insert(m.partition);
            }
            // A standby's bootstrap moves no partition.
            "standby" => {}
            _ => {
                held.remove(&m.partition);
            }
        }
    }
    held
}

/// The partitions `p` has a ready standby of (a bootstrap reported) and
/// does not own.
fn following(p: &Proc) -> BTreeSet<i32> {
    let standbys: BTreeSet<i32> = p
        .moves()
        .iter()
        .filter(|m| m.event == "standby")
        .map(|m| m.partition)
        .collect();
    standbys.difference(&opened_by(p)).copied().collect()
}

/// What both scenarios start with: the topics and the repository created,
/// input flowing.
struct Setup {
    runtime: tokio::runtime::Runtime,
    feeder: Feeder,
    all: BTreeSet<i32>,
}

/// `from`: the first event of the stream to feed.
fn setup(config: &ScenarioConfig, from: u64) -> Result<Setup> {
    std::fs::create_dir_all(&config.dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(prepare(config))?;
    let input = input_topic(&config.app_id);
    let feeder = Feeder::start(&config.bootstrap, &input, config.users, config.rate, from)?;
    Ok(Setup {
        runtime,
        feeder,
        all: (0..config.partitions).collect(),
    })
}

/// How the scenarios end: input stops, the `running` processes consume
/// it to its end and stop gracefully, and the moves of every process (the
/// running and the `gone` ones) and the end state are checked, the input
/// fed to `model` (which holds the earlier generations' state, if any).
/// Returns the report and how many events were fed.
fn finish(
    config: &ScenarioConfig,
    setup: Setup,
    running: &mut [&mut Proc],
    gone: &[&Proc],
    model: &mut Model,
) -> Result<(ScenarioReport, u64)> {
    eprintln!("[scenario] input stops; waiting for the group to catch up");
    let sent = setup.feeder.finish()?;
    wait_consumed(config, running, Duration::from_secs(180))?;
    eprintln!("[scenario] the processes stop gracefully");
    for p in running.iter_mut() {
        p.stop(Duration::from_secs(120))?;
    }
    let mut moves: Vec<MoveLine> = running
        .iter()
        .map(|p| p.moves())
        .chain(gone.iter().map(|p| p.moves()))
        .flatten()
        .collect();
    moves.sort_by_key(|m| m.at_ms);
    if let Some(m) = moves.iter().find(|m| m.event == "failed") {
        return Err(format!("a store failed to open: {m:?}").into());
    }
    let mut report = ScenarioReport {
        classified: classify(&moves),
        moves,
        ..Default::default()
    };
    setup.runtime.block_on(verify(config, &mut report, model))?;
    if report.input_records as u64 != sent {
        return Err(format!(
            "the input holds {} records, the feeder sent {sent}",
            report.input_records
        )
        .into());
    }
    Ok((report, sent))
}

/// Runs the scenario and checks the result; `Err` says what failed.
pub fn run(config: &ScenarioConfig) -> Result<ScenarioReport> {
    let setup = setup(config, 0)?;
    let all = setup.all.clone();
    let settle = config.settle;
    let log = |what: &str| eprintln!("[scenario] {what}");

    log("start a and b");
    let mut a = Proc::spawn(config, "a")?;
    let mut b = Proc::spawn(config, "b")?;
    wait_until(
        "a and b to own every partition",
        Duration::from_secs(180),
        || {
            a.check_alive()?;
            b.check_alive()?;
            let held: BTreeSet<i32> = opened_by(&a).union(&opened_by(&b)).copied().collect();
            Ok(held == all)
        },
    )?;
    std::thread::sleep(settle);

    log("c joins");
    let mut c = Proc::spawn(config, "c")?;
    wait_until("c to own partitions", Duration::from_secs(180), || {
        c.check_alive()?;
        Ok(!opened_by(&c).is_empty())
    })?;
    std::thread::sleep(settle);

    log("a leaves gracefully");
    a.stop(Duration::from_secs(90))?;
    std::thread::sleep(settle);

    wait_until(
        "b and c to own every partition",
        Duration::from_secs(180),
        || {
            b.check_alive()?;
            c.check_alive()?;
            let (hb, hc) = (opened_by(&b), opened_by(&c));
            let held: BTreeSet<i32> = hb.union(&hc).copied().collect();
            Ok(held == all && !hb.is_empty())
        },
    )?;

    log(
        "b is SIGKILLed; a comes back (its local stores are still there) and the group takes b's partitions",
    );
    let (b_held, mut a2) = kill_and_join(config, &all, &mut b, &mut c, "a2")?;

    let model = &mut Model::default();
    let (mut report, _) = finish(config, setup, &mut [&mut c, &mut a2], &[&a, &b], model)?;
    report.killed = vec![b.name.clone()];
    let moves = report.moves.clone();
    report.overlapping_moves = check_moves(&moves, &b.name, &b_held)?;
    report.killed_reopens = killed_reopens(&report, &b.name, &b_held);
    Ok(report)
}

/// SIGKILLs `victim`, then starts `newcomer` once the group has noticed,
/// and waits until `survivor` and the newcomer own every partition (then
/// lets them settle). Returns what the victim held, as far as its report
/// got (it writes after each batch), and the newcomer.
///
/// The group notices at the session timeout. tansu 0.6.0 then rebalances
/// but hands the survivors their previous assignment (the generation is
/// not bumped and SyncGroup returns the stale one), so the victim's
/// partitions stay unowned until the membership changes again: the
/// newcomer joins. A Kafka broker reassigns them at the session timeout.
fn kill_and_join(
    config: &ScenarioConfig,
    all: &BTreeSet<i32>,
    victim: &mut Proc,
    survivor: &mut Proc,
    newcomer: &str,
) -> Result<(BTreeSet<i32>, Proc)> {
    victim.child.kill()?;
    victim.child.wait()?;
    let held = opened_by(victim);
    // Nothing shows when the broker has expired the victim (tansu keeps the
    // survivors' assignment, the board keeps a killed process's entry):
    // wait out its session, with a margin.
    std::thread::sleep(config.session_timeout + Duration::from_secs(5));
    let mut n = Proc::spawn(config, newcomer)?;
    wait_until(
        &format!("{} and {newcomer} to own every partition", survivor.name),
        config.session_timeout * 4 + Duration::from_secs(120),
        || {
            survivor.check_alive()?;
            n.check_alive()?;
            let held: BTreeSet<i32> = opened_by(survivor).union(&opened_by(&n)).copied().collect();
            Ok(held == *all && !opened_by(&n).is_empty())
        },
    )?;
    std::thread::sleep(config.settle);
    Ok((held, n))
}

/// How each partition `killed` held came back: the next open after its
/// last one there, `(partition, kind, records replayed)`.
fn killed_reopens(
    report: &ScenarioReport,
    killed: &str,
    held: &BTreeSet<i32>,
) -> Vec<(i32, String, u64)> {
    let mut out = Vec::new();
    for p in held {
        let last = report
            .classified
            .iter()
            .rposition(|(m, _)| m.process == killed && m.partition == *p && m.event == "opened");
        if let Some((m, kind)) = last.and_then(|i| {
            report.classified[i + 1..]
                .iter()
                .find(|(m, _)| m.partition == *p && m.event == "opened")
        }) {
            out.push((*p, kind.clone(), m.records_replayed.unwrap_or(0)));
        }
    }
    out
}

/// Warm standbys (`--standbys 1`): `a` and `b` share the partitions, each
/// following the other's; once `b` follows every partition `a` owns, `a`
/// is SIGKILLed while input flows. When the group gives `a`'s partitions
/// out again (tansu 0.6.0: once the membership changes, so `c` joins; a
/// Kafka broker does it at the session timeout), those `b` gets must be
/// promoted standbys: nothing downloaded, only the standby's lag
/// replayed. With eager `roundrobin` the members are ordered by member id
/// (the client id first, then a UUID): `b` takes the first share, which
/// was `a`'s. The end is checked as in [`run`].
pub fn run_standby(config: &ScenarioConfig) -> Result<ScenarioReport> {
    let setup = setup(config, 0)?;
    let all = setup.all.clone();
    let log = |what: &str| eprintln!("[standby] {what}");

    log("start a and b, each following the other's partitions");
    let (mut a, mut b) = start_two(config, &all)?;
    wait_until(
        "b to follow every partition a owns",
        Duration::from_secs(180),
        || {
            a.check_alive()?;
            b.check_alive()?;
            let held = opened_by(&a);
            Ok(!held.is_empty() && held.is_subset(&following(&b)))
        },
    )?;
    std::thread::sleep(config.settle);

    log("a is SIGKILLed; c joins, and the group gives a's partitions out");
    let (a_held, mut c) = kill_and_join(config, &all, &mut a, &mut b, "c")?;

    let model = &mut Model::default();
    let (mut report, _) = finish(config, setup, &mut [&mut b, &mut c], &[&a], model)?;
    report.killed = vec![a.name.clone()];
    let moves = report.moves.clone();
    report.overlapping_moves = check_moves(&moves, &a.name, &a_held)?;
    report.killed_reopens = killed_reopens(&report, &a.name, &a_held);
    let promoted: Vec<&(i32, String, u64)> = report
        .killed_reopens
        .iter()
        .filter(|(_, kind, _)| kind == "standby")
        .collect();
    if promoted.is_empty() {
        return Err(format!(
            "no partition of the killed process was promoted from a standby: {:?}",
            report.killed_reopens
        )
        .into());
    }
    Ok(report)
}

/// The outage scenario: `a` and `b` share the partitions; the server
/// `outage` controls goes down (`outage(false)`) and `a` leaves gracefully
/// — its handoffs and `b`'s opens of its partitions meet the outage — and
/// after `down_for` the server comes back (`outage(true)`). Input flows
/// throughout; the end is checked as in [`run`] (exact state, outputs),
/// except that an open after a handoff may replay: a handoff that failed
/// hands over nothing.
pub fn run_outage(
    config: &ScenarioConfig,
    down_for: Duration,
    outage: &mut dyn FnMut(bool) -> Result<()>,
) -> Result<ScenarioReport> {
    let setup = setup(config, 0)?;
    let all = setup.all.clone();
    let log = |what: &str| eprintln!("[outage] {what}");

    log("a and b start");
    let (mut a, mut b) = start_two(config, &all)?;

    log("the server goes down; a leaves");
    outage(false)?;
    a.terminate()?;
    std::thread::sleep(down_for);
    log("the server comes back");
    outage(true)?;
    a.wait_exit(Duration::from_secs(180))?;
    wait_until("b to own every partition", Duration::from_secs(180), || {
        b.check_alive()?;
        Ok(opened_by(&b) == all)
    })?;
    std::thread::sleep(config.settle);

    let model = &mut Model::default();
    Ok(finish(config, setup, &mut [&mut b], &[&a], model)?.0)
}

/// Starts `a` and `b` and waits until both own partitions and together
/// every one, then lets them settle.
fn start_two(config: &ScenarioConfig, all: &BTreeSet<i32>) -> Result<(Proc, Proc)> {
    let mut a = Proc::spawn(config, "a")?;
    let mut b = Proc::spawn(config, "b")?;
    wait_until(
        "a and b to share the partitions",
        Duration::from_secs(180),
        || {
            a.check_alive()?;
            b.check_alive()?;
            let (ha, hb) = (opened_by(&a), opened_by(&b));
            let held: BTreeSet<i32> = ha.union(&hb).copied().collect();
            Ok(held == *all && !ha.is_empty() && !hb.is_empty())
        },
    )?;
    std::thread::sleep(config.settle);
    Ok((a, b))
}

/// A process killed in the middle of its handoff: `a` and `b` share the
/// partitions, `a` is told to leave (SIGTERM: it starts committing its
/// final positions and taking handoff snapshots) and is SIGKILLed `after`
/// later. `b` and a newcomer `c` take everything over; the end is checked
/// as in [`run`].
pub fn run_killed_during_handoff(
    config: &ScenarioConfig,
    after: Duration,
) -> Result<ScenarioReport> {
    let setup = setup(config, 0)?;
    let all = setup.all.clone();
    let log = |what: &str| eprintln!("[killed-handoff] {what}");
    log("a and b start");
    let (mut a, mut b) = start_two(config, &all)?;
    log("a is told to leave, and killed during its handoff");
    a.terminate()?;
    std::thread::sleep(after);
    a.child.kill()?;
    a.child.wait()?;
    // As in `run`: tansu reassigns a dead member's partitions only when the
    // membership changes again, so `c` joins after the session timeout
    // (waited out with a margin: nothing shows when it has passed).
    std::thread::sleep(config.session_timeout + Duration::from_secs(5));
    log("c joins; b and c take a's partitions");
    let mut c = Proc::spawn(config, "c")?;
    wait_until(
        "b and c to own every partition",
        config.session_timeout * 4 + Duration::from_secs(120),
        || {
            b.check_alive()?;
            c.check_alive()?;
            let held: BTreeSet<i32> = opened_by(&b).union(&opened_by(&c)).copied().collect();
            Ok(held == all)
        },
    )?;
    std::thread::sleep(config.settle);
    let model = &mut Model::default();
    Ok(finish(config, setup, &mut [&mut b, &mut c], &[&a], model)?.0)
}
