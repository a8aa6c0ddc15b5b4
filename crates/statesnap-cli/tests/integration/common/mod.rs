//! Helpers the CLI's test files share (`mod common;`).
#![allow(dead_code, unused_imports)]

use std::path::Path;
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

// The library tests' directory-as-data helper, one copy for both crates.
#[path = "../../../../statesnap/tests/integration/common/tree.rs"]
mod tree_impl;
pub use tree_impl::{Node, tree};

/// A user's directory (not a store) at `dir`.
pub fn foreign_dir(dir: &Path) {
    std::fs::create_dir_all(dir.join("figures")).expect("mkdir");
    std::fs::write(dir.join("thesis.tex"), b"years of work").expect("write");
    std::fs::write(dir.join("figures/plot.svg"), b"<svg/>").expect("write");
}
