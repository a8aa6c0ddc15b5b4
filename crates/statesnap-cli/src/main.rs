//! The `statesnap` command: a thin shell over the library. Each command is
//! one library call plus printing (see `cmd/`); errors become exit codes by
//! kind (`statesnap --help` lists them).

mod args;
#[cfg(feature = "rocksdb")]
mod bench;
mod cmd;
mod demo;
mod out;
mod signal;

use clap::Parser;
use std::process::ExitCode;

use args::Command;
use out::Out;
use statesnap::{Error, ErrorKind, Result};

async fn dispatch(cli: &args::Cli) -> Result<ExitCode> {
    let out = Out { json: cli.json };
    match &cli.command {
        Command::Init(a) => cmd::inspect::init(a, out).await,
        Command::Stores(a) => cmd::inspect::stores(a, out).await,
        Command::List(a) => cmd::inspect::list(a, out).await,
        Command::Show(a) => cmd::inspect::show(a, out).await,
        Command::Verify(a) => cmd::verify::run(a, out).await,
        Command::Plan(a) => cmd::restore::plan(a, out).await,
        Command::Restore(a) => cmd::restore::restore(a, out).await,
        Command::Retain(a) => cmd::clean::retain(a, out).await,
        Command::Gc(a) => cmd::clean::gc(a, out).await,
        Command::Get(a) => cmd::read::get(a, out).await,
        Command::Scan(a) => cmd::read::scan(a, out).await,
        Command::Diff(a) => cmd::read::diff(a, out).await,
        Command::Clone(a) => cmd::inspect::clone(a, out).await,
        Command::Reshard(a) => cmd::reshard::run(a, out).await,
        Command::Demo(a) => demo::run(a, out).await,
        #[cfg(feature = "rocksdb")]
        Command::Bench(a) => bench::run(a, out).await,
    }
}

/// Warnings, except those of the modules whose findings the commands print.
const DEFAULT_LOG_FILTER: &str = "warn,statesnap::repo::verify=error,statesnap::restore=error";

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    // Library warnings go to stderr once, without colour codes unless
    // stderr is a terminal. The ones a command reports itself — `verify`'s
    // bad blobs and inline files, `restore`'s skipped snapshots and its
    // fall back to a full replay — are left out by default, so each problem
    // is printed once; RUST_LOG overrides this.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("statesnap: cannot start the async runtime: {e}");
            return ExitCode::from(out::exit_code(ErrorKind::Io));
        }
    };
    // A signal (SIGINT or SIGTERM) asks the command's gate to cancel
    // (see signal.rs). When the cancel wins, the command's task is dropped:
    // restores and snapshot writes stage their work in hidden paths whose
    // guards remove them, and a restore moves nothing into place after a
    // cancellation. Dropping the runtime then waits for steps still running
    // on its threads to finish and clean up after themselves. When the
    // command has already entered its commit step, it runs to its end and
    // its own outcome is reported.
    let cli = std::sync::Arc::new(cli);
    let gate = signal::gate();
    let joined = |r: std::result::Result<Result<ExitCode>, tokio::task::JoinError>| {
        r.unwrap_or_else(|e| {
            Err(Error::new(
                ErrorKind::Internal,
                "the command panicked; please report it",
            )
            .with_source(e))
        })
    };
    let mut cancelled = false;
    let result = rt.block_on(async {
        // The handlers first, then the command: a signal is never met by
        // its default action (ending the process mid-step).
        let mut signals = match signal::Signals::install() {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("statesnap: cannot handle signals ({e}); a signal ends the process");
                None
            }
        };
        let mut task = {
            let cli = cli.clone();
            tokio::spawn(async move { dispatch(&cli).await })
        };
        let mut late = false;
        loop {
            tokio::select! {
                r = &mut task => return joined(r),
                Some(s) = async { signals.as_mut()?.next().await }, if !late => {
                    if gate.cancel() {
                        eprintln!("statesnap: {}; cancelling and cleaning up", s.describe());
                        task.abort();
                        cancelled = true;
                        return Err(Error::new(
                            ErrorKind::Cancelled,
                            format!(
                                "{}: the command was cancelled; {}",
                                s.describe(),
                                signal::what_a_cancel_leaves(&cli.command)
                            ),
                        ));
                    }
                    // Too late to cancel: the command has committed. Its
                    // report is the truth; the handlers stay installed, so
                    // further signals change nothing.
                    eprintln!(
                        "statesnap: {} after the command committed its result; finishing",
                        s.describe()
                    );
                    late = true;
                }
            }
        }
    });
    drop(rt);
    if cancelled {
        for (p, e) in signal::clean_up_after_cancel() {
            eprintln!(
                "statesnap: could not remove path=`{}` after the cancel: {e}; remove it by hand",
                p.display()
            );
        }
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            if cli.json {
                crate::outln!(
                    "{}",
                    serde_json::json!({
                        "error": {
                            "kind": e.kind().as_str(),
                            "reason": e.reason().map(statesnap::Reason::as_str),
                            "message": e.to_string(),
                        }
                    })
                );
            }
            eprintln!("statesnap: {e}");
            ExitCode::from(out::exit_code(e.kind()))
        }
    }
}
