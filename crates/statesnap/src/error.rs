//! The one public error type.
//!
//! Every module keeps its own private error enum (or builds [`Error`]s
//! directly) and maps into [`Error`], whose [`ErrorKind`] tells the caller what
//! to do: retry, fall back to an older snapshot or to full replay, or fix
//! configuration. Messages are lowercase and carry ``key=`value` `` fields.
//! Third-party errors (`rocksdb::Error`, `object_store::Error`, `std::io::Error`)
//! are kept as the [`std::error::Error::source`], never as public variants.

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

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error every public statesnap function returns.
///
/// Display shows `<kind> error: <message>`; the underlying cause, if any, is
/// available through [`std::error::Error::source`] (and is appended to the
/// message by `{:#}`).
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<BoxError>,
}

impl Error {
    /// A new error of `kind` with a lowercase, field-carrying message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into(), source: None }
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
    #[allow(dead_code)] // for snapshot/restore code that is not on every branch yet
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
        self.source.as_deref().map(|s| s as &(dyn std::error::Error + 'static))
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
        assert_eq!(format!("{e:#}"), "io error: write failed path=`/x`: disk on fire");
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
