//! The `statesnap` command against a local repository (and, when the test
//! script started one, the S3 server): every command's happy path and
//! `--json` shape, and the bad input an operator meets.
//!
//! The fixture is built with the library, as an application would: a
//! RocksDB store on a file changelog, written through the runtime, with
//! three snapshots.

use crate::common;

use common::{foreign_dir, json_of, manual_manager, run_json_args, statesnap, tree};
use statesnap::StoreKey;
use std::path::{Path, PathBuf};
use std::time::Duration;

use assert_cmd::Command;
use predicates::prelude::*;
use statesnap::{FileChangelog, Repository, SnapshotPolicy, StateManager, StateStore, StoreSpec};

const STORE: &str = "shop/carts/0";

/// A repository with store `shop.carts.0`: 3 snapshots at growing offsets
/// over 300 keys; the newest deletes `cart-0000` and changes `cart-0001`.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    repo_url: String,
    log_url: String,
}

impl Fixture {
    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p)
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn log(root: &Path) -> FileChangelog {
    let id = StoreKey::new("shop", "carts", 0)
        .expect("id")
        .changelog_id();
    FileChangelog::open(root.join("log"), id, Default::default()).expect("log")
}

async fn write_fixture(repo_url: &str, root: &Path) {
    let m = manual_manager(repo_url).await;
    let spec = StoreSpec::rocksdb(
        StoreKey::new("shop", "carts", 0).expect("spec"),
        log(root),
        root.join("app-store"),
    );
    let mut h = m.open(spec).await.expect("open");
    for round in 0..3u32 {
        for k in 0..300u32 {
            if round == 2 && k == 0 {
                h.delete(format!("cart-{k:04}"));
                continue;
            }
            if round < 2 || k == 1 {
                h.put(format!("cart-{k:04}"), format!("items-{k}-round-{round}"));
            }
        }
        h.commit().expect("commit");
        if round == 2 {
            // The newest snapshot then shares no SST with the older two:
            // dropping those leaves blobs for gc (their small files travel
            // inline, in the manifests).
            h.store().db().compact_range::<&[u8], &[u8]>(None, None);
        }
        assert!(h.snapshot_now().expect("snapshot"));
        let st = h.wait_for_snapshot().await;
        assert_eq!(st.snapshots_failed, 0, "{:?}", st.last_error);
    }
    h.abandon().await;
    m.shutdown().await;
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let repo_url = format!("file://{}", root.join("repo").display());
    rt().block_on(write_fixture(&repo_url, &root));
    Fixture {
        log_url: format!("file://{}", root.join("log").display()),
        _dir: dir,
        root,
        repo_url,
    }
}

/// Runs `args` with `--json` and returns the parsed stdout, asserting
/// exit code `code`.
fn run_json(f: &Fixture, args: &[&str], code: i32) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--repo", &f.repo_url]);
    run_json_args(&all, code)
}

fn snapshot_ids(f: &Fixture) -> Vec<String> {
    let v = run_json(f, &["list", STORE], 0);
    v["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_owned())
        .collect()
}

/// Flips a byte in the middle of the newest snapshot's largest SST blob
/// (one only it names: the fixture compacted the store before it) and
/// returns the blob's path.
fn rot_newest_largest_sst(f: &Fixture) -> PathBuf {
    let ids = snapshot_ids(f);
    let newest = run_json(f, &["show", STORE, &ids[2]], 0);
    let ssts: Vec<String> = newest["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter(|file| file["path"].as_str().is_some_and(|p| p.ends_with(".sst")))
        .map(|file| file["blake3"].as_str().expect("blake3").to_owned())
        .collect();
    let blob = largest_blob_of(f, &ssts);
    let mut bytes = std::fs::read(&blob).expect("read blob");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&blob, bytes).expect("write blob");
    blob
}
/// The largest blob file of the repository among those named `names`.
fn largest_blob_of(f: &Fixture, names: &[String]) -> PathBuf {
    let mut blobs = Vec::new();
    let mut stack = vec![f.path("repo/stores/shop.carts.0/blobs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if names
                .iter()
                .any(|n| p.file_name().is_some_and(|f| f == n.as_str()))
            {
                blobs.push((std::fs::metadata(&p).expect("meta").len(), p));
            }
        }
    }
    blobs.sort();
    blobs.pop().expect("a blob").1
}

#[test]
fn the_inspection_commands_describe_the_repository() {
    let f = fixture();
    let stores = run_json(&f, &["stores"], 0);
    assert_eq!(stores[0]["store"], "shop.carts.0");
    assert_eq!(stores[0]["snapshots"], 3);
    assert!(stores[0]["unique_bytes"].as_u64().unwrap() > 0);
    assert!(
        stores[0]["total_bytes"].as_u64().unwrap() >= stores[0]["unique_bytes"].as_u64().unwrap()
    );

    let list = run_json(&f, &["list", STORE, "--changelog", &f.log_url], 0);
    let snaps = list["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 3);
    let offsets: Vec<u64> = snaps
        .iter()
        .map(|s| s["offset"].as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    assert!(snaps.iter().all(|s| s["usable"] == true), "{list}");
    assert_eq!(snaps[0]["format"], "rocksdb/1");
    assert_eq!(snaps[1]["parent"], snaps[0]["id"]);

    let id = snaps[2]["id"].as_str().unwrap();
    let show = run_json(&f, &["show", STORE, id], 0);
    assert_eq!(show["snapshot_id"], id);
    assert_eq!(show["changelog"]["offset"], snaps[2]["offset"]);
    let latest = run_json(&f, &["show", STORE, "latest"], 0);
    assert_eq!(latest["snapshot_id"], id);

    // Text forms print tables with the same facts.
    statesnap()
        .args(["stores", "--repo", &f.repo_url])
        .assert()
        .success()
        .stdout(predicate::str::contains("shop.carts.0"));
    statesnap()
        .args(["list", STORE, "--repo", &f.repo_url])
        .assert()
        .success()
        .stdout(predicate::str::contains(id).and(predicate::str::contains("--changelog")));
}

#[test]
fn offline_reads_see_each_snapshot_as_it_was() {
    let f = fixture();
    let ids = snapshot_ids(&f);
    let got = run_json(&f, &["get", STORE, "cart-0001"], 0);
    assert_eq!(got["value"]["utf8"], "items-1-round-2");
    let old = run_json(&f, &["get", STORE, "cart-0001", "--snapshot", &ids[0]], 0);
    assert_eq!(old["value"]["utf8"], "items-1-round-0");
    // A deleted key: not found (exit 4), value null.
    let gone = run_json(&f, &["get", STORE, "cart-0000"], 4);
    assert!(gone["value"].is_null());

    let scan = run_json(
        &f,
        &["scan", STORE, "--prefix", "cart-02", "--limit", "5"],
        0,
    );
    let pairs = scan["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 5);
    assert_eq!(pairs[0]["key"]["utf8"], "cart-0200");
    assert_eq!(scan["truncated"], true);

    let diff = run_json(&f, &["diff", STORE, &ids[0], &ids[2]], 0);
    assert_eq!(diff["added"], 0);
    assert_eq!(diff["removed"], 1);
    // Round 1 rewrote every key; round 2 deleted cart-0000.
    assert_eq!(diff["changed"], 299);
    assert_eq!(diff["sample_removed"][0]["utf8"], "cart-0000");
    let diff12 = run_json(&f, &["diff", STORE, &ids[1], "latest"], 0);
    assert_eq!(diff12["changed"], 1);
    assert_eq!(diff12["removed"], 1);
    assert_eq!(diff12["unchanged"], 298);
}

#[test]
fn plan_and_restore_agree_and_restore_refuses_a_non_empty_target() {
    let f = fixture();
    let ids = snapshot_ids(&f);
    let plan = run_json(&f, &["plan", STORE, "--changelog", &f.log_url], 0);
    assert_eq!(plan["chosen"]["source"]["kind"], "snapshot");
    assert_eq!(plan["chosen"]["source"]["id"], ids[2].as_str());
    assert_eq!(plan["chosen"]["records_to_replay"], 0);
    assert!(plan["estimated_seconds"].as_f64().unwrap() >= 0.0);
    // The estimate says what it assumed.
    assert!(
        plan["estimate_rates"]["download_bytes_per_sec"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{plan}"
    );
    assert!(
        plan["estimate_rates"]["replay_records_per_sec"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{plan}"
    );

    let target = f.path("restored");
    let r = run_json(
        &f,
        &[
            "restore",
            STORE,
            "--changelog",
            &f.log_url,
            "--to",
            target.to_str().unwrap(),
        ],
        0,
    );
    assert_eq!(r["source"]["kind"], "snapshot");
    assert_eq!(r["source"]["id"], ids[2].as_str());
    assert_eq!(r["records_replayed"], 0);
    // `restore --to` returns a durable directory: every file synced, no
    // mark left for a background sync to remove.
    let marks: Vec<_> = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".statesnap-unsynced-"))
        .collect();
    assert!(marks.is_empty(), "{marks:?}");
    // The restored directory is a RocksDB store with the data.
    let store = statesnap::RocksStore::open(&target, &Default::default()).expect("open restored");
    assert_eq!(
        store.get(b"cart-0001").unwrap().as_deref(),
        Some(&b"items-1-round-2"[..])
    );
    assert!(store.get(b"cart-0000").unwrap().is_none());
    drop(store);

    // Not empty now: refused without --force (the hint, run just below),
    // and left as it was.
    let before = std::fs::read_dir(&target).unwrap().count();
    statesnap()
        .args([
            "restore",
            STORE,
            "--repo",
            &f.repo_url,
            "--changelog",
            &f.log_url,
        ])
        .args(["--to", target.to_str().unwrap()])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("--force"));
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), before);

    // Point in time: the first snapshot's offset, with --force.
    let first = run_json(&f, &["show", STORE, &ids[0]], 0);
    let at = first["changelog"]["offset"].as_u64().unwrap().to_string();
    let r = run_json(
        &f,
        &[
            "restore",
            STORE,
            "--changelog",
            &f.log_url,
            "--to",
            target.to_str().unwrap(),
            "--at-offset",
            &at,
            "--force",
        ],
        0,
    );
    assert_eq!(r["source"]["id"], ids[0].as_str());
    let store = statesnap::RocksStore::open(&target, &Default::default()).expect("open restored");
    assert_eq!(
        store.get(b"cart-0001").unwrap().as_deref(),
        Some(&b"items-1-round-0"[..])
    );
}

#[test]
fn verify_finds_a_rotten_blob_and_restore_falls_back_past_it() {
    let f = fixture();
    let ok = run_json(&f, &["verify"], 0);
    assert_eq!(ok["ok"], true);
    assert!(ok["blobs_checked"].as_u64().unwrap() > 0);
    let deep = run_json(&f, &["verify", STORE, "--deep"], 0);
    assert_eq!(deep["deep"][0]["ok"], true, "{deep}");

    // Rot the newest snapshot's largest SST (one only it names: the
    // fixture compacted the store before it).
    let ids = snapshot_ids(&f);
    let blob = rot_newest_largest_sst(&f);
    let name = blob.file_name().unwrap().to_str().unwrap().to_owned();

    let bad = run_json(&f, &["verify"], 5);
    assert_eq!(bad["ok"], false);
    assert_eq!(bad["bad_blobs"][0]["blob"], name.as_str());
    assert_eq!(bad["bad_blobs"][0]["kind"], "corrupt");
    statesnap()
        .args(["verify", "--repo", &f.repo_url])
        .assert()
        .code(5)
        .stdout(predicate::str::contains("BAD blob").and(predicate::str::contains(&name)));

    // The restore skips every snapshot naming the rotten blob, says so,
    // and still ends exact (older snapshot + replay, or full replay).
    let target = f.path("restored");
    let r = run_json(
        &f,
        &[
            "restore",
            STORE,
            "--changelog",
            &f.log_url,
            "--to",
            target.to_str().unwrap(),
        ],
        0,
    );
    let skipped = r["skipped"].as_array().unwrap();
    assert!(!skipped.is_empty(), "{r}");
    assert_eq!(skipped[0]["kind"], "corrupt");
    assert_eq!(skipped[0]["id"], ids[2].as_str());
    let store = statesnap::RocksStore::open(&target, &Default::default()).expect("open restored");
    assert_eq!(
        store.get(b"cart-0001").unwrap().as_deref(),
        Some(&b"items-1-round-2"[..])
    );
}

#[test]
fn a_corrupt_manifest_is_reported_by_list_and_verify() {
    let f = fixture();
    let dir = f.path("repo/stores/shop.carts.0/manifests");
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    manifests.sort();
    let newest = manifests.last().unwrap();
    let text = std::fs::read_to_string(newest).unwrap();
    std::fs::write(newest, text.replacen("\"keys\"", "\"kyes\"", 1)).unwrap();
    let list = run_json(&f, &["list", STORE], 0);
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 2);
    assert_eq!(list["unreadable"][0]["kind"], "corrupt");
    let v = run_json(&f, &["verify"], 5);
    assert_eq!(v["unreadable_manifests"][0]["kind"], "corrupt");
}

