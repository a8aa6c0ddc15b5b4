//! A directory as data: every entry under a root with its kind, bytes and
//! link target, so a test can say "byte for byte as before" in one
//! comparison. Shared by the library's tests (`common::tree`) and the CLI's
//! (`#[path]` from `crates/statesnap-cli/tests/integration/common`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One entry of a [`tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
    Other,
}

/// Every entry under `root` and `root` itself (as ``), by path relative to
/// it: names, kinds, bytes and link targets. Empty when `root` is missing.
pub fn tree(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let node = if m.file_type().is_symlink() {
            Node::Link(std::fs::read_link(&p).expect("read_link"))
        } else if m.is_dir() {
            for e in std::fs::read_dir(&p).expect("read_dir") {
                stack.push(rel.join(e.expect("dir entry").file_name()));
            }
            Node::Dir
        } else if m.is_file() {
            Node::File(std::fs::read(&p).expect("read"))
        } else {
            Node::Other
        };
        out.insert(rel, node);
    }
    out
}
