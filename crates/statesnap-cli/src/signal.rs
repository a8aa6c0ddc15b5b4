//! Cancellation: SIGINT (Ctrl-C) and SIGTERM (`timeout`, systemd,
//! Kubernetes) are handled alike, and what the command reports is what it
//! did.
//!
//! Every command runs under one [`CommitGate`] (see `statesnap::commit`).
//! A command that commits at its end (`restore` moving its store over the
//! target) enters the gate just before that step. A signal asks the gate to
//! cancel: before the commit the command is stopped and cleans up; after
//! it, the command finishes and its real outcome is reported (exit 0 and
//! the normal report for a restore that replaced its target). The decision
//! and the report are one: the signal path reports "cancelled" only when
//! the gate said the cancel won.
//!
//! Test seams (environment, for the CLI's own tests that force an
//! interleaving instead of hoping a timer hits it):
//! `STATESNAP_TEST_HOLD=before-commit` holds the command at the gate, just
//! before the decision, until a signal has arrived;
//! `STATESNAP_TEST_HOLD=after-commit` holds it after its commit step and
//! before its report, until a signal has arrived. Each prints
//! `statesnap: test hold at POINT` on stderr when it starts to wait.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use statesnap::commit::CommitGate;

use crate::args::Command;

/// The process's gate, shared by the command and the signal handler.
pub fn gate() -> Arc<CommitGate> {
    static GATE: OnceLock<Arc<CommitGate>> = OnceLock::new();
    GATE.get_or_init(|| {
        let gate = Arc::new(CommitGate::new());
        if hold_requested("before-commit") {
            gate.set_before_enter(Box::new(|g| hold(g, "before-commit")));
        }
        gate
    })
    .clone()
}

/// How long a test hold waits for its signal before going on.
const HOLD_LIMIT: Duration = Duration::from_secs(120);

fn hold_requested(point: &str) -> bool {
    std::env::var("STATESNAP_TEST_HOLD").is_ok_and(|v| v == point)
}

fn hold(gate: &CommitGate, point: &str) {
    eprintln!("statesnap: test hold at {point}");
    // Off the runtime's worker (a worker blocked here would keep a
    // one-core machine's runtime from delivering the very signal awaited).
    let wait = || gate.wait_for_cancel_request(HOLD_LIMIT);
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    };
}

/// The `after-commit` test hold: called by a command between its commit
/// step and its report.
pub fn after_commit() {
    if hold_requested("after-commit") {
        hold(&gate(), "after-commit");
    }
}

/// Paths removed once a cancelled command has stopped and every step it
/// started has ended (the runtime is gone): its temporary directories.
fn leftovers() -> &'static Mutex<Vec<PathBuf>> {
    static PATHS: OnceLock<Mutex<Vec<PathBuf>>> = OnceLock::new();
    PATHS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Removes `dir` if the command is cancelled (the demo's directory).
pub fn remove_on_cancel(dir: PathBuf) {
    leftovers()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(dir);
}

/// Called after a cancel, once the runtime has been dropped: removes what
/// [`remove_on_cancel`] registered. Returns the paths it could not remove.
pub fn clean_up_after_cancel() -> Vec<(PathBuf, std::io::Error)> {
    let paths = std::mem::take(
        &mut *leftovers()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let mut failed = Vec::new();
    for p in paths {
        match std::fs::remove_dir_all(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed.push((p, e)),
        }
    }
    failed
}

/// Which signal arrived.
#[derive(Debug, Clone, Copy)]
pub enum Signal {
    Interrupt,
    Terminate,
}

impl Signal {
    pub fn describe(self) -> &'static str {
        match self {
            Signal::Interrupt => "interrupted (Ctrl-C, SIGINT)",
            Signal::Terminate => "terminated (SIGTERM)",
        }
    }
}

/// The process's SIGINT and SIGTERM handlers: installed once, before the
/// command starts; from then on neither signal has its default action.
#[derive(Debug)]
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs both handlers (in a runtime). Fails only if one cannot be
    /// installed.
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// The next signal (`None` if the handlers were torn down).
    pub async fn next(&mut self) -> Option<Signal> {
        tokio::select! {
            s = self.int.recv() => s.map(|()| Signal::Interrupt),
            s = self.term.recv() => s.map(|()| Signal::Terminate),
        }
    }
}

/// What a cancelled `command` leaves behind: the sentence after
/// "the command was cancelled; ". Exactly what holds, command by command.
pub fn what_a_cancel_leaves(command: &Command) -> &'static str {
    match command {
        Command::Stores(_)
        | Command::List(_)
        | Command::Show(_)
        | Command::Plan(_)
        | Command::Get(_)
        | Command::Scan(_)
        | Command::Diff(_) => "it only reads: nothing was changed",
        Command::Verify(_) => {
            "it only reads (a deep check restores into a temporary directory, removed): nothing \
             was changed"
        }
        Command::Init(_) => {
            "the repository marker is written last and in one put: the repository is either \
             initialized or not, as `statesnap list` shows; run init again if it is not"
        }
        Command::Restore(_) => {
            "the target is as it was (the store is moved into place in one rename, which had not \
             happened) and the staging directory beside it is removed"
        }
        Command::Clone(_) => {
            "the target store has a new snapshot only if the cancel came during the manifest's \
             write, its last step (`statesnap list` shows whether it has); blobs copied without \
             a manifest are unreferenced until `statesnap gc` removes them; with --changelog, \
             records already appended stay in the new changelog: empty or recreate it before \
             cloning again"
        }
        Command::Retain(_) => {
            "snapshots already deleted stay deleted (each was one the policy deletes); run the \
             same command again to finish"
        }
        Command::Gc(_) => {
            "blobs already deleted stay deleted (each was unreferenced); run gc again to finish"
        }
        Command::Reshard(_) => {
            "target changelogs and the repository may hold part of the new partitions; run the \
             same command with --force to resume it (the targets are checked against this \
             reshard's output), and its scratch directory is removed"
        }
        Command::Demo(_) => "the demo's directory is removed (unless --keep)",
        #[cfg(feature = "rocksdb")]
        Command::Bench(_) => {
            "benchmark results printed so far stand; its temporary directories are removed"
        }
    }
}
