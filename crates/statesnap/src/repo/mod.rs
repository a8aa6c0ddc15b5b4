//! The snapshot repository: blobs and manifests in any
//! [`object_store::ObjectStore`], chosen by URL.
//!
//! ```text
//! <root>/statesnap.json                                  marker (format version, id)
//! <root>/stores/<store-key>/manifests/<offset:020>-<id>.json
//! <root>/stores/<store-key>/blobs/<hh>/<blake3-hex>
//! ```
//!
//! * [`Repository::init`] creates the marker (conditional create; an existing
//!   repository is an `AlreadyExists` error, never silently reused), and
//!   [`Repository::open`] refuses a location without one.
//! * Blobs ([`blob`]) are content-addressed and verified on every read.
//! * [`Repository::commit`] writes a manifest last, with `PutMode::Create`,
//!   after re-checking every blob it names (invariant 3).
//! * [`catalog`] lists and picks snapshots, never trusting listing order;
//!   [`retention`] decides what to keep; [`gc`] collects unreferenced blobs
//!   with the two-phase protocol described in `docs/gc.md`.
//!
//! `object_store::Error` never crosses this module's public API: it is mapped
//! to an [`ErrorKind`](crate::ErrorKind) and kept as the error's source.

pub(crate) mod blob;
pub(crate) mod catalog;
pub(crate) mod clone;
pub(crate) mod commit;
#[cfg(feature = "testing")]
pub mod faulty;
pub(crate) mod gc;
pub(crate) mod limit;
pub(crate) mod maintenance;
pub(crate) mod manifest;
/// The object key layout; public with feature `testing`, for tests that
/// reach into a repository's objects.
#[cfg(feature = "testing")]
pub mod paths;
#[cfg(not(feature = "testing"))]
pub(crate) mod paths;
pub(crate) mod retention;
pub(crate) mod verify;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::clock::{SharedClock, system_clock};
use crate::error::{Error, ErrorKind, Result};

pub use blob::{BlobInfo, BlobReader, BlobRef, Blobs, PutOutcome, RestoreSync, TransferOptions};
pub use catalog::{
    Catalog, Listing, MAX_MANIFEST_BYTES, ManifestKey, SnapshotInfo, StoreSummary,
    UnreadableManifest,
};
pub use clone::CloneReport;
pub use commit::SnapshotWriter;
pub use gc::{CondemnationRecord, CondemnedBlob, GC_RECORD_FORMAT_VERSION, GcOptions, GcReport};
pub use limit::BandwidthLimit;
pub use maintenance::Maintenance;
pub(crate) use manifest::ManifestExtras;
pub use manifest::{
    ChangelogPosition, FEATURE_INLINE_FILES, FileEntry, InlineFile, MANIFEST_FORMAT_VERSION,
    MAX_FILE_PATH_LEN, MAX_INLINE_FILE, MAX_INLINE_TOTAL, Manifest, ManifestDraft, MeasuredRates,
    SUPPORTED_FEATURES, SnapshotStats, StoreFormatId,
};
pub use paths::{
    BlobHash, Entropy, MAX_NAME_LEN, MAX_STORE_KEY_LEN, ManifestName, OsEntropy, SeededEntropy,
    SharedEntropy, SnapshotId, StoreKey,
};
pub use retention::{
    DropReason, KeepReason, RetentionPlan, RetentionPolicy, plan as plan_retention,
    plan_for_changelog as plan_retention_for_changelog,
    plan_for_lineage as plan_retention_for_lineage,
};
pub use verify::{BadBlob, BadInlineFile, VerifyOptions, VerifyProgress, VerifyReport};

/// The repository format version this build writes and reads.
pub const REPOSITORY_FORMAT_VERSION: u64 = 1;

/// The contents of `statesnap.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryMarker {
    /// Repository format version.
    pub format_version: u64,
    /// Random id of this repository (a UUID v4, hyphenated).
    pub repository_id: String,
    /// When `init` ran, ms since the epoch (injected clock).
    pub created_at: i64,
}