/// A manifest sealed with a damaged inline file (its checksum matches, so
/// it lists): `verify` names the snapshot and the file, without restoring.
#[test]
fn verify_reports_a_damaged_inline_file() {
    let f = fixture();
    let ids = snapshot_ids(&f);
    let dir = f.path("repo/stores/shop.carts.0/manifests");
    let newest = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&newest).unwrap()).unwrap();
    let files = v["inline_files"].as_array().unwrap();
    let i = files.iter().position(|x| x["path"] == "CURRENT").unwrap();
    let other = statesnap::repo::InlineFile::new("CURRENT", b"MANIFEST-999999\n").unwrap();
    v["inline_files"][i]["zstd_base64"] = other.zstd_base64.into();
    let body = statesnap::repo::Manifest::canonical_body(&v).unwrap();
    v["checksum"] = blake3::hash(&body).to_hex().to_string().into();
    std::fs::write(&newest, serde_json::to_vec(&v).unwrap()).unwrap();

    assert_eq!(snapshot_ids(&f).len(), 3, "the resealed manifest lists");
    let out = run_json(&f, &["verify"], 5);
    assert_eq!(out["ok"], false);
    let bad = out["bad_inline_files"].as_array().unwrap();
    assert_eq!(bad.len(), 1, "{out}");
    assert_eq!(bad[0]["path"], "CURRENT");
    assert_eq!(bad[0]["snapshot"], ids[2].as_str());
    statesnap()
        .args(["verify", "--repo", &f.repo_url])
        .assert()
        .code(5)
        .stdout(predicate::str::contains(format!(
            "BAD inline file CURRENT of snapshot {}",
            ids[2]
        )));
}

