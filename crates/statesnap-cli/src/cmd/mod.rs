//! The commands over a repository. Each is one call into the library plus
//! printing; what they share — opening the repository, parsing a store key
//! or a snapshot id, picking the format a manifest names — lives here.

pub mod clean;
pub mod inspect;
pub mod read;
pub mod reshard;
pub mod restore;
pub mod verify;

use std::path::Path;

use statesnap::changelog::{Changelog, ChangelogUrl};
use statesnap::repo::{RepositoryOptions, SnapshotId, SnapshotInfo, StoreKey};
use statesnap::{Error, ErrorKind, Repository, Result};

use crate::args::RepoArgs;

/// Opens the repository the arguments name (its marker must exist).
pub async fn open_repo(a: &RepoArgs) -> Result<Repository> {
    Repository::open(&a.repo, repo_options(a)).await
}

/// The repository options from `-o KEY=VALUE`.
pub fn repo_options(a: &RepoArgs) -> RepositoryOptions {
    RepositoryOptions {
        store_options: a.options.iter().cloned().collect(),
        max_commit_duration: a.max_commit,
        ..RepositoryOptions::default()
    }
}

/// `APPLICATION/STORE/PARTITION` (or the dotted form the repository uses).
pub fn store_key(s: &str) -> Result<StoreKey> {
    let parts: Vec<&str> = if s.contains('/') {
        s.split('/').collect()
    } else {
        s.split('.').collect()
    };
    let bad = || {
        Error::new(
            ErrorKind::Config,
            format!(
                "bad store partition store=`{}`; write APPLICATION/STORE/PARTITION, e.g. \
                 shop/carts/0 (`statesnap stores` lists them)",
                s.escape_debug()
            ),
        )
    };
    let [app, store, partition] = parts[..] else {
        return Err(bad());
    };
    let partition = partition.parse().map_err(|_| bad())?;
    StoreKey::new(app, store, partition)
}

/// Snapshot `id` of `sk` (`latest`: the newest valid one of the live
/// changelog incarnation, as restore and retention mean it). With `live`,
/// the store's changelog URL, the live incarnation is the changelog's
/// current one, and `latest` is not found when none of its snapshots
/// belongs to it. Without, it is that of the most recently created
/// snapshot, and when the store's snapshots span several incarnations a
/// note on stderr says which one `latest` took. When the store has no
/// snapshots at all, the not-found error names similar stores.
pub async fn snapshot(
    repo: &Repository,
    sk: &StoreKey,
    id: &str,
    live: Option<&str>,
) -> Result<SnapshotInfo> {
    if let Some(id) = snapshot_id(id)? {
        return repo.catalog().get_snapshot(sk, id).await;
    }
    let listing = repo.catalog().list_snapshots(sk).await?;
    if let Some(url) = live {
        let log = changelog(url, sk)?;
        let lineage = log.lineage()?;
        if let Some(latest) = listing.latest_of(&lineage) {
            return Ok(latest.clone());
        }
        if !listing.snapshots.is_empty() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "no snapshot of the store belongs to its changelog's current incarnation \
                     store_key=`{sk}` changelog=`{url}` lineage=`{lineage}`; its {} valid \
                     snapshots belong to {} other incarnation(s), so the changelog was recreated \
                     after them and a restore replays it from its start (name a snapshot id to \
                     read an old one; `statesnap list --changelog` shows which)",
                    listing.snapshots.len(),
                    listing.lineages()
                ),
            ));
        }
    }
    if let Some(latest) = listing.latest() {
        let lineages = listing.lineages();
        if lineages > 1 {
            eprintln!(
                "note: the snapshots of {sk} span {lineages} changelog incarnations; `latest` is \
                 {} at offset {}, the newest of the live one (lineage {}, that of the most \
                 recently created snapshot); name a snapshot id to read another",
                latest.id(),
                latest.offset(),
                latest.manifest.changelog.lineage
            );
        }
        return Ok(latest.clone());
    }
    if listing.snapshots.is_empty() && listing.unreadable.is_empty() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "store has no snapshots store_key=`{sk}`; {}",
                similar_stores_hint(repo, sk).await
            ),
        ));
    }
    Err(Error::new(
        ErrorKind::NotFound,
        format!(
            "store has no valid snapshot store_key=`{sk}` ({} unreadable manifests; `statesnap list` \
         shows why)",
            listing.unreadable.len()
        ),
    ))
}

/// Not found: store `sk` has no snapshots (`list`), with similar stores.
pub async fn store_not_found(repo: &Repository, sk: &StoreKey) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!(
            "store has no snapshots store_key=`{sk}` repository=`{}`; {}",
            repo.url(),
            similar_stores_hint(repo, sk).await
        ),
    )
}

/// "did you mean" with store partitions close to `sk` (other partitions
/// of the same store, near spellings), or where to look.
async fn similar_stores_hint(repo: &Repository, sk: &StoreKey) -> String {
    let similar = repo
        .catalog()
        .similar_stores(sk, 5)
        .await
        .unwrap_or_default();
    if similar.is_empty() {
        "`statesnap stores` lists the stores that have some".to_owned()
    } else {
        let names: Vec<String> = similar.iter().map(|k| format!("`{k}`")).collect();
        format!(
            "did you mean {}? (`statesnap stores` lists every store)",
            names.join(", ")
        )
    }
}

