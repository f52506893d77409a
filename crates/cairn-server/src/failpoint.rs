//! Fail points for tests that kill a server at a chosen moment: `CAIRN_FAILPOINTS=name[,name]`
//! arms them in a server built with the `failpoints` feature (the `fail` crate); elsewhere they
//! compile to nothing. An armed point fires once per cluster: the first server to reach it
//! creates `FILE.d/failpoint-<name>` and SIGKILLs itself, so the leader elected after it (which
//! has the same environment) passes the point and carries on.

use std::path::Path;

/// Arms the fail points named in `CAIRN_FAILPOINTS`, their markers in `dir` (the cluster file's
/// folder).
pub fn arm(dir: &Path) {
    let Ok(names) = std::env::var("CAIRN_FAILPOINTS") else { return };
    #[cfg(feature = "failpoints")]
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let (marker, point) = (dir.join(format!("failpoint-{name}")), name.to_string());
        let fire = move || {
            if std::fs::OpenOptions::new().write(true).create_new(true).open(&marker).is_ok() {
                tracing::warn!("fail point {point} reached: killing this process (CAIRN_FAILPOINTS)");
                // SAFETY: kill(2) on this process; it does not return.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
        };
        if let Err(e) = fail::cfg_callback(name, fire) {
            tracing::warn!("fail point {name}: {e}");
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = dir;
    #[cfg(not(feature = "failpoints"))]
    tracing::warn!("CAIRN_FAILPOINTS={names} ignored: this server was built without the `failpoints` feature");
}

/// Passes fail point `name` (see the module comment).
pub fn hit(name: &'static str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name);
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