/// How a [`Repository`] is connected and behaves.
#[derive(Debug, Clone)]
pub struct RepositoryOptions {
    /// Backend options, overriding environment variables: for `s3://` any
    /// `AmazonS3ConfigKey` (`endpoint`, `region`, `allow_http`,
    /// `virtual_hosted_style_request`, `access_key_id`, ...), for `gs://` any
    /// `GoogleConfigKey`, for `az://` any `AzureConfigKey`.
    pub store_options: BTreeMap<String, String>,
    /// Time source for `created_at`, retention and gc.
    pub clock: SharedClock,
    /// Randomness for new ids and keys.
    pub entropy: SharedEntropy,
    /// Transfer tuning.
    pub transfer: TransferOptions,
    /// The longest a snapshot commit may take from its blob re-check to its
    /// manifest create; a slower commit is abandoned (stale error). Must be
    /// well below the gc grace period (see `docs/gc.md`). Default 10 minutes.
    pub max_commit_duration: Duration,
}

impl Default for RepositoryOptions {
    fn default() -> Self {
        RepositoryOptions {
            store_options: BTreeMap::new(),
            clock: system_clock(),
            entropy: paths::os_entropy(),
            transfer: TransferOptions::default(),
            max_commit_duration: Duration::from_secs(600),
        }
    }
}

/// A snapshot repository over an object store.
#[derive(Debug, Clone)]
pub struct Repository {
    store: Arc<dyn ObjectStore>,
    url: String,
    clock: SharedClock,
    entropy: SharedEntropy,
    transfer: TransferOptions,
    max_commit_duration: Duration,
    /// Shared by every transfer of this repository and its clones.
    limit: Option<Arc<BandwidthLimit>>,
    /// Blob bytes read, for progress reporting ([`Repository::counting_reads`]).
    read_counter: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// A `file://` repository's filesystem, for hard-linking immutable
    /// files into it ([`TransferOptions::link_immutable_files`]); `None`
    /// for every other store, wrapped ones included.
    local: Option<Arc<object_store::local::LocalFileSystem>>,
}

impl Repository {
    /// Creates a new repository at `url`: writes `statesnap.json` with a
    /// conditional create. If a repository already exists there this fails
    /// with [`ErrorKind::AlreadyExists`] (use [`Repository::open`]); for
    /// `file://` URLs the directory is created.
    pub async fn init(url: &str, opts: RepositoryOptions) -> Result<Repository> {
        let repo = Repository::connect(url, opts, true).await?;
        repo.create_marker().await?;
        Ok(repo)
    }

    /// Opens the existing repository at `url`, checking its marker.
    pub async fn open(url: &str, opts: RepositoryOptions) -> Result<Repository> {
        let repo = Repository::connect(url, opts, false).await?;
        repo.read_marker().await?;
        Ok(repo)
    }

    /// Wraps an object store (e.g. a fault-injecting one) without touching
    /// the marker; `prefix` (may be empty) is the repository root inside it.
    pub fn from_store(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Repository> {
        Repository::from_store_with(store, prefix, RepositoryOptions::default())
    }

    /// [`Repository::from_store`] with options.
    pub fn from_store_with(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        opts: RepositoryOptions,
    ) -> Result<Repository> {
        let prefix = prefix.trim_matches('/');
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            store
        } else {
            let p = Path::parse(prefix).map_err(|e| {
                Error::config(format!(
                    "invalid repository prefix prefix=`{}`",
                    prefix.escape_debug()
                ))
                .with_source(e)
            })?;
            Arc::new(object_store::prefix::PrefixStore::new(store, p))
        };
        Ok(Repository {
            url: format!("store://{prefix}"),
            store,
            clock: opts.clock,
            entropy: opts.entropy,
            transfer: opts.transfer,
            max_commit_duration: opts.max_commit_duration,
            limit: None,
            read_counter: None,
            local: None,
        })
    }

