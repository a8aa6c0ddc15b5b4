//! Command-line arguments. Doc comments are the `--help` text.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

/// statesnap: durable key-value state for stream processors that recovers fast.
///
/// A store is a local cache of its changelog; snapshots copy the store's files
/// to a repository, tagged with the changelog offset they reflect. Restore is
/// the newest valid snapshot plus a replay of the changelog after it.
///
/// Exit codes: 0 ok; 1 internal error (a bug: please report it); 2 usage;
/// 3 config (bad input, missing credentials: fix it); 4 not found (no
/// repository there: `statesnap init --repo URL`; a store without
/// snapshots; a missing snapshot or key);
/// 5 corrupt (a check failed; `verify` found problems); 6 stale (valid data
/// that can no longer be used safely); 7 transient (unreachable server,
/// timeout, lock held: retry); 8 local I/O (permissions, full disk);
/// 9 already exists; 130 cancelled (Ctrl-C).
#[derive(Debug, Parser)]
#[command(name = "statesnap", version, about, long_about)]
pub struct Cli {
    /// Print machine-readable JSON on stdout instead of text (progress bars
    /// are hidden).
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a repository (the marker object `statesnap.json`).
    Init(RepoArgs),
    /// Every store partition in the repository: snapshots, newest offset,
    /// bytes named and bytes stored.
    Stores(RepoArgs),
    /// The snapshots of one store partition, oldest first.
    List(ListArgs),
    /// One snapshot's manifest.
    Show(ShowArgs),
    /// Check every blob's size and hash (in parallel); `--deep` also
    /// restores snapshots into a scratch directory and compares their
    /// logical digest. Exit code 5 when anything is wrong.
    Verify(VerifyArgs),
    /// The restore decision as a dry run: which source and why, bytes to
    /// fetch and reuse, records to replay, estimated time.
    Plan(PlanArgs),
    /// Restore a store partition into a directory: newest usable snapshot
    /// plus the changelog after it (falling back to older snapshots, then
    /// to a full replay).
    Restore(RestoreArgs),
    /// Apply a retention policy: drop snapshots outside it (their blobs are
    /// collected by gc after the grace period).
    Retain(RetainArgs),
    /// Collect blobs no snapshot names (two-phase: condemned first, deleted
    /// by a run at least the grace period later).
    Gc(GcArgs),
    /// Read one key from a snapshot, offline.
    Get(GetArgs),
    /// List keys and values of a snapshot, offline.
    Scan(ScanArgs),
    /// Keys added, removed and changed between two snapshots of a store.
    Diff(DiffArgs),
    /// Copy a snapshot to another store partition (blobs copied and
    /// verified, a new manifest): seed a blue/green deployment's store or
    /// take a copy to inspect.
    Clone(CloneArgs),
    /// Move every partition of a store into a new partition count (after
    /// the input topic's partition count changed): each key goes to the
    /// partition the partitioner names (Kafka's murmur2 by default), each
    /// target gets its own new changelog and a first snapshot at its end,
    /// so the resharded application starts without replaying anything.
    Reshard(ReshardArgs),
    /// The main job on embedded defaults: a stateful workload with
    /// background snapshots, a crash, and the store rebuilt two ways side
    /// by side — newest snapshot + changelog tail vs full replay — with
    /// times, bytes, records and logical digests.
    Demo(DemoArgs),
    /// The headline comparisons in one run: restore from snapshot vs full
    /// replay across history lengths, RocksDB snapshots vs BackupEngine and
    /// cp -r, the in-memory delta, throughput under background snapshots.
    /// Prints a table and writes bench.md, bench.json and an SVG chart.
    #[cfg(feature = "rocksdb")]
    Bench(BenchArgs),
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// A small run (about a minute) of the same measurements.
    #[arg(long)]
    pub quick: bool,
    /// Add a 16 M-key store (about 1.8 GB; needs 4x that free in the scratch
    /// directory) to the scale series.
    #[arg(long)]
    pub scale: bool,
    /// Where bench.md, bench.json and restore-vs-history.svg go.
    #[arg(long, value_name = "DIR", default_value = "statesnap-bench")]
    pub out: PathBuf,
    /// Where the stores, changelogs and repositories are built (removed at
    /// the end; default: the system's temporary directory). Pick a disk
    /// with a few GB free for a full run.
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
}

