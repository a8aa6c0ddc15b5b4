//! The maintenance view of a repository. Its methods live with their
//! subjects: gc in `gc.rs`, verification in `verify.rs`, copies of
//! snapshots between stores in `clone.rs`.

use super::Repository;

/// Maintenance of a [`Repository`] ([`Repository::maintenance`]): gc (with
/// retention), verification of every blob, clones of snapshots.
#[derive(Debug, Clone, Copy)]
pub struct Maintenance<'a> {
    pub(crate) repo: &'a Repository,
}