    /// The same repository with another clock (tests use a `ManualClock`).
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The same repository with another entropy source (simulations use a
    /// [`paths::SeededEntropy`]).
    pub fn with_entropy(mut self, entropy: SharedEntropy) -> Self {
        self.entropy = entropy;
        self
    }

    /// A fresh ULID for a new id or key (clock + entropy).
    pub(crate) fn new_ulid(&self) -> ulid::Ulid {
        paths::new_ulid(&*self.clock, &*self.entropy)
    }

    /// The same repository with other transfer options.
    pub fn with_transfer(mut self, transfer: TransferOptions) -> Self {
        self.transfer = transfer;
        self
    }

    /// The same repository with every blob upload and download drawing
    /// from `limit` (clones share it; so do repositories given the same
    /// `Arc`).
    pub fn with_bandwidth_limit(mut self, limit: Arc<BandwidthLimit>) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The same repository, adding every blob byte it reads (verified or
    /// not yet) to `counter`: a progress bar reads it from another task.
    pub fn counting_reads(mut self, counter: Arc<std::sync::atomic::AtomicU64>) -> Self {
        self.read_counter = Some(counter);
        self
    }

    /// Waits for `bytes` of transfer under the bandwidth limit, if any.
    pub(crate) async fn throttle(&self, bytes: u64) {
        if let Some(l) = &self.limit {
            l.take(bytes).await;
        }
    }

    /// The same repository with another commit budget.
    pub fn with_max_commit_duration(mut self, d: Duration) -> Self {
        self.max_commit_duration = d;
        self
    }

    /// The URL this repository was opened from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Transfer options in force.
    pub fn transfer(&self) -> &TransferOptions {
        &self.transfer
    }

    /// The commit budget in force.
    pub fn max_commit_duration(&self) -> Duration {
        self.max_commit_duration
    }

    /// The raw object store, rooted at the repository root. Bypasses every
    /// check: for tooling and tests only.
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    /// Writes the marker with a conditional create.
    pub async fn create_marker(&self) -> Result<RepositoryMarker> {
        let marker = RepositoryMarker {
            format_version: REPOSITORY_FORMAT_VERSION,
            repository_id: uuid::Uuid::new_v4().hyphenated().to_string(),
            created_at: self.clock.now_ms(),
        };
        let body = serde_json::to_vec_pretty(&marker)
            .map_err(|e| Error::internal("cannot serialize repository marker").with_source(e))?;
        let key = paths::marker();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&key, PutPayload::from(body), opts)
            .await
        {
            Ok(_) => Ok(marker),
            Err(e) => {
                let err = map_store_error(
                    e,
                    &format!("cannot create repository marker url=`{}`", self.url),
                );
                if err.kind() == ErrorKind::AlreadyExists {
                    Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!(
                            "a statesnap repository already exists at url=`{}`; open it instead",
                            self.url
                        ),
                    )
                    .with_reason(crate::Reason::AlreadyExists))
                } else {
                    Err(err)
                }
            }
        }
    }

    /// Reads and checks the marker.
    pub async fn read_marker(&self) -> Result<RepositoryMarker> {
        let key = paths::marker();
        let bytes = match self.store.get(&key).await {
            Ok(r) => r.bytes().await.map_err(|e| {
                map_store_error(
                    e,
                    &format!("cannot read repository marker url=`{}`", self.url),
                )
            })?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(self.no_repository());
            }
            Err(e) => {
                return Err(map_store_error(
                    e,
                    &format!("cannot read repository marker url=`{}`", self.url),
                ));
            }
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            Error::corrupt(format!(
                "repository marker is not valid json url=`{}` key=`{key}`",
                self.url
            ))
            .with_source(e)
        })?;
        let version = value
            .get("format_version")
            .and_then(serde_json::Value::as_u64);
        match version {
            Some(REPOSITORY_FORMAT_VERSION) => {}
            Some(v) => {
                return Err(Error::config(format!(
                    "unsupported repository format version: upgrade statesnap url=`{}` \
                     format_version={v} supported={REPOSITORY_FORMAT_VERSION}",
                    self.url
                ))
                .with_reason(crate::Reason::UnsupportedVersion));
            }
            None => {
                return Err(Error::corrupt(format!(
                    "repository marker has no format_version url=`{}`",
                    self.url
                )));
            }
        }
        serde_json::from_value(value).map_err(|e| {
            Error::corrupt(format!(
                "repository marker has an invalid shape url=`{}`",
                self.url
            ))
            .with_source(e)
        })
    }

    fn no_repository(&self) -> Error {
        no_repository(&self.url)
    }

    /// The catalog: stores and snapshots, their manifests.
    pub fn catalog(&self) -> Catalog<'_> {
        Catalog { repo: self }
    }

    /// Blob I/O: put, get and head of blobs, transfers of many at once.
    pub fn blobs(&self) -> Blobs<'_> {
        Blobs { repo: self }
    }

    /// Maintenance: gc and retention, verification, clones.
    pub fn maintenance(&self) -> Maintenance<'_> {
        Maintenance { repo: self }
    }

    /// Builds the object store for `url` without touching the marker.
    pub(crate) async fn connect(
        url: &str,
        opts: RepositoryOptions,
        create_dir: bool,
    ) -> Result<Repository> {
        let parsed = url::Url::parse(url).map_err(|e| {
            Error::config(format!(
                "invalid repository url url=`{}`; a local directory is written \
                 file:///ABSOLUTE/PATH (the statesnap command also takes a plain path)",
                url.escape_debug()
            ))
            .with_source(e)
        })?;
        let mut local = None;
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match parsed.scheme() {
            "file" => {
                let fs = connect_file(&parsed, url, create_dir).await?;
                local = Some(fs.clone());
                (fs, String::new())
            }
            "memory" => {
                let name = format!("{}{}", parsed.host_str().unwrap_or(""), parsed.path());
                (named_memory_store(&name), String::new())
            }
            "s3" | "s3a" => (connect_s3(url, &opts).await?, parsed.path().to_owned()),
            "gs" => (connect_gcs(url, &opts)?, parsed.path().to_owned()),
            "az" | "abfs" | "abfss" | "azure" => {
                (connect_azure(url, &opts)?, parsed.path().to_owned())
            }
            other => {
                return Err(Error::config(format!(
                    "unsupported repository url scheme: use file://, s3://, gs://, az:// or memory:// \
                     url=`{url}` scheme=`{other}`"
                )));
            }
        };
        let mut repo = Repository::from_store_with(store, &prefix, opts)?;
        repo.url = url.to_owned();
        repo.local = local;
        Ok(repo)
    }
}

