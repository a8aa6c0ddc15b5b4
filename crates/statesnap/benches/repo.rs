//! Repository benchmarks: blob put/get bandwidth (with hashing and
//! verification) to a local directory — and to the S3 server when
//! `STATESNAP_TEST_S3_URL` is set — and catalog listing cost.
//!
//! `STATESNAP_BENCH_SIZES_MIB` (default `1,64,256`) and
//! `STATESNAP_BENCH_PARALLELISM` (default `1,4,16`) trim the matrix.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use statesnap::conformance::repo::draft;
use statesnap::repo::{
    BlobHash, BlobRef, FileEntry, Manifest, Repository, SnapshotId, StoreKey, TransferOptions,
};

use common::{env_list, runtime, sum_of_runs};

/// `repo` moving blobs `p` at a time.
fn with_parallelism(repo: &Repository, p: usize) -> Repository {
    repo.clone().with_transfer(TransferOptions {
        parallelism: p,
        ..Default::default()
    })
}

/// How long `iters` uploads by `put` took, each timed alone; what each
/// uploads is deleted after it (untimed), so the next one uploads again
/// instead of finding the blobs there.
fn time_uploads(
    rt: &tokio::runtime::Runtime,
    repo: &Repository,
    sk: &StoreKey,
    iters: u64,
    put: impl Fn() -> Vec<BlobHash>,
) -> Duration {
    sum_of_runs(iters, |_| {
        let t = Instant::now();
        let hashes = put();
        let took = t.elapsed();
        for h in hashes {
            let key = statesnap::repo::paths::blob(sk, &h);
            rt.block_on(repo.object_store().delete(&key)).unwrap();
        }
        took
    })
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2).wrapping_add(1);
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

async fn target_repos() -> Vec<(&'static str, Repository, Option<tempfile::TempDir>)> {
    let mut out = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    let url = url::Url::from_directory_path(dir.path().join("repo"))
        .unwrap()
        .to_string();
    out.push((
        "local",
        Repository::init(&url, Default::default()).await.unwrap(),
        Some(dir),
    ));
    if let Ok(base) = std::env::var("STATESNAP_TEST_S3_URL") {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let url = format!("{}/b{}", base.trim_end_matches('/'), &id[..8]);
        out.push((
            "s3",
            Repository::init(&url, Default::default()).await.unwrap(),
            None,
        ));
    }
    out
}

fn blobs(c: &mut Criterion) {
    let rt = runtime();
    let sk = StoreKey::new("bench", "blobs", 0).unwrap();
    let repos = rt.block_on(target_repos());
    let src_dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("blob");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_millis(500));
    for mib in env_list("STATESNAP_BENCH_SIZES_MIB", &[1, 64, 256]) {
        let len = mib << 20;
        let src = src_dir.path().join(format!("src-{mib}"));
        std::fs::write(&src, data(len, mib as u64)).unwrap();
        group.throughput(Throughput::Bytes(len as u64));
        for (name, repo, _) in &repos {
            for p in env_list("STATESNAP_BENCH_PARALLELISM", &[1, 4, 16]) {
                let repo = with_parallelism(repo, p);
                let put = || {
                    vec![
                        rt.block_on(repo.blobs().put_blob_file(&sk, &src))
                            .unwrap()
                            .blob
                            .hash,
                    ]
                };
                group.bench_function(
                    BenchmarkId::new(format!("put_file_{name}_{mib}MiB"), format!("p{p}")),
                    |b| b.iter_custom(|iters| time_uploads(&rt, &repo, &sk, iters, put)),
                );
            }
            let out = rt.block_on(repo.blobs().put_blob_file(&sk, &src)).unwrap();
            let dest = src_dir.path().join(format!("dest-{mib}"));
            group.bench_function(
                BenchmarkId::new(format!("get_file_{name}_{mib}MiB"), "p1"),
                |b| {
                    b.iter(|| {
                        rt.block_on(repo.blobs().get_blob_to_file(&sk, &out.blob, &dest))
                            .unwrap()
                    })
                },
            );
        }
        // Many 1 MiB blobs with bounded parallelism.
        if mib == 1 {
            let files: Vec<_> = (0..32)
                .map(|i| {
                    let p = src_dir.path().join(format!("many-{i}"));
                    std::fs::write(&p, data(len, 1000 + i)).unwrap();
                    p
                })
                .collect();
            group.throughput(Throughput::Bytes(32 * len as u64));
            for (name, repo, _) in &repos {
                for p in env_list("STATESNAP_BENCH_PARALLELISM", &[1, 4, 16]) {
                    let repo = with_parallelism(repo, p);
                    let put = || {
                        let outs = rt
                            .block_on(repo.blobs().put_blob_files(&sk, &files))
                            .unwrap();
                        outs.into_iter().map(|o| o.blob.hash).collect()
                    };
                    group.bench_function(
                        BenchmarkId::new(format!("put_32x1MiB_{name}"), format!("p{p}")),
                        |b| b.iter_custom(|iters| time_uploads(&rt, &repo, &sk, iters, put)),
                    );
                    let items: Vec<(BlobRef, std::path::PathBuf)> = files
                        .iter()
                        .enumerate()
                        .map(|(i, f)| {
                            let out = rt.block_on(repo.blobs().put_blob_file(&sk, f)).unwrap();
                            (out.blob, src_dir.path().join(format!("got-{i}")))
                        })
                        .collect();
                    group.bench_function(
                        BenchmarkId::new(format!("get_32x1MiB_{name}"), format!("p{p}")),
                        |b| {
                            b.iter(|| {
                                rt.block_on(repo.blobs().get_blobs_to_files(&sk, &items))
                                    .unwrap()
                            })
                        },
                    );
                }
            }
        }
    }
    group.finish();
}

fn listing(c: &mut Criterion) {
    let rt = runtime();
    let sk = StoreKey::new("bench", "listing", 0).unwrap();
    let url = format!("memory://bench-listing-{}", uuid::Uuid::new_v4());
    let repo = rt
        .block_on(Repository::init(&url, Default::default()))
        .unwrap();
    let n = 10_000u64;
    rt.block_on(async {
        let out = repo
            .blobs()
            .put_blob_bytes(&sk, Bytes::from_static(b"x"))
            .await
            .unwrap();
        let files = vec![FileEntry {
            path: "x".into(),
            size: 1,
            blake3: out.blob.hash,
        }];
        let store = repo.object_store();
        for i in 0..n {
            let m = Manifest::from_draft(
                draft(&sk, i, files.clone()),
                SnapshotId::from_parts(i, 7),
                0,
            )
            .unwrap();
            // Raw put: the commit path's re-checks are not what is measured.
            store
                .put(&m.key(), m.encode().unwrap().into())
                .await
                .unwrap();
        }
    });
    let mut group = c.benchmark_group("catalog");
    group.sample_size(10);
    group.throughput(Throughput::Elements(n));
    group.bench_function("list_manifest_keys_10000", |b| {
        b.iter(|| {
            assert_eq!(
                rt.block_on(repo.catalog().list_manifest_keys(&sk))
                    .unwrap()
                    .0
                    .len(),
                n as usize
            )
        })
    });
    group.bench_function("list_snapshots_read_verify_10000", |b| {
        b.iter(|| {
            assert_eq!(
                rt.block_on(repo.catalog().list_snapshots(&sk))
                    .unwrap()
                    .snapshots
                    .len(),
                n as usize
            )
        })
    });
    group.finish();
}

criterion_group!(benches, blobs, listing);
criterion_main!(benches);