/// Where the repository is.
#[derive(Debug, Clone, Args)]
pub struct RepoArgs {
    /// Repository URL: file:///DIR, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX,
    /// az://CONTAINER/PREFIX; a plain path (/srv/repo, ./repo) is a local
    /// directory, as file:// of its absolute path. Credentials come from the
    /// environment as object_store reads them (AWS_*, GOOGLE_*, AZURE_*).
    #[arg(long, env = "STATESNAP_REPO", value_name = "URL", value_parser = parse_repo)]
    pub repo: String,
    /// Backend option KEY=VALUE (repeatable), e.g. -o endpoint=http://127.0.0.1:9000
    /// -o allow_http=true -o region=us-east-1.
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub options: Vec<(String, String)>,
    /// The longest a writer may take to commit a snapshot (the
    /// repository's `max_commit_duration`; writers default to 10m). gc
    /// refuses a grace period shorter than twice it: set it to what your
    /// writers use, never lower.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10m")]
    pub max_commit: Duration,
}

/// A store partition: `APPLICATION/STORE/PARTITION` (or dotted, as keys are
/// written in the repository).
#[derive(Debug, Clone, Args)]
pub struct StoreArg {
    /// The store partition, APPLICATION/STORE/PARTITION.
    #[arg(value_name = "STORE")]
    pub store: String,
}

#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    #[command(flatten)]
    pub store: StoreArg,
    /// The store's changelog (file://DIR or kafka://HOST:PORT/TOPIC/PARTITION):
    /// with it, each snapshot says whether a restore could use it.
    #[arg(long, value_name = "URL")]
    pub changelog: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    #[command(flatten)]
    pub store: StoreArg,
    /// Snapshot id, or `latest`.
    #[arg(value_name = "ID")]
    pub id: String,
    #[command(flatten)]
    pub live: LiveArg,
}

/// Which changelog incarnation `latest` means.
#[derive(Debug, Clone, Args)]
pub struct LiveArg {
    /// The store's changelog (file://DIR or kafka://HOST:PORT/TOPIC/PARTITION):
    /// `latest` is then the newest snapshot of its current incarnation, and
    /// an error if it has none. Without it, `latest` is the newest snapshot
    /// of the incarnation of the most recently created snapshot.
    #[arg(long, value_name = "URL")]
    pub changelog: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Only this store partition (default: every store).
    #[arg(value_name = "STORE")]
    pub store: Option<String>,
    /// Also restore each store's newest snapshot (or --snapshot) into a
    /// scratch directory and compare its logical digest.
    #[arg(long)]
    pub deep: bool,
    /// With --deep and a STORE: this snapshot instead of the newest (a
    /// plain verify checks every blob of every snapshot, so without --deep
    /// it is refused rather than ignored).
    #[arg(long, value_name = "ID", requires_all = ["store", "deep"])]
    pub snapshot: Option<String>,
    /// With --deep and a STORE: the store's changelog (file://DIR or
    /// kafka://HOST:PORT/TOPIC/PARTITION); the newest snapshot is then that
    /// of its current incarnation.
    #[arg(long, value_name = "URL", requires_all = ["store", "deep"])]
    pub changelog: Option<String>,
    /// Move bad blobs to the store's quarantine (the next snapshot uploads
    /// them again).
    #[arg(long)]
    pub quarantine: bool,
}

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    #[command(flatten)]
    pub store: StoreArg,
    /// The store's changelog: file://DIR or kafka://HOST:PORT/TOPIC/PARTITION.
    #[arg(long, value_name = "URL")]
    pub changelog: String,
    /// The local store directory a restore would reuse (default: none).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Point in time: the last changelog offset the result reflects.
    #[arg(long, value_name = "OFFSET")]
    pub at_offset: Option<u64>,
}