/// A `file://` repository's store: the directory checked (and created, for
/// `init`), opened with fsync.
async fn connect_file(
    parsed: &url::Url,
    url: &str,
    create_dir: bool,
) -> Result<Arc<object_store::local::LocalFileSystem>> {
    let dir = parsed.to_file_path().map_err(|()| {
        Error::config(format!(
            "invalid file url: not an absolute local path url=`{url}`"
        ))
    })?;
    if dir.exists() && !dir.is_dir() {
        return Err(Error::config(format!(
            "the repository path is a file, not a repository directory url=`{url}` \
             path=`{}`; name the directory the repository is in (or, for init, a \
             new one)",
            dir.display()
        )));
    }
    if create_dir {
        tokio::fs::create_dir_all(&dir).await.map_err(|e| {
            Error::io(
                format!(
                    "cannot create repository directory path=`{}`",
                    dir.display()
                ),
                e,
            )
        })?;
    } else if !dir.is_dir() {
        return Err(no_repository(url));
    }
    // fsync: a blob must be durable before a manifest names it.
    let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
        .map_err(|e| map_store_error(e, &format!("cannot open local repository url=`{url}`")))?
        .with_fsync(true);
    Ok(Arc::new(fs))
}

/// An `s3://` repository's store: environment, then options, then the
/// credential check.
async fn connect_s3(url: &str, opts: &RepositoryOptions) -> Result<Arc<dyn ObjectStore>> {
    let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(url);
    for (k, v) in &opts.store_options {
        let key = parse_config_key::<object_store::aws::AmazonS3ConfigKey>(k, "aws_", url)?;
        b = b.with_config(key, v);
    }
    check_s3_credentials(&b, url).await?;
    // The builder does no I/O: whatever it refuses is configuration.
    let s3 = b.build().map_err(|e| {
        Error::config(format!("cannot configure s3 url=`{url}`: {e}")).with_source(e)
    })?;
    Ok(Arc::new(s3))
}

