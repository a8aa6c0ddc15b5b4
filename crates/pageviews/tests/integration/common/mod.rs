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

/// The shared broker and repository the test script started, or `None`
/// (the test is skipped loudly, or fails under `STATESNAP_REQUIRE_*=1`).
pub fn servers() -> Option<(String, String)> {
    let bootstrap = env_or_skip("STATESNAP_TEST_KAFKA_BOOTSTRAP", "STATESNAP_REQUIRE_KAFKA")?;
    let repo = env_or_skip("STATESNAP_TEST_S3_URL", "STATESNAP_REQUIRE_S3")?;
    Some((bootstrap, repo))
}

/// A scenario on `partitions` partitions under a fresh id starting with
/// `prefix` (its repository a prefix of that name under `repo`), working in
/// `dir`: 3 000 users at 800 events/s, 3 s to settle, 6 s sessions (with
/// 15 s, tried for slow machines, the outage scenario's survivor never got
/// the partitions back within 180 s against tansu; the cause is not known).
pub fn scenario_config(
    prefix: &str,
    bootstrap: String,
    repo: &str,
    dir: &std::path::Path,
    partitions: i32,
) -> pageviews::scenario::ScenarioConfig {
    let id = unique(prefix);
    pageviews::scenario::ScenarioConfig {
        bin: env!("CARGO_BIN_EXE_pageviews").into(),
        bootstrap,
        repo: format!("{}/{id}", repo.trim_end_matches('/')),
        dir: dir.to_owned(),
        app_id: id,
        partitions,
        generation: 0,
        users: 3000,
        rate: 800,
        settle: std::time::Duration::from_secs(3),
        session_timeout: std::time::Duration::from_secs(6),
        env: Vec::new(),
        standbys: 0,
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
            // The error first: a CI excerpt that keeps only the head and
            // the tail of the output still shows it.
            eprintln!("scenario failed: {e}");
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
