//! Offline reads of snapshots, without a running application: `get`,
//! `scan`, `diff`. Each restores the snapshot alone (no changelog) into a
//! scratch directory with `restore::open_snapshot`, every blob verified,
//! reads, and removes the scratch directory.

use std::process::ExitCode;

use bytes::Bytes;
use serde_json::json;
use statesnap::repo::SnapshotInfo;
use statesnap::restore::open_snapshot;
use statesnap::{Error, ErrorKind, Repository, Result, StateStore, StateStoreExt, StoreKey};

use super::{FormatKind, open_repo, snapshot, store_key, with_format};
use crate::args::{DiffArgs, GetArgs, LiveArg, RepoArgs, ScanArgs, SnapshotArg, StoreArg};
use crate::out::{self, Out};

fn arg_bytes(s: &str, hex: bool) -> Result<Vec<u8>> {
    if hex {
        out::from_hex(s)
    } else {
        Ok(s.as_bytes().to_vec())
    }
}

/// The repository, store and snapshot a read command names.
async fn chosen(
    repo: &RepoArgs,
    store: &StoreArg,
    snapshot_arg: &SnapshotArg,
    live: &LiveArg,
) -> Result<(Repository, StoreKey, SnapshotInfo)> {
    let repo = open_repo(repo).await?;
    let sk = store_key(&store.store)?;
    let s = snapshot(
        &repo,
        &sk,
        &snapshot_arg.snapshot,
        live.changelog.as_deref(),
    )
    .await?;
    Ok((repo, sk, s))
}

pub async fn get(a: &GetArgs, out: Out) -> Result<ExitCode> {
    let (repo, sk, s) = chosen(&a.repo, &a.store, &a.snapshot, &a.live).await?;
    let key = arg_bytes(&a.key, a.hex)?;
    let kind = FormatKind::named(&s.manifest.store_format.name)?;
    let (_guard, dir) = super::scratch()?;
    let spinner = out.spinner(&format!("opening snapshot {}", s.id()));
    let value = with_format!(kind, f => {
        let (store, _) = open_snapshot(&f, &repo, &s.manifest, &dir).await?;
        store.get(&key)?
    });
    spinner.finish_and_clear();
    if out.json {
        out.json(&json!({
            "snapshot": s.id().to_string(),
            "key": out::json_bytes(&key),
            "value": value.as_deref().map(out::json_bytes),
        }));
    } else {
        match &value {
            Some(v) => crate::outln!("{}", out::show_bytes(v, a.hex)),
            None => eprintln!(
                "key {} is not in snapshot {} of {sk}",
                out::show_bytes(&key, a.hex),
                s.id()
            ),
        }
    }
    Ok(if value.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(out::exit_code(ErrorKind::NotFound))
    })
}