/// A `gs://` repository's store: environment, then options.
fn connect_gcs(url: &str, opts: &RepositoryOptions) -> Result<Arc<dyn ObjectStore>> {
    let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url);
    for (k, v) in &opts.store_options {
        let key = parse_config_key::<object_store::gcp::GoogleConfigKey>(k, "google_", url)?;
        b = b.with_config(key, v);
    }
    let gcs = b.build().map_err(|e| {
        Error::config(format!("cannot configure gcs url=`{url}`: {e}")).with_source(e)
    })?;
    Ok(Arc::new(gcs))
}

/// An `az://` repository's store: environment, then options.
fn connect_azure(url: &str, opts: &RepositoryOptions) -> Result<Arc<dyn ObjectStore>> {
    let mut b = object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url);
    for (k, v) in &opts.store_options {
        let key = parse_config_key::<object_store::azure::AzureConfigKey>(k, "azure_", url)?;
        b = b.with_config(key, v);
    }
    let az = b.build().map_err(|e| {
        Error::config(format!("cannot configure azure url=`{url}`: {e}")).with_source(e)
    })?;
    Ok(Arc::new(az))
}

/// The error for a location without a repository marker: how to create one.
fn no_repository(url: &str) -> Error {
    Error::not_found(format!(
        "no statesnap repository at url=`{url}`; create one with `statesnap init --repo {url}` \
         (or `Repository::init`)"
    ))
    .with_reason(crate::Reason::NoRepository)
}

/// How long the instance metadata endpoint gets to accept a connection
/// before S3 credentials are declared missing.
const METADATA_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Refuses, as configuration, an S3 repository with no credentials.
///
/// With no static key pair, web identity or container credentials
/// configured (environment or options), `object_store` fetches credentials
/// from the EC2 instance metadata endpoint — and off EC2, every request
/// then fails after minutes of retries as if the server were down
/// (transient). So the endpoint is probed once (a TCP connect, at most
/// [`METADATA_PROBE_TIMEOUT`]): on EC2 it answers and instance-profile
/// credentials work as before; elsewhere the missing settings are named.
async fn check_s3_credentials(b: &object_store::aws::AmazonS3Builder, url: &str) -> Result<()> {
    use object_store::aws::AmazonS3ConfigKey as K;
    let has = |k: K| b.get_config_value(&k).is_some_and(|v| !v.is_empty());
    let key_id = has(K::AccessKeyId);
    let secret = has(K::SecretAccessKey);
    match (key_id, secret) {
        (true, true) => return Ok(()),
        (true, false) => {
            return Err(Error::config(format!(
                "s3 credentials are incomplete: an access key id without its secret url=`{url}`; \
                 set AWS_SECRET_ACCESS_KEY (or -o secret_access_key=…)"
            )));
        }
        (false, true) => {
            return Err(Error::config(format!(
                "s3 credentials are incomplete: a secret access key without its key id \
                 url=`{url}`; set AWS_ACCESS_KEY_ID (or -o access_key_id=…)"
            )));
        }
        (false, false) => {}
    }
    let skip = b
        .get_config_value(&K::SkipSignature)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let web_identity = has(K::WebIdentityTokenFile) && has(K::RoleArn);
    let container = has(K::ContainerCredentialsRelativeUri)
        || (has(K::ContainerCredentialsFullUri) && has(K::ContainerAuthorizationTokenFile));
    if skip || web_identity || container {
        return Ok(());
    }
    let endpoint = b
        .get_config_value(&K::MetadataEndpoint)
        .unwrap_or_else(|| "http://169.254.169.254".to_owned());
    let addr = url::Url::parse(&endpoint).ok().and_then(|u| {
        Some((
            u.host_str()?.trim_matches(['[', ']']).to_owned(),
            u.port_or_known_default()?,
        ))
    });
    let answered = match addr {
        Some((host, port)) => matches!(
            tokio::time::timeout(
                METADATA_PROBE_TIMEOUT,
                tokio::net::TcpStream::connect((host.as_str(), port))
            )
            .await,
            Ok(Ok(_))
        ),
        None => false,
    };
    if answered {
        return Ok(());
    }
    Err(Error::config(format!(
        "no s3 credentials url=`{url}`: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or -o \
         access_key_id=… -o secret_access_key=…), or AWS_WEB_IDENTITY_TOKEN_FILE with \
         AWS_ROLE_ARN, or for a public bucket -o skip_signature=true (without them credentials \
         come from the EC2 instance metadata endpoint, which did not answer \
         metadata_endpoint=`{endpoint}`)"
    )))
}

