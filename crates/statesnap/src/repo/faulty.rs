//! A fault-injecting [`ObjectStore`] decorator for tests: seeded transient
//! errors, lost acknowledgements, truncated writes, latency, shuffled
//! listings, "crash after N operations", and a pause point that lets a test
//! run something else (a full gc) between two operations of a writer.
//!
//! Every trait method is implemented explicitly
//! (`#[deny(clippy::missing_trait_methods)]`), so a default can never route
//! around the faults.
//!
//! One *operation* is one call of a trait method, one location of a
//! `delete_stream`, or one `put_part`/`complete`/`abort` of a multipart
//! upload. Operation indices are taken synchronously, in call order, so a
//! test on a current-thread runtime sees the same sequence on every run.
//!
//! Faults and what they model:
//! * `error_probability`: the request fails before reaching the store (503).
//! * `lost_ack_probability`: a write is applied, then an error is returned
//!   (timeout after the store committed).
//! * `truncate_probability`: a `put` stores only a prefix of its payload and
//!   errors. Real object stores never do this (a put is atomic); it models a
//!   non-atomic backend or bit rot so readers' verification is exercised.
//!   Multipart uploads stay honest: an interrupted upload leaves nothing.
//! * `crash_after = n`: operations with index `>= n` fail without reaching
//!   the store, like a process that died after its `n`th request.

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// What to inject.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultConfig {
    /// PRNG seed.
    pub seed: u64,
    /// Probability that an operation fails before reaching the store.
    pub error_probability: f64,
    /// Probability that a write is applied and then reported as failed.
    pub lost_ack_probability: f64,
    /// Probability that a `put` stores a truncated payload and fails.
    pub truncate_probability: f64,
    /// Added latency per operation, uniformly in `[min, max]`.
    pub latency: Option<(Duration, Duration)>,
    /// Operations with index `>= n` fail.
    pub crash_after: Option<u64>,
    /// Return listings in a random order.
    pub shuffle_listings: bool,
}

#[derive(Debug)]
struct State {
    cfg: Mutex<FaultConfig>,
    rng: Mutex<u64>,
    ops: AtomicU64,
    pause: Mutex<Option<Pause>>,
    log: Mutex<Vec<String>>,
}

#[derive(Debug)]
struct Pause {
    at: u64,
    reached: Option<oneshot::Sender<()>>,
    resume: Option<oneshot::Receiver<()>>,
}

/// Lets a test wait until the paused operation is reached, then resume it.
#[derive(Debug)]
pub struct PauseHandle {
    reached: oneshot::Receiver<()>,
    resume: oneshot::Sender<()>,
}

impl PauseHandle {
    /// Waits until the writer is paused before the chosen operation; `false`
    /// if the store was dropped or the pause was replaced (never reached).
    pub async fn reached(&mut self) -> bool {
        (&mut self.reached).await.is_ok()
    }
    /// Lets the paused operation proceed.
    pub fn resume(self) {
        let _ = self.resume.send(());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Decision {
    lost_ack: bool,
    truncate: Option<f64>,
    latency: Option<Duration>,
    pause: bool,
}

fn injected(what: &str, op: &str, index: u64, path: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: format!("injected {what} op=`{op}` index={index} path=`{path}`").into(),
    }
}

impl State {
    fn next_f64(&self) -> f64 {
        let mut s = lock(&self.rng);
        // xorshift64*
        let mut x = *s;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *s = x;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Takes an operation index and decides its fate, synchronously.
    fn decide(
        &self,
        op: &str,
        path: &str,
        is_write: bool,
    ) -> (u64, object_store::Result<Decision>) {
        let index = self.ops.fetch_add(1, Ordering::SeqCst);
        lock(&self.log).push(format!("{index} {op} {path}"));
        let cfg = lock(&self.cfg).clone();
        let mut d = Decision::default();
        {
            let p = lock(&self.pause);
            d.pause = p.as_ref().is_some_and(|p| p.at == index);
        }
        if let Some((lo, hi)) = cfg.latency {
            let span = hi.saturating_sub(lo).as_secs_f64();
            d.latency = Some(lo + Duration::from_secs_f64(span * self.next_f64()));
        }
        if cfg.crash_after.is_some_and(|n| index >= n) {
            return (index, Err(injected("crash", op, index, path)));
        }
        if cfg.error_probability > 0.0 && self.next_f64() < cfg.error_probability {
            return (index, Err(injected("error", op, index, path)));
        }
        if is_write {
            if cfg.lost_ack_probability > 0.0 && self.next_f64() < cfg.lost_ack_probability {
                d.lost_ack = true;
            } else if cfg.truncate_probability > 0.0 && self.next_f64() < cfg.truncate_probability {
                d.truncate = Some(self.next_f64());
            }
        }
        (index, Ok(d))
    }

    async fn wait(&self, d: &Decision) {
        if d.pause {
            let (reached, resume) = {
                let mut p = lock(&self.pause);
                match p.as_mut() {
                    Some(p) => (p.reached.take(), p.resume.take()),
                    None => (None, None),
                }
            };
            if let Some(tx) = reached {
                let _ = tx.send(());
            }
            if let Some(rx) = resume {
                let _ = rx.await;
            }
        }
        if let Some(l) = d.latency
            && !l.is_zero()
        {
            tokio::time::sleep(l).await;
        }
    }

    fn shuffle<T>(&self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_f64() * (i + 1) as f64) as usize;
            v.swap(i, j.min(i));
        }
    }
}

