//! Small private helpers.

use std::fmt;

/// Shows bytes as a string where printable, escaped otherwise, cut at 64.
pub(crate) struct DebugBytes<'a>(pub &'a [u8]);

impl fmt::Debug for DebugBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.0[..self.0.len().min(64)];
        write!(f, "b\"{}\"", shown.escape_ascii())?;
        if self.0.len() > 64 {
            write!(f, "..({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

/// Runs `f` on every item, at most `parallelism` at a time, and returns the
/// outputs in completion order, or the first error.
///
/// Unlike `buffer_unordered(..).try_collect()`, an error does not drop the
/// items still running: no new item starts, but those in flight are driven
/// to completion before the error is returned. That matters for local file
/// I/O: a dropped `tokio::fs` or `spawn_blocking` future keeps running on the
/// blocking pool, so a caller that removes its staging directory right
/// after the error could race with a download still creating files (or the
/// directory itself) in it.
pub(crate) async fn drain_bounded<T, U, E, Fut>(
    items: impl IntoIterator<Item = T>,
    parallelism: usize,
    f: impl Fn(T) -> Fut,
) -> std::result::Result<Vec<U>, E>
where
    Fut: std::future::Future<Output = std::result::Result<U, E>>,
{
    use futures::StreamExt;
    use std::sync::atomic::{AtomicBool, Ordering};

    let failed = AtomicBool::new(false);
    let (failed, f) = (&failed, &f);
    let results: Vec<Option<std::result::Result<U, E>>> = futures::stream::iter(items)
        .map(|item| async move {
            if failed.load(Ordering::Relaxed) {
                return None;
            }
            let r = f(item).await;
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            Some(r)
        })
        .buffer_unordered(parallelism.max(1))
        .collect()
        .await;
    let mut out = Vec::with_capacity(results.len());
    for r in results.into_iter().flatten() {
        out.push(r?);
    }
    Ok(out)
}

/// Runs blocking work (an fsync, a scan, a replay, a RocksDB call) where it
/// cannot stall an executor thread: on tokio's blocking pool when called
/// inside a runtime, inline otherwise (in the spirit of object_store's
/// `maybe_spawn_blocking`). Every blocking step of an async function goes
/// through here, so a current-thread runtime, or the background runtime's
/// single worker, keeps polling its other tasks meanwhile.
///
/// A caller that is dropped does not stop `f`: what it owns is dropped
/// when it returns.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.spawn_blocking(f).await.map_err(|e| {
            crate::Error::internal("a blocking task panicked or was cancelled").with_source(e)
        })?,
        Err(_) => f(),
    }
}

/// [`blocking`] for `std::io` work (local file I/O whose errors the caller
/// maps itself).
pub(crate) async fn blocking_io<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e))),
        Err(_) => f(),
    }
}

/// Runs blocking work that borrows from its caller (a replay reading a
/// borrowed changelog, a RocksDB open through a borrowed format) from an
/// async function: on a multi-thread runtime's worker through
/// `tokio::task::block_in_place`, so the worker's other tasks move to
/// another thread meanwhile; inline anywhere else (a blocking thread, no
/// runtime). On a current-thread runtime it cannot help: work that must not
/// stall one goes through [`blocking`] with what it owns.
pub(crate) fn blocking_here<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// splitmix64: the next value of the sequence whose state is `state` (a
/// small, fast, seeded generator for reproducible ids and workloads).
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Locks `m`, ignoring poisoning: for locks around plain slots, handles and
/// counters, which a panic while holding them cannot leave half-changed.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `pread` that fills `buf` completely.
pub(crate) fn read_exact_at(file: &std::fs::File, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, pos)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            let n = std::os::windows::fs::FileExt::seek_read(
                file,
                &mut buf[done..],
                pos + done as u64,
            )?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        Ok(())
    }
}

/// `pwrite` that writes `buf` completely.
pub(crate) fn write_all_at(file: &std::fs::File, buf: &[u8], pos: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::write_all_at(file, buf, pos)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            let n =
                std::os::windows::fs::FileExt::seek_write(file, &buf[done..], pos + done as u64)?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            done += n;
        }
        Ok(())
    }
}

/// One positional read (`pread`) into `buf`; returns how many bytes it
/// read (0 at end of file).
pub(crate) fn read_at(file: &std::fs::File, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_at(file, buf, pos)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::FileExt::seek_read(file, buf, pos)
    }
}

/// fsyncs directory `dir`, so that the entries created, renamed or removed
/// in it survive a crash. (Only Unix can open a directory to sync it; on
/// other platforms this does nothing.)
pub(crate) fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::drain_bounded;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn drain_bounded_finishes_running_items_and_starts_no_new_one_after_an_error() {
        let finished = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(AtomicUsize::new(0));
        let (fin, st) = (finished.clone(), started.clone());
        let r: Result<Vec<u32>, String> = drain_bounded(0..20u32, 4, move |i| {
            let (fin, st) = (fin.clone(), st.clone());
            async move {
                st.fetch_add(1, Ordering::SeqCst);
                if i == 1 {
                    return Err(format!("item {i} failed"));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                fin.fetch_add(1, Ordering::SeqCst);
                Ok(i)
            }
        })
        .await;
        assert_eq!(r.unwrap_err(), "item 1 failed");
        // Every item that started also finished before the error came back
        // (all but the failed one), and no item after the first four began.
        let s = started.load(Ordering::SeqCst);
        assert_eq!(finished.load(Ordering::SeqCst), s - 1, "started={s}");
        assert!((2..=4).contains(&s), "started={s}");
    }

    #[tokio::test]
    async fn drain_bounded_returns_every_output() {
        let r: Result<Vec<u32>, ()> =
            drain_bounded(0..50u32, 3, |i| async move { Ok(i * 2) }).await;
        let mut v = r.unwrap();
        v.sort();
        assert_eq!(v, (0..50).map(|i| i * 2).collect::<Vec<_>>());
    }
}
