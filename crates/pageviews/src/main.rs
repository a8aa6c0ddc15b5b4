//! `pageviews`: the example stream processor's command line.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pageviews::app::{self, AppConfig};
use pageviews::{bench, scenario};

#[derive(Parser, Debug)]
#[command(about = "Page views per user in a Kafka consumer group, its state on statesnap")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Runs one process of the group until SIGTERM or Ctrl-C, then hands its
    /// partitions off.
    Run {
        /// This process's name (reports, client id).
        #[arg(long)]
        name: String,
        /// Kafka bootstrap servers.
        #[arg(long, env = "STATESNAP_TEST_KAFKA_BOOTSTRAP")]
        bootstrap: String,
        /// Repository URL.
        #[arg(long, env = "STATESNAP_TEST_S3_URL")]
        repo: String,
        /// Application id: consumer group, store and changelog prefix.
        #[arg(long, default_value = "pageviews")]
        app_id: String,
        /// Input topic.
        #[arg(long)]
        input: String,
        /// Output topic.
        #[arg(long)]
        output: String,
        /// Partitions of the input (and of the changelog topic).
        #[arg(long, default_value_t = 6)]
        partitions: i32,
        /// The input generation: bump it with each change of the partition
        /// count (a reshard of the state and a new input topic), so the new
        /// input's offsets, which start at 0 again, count as newer.
        #[arg(long, default_value_t = 0)]
        input_generation: u32,
        /// Where this process keeps its stores.
        #[arg(long)]
        data_dir: PathBuf,
        /// JSON-lines file partition moves are appended to.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Background snapshot interval.
        #[arg(long, default_value_t = 1000)]
        snapshot_every_ms: u64,
        /// Consumer group session timeout.
        #[arg(long, default_value_t = 6000)]
        session_timeout_ms: u64,
        /// Input records per batch.
        #[arg(long, default_value_t = 2000)]
        batch: usize,
        /// Partition assignment strategy (`roundrobin`, `range`: eager;
        /// `cooperative-sticky`).
        #[arg(long, default_value = "roundrobin")]
        assignment: String,
        /// Warm standbys per partition (0 or 1), placed from the
        /// membership board (`<app-id>-members`).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1))]
        standbys: u32,
    },
    /// Runs the moving-partitions scenario (processes join, leave, are
    /// killed while input flows) and checks the result against a model.
    Scenario {
        #[command(flatten)]
        args: ScenarioArgs,
    },
    /// Warm standbys: two processes follow each other's partitions, one
    /// is SIGKILLed, and the other promotes its standbys of the killed
    /// one's partitions (nothing downloaded, only the lag replayed).
    Standby {
        #[command(flatten)]
        args: ScenarioArgs,
    },
    /// Changes the partition count through reshards of the state: the group
    /// runs, stops, its state is resharded into the next count, the input
    /// moves to a new topic with that count and the group carries on (each
    /// generation checked against one model of the whole history).
    Reshard {
        #[command(flatten)]
        servers: Servers,
        /// The partition counts, one generation each.
        #[arg(long, value_delimiter = ',', default_value = "6,12,4")]
        layout: Vec<i32>,
        /// Input events per second.
        #[arg(long, default_value_t = 800)]
        rate: u64,
        /// Seconds each phase lets the group settle.
        #[arg(long, default_value_t = 3)]
        settle_secs: u64,
    },
    /// Time to ready of a moved partition: handoff snapshot vs full replay.
    Bench {
        #[command(flatten)]
        servers: Servers,
        /// Keys in the partition.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
    },
}

/// A scenario's servers and pace.
#[derive(clap::Args, Debug)]
struct ScenarioArgs {
    #[command(flatten)]
    servers: Servers,
    /// Input partitions.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Input events per second.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Seconds each phase lets the group settle.
    #[arg(long, default_value_t = 4)]
    settle_secs: u64,
}

impl ScenarioArgs {
    /// The scenario these arguments describe, under a fresh id starting
    /// with `prefix`.
    fn config(self, prefix: &str) -> pageviews::Result<scenario::ScenarioConfig> {
        self.servers
            .scenario(prefix, self.partitions, self.rate, self.settle_secs)
    }
}

