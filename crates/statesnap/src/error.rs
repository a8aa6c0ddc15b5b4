//! The one public error type.
//!
//! Every module keeps its own private error enum (or builds [`Error`]s
//! directly) and maps into [`Error`], whose [`ErrorKind`] tells the caller what
//! to do: retry, fall back to an older snapshot or to full replay, or fix
//! configuration. Messages are lowercase and carry ``key=`value` `` fields.
//! Third-party errors (`rocksdb::Error`, `object_store::Error`, `std::io::Error`)
//! are kept as the [`std::error::Error::source`], never as public variants.
//!
//! A refusal (an error that is not a failure of the environment but a
//! decision: the data cannot be used safely, the directory is in use, the
//! format is too new) also carries a [`Reason`], so a caller can tell the
//! cases of one kind apart without reading the message. Callers act on the
//! kind, and on the reason for refusals; the message is for people.

use std::fmt;

/// What kind of failure an [`Error`] is, i.e. what the caller should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A temporary failure (timeout, 503, broker unreachable, lock contention).
    /// Retrying the same call later may succeed; nothing was applied.
    Transient,
    /// Stored bytes failed a check (checksum, hash, size, framing). Do not load
    /// them; fall back to an older snapshot or to full changelog replay.
    Corrupt,
    /// The data is valid but can no longer be used safely, e.g. a snapshot
    /// below the changelog's tombstone horizon, or a store that is ahead of its
    /// changelog. Fall back or rebuild.
    Stale,
    /// The configuration or the input is wrong (bad URL, hostile name,
    /// missing repository marker, unsupported format version). Fix it.
    Config,
    /// The thing asked for does not exist.
    NotFound,
    /// A conditional create found the object already there.
    AlreadyExists,
    /// A local I/O failure that is not corruption (permission denied, disk
    /// full). Fix the environment; nothing was lost.
    Io,
    /// The operation was cancelled (shutdown, Ctrl-C).
    Cancelled,
    /// A bug in statesnap: an internal invariant did not hold. Please report it.
    Internal,
}

impl ErrorKind {
    /// The lowercase name used in messages (`transient`, `corrupt`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Transient => "transient",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Stale => "stale",
            ErrorKind::Config => "config",
            ErrorKind::NotFound => "not-found",
            ErrorKind::AlreadyExists => "already-exists",
            ErrorKind::Io => "io",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why statesnap refused, for the refusals a caller may act on beyond the
/// [`ErrorKind`]. [`Error::reason`] returns it; errors that are not one of
/// these refusals (I/O, broker and object-store failures, most corruption)
/// have none. New reasons may be added; match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The changelog's compaction or retention horizon overtook the point
    /// this needed (a snapshot or store below the tombstone horizon, a
    /// replay whose start was deleted, a point in time whose records a later
    /// write replaced): replaying from there could resurrect deleted keys or
    /// miss records. Kind `stale`: use a newer snapshot or rebuild.
    BelowHorizon,
    /// The changelog was deleted and recreated (its lineage changed) since
    /// the snapshot or binding was taken. Kind `stale`.
    LineageChanged,
    /// Another writer claimed the changelog partition: this handle no
    /// longer owns it. Kind `stale`: close it.
    Fenced,
    /// A store, cut or snapshot claims offsets beyond the changelog's end:
    /// the log lost records it applied, or it follows another log. Kind
    /// `stale`: delete the store and restore or replay it.
    AheadOfLog,
    /// The changelog lost records and handed their offsets out again (the
    /// epoch at an offset differs, acknowledged offsets reappeared or
    /// vanished). Kind `stale`: rebuild from what the log holds.
    HistoryLost,
    /// The store, cut, snapshot or changelog directory belongs to another
    /// changelog than the one given (its changelog binding differs). Kind
    /// `stale` for stores and cuts, `config` for snapshots and directories.
    OtherChangelog,
    /// A store has applied records but records no changelog binding, so its
    /// offset cannot be trusted against any log. Kind `stale`.
    Unbound,
    /// A store already applied records past the requested point in time; a
    /// store cannot go back. Kind `config` or `stale`.
    PastPoint,
    /// An offset or point in time is past the changelog's end. Kind `config`.
    PastEnd,
    /// A store or changelog directory is locked by another handle, process
    /// or open store. Kind `transient` (retry once the holder lets go) or
    /// `config` (the same manager was given it twice).
    InUse,
    /// Written by a newer statesnap: a format version or required feature
    /// this build does not understand. Kind `config`: upgrade statesnap.
    UnsupportedVersion,
    /// No statesnap repository at the URL (its marker is missing). Kind
    /// `not-found`: run `statesnap init` (or `Repository::init`).
    NoRepository,
    /// The restored or rebuilt contents differ from the snapshot's logical
    /// digest. Kind `corrupt`.
    DigestMismatch,
    /// The target already exists or already holds data (a repository,
    /// manifest, directory, snapshots, or changelog records). Kind
    /// `already-exists` or `config`.
    AlreadyExists,
    /// The restore target is a non-empty directory without the store
    /// marker (not a store statesnap made). Kind `config`: move its contents
    /// away, or adopt it (`RestoreOptions::replace_unmarked`, CLI `--force`).
    UnmarkedTarget,
    /// The restore target can never be replaced: a symbolic link, a file, a
    /// mount point, or a path without a name of its own. Kind `config`.
    UnsafeTarget,
    /// The handle or changelog was opened read-only. Kind `config`.
    ReadOnly,
    /// This changelog reader or writer failed earlier and refuses to go on;
    /// open a new one. The kind is the first error's (a reader) or `io` (a
    /// file changelog's writer).
    FailedEarlier,
    /// A store write failed after its batch was committed to the changelog:
    /// the store is behind it. Kind `stale`: call `catch_up` first.
    Behind,
    /// A snapshot commit raced garbage collection (a reused blob was
    /// condemned or removed, a staged upload was removed, or the commit
    /// outlived its budget). Kind `stale` (`transient` for the staged
    /// upload): retry the snapshot.
    GcRace,
}

