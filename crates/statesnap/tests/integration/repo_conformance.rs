//! The repository conformance suite against every backend: memory, a local
//! directory, and a real S3-protocol server when `STATESNAP_TEST_S3_URL` is
//! set (see `scripts/s3.sh`).

use statesnap::conformance::repo::run_all;
use statesnap::repo::RepositoryOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    let url = format!("memory://conformance-{}", uuid::Uuid::new_v4());
    run_all(&url, RepositoryOptions::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("repo");
    let url = url::Url::from_directory_path(&root)
        .expect("file url")
        .to_string();
    run_all(&url, RepositoryOptions::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_server() {
    let Ok(base) = std::env::var("STATESNAP_TEST_S3_URL") else {
        if std::env::var("STATESNAP_REQUIRE_S3").as_deref() == Ok("1") {
            panic!(
                "STATESNAP_REQUIRE_S3=1 but STATESNAP_TEST_S3_URL is not set: start the server with scripts/s3.sh"
            );
        }
        eprintln!(
            "\n!!!!!! SKIPPED: repository conformance against S3 — STATESNAP_TEST_S3_URL is not set \
             (source scripts/s3.sh; s3_start) !!!!!!\n"
        );
        return;
    };
    // Short: s3s-fs cannot store keys much over 180 bytes (see scripts/s3.sh).
    let id = uuid::Uuid::new_v4().simple().to_string();
    let url = format!("{}/c{}", base.trim_end_matches('/'), &id[..8]);
    run_all(&url, RepositoryOptions::default()).await;
}
