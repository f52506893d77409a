//! The server's log: one line per event with an RFC 3339 time, a level and the server's id,
//! as text or JSON lines (`--log-format json`), filtered by `RUST_LOG` or `--log-level`
//! (default `info`; openraft's own events only when the filter names them, as its elections
//! log routine errors). It goes to `FILE.d/server-<id>.log` (the owner's only, as the secret:
//! logs name datasets and paths); an older log there is kept as `server-<id>.log.1` unless the
//! launcher (`cairn cluster start`) already opened the file as this process's stderr after
//! keeping the old one. Failures that repeat are logged at most once per period, with how many
//! were left out ([`limited`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `2026-11-28T02:45:00.123456Z  WARN server=2 ...`
    #[default]
    Text,
    /// One JSON object a line (`timestamp`, `level`, `fields`).
    Json,
}

/// Whether this process's stderr is the file at `path` (a launcher redirected it there).
fn stderr_is(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), std::fs::metadata("/proc/self/fd/2")) {
        (Ok(file), Ok(err)) => (file.dev(), file.ino()) == (err.dev(), err.ino()),
        _ => false,
    }
}

/// Starts logging for this process (once; a second call, e.g. a second server in one test
/// process, keeps the first's). `file` is where the log goes (`None`: stderr).
pub fn init(file: Option<&Path>, level: Option<&str>, format: LogFormat) -> std::io::Result<()> {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let writer = match file {
        Some(path) if !stderr_is(path) => {
            cairn_proto::cluster::rotate_log(path);
            let f = {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?
            };
            BoxMakeWriter::new(std::sync::Arc::new(f))
        }
        _ => BoxMakeWriter::new(std::io::stderr),
    };
    let filter = match level {
        Some(l) => tracing_subscriber::EnvFilter::new(l),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=off")),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_target(false).with_ansi(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

/// How often a failure that repeats is logged at most (`encode failed ... Connection refused`
/// was logged 167 times in one run before).
pub const EVERY: Duration = Duration::from_secs(10);

/// Whether a failure of kind `key` should be logged now: the first of a kind is, then at most
/// one per `period`. `Some(n)`: log it, saying `n` more were left out since the last one.
pub fn limited(key: &'static str, period: Duration) -> Option<u64> {
    static SEEN: OnceLock<Mutex<HashMap<&'static str, (Instant, u64)>>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    match seen.get_mut(key) {
        Some((last, skipped)) if now.duration_since(*last) < period => {
            *skipped += 1;
            None
        }
        Some((last, skipped)) => {
            *last = now;
            Some(std::mem::take(skipped))
        }
        None => {
            seen.insert(key, (now, 0));
            Some(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_left_out_within_the_period_and_counted() {
        assert_eq!(limited("test-a", Duration::from_secs(3600)), Some(0));
        assert_eq!(limited("test-a", Duration::from_secs(3600)), None);
        assert_eq!(limited("test-a", Duration::from_secs(3600)), None);
        assert_eq!(limited("test-b", Duration::from_secs(3600)), Some(0), "each kind on its own");
        assert_eq!(limited("test-a", Duration::ZERO), Some(2), "the next one says how many were left out");
    }
}
