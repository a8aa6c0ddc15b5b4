//! `statesnap demo`: the main job on embedded defaults.

use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use statesnap::changelog::file::{FileChangelog, FileChangelogOptions};
use statesnap::changelog::{Changelog, ChangelogId};
use statesnap::restore::ReplayOptions;
use statesnap::store::logged::LoggedStore;
use statesnap::store::memory::MemoryStore;
use statesnap::store::{StateStore, StateStoreExt};
use statesnap::{Error, ErrorKind, Result};

use crate::args::{DemoArgs, StoreKind};

fn open_store(
    kind: StoreKind,
    #[allow(unused_variables)] dir: &Path,
) -> Result<Box<dyn StateStore>> {
    Ok(match kind {
        StoreKind::Memory => Box::new(MemoryStore::new()),
        #[cfg(feature = "rocksdb")]
        StoreKind::Rocksdb => Box::new(statesnap::store::rocks::RocksStore::open(
            dir,
            &statesnap::store::rocks::RocksOptions::default(),
        )?),
    })
}

fn value_for(i: u64, size: usize) -> Vec<u8> {
    let mut v = format!("value-{i:012}-").into_bytes();
    v.resize(size.max(v.len()), b'.');
    v.truncate(size);
    v
}

pub fn run(args: &DemoArgs, json: bool) -> Result<()> {
    if args.keys == 0 || args.batch == 0 {
        return Err(Error::new(
            ErrorKind::Config,
            "--keys and --batch must be at least 1",
        ));
    }
    let _tmp;
    let root: PathBuf = match &args.dir {
        Some(d) => d.clone(),
        None => {
            let t = tempfile::tempdir().map_err(|e| {
                Error::new(ErrorKind::Io, "cannot create a temporary directory").with_source(e)
            })?;
            let p = t.path().to_path_buf();
            _tmp = t;
            p
        }
    };
    let changelog_dir = root.join("changelog");
    let store_dir = root.join("store");
    let id = ChangelogId::for_store("demo", "counts", 0)?;
    let say = |s: String| {
        if !json {
            println!("{s}");
        }
    };
    say(format!(
        "statesnap demo: {} records over {} keys ({}-byte values), store={:?}, dir={}",
        args.records,
        args.keys,
        args.value_size,
        args.store,
        root.display()
    ));

    // 1. Write through a LoggedStore: changelog first, then the store.
    let mut model: HashMap<u64, Option<u64>> = HashMap::new();
    let t0 = Instant::now();
    {
        let changelog =
            FileChangelog::open(&changelog_dir, id.clone(), FileChangelogOptions::default())?;
        let store = open_store(args.store, &store_dir)?;
        let mut logged = LoggedStore::new(store, changelog)?;
        logged.catch_up(&ReplayOptions::default())?;
        for i in 0..args.records {
            // A multiplicative hash spreads writes over the key space.
            let k = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) % args.keys;
            let key = format!("key-{k:010}");
            if i % 10 == 9 {
                logged.delete(key);
                model.insert(k, None);
            } else {
                logged.put(key, value_for(i, args.value_size));
                model.insert(k, Some(i));
            }
            if (i + 1) % args.batch == 0 {
                logged.commit()?;
            }
        }
        logged.commit()?;
        logged.changelog().flush()?;
    }
    let write = t0.elapsed();
    say(format!(
        "wrote    {} records in {:.2?} ({:.0} records/s), committed every {}",
        args.records,
        write,
        args.records as f64 / write.as_secs_f64().max(1e-9),
        args.batch
    ));

    // 2. Lose the store entirely, then rebuild it by replaying the changelog.
    if store_dir.exists() {
        std::fs::remove_dir_all(&store_dir).map_err(|e| {
            Error::new(ErrorKind::Io, "cannot remove the demo store").with_source(e)
        })?;
    }
    let changelog = FileChangelog::open(&changelog_dir, id, FileChangelogOptions::default())?;
    let store = open_store(args.store, &store_dir)?;
    let mut logged = LoggedStore::new(store, changelog)?;
    let end = logged.changelog().end_offset()?;
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(end).with_style(
            ProgressStyle::with_template("replay   [{bar:40}] {pos}/{len} offsets {per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    };
    let report = logged.catch_up_with_progress(&ReplayOptions::default(), &mut |p| {
        bar.set_position(p.applied_offset + 1);
    })?;
    bar.finish_and_clear();
    say(format!(
        "replayed {} records ({} MB) in {:.2?} ({:.0} records/s) into an empty store",
        report.records,
        report.bytes / 1_000_000,
        report.duration,
        report.records_per_sec()
    ));

    // 3. Verify the rebuilt store against the model of committed writes.
    let t2 = Instant::now();
    let live: HashMap<u64, u64> = model
        .iter()
        .filter_map(|(k, v)| v.map(|i| (*k, i)))
        .collect();
    let mut seen = 0u64;
    for kv in logged.store().iter()? {
        let (k, v) = kv?;
        let ks = std::str::from_utf8(&k)
            .ok()
            .and_then(|s| s.strip_prefix("key-"))
            .and_then(|s| s.parse::<u64>().ok());
        let Some(k) = ks else {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("unexpected key in rebuilt store key={k:?}"),
            ));
        };
        match live.get(&k) {
            Some(i) if v.as_ref() == value_for(*i, args.value_size).as_slice() => seen += 1,
            _ => {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!("rebuilt store disagrees with the model key={k}"),
                ));
            }
        }
    }
    if seen != live.len() as u64 {
        return Err(Error::new(
            ErrorKind::Internal,
            format!(
                "rebuilt store is missing keys expected={} found={seen}",
                live.len()
            ),
        ));
    }
    say(format!(
        "verified {seen} live keys ({} deleted) in {:.2?}: the rebuilt store equals the committed writes",
        model.len() - live.len(),
        t2.elapsed()
    ));
    if json {
        println!(
            "{}",
            serde_json::json!({
                "records": args.records,
                "keys": args.keys,
                "live_keys": seen,
                "write_secs": write.as_secs_f64(),
                "replay_records": report.records,
                "replay_secs": report.duration.as_secs_f64(),
                "replay_records_per_sec": report.records_per_sec(),
            })
        );
    }
    Ok(())
}
