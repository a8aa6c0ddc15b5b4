//! `statesnap reshard` from the command line: the dry run writes nothing,
//! the run leaves targets a new application opens without replaying, a
//! rerun is refused unless resumed, and bad input gets its exit code.
#![cfg(feature = "rocksdb")]

use std::collections::BTreeMap;
use std::path::Path;

use crate::common;

use common::{manual_manager, run_json_args, statesnap};
use statesnap::reshard::{Murmur2, Partitioner};
use statesnap::restore::{RestoreOptions, restore_store};
use statesnap::{FileChangelog, RocksFormat, StateStoreExt, StoreKey, StoreSpec};

/// The source store `shop/carts`, 3 partitions on file logs at
/// `logs/{topic}-{partition}`, each with a handoff snapshot and a tail of
/// records after it; returns the repository URL and every live pair.
async fn sources(root: &Path) -> (String, BTreeMap<String, String>) {
    let url = format!("file://{}", root.join("repo").display());
    let m = manual_manager(&url).await;
    let mut model = BTreeMap::new();
    for p in 0..3u32 {
        let key = StoreKey::new("shop", "carts", p).expect("key");
        let log = FileChangelog::open(
            root.join(format!("logs/shop-carts-changelog-{p}")),
            key.changelog_id(),
            Default::default(),
        )
        .expect("log");
        let spec = StoreSpec::rocksdb(key, log, root.join(format!("app/{p}")));
        let mut h = m.open(spec).await.expect("open");
        for round in 0..2 {
            for i in 0..600u32 {
                let k = format!("cart-{i:04}");
                if Murmur2.partition(k.as_bytes(), 3) != p {
                    continue;
                }
                let v = format!("items-{i}-{round}");
                h.put(k.clone(), v.clone());
                model.insert(k, v);
            }
            h.commit().expect("commit");
            if round == 0 {
                assert!(h.snapshot_now().expect("snapshot"));
                let status = h.wait_for_snapshot().await;
                assert!(status.last_snapshot.is_some(), "{status:?}");
            }
        }
        // No handoff: the tail after the snapshot stays in the log, and
        // the reshard replays it.
        h.abandon().await;
    }
    m.shutdown().await;
    (url, model)
}

/// `statesnap reshard` of `shop/carts` into `shop2/carts` with `args`.
fn reshard(repo: &str, template: &str, args: &[&str], code: i32) -> serde_json::Value {
    let mut all = vec![
        "reshard",
        "--repo",
        repo,
        "--from",
        "shop/carts",
        "--to",
        "shop2/carts",
    ];
    all.extend(["--changelog-template", template]);
    all.extend(args);
    run_json_args(&all, code)
}

#[test]
fn reshard_moves_every_key_and_the_targets_open_without_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (repo, model) = rt.block_on(sources(root));
    let template = format!("file://{}/logs/{{topic}}-{{partition}}", root.display());

    // The dry run says what it would read and writes nothing.
    let plan = reshard(&repo, &template, &["--partitions", "5", "--dry-run"], 0);
    assert_eq!(plan["sources"].as_array().expect("sources").len(), 3);
    assert!(
        plan["sources"]
            .as_array()
            .expect("sources")
            .iter()
            .all(|s| s["tail_records"].as_u64() > Some(0))
    );
    assert_eq!(plan["targets"].as_array().expect("targets").len(), 5);
    assert!(!root.join("logs/shop2-carts-changelog-0").exists());

    let r = reshard(&repo, &template, &["--partitions", "5", "--verify"], 0);
    assert_eq!(r["keys"].as_u64(), Some(model.len() as u64));
    let targets = r["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 5);
    assert!(
        targets
            .iter()
            .all(|t| t["replay_verified"] == true && t["snapshot"].is_string())
    );

    // Each target opens from its snapshot, replays nothing, and holds the
    // keys murmur2 places in it.
    rt.block_on(async {
        let repo = statesnap::Repository::open(&repo, Default::default())
            .await
            .expect("open");
        let mut seen = BTreeMap::new();
        for p in 0..5u32 {
            let key = StoreKey::new("shop2", "carts", p).expect("key");
            let log = FileChangelog::open(
                root.join(format!("logs/shop2-carts-changelog-{p}")),
                key.changelog_id(),
                Default::default(),
            )
            .expect("log");
            let target = root.join(format!("open/{p}"));
            let (store, report) = restore_store(
                &RocksFormat::default(),
                &repo,
                &key,
                &log,
                &target,
                &RestoreOptions::default(),
            )
            .await
            .expect("restore");
            assert_eq!(report.replay.records, 0);
            for kv in store.iter().expect("iter") {
                let (k, v) = kv.expect("entry");
                assert_eq!(Murmur2.partition(&k, 5), p);
                seen.insert(
                    String::from_utf8(k.to_vec()).expect("utf8"),
                    String::from_utf8(v.to_vec()).expect("utf8"),
                );
            }
        }
        assert_eq!(seen, model);
    });

    // A second run is refused: the targets hold the first run's state.
    let e = reshard(&repo, &template, &["--partitions", "5"], 9);
    assert_eq!(e["error"]["kind"], "already-exists");
    // Resumed, it finds its own output and changes nothing.
    let again = reshard(&repo, &template, &["--partitions", "5", "--force"], 0);
    let again = again["targets"].as_array().expect("targets");
    assert!(
        again
            .iter()
            .all(|t| t["appended"] == 0 && t["snapshot_reused"] == true)
    );
}