#[test]
fn retain_gc_and_clone_say_what_they_do() {
    let f = fixture();
    let ids = snapshot_ids(&f);
    let dry = run_json(&f, &["retain", STORE, "--keep-last", "1", "--dry-run"], 0);
    assert_eq!(dry["dry_run"], true);
    let dropped: Vec<&str> = dry["stores"][0]["manifests_deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(dropped.len(), 2, "{dry}");
    assert!(!dropped.contains(&ids[2].as_str()));
    for d in dry["stores"][0]["manifests_deleted"].as_array().unwrap() {
        assert_eq!(d["reason"], "not among the newest 1 snapshots", "{dry}");
    }
    // Nothing changed.
    assert_eq!(snapshot_ids(&f).len(), 3);
    let done = run_json(&f, &["retain", STORE, "--keep-last", "1"], 0);
    assert_eq!(
        done["stores"][0]["manifests_deleted"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(snapshot_ids(&f), vec![ids[2].clone()]);
    // Blobs are young: gc condemns nothing within the grace period, and
    // with no grace, condemns what no snapshot names.
    let gc = run_json(&f, &["gc", "--dry-run"], 0);
    assert_eq!(gc["stores"][0]["blobs_condemned"], 0);
    // A grace of 2 s needs a commit budget of at most 1 s; with the
    // default budget (10m) gc refuses it.
    run_json(&f, &["gc", "--grace", "2s"], 3);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let gc = run_json(&f, &["gc", "--grace", "2s", "--max-commit", "1s"], 0);
    assert!(
        gc["stores"][0]["blobs_condemned"].as_u64().unwrap() > 0,
        "{gc}"
    );
    statesnap()
        .args(["retain", "--repo", &f.repo_url])
        .assert()
        .code(3);

    let c = run_json(&f, &["clone", "--from", STORE, "--to", "shop2/carts/0"], 0);
    assert_eq!(c["to"], "shop2.carts.0");
    assert!(c["blobs_copied"].as_u64().unwrap() > 0);
    let got = run_json(&f, &["get", "shop2/carts/0", "cart-0001"], 0);
    assert_eq!(got["value"]["utf8"], "items-1-round-2");
    let stores = run_json(&f, &["stores"], 0);
    assert_eq!(stores.as_array().unwrap().len(), 2);
}

/// `clone --changelog`: the target follows its own, new changelog — a
/// restore with that changelog gives the source snapshot's contents, and
/// later writes to it land on top; a changelog with records is refused.
#[test]
fn clone_with_a_changelog_seeds_a_store_that_follows_its_own_log() {
    let f = fixture();
    let green_log = format!("file://{}", f.root.join("green-log").display());
    let source = run_json(&f, &["show", STORE, "latest"], 0);
    let c = run_json(
        &f,
        &[
            "clone",
            "--from",
            STORE,
            "--to",
            "green/carts/0",
            "--changelog",
            &green_log,
        ],
        0,
    );
    // 300 keys written, cart-0000 deleted in the last round.
    assert_eq!(c["records_written"], 299, "{c}");
    assert_eq!(
        c["offset"], 298,
        "the first snapshot sits at the new log's last offset"
    );
    assert_eq!(c["changelog"]["topic"], "green-carts-changelog", "{c}");
    assert_eq!(c["source_snapshot"], source["snapshot_id"], "{c}");
    // The seeded store restores from its own changelog, and a restore
    // with the source's changelog is refused for that snapshot.
    let to = f.root.join("green-restored");
    let r = run_json(
        &f,
        &[
            "restore",
            "green/carts/0",
            "--changelog",
            &green_log,
            "--to",
            to.to_str().unwrap(),
        ],
        0,
    );
    assert_eq!(r["source"]["kind"], "snapshot", "{r}");
    assert_eq!(r["records_replayed"], 0, "{r}");
    let got = run_json(&f, &["get", "green/carts/0", "cart-0001"], 0);
    assert_eq!(got["value"]["utf8"], "items-1-round-2");
    let gone = run_json(&f, &["get", "green/carts/0", "cart-0000"], 4);
    assert!(gone["value"].is_null(), "{gone}");
    // Seeding again: the log has records now (config); another store's
    // log directory is refused; and the store has a snapshot already.
    let again = run_json(
        &f,
        &[
            "clone",
            "--from",
            STORE,
            "--to",
            "green/carts/0",
            "--changelog",
            &green_log,
        ],
        3,
    );
    assert_eq!(again["error"]["reason"], "already_exists", "{again}");
    let foreign = run_json(
        &f,
        &[
            "clone",
            "--from",
            STORE,
            "--to",
            "green2/carts/0",
            "--changelog",
            &green_log,
        ],
        3,
    );
    assert_eq!(foreign["error"]["reason"], "other_changelog", "{foreign}");
    let fresh = format!("file://{}", f.root.join("green-log-2").display());
    let exists = run_json(
        &f,
        &[
            "clone",
            "--from",
            STORE,
            "--to",
            "green/carts/0",
            "--changelog",
            &fresh,
        ],
        9,
    );
    assert_eq!(exists["error"]["kind"], "already-exists", "{exists}");
    assert_eq!(exists["error"]["reason"], "already_exists", "{exists}");
}

#[test]
fn bad_input_gets_a_clear_error_and_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("file://{}", dir.path().join("nothing").display());
    // Missing repository: not found, reason `no_repository` (the fix,
    // `statesnap init`, is run just below).
    statesnap()
        .args(["stores", "--repo", &missing])
        .assert()
        .code(4);
    let out = statesnap()
        .args(["stores", "--repo", &missing, "--json"])
        .assert()
        .code(4)
        .get_output()
        .stdout
        .clone();
    assert_eq!(json_of(&out)["error"]["reason"], "no_repository");
    // Unknown scheme.
    statesnap()
        .args(["stores", "--repo", "ftp://host/x"])
        .assert()
        .code(3);
    // Init, then init again: already exists.
    statesnap()
        .args(["init", "--repo", &missing])
        .assert()
        .success();
    statesnap()
        .args(["init", "--repo", &missing])
        .assert()
        .code(9);
    // Unknown snapshot id and a malformed one.
    statesnap()
        .args([
            "show",
            STORE,
            "01JAAAAAAAAAAAAAAAAAAAAAAA",
            "--repo",
            &missing,
        ])
        .assert()
        .code(4);
    statesnap()
        .args(["show", STORE, "not-an-id", "--repo", &missing])
        .assert()
        .code(3);
    // A hostile store name.
    statesnap()
        .args(["list", "../etc/x/0", "--repo", &missing])
        .assert()
        .code(3);
    // Errors come as JSON too.
    let out = statesnap()
        .args(["show", STORE, "latest", "--repo", &missing, "--json"])
        .assert()
        .code(4)
        .get_output()
        .stdout
        .clone();
    assert_eq!(json_of(&out)["error"]["kind"], "not-found");
    assert!(json_of(&out)["error"]["reason"].is_null());
    // A bad changelog URL.
    statesnap()
        .args(["plan", STORE, "--changelog", "log", "--repo", &missing])
        .assert()
        .code(3);
}

#[test]
fn an_unreachable_s3_endpoint_is_transient() {
    statesnap()
        .args(["stores", "--repo", "s3://bucket/prefix"])
        .args(["-o", "endpoint=http://127.0.0.1:9", "-o", "allow_http=true"])
        .args([
            "-o",
            "access_key_id=x",
            "-o",
            "secret_access_key=y",
            "-o",
            "region=us-east-1",
        ])
        .timeout(Duration::from_secs(300))
        .assert()
        .code(7);
}

/// Against the S3 server `scripts/test.sh` starts (skipped, with a note,
/// when `STATESNAP_TEST_S3_URL` is not set).
#[test]
fn the_commands_work_against_the_s3_server() {
    let Ok(base) = std::env::var("STATESNAP_TEST_S3_URL") else {
        assert!(
            std::env::var_os("STATESNAP_REQUIRE_S3").is_none(),
            "STATESNAP_REQUIRE_S3 is set but STATESNAP_TEST_S3_URL is not"
        );
        eprintln!("STATESNAP_TEST_S3_URL not set: run through scripts/test.sh for the S3 test");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{base}/cli-{}", std::process::id());
    rt().block_on(write_fixture(&url, dir.path()));
    let f = Fixture {
        log_url: format!("file://{}", dir.path().join("log").display()),
        root: dir.path().to_path_buf(),
        repo_url: url,
        _dir: dir,
    };
    let stores = run_json(&f, &["stores"], 0);
    assert_eq!(stores[0]["snapshots"], 3);
    assert_eq!(run_json(&f, &["verify", "--deep"], 0)["ok"], true);
    let target = f.path("restored");
    let r = run_json(
        &f,
        &[
            "restore",
            STORE,
            "--changelog",
            &f.log_url,
            "--to",
            target.to_str().unwrap(),
        ],
        0,
    );
    assert_eq!(r["source"]["kind"], "snapshot");
    // Wrong credentials: the server refuses; not transient, not a success.
    statesnap()
        .args([
            "stores",
            "--repo",
            &f.repo_url,
            "-o",
            "secret_access_key=wrong",
        ])
        .assert()
        .failure()
        .code(predicate::ne(0).and(predicate::ne(7)));
    // The demo, redirected to the S3 server: snapshots go there and the
    // rebuilt store comes back from there.
    let demo_repo = format!("{base}/demo-{}", std::process::id());
    let work = f.path("demo");
    let out = statesnap()
        .args(["demo", "--keys", "2000", "--updates-per-key", "5", "--json"])
        .args(["--repo", &demo_repo, "--dir", work.to_str().unwrap()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v = json_of(&out);
    assert_eq!(v["digests_equal"], true, "{v}");
    assert!(
        v["snapshot_restore"]["bytes_downloaded"].as_u64().unwrap() > 0,
        "the snapshot came from the S3 server: {v}"
    );
    let stores = statesnap()
        .args(["stores", "--repo", &demo_repo, "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(json_of(&stores)[0]["store"], "demo.users.0");
}

/// A repository in `root/repo` and a file changelog in `root/log` with
/// `records` writes to 200 000 carts (committed every 10 000), and a
/// snapshot after record `snapshot_after` if given: a restore long enough
/// to interrupt. Returns the repository's URL.
fn long_history(root: &Path, records: u32, snapshot_after: Option<u32>) -> String {
    let repo_url = format!("file://{}", root.join("repo").display());
    rt().block_on(async {
        let m = manual_manager(&repo_url).await;
        let spec = StoreSpec::rocksdb(
            StoreKey::new("shop", "carts", 0).expect("spec"),
            log(root),
            root.join("app-store"),
        );
        let mut h = m.open(spec).await.expect("open");
        for i in 0..records {
            h.put(
                format!("cart-{:07}", i % 200_000),
                i.to_le_bytes().repeat(8),
            );
            if i % 10_000 == 9_999 {
                h.commit().expect("commit");
            }
            if snapshot_after == Some(i) {
                h.commit().expect("commit");
                assert!(h.snapshot_now().expect("snapshot"));
                let st = h.wait_for_snapshot().await;
                assert_eq!(st.snapshots_failed, 0, "{:?}", st.last_error);
            }
        }
        h.commit().expect("commit");
        h.abandon().await;
        m.shutdown().await;
    });
    repo_url
}

/// Ctrl-C in the middle of a restore: exit 130, the target untouched, no
/// staging left behind.
#[test]
fn ctrl_c_during_a_restore_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A long changelog and no snapshot: a full replay takes seconds.
    let repo_url = long_history(root, 1_500_000, None);
    let parent = root.join("out");
    std::fs::create_dir_all(&parent).unwrap();
    let target = parent.join("restored");
    let bin = assert_cmd::cargo::cargo_bin("statesnap");
    let mut child = std::process::Command::new(bin)
        .args(["restore", STORE, "--repo", &repo_url])
        .args([
            "--changelog",
            &format!("file://{}", root.join("log").display()),
        ])
        .args(["--to", target.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the restore is under way (its staging exists).
    let staging = |p: &Path| -> Vec<String> {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    };
    let started = std::time::Instant::now();
    while staging(&parent).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the restore ended before it could be interrupted"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no staging appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(!target.exists(), "the target was created");
    assert_eq!(
        staging(&parent),
        Vec::<String>::new(),
        "staging left behind"
    );
}

/// Defect: `restore --to LINK/ --force` followed the link (`lstat` of
/// `LINK/` is the directory behind it), wrote the store marker into the
/// user's directory there, then failed. Every way of writing a link as the
/// target is refused (config, exit 3) and nothing behind it changes.
#[test]
fn restore_refuses_a_symlinked_target_however_it_is_written() {
    let f = fixture();
    let area = f.path("area");
    let elsewhere = area.join("elsewhere");
    foreign_dir(&elsewhere);
    std::os::unix::fs::symlink(&elsewhere, area.join("link")).unwrap();
    let before = tree(&area);
    for form in ["link", "link/", "link/.", "link//./"] {
        for force in [false, true] {
            let to = format!("{}/{form}", area.display());
            let mut cmd = statesnap();
            cmd.args(["restore", STORE, "--repo", &f.repo_url]).args([
                "--changelog",
                &f.log_url,
                "--to",
                &to,
                "--json",
            ]);
            if force {
                cmd.arg("--force");
            }
            let out = cmd.assert().code(3).get_output().stdout.clone();
            assert_eq!(json_of(&out)["error"]["kind"], "config", "{form}");
            assert_eq!(tree(&area), before, "{form} force={force}");
        }
    }
}

/// Defect: Ctrl-C during `restore --force` into a user's directory left the
/// store marker in it (written before the restore began). Interrupted at
/// several moments (planning, downloading the snapshot, replaying the
/// tail), the directory is byte for byte as it was and no staging is left
/// beside it; a restore that finished first left a complete store.
#[test]
fn ctrl_c_during_a_forced_restore_leaves_the_directory_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A snapshot, then a long tail: the restore downloads, then replays
    // for a while.
    let repo_url = long_history(root, 1_000_000, Some(400_000));
    let log_url = format!("file://{}", root.join("log").display());
    let parent = root.join("out");
    let target = parent.join("home");
    let bin = assert_cmd::cargo::cargo_bin("statesnap");
    let mut interrupted = 0;
    for delay_ms in [0u64, 20, 60, 150, 300, 600, 1200, 2500] {
        let _ = std::fs::remove_dir_all(&parent);
        foreign_dir(&target);
        let before = tree(&parent);
        let child = std::process::Command::new(&bin)
            .args([
                "restore",
                STORE,
                "--repo",
                &repo_url,
                "--changelog",
                &log_url,
            ])
            .args(["--to", target.to_str().unwrap(), "--force"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        // (It may have finished already: then there is no one to signal.)
        let _ = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            // Finished before the signal: a complete store.
            let store = statesnap::RocksStore::open(&target, &Default::default())
                .unwrap_or_else(|e| panic!("delay {delay_ms} ms: {e}"));
            assert!(store.get(b"cart-0000001").unwrap().is_some());
            assert!(!target.join("thesis.tex").exists());
            drop(store);
        } else {
            // Ctrl-C: 130; or, before the handler was installed, killed
            // by the signal itself.
            use std::os::unix::process::ExitStatusExt;
            assert!(
                out.status.code() == Some(130) || out.status.signal() == Some(2),
                "delay {delay_ms} ms: {:?} {stderr}",
                out.status
            );
            interrupted += 1;
            assert_eq!(tree(&parent), before, "delay {delay_ms} ms: {stderr}");
        }
        let hidden: Vec<_> = std::fs::read_dir(&parent)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.') || n.contains("statesnap"))
            .collect();
        assert!(hidden.is_empty(), "delay {delay_ms} ms: {hidden:?}");
    }
    assert!(interrupted >= 3, "{interrupted}");
}

/// The demo at a small size: the speed-up line and equal digests.
#[test]
fn the_demo_shows_snapshot_restore_beating_replay_with_equal_digests() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("demo");
    statesnap()
        .args(["demo", "--keys", "3000", "--updates-per-key", "20"])
        .args(["--dir", work.to_str().unwrap()])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("speed-up: snapshot + tail was")
                .and(predicate::str::contains("digests equal")),
        );
    assert!(
        !work.exists(),
        "the demo removes its directory without --keep"
    );
    let out = statesnap()
        .args([
            "demo",
            "--keys",
            "2000",
            "--updates-per-key",
            "5",
            "--store",
            "memory",
        ])
        .args(["--dir", work.to_str().unwrap(), "--keep", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v = json_of(&out);
    assert_eq!(v["digests_equal"], true);
    assert_eq!(v["snapshot_restore"]["digest"], v["model_digest"]);
    assert_eq!(v["full_replay"]["records_replayed"], v["changelog_records"]);
    assert!(v["background_snapshots"].as_u64().unwrap() >= 1, "{v}");
    assert!(
        v["snapshot_restore"]["records_replayed"].as_u64().unwrap()
            < v["full_replay"]["records_replayed"].as_u64().unwrap(),
        "{v}"
    );
    assert!(work.join("repo").exists(), "--keep keeps the directory");
    // The README's command: no --dir, a new directory under $TMPDIR (never
    // the current one), removed at the end.
    let cwd = dir.path().join("cwd");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::create_dir(&tmp).unwrap();
    statesnap()
        .current_dir(&cwd)
        .env("TMPDIR", &tmp)
        .args(["demo", "--keys", "2000", "--updates-per-key", "5"])
        .assert()
        .success()
        .stdout(predicate::str::contains("digests equal"));
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0, "cwd untouched");
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "the default demo directory is removed"
    );
}

/// `bench --quick`: every part runs, the files are written, and the figures
/// are consistent with what each part measured.
#[test]
fn bench_quick_writes_markdown_json_and_a_chart() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("results");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let out = statesnap()
        .timeout(Duration::from_secs(1800))
        .args(["bench", "--quick", "--json"])
        .args(["--out", out_dir.to_str().unwrap()])
        .args(["--scratch", scratch.to_str().unwrap()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v = json_of(&out);
    let on_disk = json_of(&std::fs::read(out_dir.join("bench.json")).unwrap());
    assert_eq!(v, on_disk, "--json prints what bench.json holds");
    let replay = v["restore_vs_replay"].as_array().unwrap();
    let histories: Vec<u64> = replay
        .iter()
        .map(|c| c["updates_per_key"].as_u64().unwrap())
        .collect();
    assert_eq!(histories, [10, 30, 100]);
    for c in replay {
        assert_eq!(
            c["records"].as_u64().unwrap(),
            c["keys"].as_u64().unwrap() * c["updates_per_key"].as_u64().unwrap(),
            "{c}"
        );
        assert!(c["restore_secs"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["replay_secs"].as_f64().unwrap() > 0.0, "{c}");
    }
    let b = &v["rocksdb_vs_backup_engine"];
    assert!(
        b["incremental_bytes"]["ours"].as_f64().unwrap() > 0.0,
        "{b}"
    );
    assert!(
        b["incremental_bytes"]["ours"].as_f64().unwrap()
            < b["full_bytes"]["ours"].as_f64().unwrap(),
        "an incremental snapshot uploads less than the full one: {b}"
    );
    for k in [
        "full_linked_secs",
        "incremental_linked_secs",
        "incremental_unsynced_secs",
        "incremental_linked_unsynced_secs",
    ] {
        assert!(b[k]["ours"].as_f64().unwrap() > 0.0, "{k}: {b}");
        assert!(b[k]["theirs"].as_f64().unwrap() > 0.0, "{k}: {b}");
    }
    let d = &v["memory_delta"];
    assert!(
        d["delta_bytes"].as_u64().unwrap() < d["full_bytes"].as_u64().unwrap(),
        "{d}"
    );
    let t = v["throughput"].as_array().unwrap();
    assert_eq!(t.len(), 4, "memory and rocksdb, without and with snapshots");
    assert!(
        t.iter()
            .filter(|x| !x["every_secs"].is_null())
            .all(|x| x["snapshots"].as_u64().unwrap() >= 1 && x["failed"] == 0),
        "{t:?}"
    );
    let scale = v["scale"].as_array().unwrap();
    let keys: Vec<u64> = scale.iter().map(|p| p["keys"].as_u64().unwrap()).collect();
    assert_eq!(keys, [20_000, 80_000]);
    assert!(
        scale[1]["snapshot_bytes"].as_u64().unwrap()
            > 3 * scale[0]["snapshot_bytes"].as_u64().unwrap(),
        "four times the keys, about four times the bytes: {scale:?}"
    );
    let p = &v["partitions"];
    assert_eq!(p["partitions"], 4, "{p}");
    assert!(p["bytes"].as_u64().unwrap() > 0, "{p}");
    assert!(
        b["restore_breakdown"]["transfer_secs"].as_f64().unwrap() > 0.0,
        "{b}"
    );
    let f = &v["failover"];
    assert_eq!(f["keys"], 20_000, "{f}");
    assert_eq!(
        f["standby_downloaded"], 0,
        "a promotion downloads nothing: {f}"
    );
    assert_eq!(
        f["standby_replayed"], f["lag_at_promote"],
        "a promotion replays the lag it finds: {f}"
    );
    assert!(f["snapshot_tail_downloaded"].as_u64().unwrap() > 0, "{f}");
    assert!(f["full_replay_records"].as_u64().unwrap() >= 20_000, "{f}");
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    let md = std::fs::read_to_string(out_dir.join("bench.md")).unwrap();
    assert!(md.contains("promoted standby"), "{md}");
    assert!(
        md.contains("| measure | statesnap | compared with | ratio |"),
        "{md}"
    );
    assert!(md.contains("restore-vs-history.svg"), "{md}");
    assert!(md.contains("hard-links SSTs"), "{md}");
    let svg = std::fs::read_to_string(out_dir.join("restore-vs-history.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(
        svg.contains("full changelog replay"),
        "the legend names both series"
    );
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "the scratch directory is removed"
    );
}

/// `statesnap` with no `AWS_*` variable of this environment (and no
/// `RUST_LOG`), so a test sees only the settings it passes.
fn statesnap_clean_env() -> Command {
    let mut c = statesnap();
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("AWS_")) {
            c.env_remove(k);
        }
    }
    c.env_remove("RUST_LOG");
    c
}

/// Missing S3 credentials are configuration to fix (exit 3), not an outage
/// to retry (7): with no key pair, web identity or container credentials,
/// object_store asks the instance metadata endpoint, which does not answer
/// here (a closed loopback port stands in for "not on EC2"). Half a key
/// pair is refused the same way. No network beyond loopback.
#[test]
fn missing_s3_credentials_are_config_not_transient() {
    let base = [
        "stores",
        "--repo",
        "s3://bucket/prefix",
        "-o",
        "endpoint=http://127.0.0.1:9",
        "-o",
        "allow_http=true",
        "-o",
        "region=us-east-1",
        "-o",
        "metadata_endpoint=http://127.0.0.1:9",
        "--json",
    ];
    let out = statesnap_clean_env()
        .args(base)
        .assert()
        .code(3)
        .get_output()
        .stdout
        .clone();
    assert_eq!(json_of(&out)["error"]["kind"], "config");
    for half in ["access_key_id=x", "secret_access_key=y"] {
        let out = statesnap_clean_env()
            .args(base)
            .args(["-o", half])
            .assert()
            .code(3)
            .get_output()
            .stdout
            .clone();
        assert_eq!(json_of(&out)["error"]["kind"], "config", "{half}");
    }
}

/// The hint for a missing repository is a command that works, and a path
/// that is a regular file is not "missing" (config, not not-found).
#[test]
fn the_missing_repository_hint_works_and_a_file_is_not_a_repository() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("file://{}", dir.path().join("nothing").display());
    let out = statesnap()
        .args(["stores", "--repo", &missing])
        .assert()
        .code(4)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8_lossy(&out);
    // The command between the backticks after "create one with".
    let hint = err
        .split("create one with `")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap_or_else(|| panic!("no hint: {err}"));
    let words: Vec<&str> = hint.split_whitespace().collect();
    assert_eq!(words[0], "statesnap", "{err}");
    statesnap().args(&words[1..]).assert().success();
    statesnap()
        .args(["stores", "--repo", &missing])
        .assert()
        .success();

    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a repository").unwrap();
    let file_url = format!("file://{}", file.display());
    for cmd in ["stores", "init"] {
        let out = statesnap()
            .args([cmd, "--repo", &file_url, "--json"])
            .assert()
            .code(3)
            .get_output()
            .stdout
            .clone();
        assert_eq!(json_of(&out)["error"]["kind"], "config", "{cmd}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"not a repository");
}

/// `list` of a store with no snapshots is not found (4), as `show` is;
/// a store that has snapshots lists them.
#[test]
fn list_and_show_of_a_store_without_snapshots_are_both_not_found() {
    let f = fixture();
    for args in [
        &["list", "shop/carts/1"][..],
        &["show", "shop/carts/1", "latest"],
        &["list", "shop/cart/0"],
        &["show", "shop/cart/0", "01JAAAAAAAAAAAAAAAAAAAAAAA"],
    ] {
        let v = run_json(&f, args, 4);
        assert_eq!(v["error"]["kind"], "not-found", "{args:?}: {v}");
    }
    assert_eq!(snapshot_ids(&f).len(), 3);
}

/// A plain path given to `--repo` is a local directory (absolute or
/// relative to the current directory), as its file:// URL.
#[test]
fn a_plain_path_repository_is_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let abs = dir.path().join("abs-repo");
    let out = statesnap()
        .args(["init", "--repo", abs.to_str().unwrap(), "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let url = json_of(&out)["repository"].as_str().unwrap().to_owned();
    assert!(url.starts_with("file:///"), "{url}");
    assert!(abs.join("statesnap.json").exists());
    statesnap()
        .current_dir(dir.path())
        .args(["init", "--repo", "./rel-repo"])
        .assert()
        .success();
    assert!(dir.path().join("rel-repo/statesnap.json").exists());
    let out = statesnap()
        .current_dir(dir.path())
        .args(["stores", "--repo", "rel-repo", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(json_of(&out), serde_json::json!([]));
    // The environment variable takes a path too.
    statesnap()
        .env("STATESNAP_REPO", abs.to_str().unwrap())
        .args(["stores"])
        .assert()
        .success();
}

/// `retain --dry-run` that condemns nothing says how many unreferenced
/// blobs the grace period protects, and their bytes.
#[test]
fn retain_dry_run_counts_unreferenced_blobs_the_grace_protects() {
    let f = fixture();
    let dry = run_json(&f, &["retain", STORE, "--keep-last", "1", "--dry-run"], 0);
    let s = &dry["stores"][0];
    assert_eq!(s["blobs_condemned"], 0, "{dry}");
    assert!(s["blobs_too_young"].as_u64().unwrap() > 0, "{dry}");
    assert!(s["bytes_too_young"].as_u64().unwrap() > 0, "{dry}");
    // With nothing dropped, every blob is referenced.
    let gc = run_json(&f, &["gc", "--dry-run"], 0);
    assert_eq!(gc["stores"][0]["blobs_too_young"], 0, "{gc}");
}

/// `gc --dry-run` right after a `retain` that condemned blobs says they
/// are waiting out the grace period (it said "0 B condemned" and nothing
/// of them), and a dry run never says it freed anything.
#[test]
fn gc_after_retain_reports_the_blobs_waiting_out_their_grace() {
    let f = fixture();
    // A short grace (its floor is twice --max-commit), and blobs older
    // than it, so `retain` condemns the dropped snapshot's own blobs.
    let fast = ["--max-commit", "1s", "--grace", "2s"];
    std::thread::sleep(Duration::from_millis(2500));
    let retain = run_json(
        &f,
        &[&["retain", STORE, "--keep-last", "1"][..], &fast].concat(),
        0,
    );
    let condemned = retain["stores"][0]["blobs_condemned"].as_u64().unwrap();
    assert!(condemned > 0, "{retain}");
    let gc = run_json(&f, &[&["gc", "--dry-run"][..], &fast].concat(), 0);
    let s = &gc["stores"][0];
    assert_eq!(s["blobs_pending"].as_u64(), Some(condemned), "{gc}");
    assert!(s["bytes_pending"].as_u64().unwrap() > 0, "{gc}");
    assert!(s["pending_ripe_at_ms"].as_i64().is_some(), "{gc}");
    assert_eq!(s["blobs_deleted"], 0, "{gc}");
    let text = statesnap_clean_env()
        .args(["gc", "--dry-run", "--repo", &f.repo_url])
        .args(fast)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains(&format!("{condemned} blobs ("))
            && text.contains("waiting out the grace period"),
        "{text}"
    );
    assert!(text.contains("would be freed now"), "{text}");
    // Once the grace has passed, the dry run counts them as what a run
    // would delete, and still changes nothing.
    std::thread::sleep(Duration::from_millis(2500));
    let gc = run_json(&f, &[&["gc", "--dry-run"][..], &fast].concat(), 0);
    assert_eq!(
        gc["stores"][0]["blobs_deleted"].as_u64(),
        Some(condemned),
        "{gc}"
    );
    assert_eq!(gc["stores"][0]["blobs_pending"], 0, "{gc}");
    let again = run_json(&f, &[&["gc", "--dry-run"][..], &fast].concat(), 0);
    assert_eq!(
        again["stores"][0]["blobs_deleted"].as_u64(),
        Some(condemned),
        "{again}"
    );
}

/// A warning the command reports itself (verify's bad blob) is printed
/// once, on stdout, not again as a log line on stderr; and nothing on a
/// non-terminal stderr carries colour codes.
#[test]
fn warnings_are_printed_once_without_colour_codes() {
    let f = fixture();
    rot_newest_largest_sst(&f);
    for json in [false, true] {
        let mut c = statesnap_clean_env();
        c.args(["verify", "--repo", &f.repo_url]);
        if json {
            c.arg("--json");
        }
        let out = c.assert().code(5).get_output().clone();
        assert!(!out.stdout.is_empty());
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "",
            "the report is on stdout only (json={json})"
        );
    }
    // A restore that skips the rotten snapshot: reported once (stdout),
    // and whatever reaches stderr has no escape codes.
    let target = f.path("restored");
    let out = statesnap_clean_env()
        .args(["restore", STORE, "--repo", &f.repo_url])
        .args(["--changelog", &f.log_url, "--to", target.to_str().unwrap()])
        .assert()
        .success()
        .get_output()
        .clone();
    assert!(!out.stderr.contains(&0x1b), "{:?}", out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// The exit-code table's rows without a test elsewhere: 2 usage and 8 local
/// I/O. (0, 3, 4, 5, 7, 9 and 130 are asserted by the tests above; 1 is a
/// bug and 6 needs a changelog whose prefix was deleted, which the file
/// log never does: the library's tests cover that kind.)
#[test]
fn usage_and_local_io_errors_have_their_exit_codes() {
    statesnap().args(["list"]).assert().code(2);
    statesnap().args(["no-such-command"]).assert().code(2);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    // A directory cannot be created under a regular file.
    let under = format!("file://{}", file.join("repo").display());
    let out = statesnap()
        .args(["init", "--repo", &under, "--json"])
        .assert()
        .code(8)
        .get_output()
        .stdout
        .clone();
    assert_eq!(json_of(&out)["error"]["kind"], "io");
}

/// Cloning a snapshot the target already holds adds no duplicate: the
/// report says it is already present and the target still lists one.
#[test]
fn cloning_the_same_snapshot_again_adds_no_duplicate() {
    let f = fixture();
    let first = run_json(&f, &["clone", "--from", STORE, "--to", "copy/carts/0"], 0);
    assert_eq!(first["already_present"], false, "{first}");
    let again = run_json(&f, &["clone", "--from", STORE, "--to", "copy/carts/0"], 0);
    assert_eq!(again["already_present"], true, "{again}");
    assert_eq!(again["snapshot"], first["snapshot"], "{again}");
    assert_eq!(again["blobs_copied"], 0, "{again}");
    let list = run_json(&f, &["list", "copy/carts/0"], 0);
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 1, "{list}");
    // Another snapshot of the source is a new copy.
    let ids = snapshot_ids(&f);
    let older = run_json(
        &f,
        &[
            "clone",
            "--from",
            STORE,
            "--to",
            "copy/carts/0",
            "--snapshot",
            &ids[0],
        ],
        0,
    );
    assert_eq!(older["already_present"], false, "{older}");
    let list = run_json(&f, &["list", "copy/carts/0"], 0);
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 2, "{list}");
}

/// `demo --keep` names what it kept and three commands to try; each runs.
/// Without --dir the demo works under $TMPDIR, not the current directory.
#[test]
fn demo_keep_prints_commands_that_work() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("cwd");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::create_dir(&tmp).unwrap();
    let out = statesnap()
        .current_dir(&cwd)
        .env("TMPDIR", &tmp)
        .args(["demo", "--keys", "2000", "--updates-per-key", "5"])
        .args(["--store", "memory", "--keep", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v = json_of(&out);
    let kept = &v["kept"];
    assert_eq!(kept["store"], "demo/users/0", "{v}");
    let kept_dir = PathBuf::from(kept["dir"].as_str().unwrap());
    assert!(kept_dir.starts_with(&tmp), "{v}");
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0, "cwd untouched");
    let commands = kept["commands"].as_array().unwrap();
    assert_eq!(commands.len(), 3, "{v}");
    for c in commands {
        let argv: Vec<&str> = c
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap())
            .collect();
        assert_eq!(argv[0], "statesnap");
        statesnap()
            .current_dir(&cwd)
            .args(&argv[1..])
            .assert()
            .success();
    }
    // The text form prints the same commands.
    let work = dir.path().join("demo-text");
    statesnap()
        .args(["demo", "--keys", "2000", "--updates-per-key", "5"])
        .args([
            "--store",
            "memory",
            "--keep",
            "--dir",
            work.to_str().unwrap(),
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "statesnap verify demo/users/0 --deep",
        ));
}

/// The demo snapshots at a cadence that does not grow with the workload
/// (it used to snapshot every twentieth of it, so the tail a crash leaves
/// grew with the history): a longer history keeps the same cadence.
#[test]
fn the_demo_snapshot_cadence_does_not_grow_with_the_history() {
    let cadence = |updates: &str| {
        let out = statesnap()
            .args(["demo", "--keys", "2000", "--updates-per-key", updates])
            .args(["--store", "memory", "--json"])
            .env("TMPDIR", std::env::temp_dir())
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let v = json_of(&out);
        assert_eq!(v["digests_equal"], true, "{v}");
        v["snapshot_every_records"].as_u64().unwrap()
    };
    let short = cadence("50");
    let long = cadence("100");
    assert_eq!(short, long, "the cadence is the same for twice the history");
    assert!(short > 0);
}

/// Edits the manifest of snapshot `id` with `edit` and reseals it (a
/// correct checksum), as an older or buggy writer would have written it.
fn rewrite_manifest(f: &Fixture, id: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let dir = f.path("repo/stores/shop.carts.0/manifests");
    let path = std::fs::read_dir(&dir)
        .expect("manifests")
        .map(|e| e.expect("entry").path())
        .find(|p| p.to_string_lossy().contains(id))
        .expect("the snapshot's manifest");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    edit(&mut v);
    let body = statesnap::repo::Manifest::canonical_body(&v).expect("body");
    v["checksum"] = blake3::hash(&body).to_hex().to_string().into();
    std::fs::write(&path, serde_json::to_vec_pretty(&v).expect("encode")).expect("write");
}

/// `verify --deep` on RocksDB snapshots (the default store) really
/// compares: their manifests record a digest, the restored contents match
/// it, and a digest that disagrees with the (intact) blobs fails with exit
/// code 5.
#[test]
fn verify_deep_compares_a_rocksdb_snapshots_recorded_digest() {
    let f = fixture();
    let deep = run_json(&f, &["verify", STORE, "--deep"], 0);
    let d = &deep["deep"][0];
    assert_eq!(d["status"], "matched", "{deep}");
    assert_eq!(d["digest_compared"], true, "{deep}");
    assert_eq!(d["ok"], true, "{deep}");
    assert_eq!(d["expected_digest"], d["actual_digest"], "{deep}");
    assert_eq!(d["keys"], 299, "{deep}");
    assert_eq!(deep["deep_not_compared"], 0);
    statesnap()
        .args(["verify", STORE, "--deep", "--repo", &f.repo_url])
        .assert()
        .success()
        .stdout(predicate::str::contains("match the recorded digest"));

    // The newest manifest's digest altered (its key count kept) and resealed.
    let ids = snapshot_ids(&f);
    rewrite_manifest(&f, &ids[2], |v| {
        let d = v["logical_digest"].as_str().unwrap().to_owned();
        let (keys, sum) = d.split_once(':').unwrap();
        let flipped = if sum.starts_with('0') { "1" } else { "0" };
        v["logical_digest"] = format!("{keys}:{flipped}{}", &sum[1..]).into();
    });
    let blobs = run_json(&f, &["verify"], 0);
    assert_eq!(blobs["ok"], true, "the blobs are intact: {blobs}");
    let bad = run_json(&f, &["verify", STORE, "--deep"], 5);
    assert_eq!(bad["ok"], false);
    assert_eq!(bad["deep"][0]["status"], "mismatch", "{bad}");
    assert_eq!(bad["deep"][0]["digest_compared"], true, "{bad}");
    assert_eq!(bad["deep"][0]["ok"], false, "{bad}");
}

/// A manifest that records no digest (as older writers wrote RocksDB
/// snapshots): `verify --deep` restores it, verifying every blob, and says
/// it compared nothing — its own status, not "matched" — without failing.
/// `show` labels its key count as an estimate.
#[test]
fn verify_deep_says_when_no_digest_was_recorded() {
    let f = fixture();
    let ids = snapshot_ids(&f);
    rewrite_manifest(&f, &ids[2], |v| {
        let m = v.as_object_mut().unwrap();
        m.remove("logical_digest");
        m["stats"].as_object_mut().unwrap().remove("counts_exact");
    });
    let deep = run_json(&f, &["verify", STORE, "--deep"], 0);
    let d = &deep["deep"][0];
    assert_eq!(d["snapshot"], ids[2].as_str(), "{deep}");
    assert_eq!(d["status"], "no_digest_recorded", "{deep}");
    assert_eq!(d["digest_compared"], false, "{deep}");
    assert_eq!(d["expected_digest"], serde_json::Value::Null, "{deep}");
    assert_eq!(deep["deep_not_compared"], 1, "{deep}");
    statesnap()
        .args(["verify", STORE, "--deep", "--repo", &f.repo_url])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "no digest recorded: blobs verified only",
        ));
    statesnap()
        .args(["show", STORE, &ids[2], "--repo", &f.repo_url])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("keys (estimate)")
                .and(predicate::str::contains("none recorded")),
        );
    let list = run_json(&f, &["list", STORE], 0);
    assert_eq!(list["snapshots"][2]["keys_exact"], false, "{list}");
    assert_eq!(list["snapshots"][1]["keys_exact"], true, "{list}");
}

/// `show` (and `list`) print the key count counted at snapshot time. The
/// fixture's second snapshot holds 300 keys, each written twice, in files
/// that hold both versions: RocksDB's estimate (what `show` printed) counts
/// about twice as many.
#[test]
fn show_prints_the_exact_key_count_of_a_store_with_overwritten_keys() {
    let f = fixture();
    let ids = snapshot_ids(&f);
    // RocksDB's estimate for that snapshot's contents is not 300.
    let rt = rt();
    let estimate = rt.block_on(async {
        let repo = Repository::open(&f.repo_url, Default::default())
            .await
            .unwrap();
        let sk = statesnap::StoreKey::new("shop", "carts", 0).unwrap();
        let s = repo
            .catalog()
            .get_snapshot(&sk, ids[1].parse().unwrap())
            .await
            .unwrap();
        let dir = f.path("opened");
        let (store, _) = statesnap::restore::open_snapshot(
            &statesnap::RocksFormat::default(),
            &repo,
            &s.manifest,
            &dir,
        )
        .await
        .unwrap();
        store
            .db()
            .property_int_value("rocksdb.estimate-num-keys")
            .unwrap()
            .unwrap()
    });
    assert_ne!(estimate, 300, "the estimate differs from the truth");

    let show = run_json(&f, &["show", STORE, &ids[1]], 0);
    assert_eq!(show["stats"]["keys"], 300, "{show}");
    assert_eq!(show["stats"]["counts_exact"], true, "{show}");
    let text = statesnap()
        .args(["show", STORE, &ids[1], "--repo", &f.repo_url])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("contents   300 keys (counted)"), "{text}");
    assert!(!text.contains(&format!("{estimate} keys")), "{text}");
    let list = run_json(&f, &["list", STORE], 0);
    assert_eq!(list["snapshots"][1]["keys"], 300, "{list}");
    assert_eq!(list["snapshots"][1]["keys_exact"], true, "{list}");
    assert_eq!(list["snapshots"][2]["keys"], 299, "{list}");
}

/// A point in time past the log's end is refused (config, exit 3) and
/// creates nothing; a target directory a live handle owns is refused
/// (transient, exit 7) and the live store is not touched.
#[test]
fn restore_refuses_a_point_past_the_end_and_a_directory_in_use() {
    let f = fixture();
    let past = f.path("past-the-end");
    statesnap()
        .args([
            "restore",
            STORE,
            "--repo",
            &f.repo_url,
            "--changelog",
            &f.log_url,
        ])
        .args(["--to", past.to_str().unwrap(), "--at-offset", "99999999"])
        .assert()
        .code(3);
    assert!(!past.exists(), "a refused restore creates nothing");

    // A live handle of another store partition owns `live` (as a path
    // template missing the partition would make it).
    let live = f.path("live");
    let rt = rt();
    let (m, h) = rt.block_on(async {
        let repo = Repository::open(&f.repo_url, Default::default())
            .await
            .expect("open");
        let m = StateManager::builder(repo)
            .policy(SnapshotPolicy::manual())
            .build()
            .expect("manager");
        let id = StoreKey::new("shop", "carts", 1)
            .expect("id")
            .changelog_id();
        let l = FileChangelog::open(f.path("log-1"), id, Default::default()).expect("log");
        let spec = StoreSpec::rocksdb(StoreKey::new("shop", "carts", 1).expect("spec"), l, &live);
        let mut h = m.open(spec).await.expect("open live");
        h.put("mine", "untouched");
        h.commit().expect("commit");
        (m, h)
    });
    let files = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("LOG"))
            .collect();
        v.sort();
        v
    };
    let before = files(&live);
    for spelled in [live.display().to_string(), format!("{}/", live.display())] {
        statesnap()
            .args([
                "restore",
                STORE,
                "--repo",
                &f.repo_url,
                "--changelog",
                &f.log_url,
            ])
            .args(["--to", &spelled, "--force"])
            .assert()
            .code(7);
        assert_eq!(files(&live), before, "{spelled}");
    }
    assert_eq!(h.get(b"mine").unwrap().as_deref(), Some(&b"untouched"[..]));
    rt.block_on(async {
        let closed = h.close().await.expect("handoff snapshot");
        assert!(closed.took_snapshot);
        m.shutdown().await;
    });
}

/// Defect: `statesnap list … | head -2` panicked ("failed printing to
/// stdout: Broken pipe", an internal error, exit 1). A reader that goes
/// away is not the command's failure: it exits as it would have, quietly,
/// for text and JSON output alike, and a restore whose stdout is gone
/// still restores.
#[test]
fn a_closed_stdout_is_not_an_error() {
    let f = fixture();
    let bin = assert_cmd::cargo::cargo_bin("statesnap");
    let target = f.path("piped-restore");
    let runs: [Vec<String>; 4] = [
        vec![
            "list".into(),
            STORE.into(),
            "--repo".into(),
            f.repo_url.clone(),
        ],
        vec![
            "--json".into(),
            "list".into(),
            STORE.into(),
            "--repo".into(),
            f.repo_url.clone(),
        ],
        vec![
            "scan".into(),
            STORE.into(),
            "--repo".into(),
            f.repo_url.clone(),
        ],
        vec![
            "restore".into(),
            STORE.into(),
            "--repo".into(),
            f.repo_url.clone(),
            "--changelog".into(),
            f.log_url.clone(),
            "--to".into(),
            target.display().to_string(),
        ],
    ];
    for args in runs {
        // A pipe whose read end is closed before the command writes.
        let mut child = std::process::Command::new(&bin)
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        for bad in ["panicked", "internal", "Broken pipe", "report it"] {
            assert!(!stderr.contains(bad), "{args:?}: {stderr}");
        }
    }
    let store = statesnap::RocksStore::open(&target, &Default::default()).unwrap();
    assert_eq!(
        store.get(b"cart-0001").unwrap().as_deref(),
        Some(&b"items-1-round-2"[..])
    );
}

/// Defect: on a terminal, `restore --full-replay` showed `replaying
/// 0/N (eta 0s)` for the whole replay and then jumped to done (the bar
/// was polled on the thread the replay blocked), and every spinner drew an
/// empty `0/0` bar without its message. Under a pseudo-terminal (`script`),
/// the bar shows positions strictly between 0 and the total while it runs.
#[test]
fn progress_moves_on_a_terminal_during_a_long_replay() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("this test needs `script` (util-linux) to give the command a terminal");
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let records = 1_500_000u32;
    let repo_url = long_history(root, records, None);
    let target = root.join("restored");
    let bin = assert_cmd::cargo::cargo_bin("statesnap");
    let command = format!(
        "{} restore {STORE} --repo {repo_url} --changelog file://{} --to {} --full-replay",
        bin.display(),
        root.join("log").display(),
        target.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("COLUMNS", "160")
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    let total = format!("/{records} records");
    let positions: Vec<u64> = screen
        .match_indices(&total)
        .filter_map(|(at, _)| {
            let digits: String = screen[..at]
                .chars()
                .rev()
                .take_while(char::is_ascii_digit)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            digits.parse().ok()
        })
        .collect();
    assert!(
        positions.iter().any(|&p| p > 0 && p < u64::from(records)),
        "no position between 0 and {records} was drawn: {positions:?}\n{screen}"
    );
    assert!(screen.contains("replaying"), "{screen}");
}

/// Writes `rounds` commits of the same 50 keys (`user-NN` = the round) on
/// a new changelog at `log_dir` and snapshots the store at the end.
async fn incarnation(repo_url: &str, root: &Path, log_dir: &str, rounds: u32) {
    let m = match statesnap::Repository::open(repo_url, Default::default()).await {
        Ok(repo) => StateManager::builder(repo)
            .policy(SnapshotPolicy::manual())
            .build()
            .expect("manager"),
        Err(_) => manual_manager(repo_url).await,
    };
    let id = StoreKey::new("shop", "carts", 0).expect("key");
    let log = FileChangelog::open(root.join(log_dir), id.changelog_id(), Default::default())
        .expect("log");
    let spec = StoreSpec::rocksdb(id, log, root.join(format!("store-{log_dir}")));
    let mut h = m.open(spec).await.expect("open");
    for round in 0..rounds {
        for k in 0..50u32 {
            h.put(format!("user-{k:02}"), round.to_string());
        }
        h.commit().expect("commit");
    }
    assert!(h.snapshot_now().expect("snapshot"));
    let st = h.wait_for_snapshot().await;
    assert_eq!(st.snapshots_failed, 0, "{:?}", st.last_error);
    h.abandon().await;
    m.shutdown().await;
}

/// Defect: after the changelog was recreated, "latest" was the dead
/// incarnation's snapshot (the highest offset wins), and `get` printed its
/// data, while `retain` would delete that very snapshot as not live.
/// "latest" is the newest snapshot of the live incarnation everywhere
/// (`show`, `get`, `scan`), with a note that the store spans two.
#[test]
fn latest_is_the_newest_snapshot_of_the_live_changelog() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let repo_url = format!("file://{}", root.join("repo").display());
    let rt = rt();
    // The old incarnation: many records, a snapshot at a high offset.
    rt.block_on(incarnation(&repo_url, root, "log-old", 30));
    // The changelog recreated (a new lineage): few records, a snapshot at
    // a lower offset, created later.
    rt.block_on(incarnation(&repo_url, root, "log-new", 2));
    let list = run_json_args(&["list", STORE, "--repo", &repo_url], 0);
    let snaps = list["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 2);
    let (old, new) = if snaps[0]["offset"].as_u64() > snaps[1]["offset"].as_u64() {
        (&snaps[0], &snaps[1])
    } else {
        (&snaps[1], &snaps[0])
    };
    assert!(old["offset"].as_u64() > new["offset"].as_u64());

    let latest = run_json_args(&["show", STORE, "latest", "--repo", &repo_url], 0);
    assert_eq!(latest["snapshot_id"], new["id"], "{latest}");
    let got = run_json_args(&["get", STORE, "user-07", "--repo", &repo_url], 0);
    assert_eq!(got["value"]["utf8"], "1", "the live incarnation's value");
    let old_id = old["id"].as_str().unwrap();
    let got = run_json_args(
        &[
            "get",
            STORE,
            "user-07",
            "--snapshot",
            old_id,
            "--repo",
            &repo_url,
        ],
        0,
    );
    assert_eq!(got["value"]["utf8"], "29", "an id still reads the old one");
    // The note on stderr says which incarnation `latest` took.
    statesnap()
        .args(["show", STORE, "latest", "--repo", &repo_url])
        .assert()
        .success()
        .stderr(predicate::str::contains("span 2 changelog incarnations"));
    // Named by its changelog, `latest` is that incarnation's newest, for
    // every read command.
    let log_url = |d: &str| format!("file://{}", root.join(d).display());
    let by_old = run_json_args(
        &[
            "show",
            STORE,
            "latest",
            "--changelog",
            &log_url("log-old"),
            "--repo",
            &repo_url,
        ],
        0,
    );
    assert_eq!(by_old["snapshot_id"], old["id"], "{by_old}");
    for (log, want) in [("log-old", "29"), ("log-new", "1")] {
        let got = run_json_args(
            &[
                "get",
                STORE,
                "user-07",
                "--changelog",
                &log_url(log),
                "--repo",
                &repo_url,
            ],
            0,
        );
        assert_eq!(got["value"]["utf8"], want, "{log}: {got}");
    }
    // A changelog recreated once more, with no snapshot yet: a clear
    // not-found, never another incarnation's data.
    use statesnap::changelog::Changelog as _;
    let third = FileChangelog::open(
        root.join("log-third"),
        StoreKey::new("shop", "carts", 0).unwrap().changelog_id(),
        Default::default(),
    )
    .unwrap();
    third
        .append(&[statesnap::changelog::Record::put("user-07", "x")])
        .unwrap();
    drop(third);
    for args in [
        vec!["get", STORE, "user-07"],
        vec!["scan", STORE],
        vec!["show", STORE, "latest"],
        vec!["verify", STORE, "--deep"],
    ] {
        statesnap()
            .args(&args)
            .args(["--changelog", &log_url("log-third"), "--repo", &repo_url])
            .assert()
            .code(4)
            .stderr(predicate::str::contains("current incarnation"));
    }
    // Retention agrees: the old incarnation's snapshot is the one it drops.
    let retain = run_json_args(
        &[
            "retain",
            STORE,
            "--keep-last",
            "1",
            "--dry-run",
            "--repo",
            &repo_url,
        ],
        0,
    );
    let deleted: Vec<&str> = retain["stores"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["manifests_deleted"].as_array().unwrap())
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(deleted, vec![old_id], "{retain}");
    // And says why, in words (it said the manifest's path).
    let why = retain["stores"][0]["manifests_deleted"][0]["reason"]
        .as_str()
        .unwrap();
    assert!(why.starts_with("of another changelog incarnation"), "{why}");
}