impl Reason {
    /// The snake_case name used in machine-readable output (`below_horizon`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BelowHorizon => "below_horizon",
            Reason::LineageChanged => "lineage_changed",
            Reason::Fenced => "fenced",
            Reason::AheadOfLog => "ahead_of_log",
            Reason::HistoryLost => "history_lost",
            Reason::OtherChangelog => "other_changelog",
            Reason::Unbound => "unbound",
            Reason::PastPoint => "past_point",
            Reason::PastEnd => "past_end",
            Reason::InUse => "in_use",
            Reason::UnsupportedVersion => "unsupported_version",
            Reason::NoRepository => "no_repository",
            Reason::DigestMismatch => "digest_mismatch",
            Reason::AlreadyExists => "already_exists",
            Reason::UnmarkedTarget => "unmarked_target",
            Reason::UnsafeTarget => "unsafe_target",
            Reason::ReadOnly => "read_only",
            Reason::FailedEarlier => "failed_earlier",
            Reason::Behind => "behind",
            Reason::GcRace => "gc_race",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error every public statesnap function returns.
///
/// Display shows `<kind> error: <message>`; the underlying cause, if any, is
/// available through [`std::error::Error::source`] (and is appended to the
/// message by `{:#}`). A refusal also carries a [`Reason`] ([`Error::reason`]);
/// Display does not show it.
pub struct Error {
    kind: ErrorKind,
    reason: Option<Reason>,
    message: String,
    source: Option<BoxError>,
}

impl Error {
    /// A new error of `kind` with a lowercase, field-carrying message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            reason: None,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Why statesnap refused, for the refusals a caller may act on (see
    /// [`Reason`]); `None` for every other error.
    pub fn reason(&self) -> Option<Reason> {
        self.reason
    }

    /// Marks this error as the refusal `reason` (kind and message unchanged).
    pub(crate) fn with_reason(mut self, reason: Reason) -> Self {
        self.reason = Some(reason);
        self
    }

    /// The message, without the kind prefix or the source.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }

