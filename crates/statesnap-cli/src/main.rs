//! The `statesnap` command: a thin shell over the library. Each command is
//! one library call plus printing (see `cmd/`); errors become exit codes by
//! kind (`statesnap --help` lists them).

mod args;
#[cfg(feature = "rocksdb")]
mod bench;
mod cmd;
mod demo;
mod out;

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
    // Ctrl-C cancels the command's task: restores and snapshot writes
    // stage their work in hidden paths whose guards remove them when the
    // task is dropped, and a restore moves nothing into place after a
    // cancellation. Dropping the runtime then waits for steps still running
    // on its threads to finish and clean up after themselves.
    let cli = std::sync::Arc::new(cli);
    let task = {
        let cli = cli.clone();
        rt.spawn(async move { dispatch(&cli).await })
    };
    let abort = task.abort_handle();
    let result = rt.block_on(async {
        tokio::select! {
            r = task => r.unwrap_or_else(|e| Err(Error::new(
                ErrorKind::Internal,
                "the command panicked; please report it",
            ).with_source(e))),
            _ = tokio::signal::ctrl_c() => {
                eprintln!("statesnap: interrupted; cancelling and cleaning up");
                abort.abort();
                Err(Error::new(
                    ErrorKind::Cancelled,
                    "interrupted (Ctrl-C): the command was cancelled; nothing partial was left \
                     behind",
                ))
            }
        }
    });
    drop(rt);
    match result {
        Ok(code) => code,
        Err(e) => {
            if cli.json {
                println!(
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
