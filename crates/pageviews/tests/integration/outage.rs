//! A server goes away during a rebalance: the repository (a test-owned
//! s3s-fs) or the broker (a test-owned tansu), down for several seconds
//! while a process joins the group. The processes retry; the end state
//! and the output must still equal the single-process model.
//!
//! Needs what `scripts/test.sh` exports: `STATESNAP_TEST_S3_BIN` and the
//! `AWS_*` credentials (S3 case), `STATESNAP_TEST_KAFKA_CMD` (broker case),
//! `STATESNAP_TEST_KAFKA_BOOTSTRAP` and `STATESNAP_TEST_S3_URL` (the
//! shared servers the other half uses). Unset: skipped loudly, or a failure
//! under `STATESNAP_REQUIRE_KAFKA=1` / `STATESNAP_REQUIRE_S3=1`.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{env_or_skip, report_or_logs, scenario_config};
use pageviews::scenario::{self, ScenarioConfig};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server process of the test's own, stopped and restarted on the same
/// port with the same data.
struct Server {
    program: String,
    args: Vec<String>,
    cwd: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Server {
    fn start(&mut self) {
        let child = Command::new(&self.program)
            .args(&self.args)
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{} did not listen on {}",
                self.program,
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn config(
    dir: &std::path::Path,
    bootstrap: String,
    repo: &str,
    env: Vec<(String, String)>,
) -> ScenarioConfig {
    ScenarioConfig {
        users: 2000,
        rate: 500,
        env,
        ..scenario_config("pvo", bootstrap, repo, dir, 4)
    }
}

fn run(config: &ScenarioConfig, server: &mut Server) {
    let report = scenario::run_outage(config, Duration::from_secs(8), &mut |up| {
        if up {
            server.start();
        } else {
            server.stop();
        }
        Ok(())
    });
    let report = report_or_logs(report, &config.dir);
    println!("{}", scenario::table(&report));
    assert!(report.input_records > 0);
    assert!(report.users_checked > 0);
}

/// The repository is unreachable while `b` joins: handoffs and opens retry
/// until it is back.
#[test]
fn repository_outage_during_a_rebalance_loses_nothing() {
    let Some(bootstrap) = env_or_skip("STATESNAP_TEST_KAFKA_BOOTSTRAP", "STATESNAP_REQUIRE_KAFKA")
    else {
        return;
    };
    let Some(bin) = env_or_skip("STATESNAP_TEST_S3_BIN", "STATESNAP_REQUIRE_S3") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(data.path().join("outage")).unwrap();
    let port = free_port();
    let key = std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "statesnap".into());
    let secret =
        std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "statesnap-secret-key".into());
    let mut server = Server {
        program: bin,
        args: vec![
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--access-key".into(),
            key,
            "--secret-key".into(),
            secret,
            data.path().display().to_string(),
        ],
        cwd: data.path().to_owned(),
        port,
        child: None,
    };
    server.start();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let config = config(
        dir.path(),
        bootstrap,
        "s3://outage",
        vec![("AWS_ENDPOINT_URL".into(), endpoint)],
    );
    run(&config, &mut server);
}

/// The broker is unreachable while `b` joins: commits, opens and the
/// group itself wait for it.
#[test]
fn broker_outage_during_a_rebalance_loses_nothing() {
    let Some(cmd) = env_or_skip("STATESNAP_TEST_KAFKA_CMD", "STATESNAP_REQUIRE_KAFKA") else {
        return;
    };
    let Some(repo) = env_or_skip("STATESNAP_TEST_S3_URL", "STATESNAP_REQUIRE_S3") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut words = cmd.replace("{port}", &port.to_string());
    words = words.trim().to_owned();
    let mut parts = words.split_whitespace().map(str::to_owned);
    let program = parts.next().unwrap();
    let mut server = Server {
        program,
        args: parts.collect(),
        cwd: data.path().to_owned(),
        port,
        child: None,
    };
    server.start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), format!("127.0.0.1:{port}"), &repo, Vec::new());
    run(&config, &mut server);
}

/// A process is killed in the middle of its handoff (SIGTERM, then SIGKILL
/// 300 ms later: inside its final commits or its handoff snapshots). The
/// others take everything over from whatever was committed; state and
/// output still equal the model.
#[test]
fn a_process_killed_during_its_handoff_loses_nothing() {
    let Some(bootstrap) = env_or_skip("STATESNAP_TEST_KAFKA_BOOTSTRAP", "STATESNAP_REQUIRE_KAFKA")
    else {
        return;
    };
    let Some(repo) = env_or_skip("STATESNAP_TEST_S3_URL", "STATESNAP_REQUIRE_S3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), bootstrap, &repo, Vec::new());
    let report = report_or_logs(
        scenario::run_killed_during_handoff(&config, Duration::from_millis(300)),
        dir.path(),
    );
    println!("{}", scenario::table(&report));
    assert!(report.users_checked > 0);
}