    pub(crate) fn transient(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Transient, message)
    }
    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Corrupt, message)
    }
    pub(crate) fn stale(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Stale, message)
    }
    pub(crate) fn config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Config, message)
    }
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotFound, message)
    }
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, message)
    }

    /// Maps a local I/O error: `NotFound` stays not-found, `InvalidData`/
    /// `UnexpectedEof` become corrupt, timeouts/interrupts transient, the rest io.
    pub(crate) fn io(message: impl Into<String>, err: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match err.kind() {
            K::NotFound => ErrorKind::NotFound,
            K::InvalidData | K::UnexpectedEof => ErrorKind::Corrupt,
            K::TimedOut | K::Interrupted | K::WouldBlock => ErrorKind::Transient,
            _ => ErrorKind::Io,
        };
        Error::new(kind, message).with_source(err)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error: {}", self.kind, self.message)?;
        if f.alternate() {
            let mut cur: Option<&(dyn std::error::Error + 'static)> = self
                .source
                .as_deref()
                .map(|s| s as &(dyn std::error::Error + 'static));
            while let Some(s) = cur {
                write!(f, ": {s}")?;
                cur = s.source();
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Debug is what `main() -> Result` and `unwrap` print: make it readable.
        write!(f, "{self:#}")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// `Result` with statesnap's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_and_chains_source_in_alternate() {
        let io = std::io::Error::other("disk on fire");
        let e = Error::io("write failed path=`/x`", io);
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.to_string(), "io error: write failed path=`/x`");
        assert_eq!(
            format!("{e:#}"),
            "io error: write failed path=`/x`: disk on fire"
        );
    }

    const REASONS: [Reason; 20] = [
        Reason::BelowHorizon,
        Reason::LineageChanged,
        Reason::Fenced,
        Reason::AheadOfLog,
        Reason::HistoryLost,
        Reason::OtherChangelog,
        Reason::Unbound,
        Reason::PastPoint,
        Reason::PastEnd,
        Reason::InUse,
        Reason::UnsupportedVersion,
        Reason::NoRepository,
        Reason::DigestMismatch,
        Reason::AlreadyExists,
        Reason::UnmarkedTarget,
        Reason::UnsafeTarget,
        Reason::ReadOnly,
        Reason::FailedEarlier,
        Reason::Behind,
        Reason::GcRace,
    ];

    #[test]
    fn a_reason_leaves_kind_and_display_alone() {
        let e = Error::stale("store is ahead").with_reason(Reason::AheadOfLog);
        assert_eq!(e.kind(), ErrorKind::Stale);
        assert_eq!(e.reason(), Some(Reason::AheadOfLog));
        assert_eq!(e.to_string(), "stale error: store is ahead");
        assert_eq!(Error::config("x").reason(), None);
    }

    /// Every reason is in [`REASONS`] (the match fails to compile
    /// otherwise), has its own name, and the CLI and architecture docs name
    /// each one.
    #[test]
    fn every_reason_is_named_once_and_documented() {
        let listed = |r: Reason| match r {
            Reason::BelowHorizon
            | Reason::LineageChanged
            | Reason::Fenced
            | Reason::AheadOfLog
            | Reason::HistoryLost
            | Reason::OtherChangelog
            | Reason::Unbound
            | Reason::PastPoint
            | Reason::PastEnd
            | Reason::InUse
            | Reason::UnsupportedVersion
            | Reason::NoRepository
            | Reason::DigestMismatch
            | Reason::AlreadyExists
            | Reason::UnmarkedTarget
            | Reason::UnsafeTarget
            | Reason::ReadOnly
            | Reason::FailedEarlier
            | Reason::Behind
            | Reason::GcRace => REASONS.contains(&r),
        };
        let names: std::collections::BTreeSet<_> = REASONS.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), REASONS.len());
        for (doc, text) in [
            ("docs/cli.md", include_str!("../../../docs/cli.md")),
            (
                "docs/architecture.md",
                include_str!("../../../docs/architecture.md"),
            ),
        ] {
            for r in REASONS {
                assert!(listed(r));
                assert!(
                    text.contains(&format!("`{}`", r.as_str())),
                    "{doc} does not name `{r}`"
                );
            }
        }
    }

    #[test]
    fn io_kinds_map_to_what_the_caller_should_do() {
        let nf = Error::io("x", std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(nf.kind(), ErrorKind::NotFound);
        let eof = Error::io("x", std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        assert_eq!(eof.kind(), ErrorKind::Corrupt);
        let t = Error::io("x", std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(t.is_transient());
    }
}
