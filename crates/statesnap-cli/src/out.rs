//! Output shared by every command: JSON or text, tables that fit the
//! terminal, progress bars that appear only on a terminal, and the exit
//! code of each error kind.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use statesnap::ErrorKind;

/// Set once stdout is gone (its reader exited: `statesnap list | head`):
/// later output is dropped and the command goes on to its end, quietly.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// One line on stdout, for [`outln!`](crate::outln). A reader that went
/// away (a broken pipe) is not an error of the command: the rest of its
/// output is dropped, and the command finishes what it was doing (a
/// restore piped into `head` still restores) and exits as it would have.
/// Any other write error is said once on stderr.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(args)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    if let Err(e) = written {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("statesnap: cannot write to stdout ({e}); the rest of the output is dropped");
        }
    }
}

/// `crate::outln!` that survives a closed stdout (see [`write_line`]).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::write_line(format_args!($($arg)*))
    };
}

/// How often a command that draws no bar prints a progress line.
pub const PROGRESS_LINE_EVERY: Duration = Duration::from_secs(5);

/// How a command prints.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    /// JSON on stdout instead of text.
    pub json: bool,
}

impl Out {
    /// A table with `header`, wrapped to the terminal's width.
    pub fn table(&self, header: &[&str]) -> Table {
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(header.iter().copied());
        t
    }

