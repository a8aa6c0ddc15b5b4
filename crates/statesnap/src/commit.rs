//! The point of no return of an operation that commits at its end.
//!
//! A restore into a directory builds the whole store beside its target and
//! then moves it into place with one rename: before the rename a cancel
//! (Ctrl-C, SIGTERM, a dropped future) leaves the target as it was; after
//! it the store is restored and the operation has succeeded, whatever
//! arrives next. A [`CommitGate`] makes "cancel" and "commit" one decision:
//! the operation [`enter`](CommitGate::enter)s the gate just before its
//! commit step, the canceller asks [`cancel`](CommitGate::cancel), and
//! whichever comes first wins under one lock. A canceller told that the
//! commit has begun must let the operation finish and report its real
//! outcome; an operation told that a cancel came first must not commit.
//!
//! The gate is shared (`Arc`): the CLI creates one per command, hands it to
//! the library through the operation's options
//! ([`crate::RestoreOptions::commit_gate`]), and its signal handler calls
//! `cancel`.

use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::{Error, ErrorKind, Result};

/// Where an operation stands with respect to its commit step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateState {
    /// Neither a cancel nor the commit has happened yet.
    Open,
    /// A cancel came first: the operation will not commit.
    Cancelled,
    /// The operation entered its commit step: a cancel can no longer stop
    /// it, and its outcome (success, or the error of the commit step
    /// itself) is the one to report.
    Committing,
}

/// A function run at the start of [`CommitGate::enter`], before the
/// decision is taken (see [`CommitGate::set_before_enter`]).
pub type EnterHook = Box<dyn Fn(&CommitGate) + Send + Sync>;

/// Decides, once and atomically, whether an operation is cancelled or
/// commits. See the [module docs](self).
pub struct CommitGate {
    state: Mutex<Inner>,
    changed: Condvar,
    before_enter: OnceLock<EnterHook>,
}

impl std::fmt::Debug for CommitGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitGate")
            .field("state", &self.state())
            .field("before_enter", &self.before_enter.get().is_some())
            .finish()
    }
}

#[derive(Debug)]
struct Inner {
    state: GateState,
    /// Whether [`CommitGate::cancel`] was ever called (even too late).
    cancel_requested: bool,
}

impl Default for CommitGate {
    fn default() -> Self {
        Self::new()
    }
}

impl CommitGate {
    /// An open gate.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(Inner {
                state: GateState::Open,
                cancel_requested: false,
            }),
            changed: Condvar::new(),
            before_enter: OnceLock::new(),
        }
    }

    /// Runs `hook` at the start of every [`CommitGate::enter`], before the
    /// decision: a test holds the operation there (at the last moment a
    /// cancel can still win) and signals it, to force that interleaving
    /// instead of hoping a timer hits it. Set once; a second call is
    /// ignored.
    pub fn set_before_enter(&self, hook: EnterHook) {
        let _ = self.before_enter.set(hook);
    }

    /// Called by the operation just before its commit step (the rename,
    /// the put of the manifest). `Ok`: the commit may proceed and no
    /// cancel will be reported from now on. `Err` (`cancelled`): a cancel
    /// came first; the operation must not commit and should clean up.
    /// Entering twice is allowed (an operation with several commit steps
    /// enters before the first).
    pub fn enter(&self) -> Result<()> {
        if let Some(hook) = self.before_enter.get() {
            hook(self);
        }
        let mut inner = crate::util::lock(&self.state);
        let r = match inner.state {
            GateState::Cancelled => Err(Error::new(
                ErrorKind::Cancelled,
                "cancelled before the commit step: nothing was committed",
            )),
            GateState::Open | GateState::Committing => {
                inner.state = GateState::Committing;
                Ok(())
            }
        };
        self.changed.notify_all();
        r
    }

    /// Asks the operation to stop. `true`: the cancel won; the operation
    /// will not commit (stop it, and report it cancelled). `false`: the
    /// operation has entered its commit step; let it finish and report
    /// what it returns.
    pub fn cancel(&self) -> bool {
        let mut inner = crate::util::lock(&self.state);
        inner.cancel_requested = true;
        let won = match inner.state {
            GateState::Open | GateState::Cancelled => {
                inner.state = GateState::Cancelled;
                true
            }
            GateState::Committing => false,
        };
        self.changed.notify_all();
        won
    }

    /// Where the operation stands.
    pub fn state(&self) -> GateState {
        crate::util::lock(&self.state).state
    }

    /// Blocks until [`CommitGate::cancel`] has been called (whether or not
    /// it won), or `timeout` passes; returns whether it was called. For
    /// tests that force an interleaving: an operation held at its commit
    /// step waits here for the signal the test sends.
    pub fn wait_for_cancel_request(&self, timeout: Duration) -> bool {
        let inner = crate::util::lock(&self.state);
        let (inner, _) = self
            .changed
            .wait_timeout_while(inner, timeout, |i| !i.cancel_requested)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.cancel_requested
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_cancel_and_enter_wins() {
        let g = CommitGate::new();
        assert!(g.cancel());
        assert_eq!(
            g.enter().expect_err("cancelled").kind(),
            ErrorKind::Cancelled
        );
        assert_eq!(g.state(), GateState::Cancelled);

        let g = CommitGate::new();
        g.enter().expect("open");
        assert!(!g.cancel(), "a cancel after the commit began must lose");
        assert_eq!(g.state(), GateState::Committing);
        g.enter().expect("entering again is allowed");
    }

    #[test]
    fn a_held_operation_sees_a_cancel_request_from_another_thread() {
        let g = std::sync::Arc::new(CommitGate::new());
        g.enter().expect("open");
        let g2 = g.clone();
        let t = std::thread::spawn(move || g2.cancel());
        assert!(g.wait_for_cancel_request(Duration::from_secs(60)));
        assert!(!t.join().expect("join"));
    }

    #[test]
    fn racing_cancels_and_enters_always_agree() {
        for _ in 0..200 {
            let g = std::sync::Arc::new(CommitGate::new());
            let g2 = g.clone();
            let canceller = std::thread::spawn(move || g2.cancel());
            let entered = g.enter().is_ok();
            let cancelled = canceller.join().expect("join");
            assert_ne!(entered, cancelled, "exactly one side wins");
        }
    }
}