#[test]
fn reshard_refuses_bad_input_with_its_exit_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (repo, _) = rt.block_on(sources(root));
    let template = format!("file://{}/logs/{{topic}}-{{partition}}", root.display());

    // An unknown partitioner is a usage error.
    statesnap()
        .args([
            "reshard",
            "--repo",
            &repo,
            "--from",
            "shop/carts",
            "--to",
            "x/carts",
        ])
        .args(["--partitions", "2", "--changelog-template", &template])
        .args(["--partitioner", "round-robin"])
        .assert()
        .code(2);
    // A template naming one changelog for every partition.
    let one = format!("file://{}/logs/one", root.display());
    let e = reshard(&repo, &one, &["--partitions", "2"], 3);
    assert_eq!(e["error"]["kind"], "config");
    // A source store the repository does not hold; a target that is the
    // source.
    for (from, to, code, kind) in [
        ("shop/nothing", "x/carts", 4, "not-found"),
        ("shop/carts", "shop/carts", 3, "config"),
    ] {
        let args = ["reshard", "--repo", &repo, "--from", from, "--to", to];
        let mut args = args.to_vec();
        args.extend(["--partitions", "2", "--changelog-template", &template]);
        assert_eq!(run_json_args(&args, code)["error"]["kind"], kind);
    }
    // A missing source partition: partition 1's snapshots are gone.
    let listing = std::fs::read_dir(root.join("repo/stores/shop.carts.1"))
        .expect("store dir")
        .count();
    assert!(listing > 0);
    std::fs::remove_dir_all(root.join("repo/stores/shop.carts.1")).expect("remove");
    let e = reshard(&repo, &template, &["--partitions", "2"], 3);
    assert_eq!(e["error"]["kind"], "config");
    assert!(
        !root.join("logs/shop2-carts-changelog-0").exists(),
        "nothing written"
    );
}

/// Defect: a reshard refused because one target was not new had already
/// created the other targets' changelogs. The refusal (exit 9) now comes
/// before any target log is created, and the dry run says the real run
/// would be refused instead of planning as if all were well.
#[test]
fn a_reshard_refused_for_a_used_target_creates_no_other_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (repo, _) = rt.block_on(sources(root));
    let template = format!("file://{}/logs/{{topic}}-{{partition}}", root.display());
    // Target partition 2 of 4 already holds a record.
    let used = StoreKey::new("shop2", "carts", 2).expect("key");
    let log = FileChangelog::open(
        root.join("logs/shop2-carts-changelog-2"),
        used.changelog_id(),
        Default::default(),
    )
    .expect("log");
    statesnap::Changelog::append(&log, &[statesnap::Record::put("k", "v")]).expect("append");
    drop(log);
    let logs_before: Vec<_> = std::fs::read_dir(root.join("logs"))
        .expect("logs")
        .map(|e| e.expect("entry").file_name())
        .collect();

    let plan = reshard(&repo, &template, &["--partitions", "4", "--dry-run"], 0);
    assert_eq!(plan["would_be_refused"], true, "{plan}");
    assert_eq!(plan["targets_not_new"].as_array().map(Vec::len), Some(1));

    let e = reshard(&repo, &template, &["--partitions", "4"], 9);
    assert_eq!(e["error"]["kind"], "already-exists", "{e}");
    let mut logs_after: Vec<_> = std::fs::read_dir(root.join("logs"))
        .expect("logs")
        .map(|e| e.expect("entry").file_name())
        .collect();
    let mut before = logs_before.clone();
    before.sort();
    logs_after.sort();
    assert_eq!(logs_after, before, "no target changelog was created");
    for p in [0, 1, 3] {
        let k = StoreKey::new("shop2", "carts", p).expect("key");
        let listing = rt
            .block_on(async {
                let r = statesnap::Repository::open(&repo, Default::default()).await?;
                r.catalog().list_snapshots(&k).await
            })
            .expect("list");
        assert!(listing.snapshots.is_empty(), "no snapshot of {k}");
    }
}