fn parse_config_key<K: std::str::FromStr>(key: &str, prefix: &str, url: &str) -> Result<K> {
    let lower = key.to_ascii_lowercase();
    lower
        .parse::<K>()
        .or_else(|_| format!("{prefix}{lower}").parse::<K>())
        .map_err(|_| {
            Error::config(format!(
                "unknown object store option url=`{url}` option=`{}`",
                key.escape_debug()
            ))
        })
}

/// `memory://name` stores live for the process, so `init` then `open` of the
/// same URL see the same data.
fn named_memory_store(name: &str) -> Arc<dyn ObjectStore> {
    static STORES: OnceLock<Mutex<BTreeMap<String, Arc<object_store::memory::InMemory>>>> =
        OnceLock::new();
    let map = STORES.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut map = match map.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let store = map
        .entry(name.to_owned())
        .or_insert_with(|| Arc::new(object_store::memory::InMemory::new()));
    Arc::clone(store) as Arc<dyn ObjectStore>
}

/// Maps an `object_store` error to statesnap's error, keeping it as source.
pub(crate) fn map_store_error(e: object_store::Error, context: &str) -> Error {
    use object_store::Error as E;
    let (kind, what) = match &e {
        E::NotFound { .. } => (ErrorKind::NotFound, "object not found"),
        E::AlreadyExists { .. } | E::Precondition { .. } => {
            (ErrorKind::AlreadyExists, "object already exists")
        }
        E::Generic { .. } => (ErrorKind::Transient, "object store request failed"),
        E::InvalidPath { .. } => (ErrorKind::Config, "invalid object path"),
        E::NotSupported { .. } | E::NotImplemented { .. } => (
            ErrorKind::Config,
            "the object store does not support a required operation",
        ),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => (
            ErrorKind::Config,
            "the object store refused the credentials",
        ),
        E::UnknownConfigurationKey { .. } => (ErrorKind::Config, "unknown object store option"),
        E::JoinError { .. } => (ErrorKind::Internal, "object store task failed"),
        E::NotModified { .. } => (ErrorKind::Internal, "unexpected not-modified answer"),
        _ => (ErrorKind::Transient, "object store request failed"),
    };
    Error::new(kind, format!("{context}: {what}")).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as K};

    /// A builder that ignores the environment, its instance metadata
    /// endpoint on a closed loopback port (standing in for "not on EC2").
    fn s3() -> AmazonS3Builder {
        AmazonS3Builder::new()
            .with_url("s3://bucket/prefix")
            .with_config(K::Endpoint, "http://127.0.0.1:9")
            .with_config(K::MetadataEndpoint, "http://127.0.0.1:9")
    }

    #[tokio::test]
    async fn missing_or_half_s3_credentials_are_config() {
        let url = "s3://bucket/prefix";
        let e = check_s3_credentials(&s3(), url).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        for half in [K::AccessKeyId, K::SecretAccessKey] {
            let e = check_s3_credentials(&s3().with_config(half, "x"), url)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        }
        let both = s3()
            .with_config(K::AccessKeyId, "x")
            .with_config(K::SecretAccessKey, "y");
        assert!(check_s3_credentials(&both, url).await.is_ok());
        let public = s3().with_config(K::SkipSignature, "true");
        assert!(check_s3_credentials(&public, url).await.is_ok());
    }

    #[tokio::test]
    async fn a_file_is_not_a_repository_and_a_missing_one_says_how_to_init() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let url = format!("file://{}", file.display());
        for init in [false, true] {
            let e = Repository::connect(&url, RepositoryOptions::default(), init)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        }
        let missing = format!("file://{}", dir.path().join("none").display());
        let e = Repository::open(&missing, RepositoryOptions::default())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert_eq!(e.reason(), Some(crate::Reason::NoRepository));
    }
}
