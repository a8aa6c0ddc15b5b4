//! A shared bandwidth limit for blob transfers: a token bucket in bytes,
//! drawn by every upload and download of every repository clone that
//! shares it (the runtime's transfer budget across all stores).

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Bytes per second for all transfers sharing this limit, with a burst of
/// a tenth of a second (at least 64 KiB). A transfer takes its bytes as a
/// debt and sleeps until the bucket has refilled it, so the long-run rate
/// is the limit whatever the chunk sizes.
#[derive(Debug)]
pub struct BandwidthLimit {
    bytes_per_sec: f64,
    burst: f64,
    bucket: Mutex<(f64, Instant)>,
    taken: std::sync::atomic::AtomicU64,
}

impl BandwidthLimit {
    /// A limit of `bytes_per_sec` (at least 1).
    pub fn new(bytes_per_sec: u64) -> Self {
        let rate = bytes_per_sec.max(1) as f64;
        let burst = (rate / 10.0).max(64.0 * 1024.0);
        BandwidthLimit {
            bytes_per_sec: rate,
            burst,
            bucket: Mutex::new((burst, Instant::now())),
            taken: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The limit, bytes per second.
    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec as u64
    }

    /// Bytes taken so far (every transfer under this limit).
    pub fn bytes_taken(&self) -> u64 {
        self.taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes `bytes` from the bucket, waiting as long as that puts it in
    /// debt.
    pub async fn take(&self, bytes: u64) {
        self.taken
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        let wait = self.reserve(bytes, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Refills the bucket up to `now`, takes `bytes`, and says how long the
    /// caller must wait for the debt to be repaid.
    fn reserve(&self, bytes: u64, now: Instant) -> Duration {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let refill = now.saturating_duration_since(b.1).as_secs_f64() * self.bytes_per_sec;
        b.0 = (b.0 + refill).min(self.burst) - bytes as f64;
        b.1 = b.1.max(now);
        if b.0 < 0.0 {
            Duration::from_secs_f64(-b.0 / self.bytes_per_sec)
        } else {
            Duration::ZERO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within the burst nothing waits; past it, n bytes cost n / rate
    /// seconds of waiting; a pause refills the bucket up to the burst only.
    #[test]
    fn transfers_past_the_burst_wait_for_their_bytes() {
        let rate = 1u64 << 20; // 1 MiB/s, burst 104 857.6 B
        let l = BandwidthLimit::new(rate);
        let t0 = l.bucket.lock().unwrap().1;
        assert_eq!(l.reserve(100_000, t0), Duration::ZERO);
        let wait = l.reserve(rate, t0).as_secs_f64();
        let expected = (rate as f64 + 100_000.0 - l.burst) / rate as f64;
        assert!(
            (wait - expected).abs() < 1e-6,
            "waited {wait} expected {expected}"
        );
        // Once the debt is repaid (at t0 + wait) a small take is free again.
        let repaid = t0 + Duration::from_secs_f64(expected);
        assert_eq!(
            l.reserve(1, repaid + Duration::from_millis(1)),
            Duration::ZERO
        );
        // A long pause refills only the burst.
        let later = repaid + Duration::from_secs(100);
        assert_eq!(l.reserve(l.burst as u64, later), Duration::ZERO);
        assert!(l.reserve(rate / 10, later) > Duration::from_millis(90));
    }
}