pub async fn scan(a: &ScanArgs, out: Out) -> Result<ExitCode> {
    let (repo, _, s) = chosen(&a.repo, &a.store, &a.snapshot, &a.live).await?;
    let prefix = a
        .prefix
        .as_deref()
        .map(|p| arg_bytes(p, a.hex))
        .transpose()?;
    let kind = FormatKind::named(&s.manifest.store_format.name)?;
    let (_guard, dir) = super::scratch()?;
    let spinner = out.spinner(&format!("opening snapshot {}", s.id()));
    let (pairs, more) = with_format!(kind, f => {
        let (store, _) = open_snapshot(&f, &repo, &s.manifest, &dir).await?;
        let it = match &prefix {
            Some(p) => store.prefix(p)?,
            None => store.iter()?,
        };
        let mut pairs: Vec<(Bytes, Bytes)> = Vec::new();
        let mut more = false;
        for kv in it {
            if pairs.len() == a.limit {
                more = true;
                break;
            }
            pairs.push(kv?);
        }
        (pairs, more)
    });
    spinner.finish_and_clear();
    if out.json {
        out.json(&json!({
            "snapshot": s.id().to_string(),
            "pairs": pairs.iter().map(|(k, v)| json!({
                "key": out::json_bytes(k), "value": out::json_bytes(v),
            })).collect::<Vec<_>>(),
            "truncated": more,
        }));
    } else {
        for (k, v) in &pairs {
            crate::outln!(
                "{}\t{}",
                out::show_bytes(k, a.hex),
                out::show_bytes(v, a.hex)
            );
        }
        if more {
            eprintln!("(first {} pairs; --limit N for more)", a.limit);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Keys added, removed and changed between two sorted runs of pairs.
#[derive(Debug, Default)]
struct Diff {
    added: u64,
    removed: u64,
    changed: u64,
    unchanged: u64,
    samples: [Vec<Bytes>; 3],
}

impl Diff {
    fn note(&mut self, which: usize, key: &Bytes, sample: usize) {
        if self.samples[which].len() < sample {
            self.samples[which].push(key.clone());
        }
    }

    /// Merges two ascending iterators of pairs.
    fn of(
        old: impl Iterator<Item = Result<(Bytes, Bytes)>>,
        new: impl Iterator<Item = Result<(Bytes, Bytes)>>,
        sample: usize,
    ) -> Result<Diff> {
        let mut d = Diff::default();
        let mut old = old.peekable();
        let mut new = new.peekable();
        loop {
            let order = match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some(Err(_)), _) => {
                    return Err(old.next().and_then(Result::err).unwrap_or_else(internal));
                }
                (_, Some(Err(_))) => {
                    return Err(new.next().and_then(Result::err).unwrap_or_else(internal));
                }
                (Some(Ok(_)), None) => std::cmp::Ordering::Less,
                (None, Some(Ok(_))) => std::cmp::Ordering::Greater,
                (Some(Ok((a, _))), Some(Ok((b, _)))) => a.cmp(b),
            };
            match order {
                std::cmp::Ordering::Less => {
                    if let Some(Ok((k, _))) = old.next() {
                        d.removed += 1;
                        d.note(1, &k, sample);
                    }
                }
                std::cmp::Ordering::Greater => {
                    if let Some(Ok((k, _))) = new.next() {
                        d.added += 1;
                        d.note(0, &k, sample);
                    }
                }
                std::cmp::Ordering::Equal => {
                    if let (Some(Ok((k, a))), Some(Ok((_, b)))) = (old.next(), new.next()) {
                        if a == b {
                            d.unchanged += 1;
                        } else {
                            d.changed += 1;
                            d.note(2, &k, sample);
                        }
                    }
                }
            }
        }
        Ok(d)
    }
}

fn internal() -> Error {
    Error::new(ErrorKind::Internal, "diff lost track of an iterator error")
}

pub async fn diff(a: &DiffArgs, out: Out) -> Result<ExitCode> {
    let repo = open_repo(&a.repo).await?;
    let sk = store_key(&a.store.store)?;
    let live = a.live.changelog.as_deref();
    let s1 = snapshot(&repo, &sk, &a.from, live).await?;
    let s2 = snapshot(&repo, &sk, &a.to, live).await?;
    let kind = FormatKind::named(&s1.manifest.store_format.name)?;
    if s2.manifest.store_format.name != s1.manifest.store_format.name {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "the two snapshots have different formats id1=`{}` format1=`{}` id2=`{}` \
                 format2=`{}`; diff compares snapshots of one format",
                s1.id(),
                s1.manifest.store_format.name,
                s2.id(),
                s2.manifest.store_format.name
            ),
        ));
    }
    let (_g1, dir1) = super::scratch()?;
    let (_g2, dir2) = super::scratch()?;
    let spinner = out.spinner("opening both snapshots");
    let d = with_format!(kind, f => {
        let (old, _) = open_snapshot(&f, &repo, &s1.manifest, &dir1).await?;
        let (new, _) = open_snapshot(&f, &repo, &s2.manifest, &dir2).await?;
        Diff::of(old.iter()?, new.iter()?, a.sample)?
    });
    spinner.finish_and_clear();
    let names = ["added", "removed", "changed"];
    if out.json {
        let mut v = json!({
            "from": {"id": s1.id().to_string(), "offset": s1.offset()},
            "to": {"id": s2.id().to_string(), "offset": s2.offset()},
            "added": d.added,
            "removed": d.removed,
            "changed": d.changed,
            "unchanged": d.unchanged,
        });
        for (i, n) in names.iter().enumerate() {
            v[format!("sample_{n}")] = json!(
                d.samples[i]
                    .iter()
                    .map(|k| out::json_bytes(k))
                    .collect::<Vec<_>>()
            );
        }
        out.json(&v);
        return Ok(ExitCode::SUCCESS);
    }
    crate::outln!(
        "{} (offset {}) -> {} (offset {}): {} added, {} removed, {} changed, {} unchanged",
        s1.id(),
        s1.offset(),
        s2.id(),
        s2.offset(),
        d.added,
        d.removed,
        d.changed,
        d.unchanged
    );
    for (i, n) in names.iter().enumerate() {
        if !d.samples[i].is_empty() {
            let keys: Vec<String> = d.samples[i]
                .iter()
                .map(|k| out::show_bytes(k, a.hex))
                .collect();
            crate::outln!("{n}: {}", keys.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pairs: &[(&str, &str)]) -> Vec<Result<(Bytes, Bytes)>> {
        pairs
            .iter()
            .map(|(k, v)| Ok((Bytes::from(k.to_string()), Bytes::from(v.to_string()))))
            .collect()
    }

    #[test]
    fn a_merge_counts_each_kind_of_difference() {
        let old = run(&[("a", "1"), ("b", "1"), ("c", "1"), ("e", "1")]);
        let new = run(&[("b", "1"), ("c", "2"), ("d", "1"), ("e", "1"), ("f", "1")]);
        let d = Diff::of(old.into_iter(), new.into_iter(), 1).unwrap();
        assert_eq!((d.added, d.removed, d.changed, d.unchanged), (2, 1, 1, 2));
        assert_eq!(d.samples[0], vec![Bytes::from("d")]);
        assert_eq!(d.samples[1], vec![Bytes::from("a")]);
        assert_eq!(d.samples[2], vec![Bytes::from("c")]);
        let broken = vec![Err(Error::new(ErrorKind::Corrupt, "bad"))];
        let e = Diff::of(broken.into_iter(), run(&[]).into_iter(), 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
    }
}