    /// Prints `value` as pretty JSON.
    pub fn json(&self, value: &serde_json::Value) {
        // serde_json cannot fail to print a Value.
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
        );
    }

    /// A progress bar of `len` steps with message `what`, drawn on stderr
    /// only when it is a terminal and the output is not JSON.
    pub fn progress(&self, len: u64, what: &str, bytes: bool) -> ProgressBar {
        let pb = ProgressBar::with_draw_target(Some(len), self.draw_target());
        let template = if bytes {
            "{msg} {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})"
        } else {
            "{msg} {bar:30} {pos}/{len} (eta {eta})"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            pb.set_style(style);
        }
        pb.set_message(what.to_owned());
        pb
    }

    /// A spinner with message `what` and the time it has run (same
    /// visibility as [`Out::progress`]), redrawn ten times a second.
    pub fn spinner(&self, what: &str) -> ProgressBar {
        let pb = ProgressBar::with_draw_target(None, self.draw_target());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            pb.set_style(style);
        }
        pb.set_message(what.to_owned());
        pb.enable_steady_tick(Duration::from_millis(100));
        pb
    }

    /// Whether progress is drawn (stderr is a terminal and the output is
    /// not JSON). Otherwise long commands print [`Out::progress_line`]s.
    pub fn draws_progress(&self) -> bool {
        !self.json && std::io::stderr().is_terminal()
    }

    /// Where no bar is drawn: one line of progress on stderr, for a
    /// command that runs longer than a few seconds (a log, a CI job, a
    /// pipe), at most every [`PROGRESS_LINE_EVERY`]. `last` is when the
    /// previous line was printed (start it at the command's start).
    pub fn progress_line(&self, last: &mut std::time::Instant, line: impl FnOnce() -> String) {
        if self.draws_progress() || last.elapsed() < PROGRESS_LINE_EVERY {
            return;
        }
        *last = std::time::Instant::now();
        eprintln!("statesnap: {}", line());
    }

    /// Follows a restore's counters on a bar until the future is dropped:
    /// bytes downloaded (no total: candidates may be tried in turn), then
    /// records replayed out of the tail's length.
    pub async fn follow_restore(&self, progress: &statesnap::restore::RestoreProgress, what: &str) {
        // Cleared when this future is dropped (the restore finished).
        let pb = self
            .spinner(what)
            .with_finish(indicatif::ProgressFinish::AndClear);
        let style = |t: &str| ProgressStyle::with_template(t).ok();
        if let Some(s) = style("{spinner} {msg}: {bytes} downloaded ({bytes_per_sec})") {
            pb.set_style(s);
        }
        let mut replaying = false;
        let mut last_line = std::time::Instant::now();
        loop {
            self.progress_line(&mut last_line, || match progress.replay() {
                Some((done, total)) => format!("{what}: replayed {done} of {total} records"),
                None => format!("{what}: {} downloaded", bytes(progress.bytes_downloaded())),
            });
            match progress.replay() {
                Some((done, total)) => {
                    if !replaying {
                        replaying = true;
                        if let Some(s) =
                            style("{msg}: replaying {bar:30} {pos}/{len} records (eta {eta})")
                        {
                            pb.set_style(s);
                        }
                    }
                    pb.set_length(total);
                    pb.set_position(done);
                }
                None => pb.set_position(progress.bytes_downloaded()),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `run` on a copy of `repo` that counts the blob bytes it reads,
    /// showing them on a spinner (for transfers whose total is not known
    /// up front) until `run` finishes.
    pub async fn reading<T>(
        &self,
        repo: &statesnap::Repository,
        what: &str,
        run: impl AsyncFnOnce(&statesnap::Repository) -> statesnap::Result<T>,
    ) -> statesnap::Result<T> {
        let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = repo.clone().counting_reads(read.clone());
        let pb = self
            .spinner(what)
            .with_finish(indicatif::ProgressFinish::AndClear);
        if let Ok(s) =
            ProgressStyle::with_template("{spinner} {msg}: {bytes} read ({bytes_per_sec})")
        {
            pb.set_style(s);
        }
        let follow = async {
            loop {
                pb.set_position(read.load(std::sync::atomic::Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            biased;
            r = run(&counted) => r,
            () = follow => unreachable!("the spinner loop never returns"),
        }
    }

    fn draw_target(&self) -> ProgressDrawTarget {
        if self.json || !std::io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        }
    }
}

/// The exit code of an error kind (documented in `statesnap --help` and the
/// README).
pub fn exit_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Internal => 1,
        ErrorKind::Config => 3,
        ErrorKind::NotFound => 4,
        ErrorKind::Corrupt => 5,
        ErrorKind::Stale => 6,
        ErrorKind::Transient => 7,
        ErrorKind::Io => 8,
        ErrorKind::AlreadyExists => 9,
        ErrorKind::Cancelled => 130,
        // A kind added later: a generic failure until it gets its own code.
        _ => 1,
    }
}

/// Exit code 5: a command ran and found something wrong (e.g. `verify`).
pub fn problems_found() -> ExitCode {
    ExitCode::from(exit_code(ErrorKind::Corrupt))
}

/// A snapshot's key count and whether it is exact: counted at snapshot
/// time ([`statesnap::Manifest::exact_keys`]), else the store's estimate
/// the manifest recorded.
pub fn keys_figure(m: &statesnap::Manifest) -> (u64, bool) {
    match m.exact_keys() {
        Some(k) => (k, true),
        None => (m.stats.keys, false),
    }
}

/// [`keys_figure`] for a table: `159602`, or `~231542` for an estimate.
pub fn keys_text(m: &statesnap::Manifest) -> String {
    match keys_figure(m) {
        (k, true) => k.to_string(),
        (k, false) => format!("~{k}"),
    }
}

/// `1.2 GiB`-style sizes.
pub fn bytes(n: u64) -> String {
    indicatif::BinaryBytes(n).to_string()
}

/// `3h 4m`-style ages of a millisecond timestamp, relative to `now_ms`.
pub fn age(created_ms: i64, now_ms: i64) -> String {
    let secs = ((now_ms - created_ms).max(0) / 1000) as u64;
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// A duration the way `--grace` takes it: `7d`, `12h`, `30m`, `90s`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        s if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        s if s.is_multiple_of(3600) => format!("{}h", s / 3600),
        s if s.is_multiple_of(60) => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Seconds with millisecond precision.
pub fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// Bytes as text: UTF-8 without control characters as is, anything else
/// (or with `hex`) as `0x…`.
pub fn show_bytes(b: &[u8], hex: bool) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if !hex && !s.chars().any(char::is_control) => s.to_owned(),
        _ => format!("0x{}", to_hex(b)),
    }
}

/// Lowercase hex.
pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes for JSON: `{"utf8": ...}` when they are UTF-8, `{"hex": ...}`
/// otherwise, so no byte is lost.
pub fn json_bytes(b: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(b) {
        Ok(s) => serde_json::json!({ "utf8": s }),
        Err(_) => serde_json::json!({ "hex": to_hex(b) }),
    }
}

/// Parses hex digits (an optional `0x` prefix allowed).
pub fn from_hex(s: &str) -> Result<Vec<u8>, statesnap::Error> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    let bad = || {
        statesnap::Error::new(
            ErrorKind::Config,
            format!("not hex digits value=`{}`", s.escape_debug()),
        )
    };
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_through_hex_and_show_safely() {
        assert_eq!(from_hex("0x00ff10").unwrap(), vec![0, 255, 16]);
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
        assert_eq!(show_bytes(b"user-1", false), "user-1");
        assert_eq!(show_bytes(b"a\nb", false), "0x610a62");
        assert_eq!(show_bytes(&[0xff], false), "0xff");
        assert_eq!(json_bytes(&[0xff]), serde_json::json!({"hex": "ff"}));
        assert_eq!(age(0, 90_000), "1m 30s");
        assert_eq!(age(0, 2 * 86_400_000 + 3_600_000), "2d 1h");
        assert_eq!(duration(Duration::from_secs(3600)), "1h");
        assert_eq!(duration(Duration::from_secs(90)), "90s");
    }

    /// The exit-code tables of the README and docs/cli.md say what
    /// [`exit_code`] does, row by row, and leave no kind out.
    #[test]
    fn the_documented_exit_codes_are_the_ones_returned() {
        let kinds = [
            ErrorKind::Internal,
            ErrorKind::Config,
            ErrorKind::NotFound,
            ErrorKind::Corrupt,
            ErrorKind::Stale,
            ErrorKind::Transient,
            ErrorKind::Io,
            ErrorKind::AlreadyExists,
            ErrorKind::Cancelled,
        ];
        for (name, doc) in [
            ("README.md", include_str!("../../../README.md")),
            ("docs/cli.md", include_str!("../../../docs/cli.md")),
        ] {
            let section = doc
                .split("| code | kind |")
                .nth(1)
                .unwrap_or_else(|| panic!("{name}: no `| code | kind |` table"));
            let mut rows = Vec::new();
            for line in section.lines().skip(2) {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                if cells.len() < 3 || !line.starts_with('|') {
                    break;
                }
                let code: u8 = cells[1]
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: {line}"));
                rows.push((code, cells[2].to_owned()));
            }
            let mut documented = Vec::new();
            for (code, kind) in &rows {
                let expected = match kind.as_str() {
                    "ok" => 0,
                    "usage" => 2,
                    k => {
                        let kind = kinds
                            .iter()
                            .find(|x| x.as_str() == k)
                            .unwrap_or_else(|| panic!("{name}: unknown kind `{k}`"));
                        documented.push(*kind);
                        exit_code(*kind)
                    }
                };
                assert_eq!(*code, expected, "{name}: the row of `{kind}`");
            }
            for k in kinds {
                assert!(documented.contains(&k), "{name}: no row for `{k}`");
            }
        }
    }
}
