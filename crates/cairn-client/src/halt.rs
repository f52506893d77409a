//! Whether the job asks the application to stop at its next step: the job script's halt file
//! (created on `SIGUSR1`, e.g. `#SBATCH --signal=B:USR1@300`), or the allocation's end within
//! `$CAIRN_HALT_SECONDS`. Read afresh on every call, so a loop can ask once per step.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// True when `$CAIRN_HALT_FILE` names a file that exists, or when fewer than
/// `$CAIRN_HALT_SECONDS` remain before `$SLURM_JOB_END_TIME` (Unix seconds). Unset or
/// unparsable variables ask nothing.
pub fn requested() -> bool {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    decide(var("CAIRN_HALT_FILE").as_deref().map(Path::new), var("CAIRN_HALT_SECONDS"), var("SLURM_JOB_END_TIME"), now)
}

fn decide(file: Option<&Path>, seconds: Option<String>, end: Option<String>, now: f64) -> bool {
    if file.is_some_and(Path::exists) {
        return true;
    }
    match (seconds.and_then(|s| s.trim().parse::<f64>().ok()), end.and_then(|e| e.trim().parse::<f64>().ok())) {
        (Some(margin), Some(end)) => end - now < margin,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_halt_file_asks_while_it_exists() {
        let dir = std::env::temp_dir().join(format!("cairn-halt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("halt");
        assert!(!decide(Some(&file), None, None, 0.0));
        std::fs::write(&file, b"").unwrap();
        assert!(decide(Some(&file), None, None, 0.0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_time_limit_asks_within_the_margin_only() {
        let s = |v: &str| Some(v.to_string());
        assert!(!decide(None, s("300"), s("10000"), 9000.0), "1000 s left, margin 300");
        assert!(decide(None, s("300"), s("10000"), 9800.0), "200 s left");
        assert!(decide(None, s("300"), s("10000"), 10500.0), "past the end");
        assert!(!decide(None, None, s("10000"), 9999.0), "no margin set");
        assert!(!decide(None, s("300"), None, 9999.0), "not under Slurm");
        assert!(!decide(None, s("soon"), s("10000"), 9999.0), "an unparsable margin asks nothing");
    }
}