/// A snapshot id argument: `latest` is `None`.
pub fn snapshot_id(id: &str) -> Result<Option<SnapshotId>> {
    match id {
        "latest" => Ok(None),
        id => Ok(Some(id.parse()?)),
    }
}

/// Opens the changelog `url` for reading, expecting the one a store `sk`
/// follows by convention (a Kafka URL names its own topic).
pub fn changelog(url: &str, sk: &StoreKey) -> Result<Box<dyn Changelog>> {
    let url: ChangelogUrl = url.parse()?;
    url.open_for_reading(sk.changelog_id())
}

/// Declares the snapshot formats this build reads, one entry each: its
/// `FormatKind` variant, the name its manifests record (the format's own
/// `FORMAT_NAME`), and the format value the library's generic operations
/// get. `FormatKind`, the `FORMATS` table and `with_format!` all come from
/// the entries, so a new format is one entry in the `formats!` below.
macro_rules! formats {
    ($d:tt $(
        $(#[doc = $doc:literal])*
        $(#[cfg($cfg:meta)])?
        $kind:ident = $name:path => $make:expr;
    )*) => {
        /// The snapshot formats this build reads.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum FormatKind {
            $($(#[doc = $doc])* $(#[cfg($cfg)])? $kind,)*
        }

        /// Every format this build reads, by the name its manifests record.
        const FORMATS: &[(&str, FormatKind)] = &[
            $($(#[cfg($cfg)])? ($name, FormatKind::$kind),)*
        ];

        /// Runs `$body` with `$f` bound to a format value of kind `$kind`: the
        /// library's operations are generic over the format type.
        macro_rules! with_format {
            ($d kind:expr, $d f:ident => $d body:expr) => {
                match $d kind {
                    $($(#[cfg($cfg)])? $crate::cmd::FormatKind::$kind => {
                        let $d f = $make;
                        $d body
                    })*
                }
            };
        }
        pub(crate) use with_format;
    };
}

formats! {$
    /// `portable`: restored into RocksDB (or memory without it).
    Portable = statesnap::format::portable::FORMAT_NAME => crate::cmd::portable();
    /// `rocksdb`.
    #[cfg(feature = "rocksdb")]
    Rocksdb = statesnap::format::rocks::FORMAT_NAME => statesnap::RocksFormat::new(Default::default());
}

impl FormatKind {
    /// The format named `name` (as manifests record it).
    pub fn named(name: &str) -> Result<Self> {
        match FORMATS.iter().find(|(n, _)| *n == name) {
            Some(&(_, kind)) => Ok(kind),
            None => {
                let names: Vec<&str> = FORMATS.iter().map(|&(n, _)| n).collect();
                Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "this build cannot read store format format=`{}`; it reads {}{}",
                        name.escape_debug(),
                        names.join(" and "),
                        if cfg!(feature = "rocksdb") {
                            ""
                        } else {
                            " (rebuild with the rocksdb feature for rocksdb)"
                        }
                    ),
                ))
            }
        }
    }

    /// The format of store `sk`'s newest snapshot (portable when it has
    /// none: any store can be rebuilt by replay into it).
    pub async fn of_store(repo: &Repository, sk: &StoreKey) -> Result<Self> {
        match repo.catalog().latest(sk).await? {
            Some(s) => FormatKind::named(&s.manifest.store_format.name),
            None => Ok(FormatKind::default_for_replay()),
        }
    }

    fn default_for_replay() -> Self {
        #[cfg(feature = "rocksdb")]
        {
            FormatKind::Rocksdb
        }
        #[cfg(not(feature = "rocksdb"))]
        {
            FormatKind::Portable
        }
    }
}

/// The portable format, restoring into a RocksDB store at the target path
/// (a directory a user can open) — or into memory in a build without
/// RocksDB.
#[cfg(feature = "rocksdb")]
pub fn portable() -> statesnap::PortableFormat<statesnap::RocksStore> {
    statesnap::PortableFormat::new(|p: &Path| {
        statesnap::RocksStore::open(p, &statesnap::RocksOptions::default())
    })
}

/// The portable format, restoring into memory.
#[cfg(not(feature = "rocksdb"))]
pub fn portable() -> statesnap::PortableFormat<statesnap::MemoryStore> {
    let _ = |_: &Path| ();
    statesnap::PortableFormat::memory()
}

/// A scratch directory path under the system's temporary directory that
/// does not exist yet (the library creates it), removed with the guard.
pub fn scratch() -> Result<(tempfile::TempDir, std::path::PathBuf)> {
    let dir = tempfile::Builder::new()
        .prefix("statesnap-")
        .tempdir()
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                "cannot create a scratch directory in the system's temporary directory; set \
                 TMPDIR to a writable one",
            )
            .with_source(e)
        })?;
    let path = dir.path().join("store");
    Ok((dir, path))
}
