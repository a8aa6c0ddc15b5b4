//! What a capture costs the writer of an in-memory store, by entry layout
//! (`cargo bench -p statesnap --all-features --bench map_layout`).
//!
//! The in-memory store keeps a persistent map (`imbl::OrdMap`); a capture
//! is a clone of it, after which the first write to each leaf copies that
//! leaf. This bench fills a map with 1 M entries (16-byte keys, 96-byte
//! values), then times 400 000 random overwrites with no clone held and
//! with one held (as while a snapshot is written), for three layouts:
//! `Bytes` keys and values (what `MemoryStore` held before its slots),
//! inline fixed-size arrays (what its slots hold for short keys and
//! values, `src/store/slot.rs`), and `Bytes` keys with `Arc<[u8]>` values.
//! It also times dropping the held version. Prints a table; no criterion (one
//! large run per case says more than many small ones here).
//!
//! `STATESNAP_BENCH_MAP_KEYS` sets the size (default 1 000 000; 50 000
//! under `cargo test`).
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use imbl::OrdMap;
use statesnap::bench::SplitMix64;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn key_bytes(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..15].copy_from_slice(format!("user-{i:010}").as_bytes());
    k
}

fn value_bytes(seed: u64) -> [u8; 96] {
    let mut v = [0u8; 96];
    for c in v.chunks_mut(8) {
        c.copy_from_slice(&seed.to_le_bytes());
    }
    v
}

/// `b` in `Bytes`' shared representation: a `Bytes` made from a `Vec` is
/// "promotable" and allocates its shared header on its first clone — which,
/// in a persistent map, is the leaf copy after a capture. Cloning once here
/// moves that allocation to the insert.
fn shared(b: Bytes) -> Bytes {
    drop(b.clone());
    b
}

/// ns per overwrite without and with a held clone, and the drop time.
fn run<K: Clone + Ord, V: Clone>(n: u64, mk: impl Fn(u64, u64) -> (K, V)) -> (f64, f64, Duration) {
    let writes = (n * 2 / 5) as usize;
    let mut m: OrdMap<K, V> = (0..n).map(|i| mk(i, 0)).collect();
    let mut free = Vec::new();
    let mut held = Vec::new();
    let mut drops = Vec::new();
    for round in 0..4u64 {
        let capture = round % 2 == 1;
        let mut rng = SplitMix64(round + 3);
        let clone = capture.then(|| m.clone());
        let t = Instant::now();
        for _ in 0..writes {
            let (k, v) = mk(rng.next_u64() % n, rng.next_u64());
            m.insert(k, v);
        }
        let ns = t.elapsed().as_nanos() as f64 / writes as f64;
        let t = Instant::now();
        drop(clone);
        if capture {
            held.push(ns);
            drops.push(t.elapsed());
        } else {
            free.push(ns);
        }
    }
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    (avg(&free), avg(&held), drops.iter().sum::<Duration>() / 2)
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let n = common::env_u64(
        "STATESNAP_BENCH_MAP_KEYS",
        if benching { 1_000_000 } else { 50_000 },
    );
    println!(
        "{n} entries, {} random overwrites per round, 2 rounds each",
        n * 2 / 5
    );
    println!("layout                        ns/write  with a clone held  added   drop held");
    let rows = [
        (
            "Bytes key, Bytes value",
            run(n, |i, s| {
                (
                    Bytes::copy_from_slice(&key_bytes(i)),
                    Bytes::from(value_bytes(s).to_vec()),
                )
            }),
        ),
        (
            "Bytes, made shared on insert",
            run(n, |i, s| {
                (
                    shared(Bytes::copy_from_slice(&key_bytes(i))),
                    shared(Bytes::from(value_bytes(s).to_vec())),
                )
            }),
        ),
        (
            "inline [u8;16], [u8;96]",
            run(n, |i, s| (key_bytes(i), value_bytes(s))),
        ),
        (
            "Bytes key, Arc<[u8]> value",
            run(n, |i, s| {
                (
                    Bytes::copy_from_slice(&key_bytes(i)),
                    Arc::<[u8]>::from(&value_bytes(s)[..]),
                )
            }),
        ),
    ];
    for (name, (free, held, drop)) in rows {
        println!(
            "{name:<28} {free:>9.0}  {held:>17.0}  {:>4.0} %  {:>7.1} ms",
            100.0 * (held - free) / free,
            drop.as_secs_f64() * 1e3
        );
    }
}
