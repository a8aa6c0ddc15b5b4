//! Where background snapshots run: a small tokio runtime the manager owns,
//! on threads of lower CPU priority, so that encoding, hashing and
//! uploading a snapshot take the processor only when the threads that
//! process records do not need it (RocksDB lowers its compaction threads'
//! priority for the same reason).
//!
//! Handoff snapshots ([`super::StateHandle::close`]) and restores run on
//! the caller's runtime at its priority: someone waits for them.

use std::sync::Arc;

use crate::error::{Error, Result};

/// How the manager runs background snapshots and maintenance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackgroundOptions {
    /// Worker threads of the background runtime; `0` runs background work
    /// on the runtime that built the manager, at its priority. Default 1:
    /// CPU-heavy steps (encoding, hashing) also use tokio's blocking
    /// threads of that runtime, which get the same priority.
    pub threads: usize,
    /// Lower the background threads' CPU priority (Linux: a nice value of
    /// about 10, where the scheduler gives a thread of nice 0 about ten
    /// times the CPU share). Default on. Ignored where the platform does
    /// not allow it (a debug event says so).
    pub low_priority: bool,
}

impl Default for BackgroundOptions {
    fn default() -> Self {
        BackgroundOptions {
            threads: 1,
            low_priority: true,
        }
    }
}

/// The manager's background runtime, shut down without waiting when the
/// manager is dropped (its tasks are cancelled first; see
/// [`super::StateManager::shutdown`] for draining).
#[derive(Debug)]
pub(super) struct Background {
    own: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl Background {
    /// Starts the runtime, or borrows `caller`'s when `options.threads` is 0.
    pub(super) fn start(
        options: BackgroundOptions,
        caller: tokio::runtime::Handle,
    ) -> Result<Self> {
        if options.threads == 0 {
            return Ok(Background {
                own: None,
                handle: caller,
            });
        }
        let low = options.low_priority;
        let logged = Arc::new(std::sync::Once::new());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads)
            .thread_name("statesnap-background")
            .on_thread_start(move || {
                if low {
                    lower_priority(&logged);
                }
            })
            .enable_all()
            .build()
            .map_err(|e| {
                Error::transient("cannot start the background runtime's threads").with_source(e)
            })?;
        Ok(Background {
            handle: rt.handle().clone(),
            own: Some(rt),
        })
    }

    pub(super) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // Dropping a runtime blocks until its workers stop, which is not
        // allowed inside async code, where a manager is often dropped.
        if let Some(rt) = self.own.take() {
            rt.shutdown_background();
        }
    }
}

/// The crossplatform priority (0 = lowest, 99 = highest) background
/// threads get: on Linux a positive nice value of about 10.
const LOW: u8 = 25;

fn lower_priority(logged: &std::sync::Once) {
    use thread_priority::{ThreadPriority, ThreadPriorityValue};
    let result = ThreadPriorityValue::try_from(LOW)
        .map_err(|e| format!("{e:?}"))
        .and_then(|v| {
            thread_priority::set_current_thread_priority(ThreadPriority::Crossplatform(v))
                .map_err(|e| format!("{e:?}"))
        });
    if let Err(e) = result {
        logged.call_once(|| {
            tracing::debug!(error = %e, "cannot lower the background threads' priority; they run at normal priority");
        });
    }
}
