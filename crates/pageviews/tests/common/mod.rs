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
