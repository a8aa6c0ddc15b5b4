//! Helpers shared by the integration tests (`mod common;`).
#![allow(dead_code)]

/// `var`'s value; unset, the test is skipped loudly, or fails when
/// `require=1` (`scripts/test.sh` sets it: the servers must be there).
pub fn env_or_skip(var: &str, require: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            assert!(
                std::env::var(require).as_deref() != Ok("1"),
                "{require}=1 but {var} is not set: run scripts/test.sh, which starts the servers"
            );
            eprintln!("SKIPPED: {var} is not set (run scripts/test.sh to start the servers)");
            None
        }
    }
}

/// A name no other run used: topics, group and repository prefix.
#[allow(clippy::disallowed_methods)] // a unique name, not a time anyone reads
pub fn unique(prefix: &str) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{prefix}-{}-{ms}", std::process::id())
}

/// The scenario's report, or a panic with `err` and the tail of each
/// process's log in `dir`.
pub fn report_or_logs<T, E: std::fmt::Display>(result: Result<T, E>, dir: &std::path::Path) -> T {
    match result {
        Ok(r) => r,
        Err(e) => {
            print_logs(dir);
            panic!("scenario failed: {e}");
        }
    }
}

/// The tail of each process's log in `dir`.
pub fn print_logs(dir: &std::path::Path) {
    for name in ["a", "b", "c", "a2"] {
        let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        eprintln!(
            "--- {}/{name}.log (last lines, newest first)\n{}",
            dir.display(),
            tail.join("\n")
        );
    }
}
