//! Whether the job asks the application to stop at its next step: the job script's halt file
//! (created on `SIGUSR1`, e.g. `#SBATCH --signal=B:USR1@300`), or the allocation's end within
//! `$CAIRN_HALT_SECONDS`. Read afresh on every call, so a loop can ask once per step. This is one
//! process's answer; every rank of a writer agrees on one through `Writer::halt_requested_all`.

use cairn_core::{Error, Result};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// True when `$CAIRN_HALT_FILE` names a file that exists, or when fewer than
/// `$CAIRN_HALT_SECONDS` remain before `$SLURM_JOB_END_TIME` (Unix seconds). Unset variables
/// ask nothing; an unparsable one is a `Config` error naming it and its value (a typo would
/// otherwise mean the job never halts early).
pub fn requested() -> Result<bool> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    decide(var("CAIRN_HALT_FILE").as_deref().map(Path::new), var("CAIRN_HALT_SECONDS"), var("SLURM_JOB_END_TIME"), now)
}

fn decide(file: Option<&Path>, seconds: Option<String>, end: Option<String>, now: f64) -> Result<bool> {
    let number = |name: &str, v: Option<String>| -> Result<Option<f64>> {
        v.map(|v| {
            v.trim().parse::<f64>().ok().filter(|x| x.is_finite()).ok_or_else(|| {
                Error::Config(format!("{name}={v:?} is not a number of seconds; set it to one (e.g. {name}=300) or unset it"))
            })
        })
        .transpose()
    };
    let (margin, end) = (number("CAIRN_HALT_SECONDS", seconds)?, number("SLURM_JOB_END_TIME", end)?);
    if file.is_some_and(Path::exists) {
        return Ok(true);
    }
    Ok(matches!((margin, end), (Some(margin), Some(end)) if end - now < margin))
}

/// Whether the stale halt file was reported already (once per process).
static STALE_TOLD: AtomicBool = AtomicBool::new(false);

/// Once per process: a warning when `$CAIRN_HALT_FILE` exists and is older than this process
/// (a halt file a previous run left: this run would stop at its first step).
pub fn stale_warning() -> Option<String> {
    let file = std::env::var("CAIRN_HALT_FILE").ok().filter(|v| !v.trim().is_empty())?;
    let modified = std::fs::metadata(&file).and_then(|m| m.modified()).ok()?;
    let started = process_start()?;
    if modified >= started || STALE_TOLD.swap(true, Ordering::Relaxed) {
        return None;
    }
    Some(format!(
        "the halt file {file} is older than this process: a previous run left it, so this one stops at once; remove it at \
         the job's start (the job script does)"
    ))
}

/// When this process started, from `/proc` (its start in clock ticks after boot, and boot time).
fn process_start() -> Option<SystemTime> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at its closing parenthesis.
    let ticks: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat").ok()?.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(UNIX_EPOCH + std::time::Duration::from_secs_f64(boot as f64 + ticks as f64 / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_halt_file_asks_while_it_exists() {
        let dir = std::env::temp_dir().join(format!("cairn-halt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("halt");
        assert!(!decide(Some(&file), None, None, 0.0).unwrap());
        std::fs::write(&file, b"").unwrap();
        assert!(decide(Some(&file), None, None, 0.0).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_time_limit_asks_within_the_margin_only() {
        let s = |v: &str| Some(v.to_string());
        assert!(!decide(None, s("300"), s("10000"), 9000.0).unwrap(), "1000 s left, margin 300");
        assert!(decide(None, s("300"), s("10000"), 9800.0).unwrap(), "200 s left");
        assert!(decide(None, s("300"), s("10000"), 10500.0).unwrap(), "past the end");
        assert!(!decide(None, None, s("10000"), 9999.0).unwrap(), "no margin set");
        assert!(!decide(None, s("300"), None, 9999.0).unwrap(), "not under Slurm");
    }

    #[test]
    fn an_unparsable_variable_is_an_error_naming_it_and_its_value() {
        let s = |v: &str| Some(v.to_string());
        let e = decide(None, s("5min"), s("10000"), 0.0).unwrap_err();
        assert_eq!(e.kind(), cairn_core::ErrorKind::Config);
        assert!(e.to_string().contains("CAIRN_HALT_SECONDS=\"5min\""), "{e}");
        let e = decide(None, s("300"), s("tomorrow"), 0.0).unwrap_err();
        assert!(e.to_string().contains("SLURM_JOB_END_TIME=\"tomorrow\""), "{e}");
    }

    #[test]
    fn this_process_started_before_now_and_after_boot() {
        let started = process_start().expect("/proc tells");
        assert!(started <= SystemTime::now() && started > UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000));
    }
}