/// The servers a scenario or bench runs against, and where it works.
#[derive(clap::Args, Debug)]
struct Servers {
    /// Kafka bootstrap servers.
    #[arg(long, env = "STATESNAP_TEST_KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// Repository URL (a prefix of its own is used under it).
    #[arg(long, env = "STATESNAP_TEST_S3_URL")]
    repo: String,
    /// Working directory (default: a new temporary one).
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl Servers {
    /// A run under a fresh id starting with `prefix`: the id, the
    /// repository prefix of its own, and the working directory.
    fn run(self, prefix: &str) -> (String, String, PathBuf) {
        let id = run_id(prefix);
        let repo = format!("{}/{id}", self.repo.trim_end_matches('/'));
        let dir = self.dir.unwrap_or_else(|| std::env::temp_dir().join(&id));
        (id, repo, dir)
    }

    /// A scenario of 3 000 users on `partitions` partitions.
    fn scenario(
        self,
        prefix: &str,
        partitions: i32,
        rate: u64,
        settle_secs: u64,
    ) -> pageviews::Result<scenario::ScenarioConfig> {
        let bootstrap = self.bootstrap.clone();
        let (app_id, repo, dir) = self.run(prefix);
        eprintln!("scenario `{app_id}` in {}", dir.display());
        Ok(scenario::ScenarioConfig {
            bin: std::env::current_exe()?,
            bootstrap,
            repo,
            dir,
            app_id,
            partitions,
            generation: 0,
            users: 3000,
            rate,
            settle: Duration::from_secs(settle_secs),
            session_timeout: Duration::from_secs(6),
            env: Vec::new(),
            standbys: 0,
        })
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: the scenarios read these logs
        // from files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// A name no earlier run used: topics, group and repository prefix of a run.
fn run_id(prefix: &str) -> String {
    format!("{prefix}-{}", ulid_like())
}

#[allow(clippy::disallowed_methods)] // a unique name, not a timestamp anyone reads
fn ulid_like() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{t:x}{:x}", std::process::id())
}

fn run(cli: Cli) -> pageviews::Result<()> {
    match cli.command {
        Cmd::Run {
            name,
            bootstrap,
            repo,
            app_id,
            input,
            output,
            partitions,
            input_generation,
            data_dir,
            report,
            snapshot_every_ms,
            session_timeout_ms,
            batch,
            assignment,
            standbys,
        } => app::run(
            AppConfig {
                name,
                bootstrap,
                repo,
                app_id,
                input,
                output,
                partitions,
                generation: input_generation,
                data_dir,
                report,
                snapshot_every: Duration::from_millis(snapshot_every_ms),
                session_timeout: Duration::from_millis(session_timeout_ms),
                batch,
                assignment,
                standbys,
            },
            Arc::new(AtomicBool::new(false)),
        ),
        Cmd::Scenario { args } => {
            let config = args.config("pv")?;
            let report = scenario::run(&config)?;
            println!("{}", scenario::table(&report));
            println!(
                "exact: every partition's state and the de-duplicated output equal the single-process model"
            );
            Ok(())
        }
        Cmd::Standby { args } => {
            let config = scenario::ScenarioConfig {
                standbys: 1,
                ..args.config("pvs")?
            };
            let report = scenario::run_standby(&config)?;
            println!("{}", scenario::table(&report));
            for (p, kind, replayed) in &report.killed_reopens {
                println!("killed process's partition {p}: {kind}, {replayed} records replayed");
            }
            println!(
                "exact: every partition's state and the de-duplicated output equal the single-process model"
            );
            Ok(())
        }
        Cmd::Reshard {
            servers,
            layout,
            rate,
            settle_secs,
        } => {
            if layout.len() < 2 || layout.iter().any(|p| *p < 1) {
                return Err("--layout needs two or more partition counts, each at least 1".into());
            }
            let config = servers.scenario("pvr", layout[0], rate, settle_secs)?;
            let generations = scenario::run_reshard(&config, &layout)?;
            println!("{}", scenario::reshard_table(&generations));
            println!(
                "exact: each generation's state and de-duplicated output equal the single-process \
                 model of every generation's input"
            );
            Ok(())
        }
        Cmd::Bench { servers, keys } => {
            let bootstrap = servers.bootstrap.clone();
            let (app_id, repo, dir) = servers.run("pvbench");
            let runtime = tokio::runtime::Runtime::new()?;
            let result = runtime.block_on(bench::handoff(&bench::HandoffConfig {
                bootstrap,
                repo,
                dir: dir.clone(),
                app_id,
                keys,
            }))?;
            println!("{result}");
            let _ = std::fs::remove_dir_all(dir);
            Ok(())
        }
    }
}
