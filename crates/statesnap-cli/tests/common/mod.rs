//! Helpers the CLI's test files share (`mod common;`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use assert_cmd::Command;

/// The `statesnap` binary, without a repository from the environment and
/// with a timeout.
pub fn statesnap() -> Command {
    let mut c = Command::cargo_bin("statesnap").expect("binary");
    c.env_remove("STATESNAP_REPO")
        .timeout(Duration::from_secs(120));
    c
}

/// `out` parsed as JSON, or a panic showing it.
pub fn json_of(out: &[u8]) -> serde_json::Value {
    serde_json::from_slice(out)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(out)))
}

/// A new repository at `url` and a manager on it that snapshots only when
/// asked (fixtures write their stores through the runtime, as an
/// application does).
pub async fn manual_manager(url: &str) -> statesnap::StateManager {
    let repo = statesnap::Repository::init(url, Default::default())
        .await
        .expect("init");
    statesnap::StateManager::builder(repo)
        .policy(statesnap::SnapshotPolicy::manual())
        .build()
        .expect("manager")
}

/// Runs `statesnap` with `args` and `--json`, asserting exit code `code`;
/// the JSON it printed on stdout (a report, or `{"error": ...}`).
pub fn run_json_args(args: &[&str], code: i32) -> serde_json::Value {
    let out = statesnap()
        .args(args)
        .arg("--json")
        .assert()
        .code(code)
        .get_output()
        .stdout
        .clone();
    json_of(&out)
}

/// What is at a path, links not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
    Other,
}

/// Every entry under `root` and `root` itself (as ``), by relative path:
/// names, kinds, bytes and link targets.
pub fn tree(root: &Path) -> std::collections::BTreeMap<PathBuf, Node> {
    let mut out = std::collections::BTreeMap::new();
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
                stack.push(rel.join(e.expect("entry").file_name()));
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

/// A user's directory (not a store) at `dir`.
pub fn foreign_dir(dir: &Path) {
    std::fs::create_dir_all(dir.join("figures")).expect("mkdir");
    std::fs::write(dir.join("thesis.tex"), b"years of work").expect("write");
    std::fs::write(dir.join("figures/plot.svg"), b"<svg/>").expect("write");
}