#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    #[command(flatten)]
    pub store: StoreArg,
    /// The store's changelog: file://DIR or kafka://HOST:PORT/TOPIC/PARTITION.
    #[arg(long, value_name = "URL")]
    pub changelog: String,
    /// Where the restored store goes (a RocksDB directory).
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// Point in time: the last changelog offset the result reflects.
    #[arg(long, value_name = "OFFSET")]
    pub at_offset: Option<u64>,
    /// Replace a non-empty target directory (its contents are deleted).
    #[arg(long)]
    pub force: bool,
    /// Ignore snapshots: rebuild by replaying the whole changelog.
    #[arg(long)]
    pub full_replay: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RetainArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Only this store partition (default: every store).
    #[arg(value_name = "STORE")]
    pub store: Option<String>,
    /// Keep the newest N snapshots (and what they depend on).
    #[arg(long, value_name = "N")]
    pub keep_last: Option<usize>,
    /// Keep snapshots younger than this (e.g. 7d, 12h, 30m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub keep_newer_than: Option<Duration>,
    /// Report what would go; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Blobs younger than this are never condemned (default 1h; at least
    /// twice --max-commit, 20m with its default).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1h")]
    pub grace: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Only this store partition (default: every store).
    #[arg(value_name = "STORE")]
    pub store: Option<String>,
    /// Report what would go; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Blobs younger than this are never condemned, and condemned blobs
    /// are deleted no earlier than this after (default 1h; at least twice
    /// --max-commit, 20m with its default).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1h")]
    pub grace: Duration,
}

/// Which snapshot to read.
#[derive(Debug, Clone, Args)]
pub struct SnapshotArg {
    /// Snapshot id (default: the newest).
    #[arg(long, value_name = "ID", default_value = "latest")]
    pub snapshot: String,
}

#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    #[command(flatten)]
    pub store: StoreArg,
    #[command(flatten)]
    pub snapshot: SnapshotArg,
    #[command(flatten)]
    pub live: LiveArg,
    /// The key (UTF-8; with --hex, hex digits).
    pub key: String,
    /// KEY is hex, and values print as hex.
    #[arg(long)]
    pub hex: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    #[command(flatten)]
    pub store: StoreArg,
    #[command(flatten)]
    pub snapshot: SnapshotArg,
    #[command(flatten)]
    pub live: LiveArg,
    /// Only keys starting with this (UTF-8; with --hex, hex digits).
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// At most this many pairs.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,
    /// Keys and values print as hex (and PREFIX is hex).
    #[arg(long)]
    pub hex: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    #[command(flatten)]
    pub store: StoreArg,
    /// The older snapshot id.
    #[arg(value_name = "ID1")]
    pub from: String,
    /// The newer snapshot id (or `latest`).
    #[arg(value_name = "ID2")]
    pub to: String,
    #[command(flatten)]
    pub live: LiveArg,
    /// Keys of each kind shown as a sample.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub sample: usize,
    /// Keys print as hex.
    #[arg(long)]
    pub hex: bool,
}

