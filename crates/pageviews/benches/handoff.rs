//! Time to ready of a moved partition: handoff snapshot + restore vs full
//! changelog replay, against the broker and S3 server the test script
//! starts (`STATESNAP_TEST_KAFKA_BOOTSTRAP`, `STATESNAP_TEST_S3_URL`).
//!
//! `cargo bench -p pageviews --bench handoff` measures 1 M keys
//! (`STATESNAP_BENCH_HANDOFF_KEYS` to change it); under `cargo test` it
//! runs once at 5 000 keys as a smoke test.

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let keys: u64 = std::env::var("STATESNAP_BENCH_HANDOFF_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 1_000_000 } else { 5_000 });
    let (Ok(bootstrap), Ok(repo)) = (
        std::env::var("STATESNAP_TEST_KAFKA_BOOTSTRAP"),
        std::env::var("STATESNAP_TEST_S3_URL"),
    ) else {
        eprintln!(
            "SKIPPED: handoff bench needs STATESNAP_TEST_KAFKA_BOOTSTRAP and STATESNAP_TEST_S3_URL \
             (scripts/pageviews.sh bench starts the servers and runs it)"
        );
        return;
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: scratch directory: {e}");
            std::process::exit(1);
        }
    };
    let id = format!("pvbench-{}-{keys}", std::process::id());
    let config = pageviews::bench::HandoffConfig {
        bootstrap,
        repo: format!("{}/{id}", repo.trim_end_matches('/')),
        dir: dir.path().to_owned(),
        app_id: id,
        keys,
    };
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(pageviews::bench::handoff(&config))
                .map_err(|e| e.to_string())
        });
    match result {
        Ok(r) => println!("{r}"),
        Err(e) => {
            eprintln!("error: handoff bench failed: {e}");
            std::process::exit(1);
        }
    }
}