/// The fault-injecting store. Clone-cheap handle state is shared.
#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    state: Arc<State>,
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl FaultyStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, cfg: FaultConfig) -> Self {
        let seed = if cfg.seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            cfg.seed
        };
        FaultyStore {
            inner,
            state: Arc::new(State {
                cfg: Mutex::new(cfg),
                rng: Mutex::new(seed),
                ops: AtomicU64::new(0),
                pause: Mutex::new(None),
                log: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.inner)
    }

    /// Operations started so far.
    pub fn ops(&self) -> u64 {
        self.state.ops.load(Ordering::SeqCst)
    }

    /// `"<index> <op> <path>"` for every operation so far.
    pub fn op_log(&self) -> Vec<String> {
        lock(&self.state.log).clone()
    }

    /// Replaces the configuration (the PRNG state is kept).
    pub fn set_config(&self, cfg: FaultConfig) {
        *lock(&self.state.cfg) = cfg;
    }

    /// Sets or clears "crash after n operations".
    pub fn set_crash_after(&self, n: Option<u64>) {
        lock(&self.state.cfg).crash_after = n;
    }

    /// Pauses the operation with index `at` before it runs.
    pub fn pause_before(&self, at: u64) -> PauseHandle {
        let (reached_tx, reached_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        *lock(&self.state.pause) = Some(Pause {
            at,
            reached: Some(reached_tx),
            resume: Some(resume_rx),
        });
        PauseHandle {
            reached: reached_rx,
            resume: resume_tx,
        }
    }

    fn error_stream<T: Send + 'static>(
        e: object_store::Error,
    ) -> BoxStream<'static, object_store::Result<T>> {
        futures::stream::once(async move { Err(e) }).boxed()
    }

    fn list_via(
        &self,
        op: &'static str,
        prefix: Option<&Path>,
        make: impl FnOnce(&Arc<dyn ObjectStore>) -> BoxStream<'static, object_store::Result<ObjectMeta>>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let path = prefix.map(|p| p.to_string()).unwrap_or_default();
        let (_, decision) = self.state.decide(op, &path, false);
        let d = match decision {
            Ok(d) => d,
            Err(e) => return Self::error_stream(e),
        };
        let inner_stream = make(&self.inner);
        let state = Arc::clone(&self.state);
        futures::stream::once(async move {
            state.wait(&d).await;
            let mut items: Vec<object_store::Result<ObjectMeta>> = inner_stream.collect().await;
            if lock(&state.cfg).shuffle_listings {
                state.shuffle(&mut items);
            }
            futures::stream::iter(items)
        })
        .flatten()
        .boxed()
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let (index, d) = self.state.decide("put", location.as_ref(), true);
        let d = d?;
        self.state.wait(&d).await;
        if let Some(frac) = d.truncate {
            let full: Bytes = payload.into();
            let cut = ((full.len() as f64) * frac) as usize;
            let cut = cut.min(full.len().saturating_sub(1));
            self.inner
                .put_opts(location, PutPayload::from(full.slice(..cut)), opts)
                .await?;
            return Err(injected("truncated write", "put", index, location.as_ref()));
        }
        let r = self.inner.put_opts(location, payload, opts).await?;
        if d.lost_ack {
            return Err(injected("lost ack", "put", index, location.as_ref()));
        }
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let (_, d) = self.state.decide("put_multipart", location.as_ref(), false);
        let d = d?;
        self.state.wait(&d).await;
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload {
            inner: upload,
            state: Arc::clone(&self.state),
            path: location.to_string(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let op = if options.head { "head" } else { "get" };
        let (_, d) = self.state.decide(op, location.as_ref(), false);
        let d = d?;
        self.state.wait(&d).await;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let (_, d) = self.state.decide("get_ranges", location.as_ref(), false);
        let d = d?;
        self.state.wait(&d).await;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let state = Arc::clone(&self.state);
        let inner = Arc::clone(&self.inner);
        locations
            .then(move |loc| {
                let state = Arc::clone(&state);
                let inner = Arc::clone(&inner);
                async move {
                    let p = loc?;
                    let (index, d) = state.decide("delete", p.as_ref(), true);
                    let d = d?;
                    state.wait(&d).await;
                    let mut s = inner.delete_stream(futures::stream::once(async { Ok(p) }).boxed());
                    let deleted =
                        s.try_next()
                            .await?
                            .ok_or_else(|| object_store::Error::Generic {
                                store: "FaultyStore",
                                source: "inner delete_stream yielded nothing".into(),
                            })?;
                    if d.lost_ack {
                        return Err(injected("lost ack", "delete", index, deleted.as_ref()));
                    }
                    Ok(deleted)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.list_via("list", prefix, |inner| inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.list_via("list_with_offset", prefix, |inner| {
            inner.list_with_offset(prefix, offset)
        })
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let path = prefix.map(|p| p.to_string()).unwrap_or_default();
        let (_, d) = self.state.decide("list_with_delimiter", &path, false);
        let d = d?;
        self.state.wait(&d).await;
        let mut r = self.inner.list_with_delimiter(prefix).await?;
        if lock(&self.state.cfg).shuffle_listings {
            self.state.shuffle(&mut r.objects);
            self.state.shuffle(&mut r.common_prefixes);
        }
        Ok(r)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let (index, d) = self.state.decide("copy", to.as_ref(), true);
        let d = d?;
        self.state.wait(&d).await;
        self.inner.copy_opts(from, to, options).await?;
        if d.lost_ack {
            return Err(injected("lost ack", "copy", index, to.as_ref()));
        }
        Ok(())
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        let (index, d) = self.state.decide("rename", to.as_ref(), true);
        let d = d?;
        self.state.wait(&d).await;
        self.inner.rename_opts(from, to, options).await?;
        if d.lost_ack {
            return Err(injected("lost ack", "rename", index, to.as_ref()));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    state: Arc<State>,
    path: String,
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let (_, d) = self.state.decide("put_part", &self.path, false);
        let state = Arc::clone(&self.state);
        // The inner part is only awaited if the fault allows it; an
        // unawaited part never becomes visible (the upload is incomplete).
        let part = self.inner.put_part(data);
        Box::pin(async move {
            let d = d?;
            state.wait(&d).await;
            part.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let (index, d) = self.state.decide("complete", &self.path, true);
        let d = d?;
        self.state.wait(&d).await;
        let r = self.inner.complete().await?;
        if d.lost_ack {
            return Err(injected("lost ack", "complete", index, &self.path));
        }
        Ok(r)
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        let (_, d) = self.state.decide("abort", &self.path, false);
        let d = d?;
        self.state.wait(&d).await;
        self.inner.abort().await
    }
}