#[derive(Debug, Clone, Args)]
pub struct CloneArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The source store partition, APPLICATION/STORE/PARTITION.
    #[arg(long, value_name = "STORE")]
    pub from: String,
    /// The target store partition, APPLICATION/STORE/PARTITION.
    #[arg(long, value_name = "STORE")]
    pub to: String,
    /// The snapshot to copy (default: the newest).
    #[arg(long, value_name = "ID", default_value = "latest")]
    pub snapshot: String,
    /// The target's own changelog (file://DIR or
    /// kafka://HOST:PORT/TOPIC/PARTITION; it must be empty): the state is
    /// written into it and the target's first snapshot follows it — a
    /// blue/green deployment's store. Without it the copy keeps naming
    /// the source's changelog.
    #[arg(long, value_name = "URL")]
    pub changelog: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ReshardArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The source store, APPLICATION/STORE: every partition of it the
    /// repository holds (0..N, each with a snapshot).
    #[arg(long, value_name = "APP/STORE")]
    pub from: String,
    /// The target store, APPLICATION/STORE (another application or store
    /// name than the source).
    #[arg(long, value_name = "APP/STORE")]
    pub to: String,
    /// The target partition count M.
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub partitions: u32,
    /// Where each partition's changelog is, as a URL with `{topic}` (the
    /// store's `<application>-<store>-changelog`) and `{partition}` (also
    /// `{application}`, `{store}`): e.g. `kafka://HOST:PORT/{topic}/{partition}`
    /// or `file:///DIR/{topic}-{partition}`. The targets' new changelogs
    /// (empty; a Kafka topic is created with M partitions) and, unless
    /// --from-changelog-template, the sources'.
    #[arg(long, value_name = "URL")]
    pub changelog_template: String,
    /// The sources' changelogs, when not where --changelog-template says.
    #[arg(long, value_name = "URL")]
    pub from_changelog_template: Option<String>,
    /// How keys are placed: `murmur2` is Kafka's default partitioner for
    /// keyed records (Java client, librdkafka's murmur2_random).
    #[arg(long, default_value = "murmur2", value_parser = clap::builder::PossibleValuesParser::new(statesnap::reshard::PARTITIONERS))]
    pub partitioner: String,
    /// The targets' store format (`rocksdb` or `portable`; default: the
    /// sources').
    #[arg(long, value_name = "FORMAT")]
    pub to_format: Option<String>,
    /// Resume an interrupted reshard: targets that already hold records or
    /// snapshots are checked against this reshard's output (and refused
    /// if they differ) instead of refused outright.
    #[arg(long)]
    pub force: bool,
    /// Also rebuild every target from its new changelog alone and check it
    /// holds the same state (one more pass over the data).
    #[arg(long)]
    pub verify: bool,
    /// Print what would be done (sources, their snapshots and tails, the
    /// targets' changelogs) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Scratch directory for the restored sources and the built targets
    /// (must not exist; removed at the end). Default: under $TMPDIR.
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
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

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Working directory, relative to the current one (default: a new
    /// `statesnap-demo-*` under $TMPDIR); removed at the end unless --keep.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the working directory (store, changelog, repository) and print
    /// commands to try on it.
    #[arg(long)]
    pub keep: bool,
    /// Users (each has a count and a last-seen key).
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Events per user on average (the history the changelog holds).
    #[arg(long, default_value_t = 10)]
    pub updates_per_key: u64,
    /// Store type.
    #[arg(long, value_enum, default_value_t = default_store())]
    pub store: StoreKind,
    /// Repository URL instead of one in the working directory (e.g. an S3
    /// bucket: s3://BUCKET/PREFIX with -o options; a plain path is a local
    /// directory).
    #[arg(long, value_name = "URL", value_parser = parse_repo)]
    pub repo: Option<String>,
    /// Backend option KEY=VALUE for --repo (repeatable).
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub options: Vec<(String, String)>,
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

/// A repository URL as given, or a plain local path (no `SCHEME:`) as the
/// `file://` URL of its absolute path (relative to the current directory).
pub fn parse_repo(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("expected a repository URL or a directory path".to_owned());
    }
    // A scheme is letters, digits, `+-.` after a letter, then `:`; a Windows
    // drive letter (`C:`) is a path.
    let has_scheme = s.split_once(':').is_some_and(|(scheme, _)| {
        scheme.len() > 1
            && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    });
    if has_scheme {
        return Ok(s.to_owned());
    }
    let abs = std::path::absolute(s)
        .map_err(|e| format!("cannot make the repository path `{s}` absolute: {e}"))?;
    url::Url::from_file_path(&abs)
        .map(String::from)
        .map_err(|()| {
            format!(
                "cannot turn the repository path `{}` into a file:// URL",
                abs.display()
            )
        })
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

/// `90s`, `30m`, `12h`, `7d`, or a number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (digits, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("expected a duration like 90s, 30m, 12h or 7d, got `{s}`"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => {
            return Err(format!(
                "unknown duration unit `{unit}` in `{s}`; use s, m, h or d"
            ));
        }
    };
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse_duration("7w").is_err());
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn a_plain_repository_path_becomes_a_file_url() {
        assert_eq!(parse_repo("s3://b/p").unwrap(), "s3://b/p");
        assert_eq!(parse_repo("file:///srv/r").unwrap(), "file:///srv/r");
        assert_eq!(parse_repo("/srv/my repo").unwrap(), "file:///srv/my%20repo");
        let cwd = std::env::current_dir().unwrap();
        let rel = parse_repo("./x").unwrap();
        let back = url::Url::parse(&rel).unwrap().to_file_path().unwrap();
        assert_eq!(
            std::path::absolute(back).unwrap(),
            std::path::absolute(cwd.join("x")).unwrap()
        );
        assert!(parse_repo("").is_err());
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
