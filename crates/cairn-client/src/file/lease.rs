//! Claims on the file engine (D²T): each committed step is leased to one claimer at a time by a
//! lease file `claims/S.G.json` (step S, generation G) holding the claimer and the expiry time.
//! The highest generation of a step is its lease. A free step is taken by creating generation 0,
//! one whose lease lapsed by creating the next generation; creating never replaces a file, so of
//! two claimers racing for a step one wins. A holder renews by rewriting its own file; once a
//! later generation exists the step has moved on. Expiry is wall-clock time: claimers on several
//! nodes need synchronised clocks (NTP), as leases anywhere do.
//!
//! Leases only share the work out: that a step is consumed once is the consume transaction's
//! guarantee (`consume.rs`), whatever happens to leases.

use super::consume;
use cairn_core::{Error, Result};
use cairn_file::layout::{publish, publish_new, Layout};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One lease file's content.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Lease {
    claimer: String,
    expires_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The current lease of each step that has one: (generation, lease).
fn current(layout: &Layout) -> Result<BTreeMap<u64, (u32, Lease)>> {
    let mut newest: BTreeMap<u64, u32> = BTreeMap::new();
    for name in layout.list("claims")? {
        let Some((step, generation)) = name.strip_suffix(".json").and_then(|n| n.split_once('.')) else { continue };
        let (Ok(step), Ok(generation)) = (step.parse::<u64>(), generation.parse::<u32>()) else { continue };
        let g = newest.entry(step).or_insert(generation);
        *g = (*g).max(generation);
    }
    let mut out = BTreeMap::new();
    for (step, generation) in newest {
        // Gone meanwhile (its step consumed) or unreadable: no lease.
        let Some(lease) = std::fs::read(layout.lease_path(step, generation)).ok().and_then(|b| serde_json::from_slice(&b).ok()) else {
            continue;
        };
        out.insert(step, (generation, lease));
    }
    Ok(out)
}

/// Leases the lowest committed step of `layout` that no live claimer holds to `claimer`; see
/// [`crate::Reader::claim`]. Transactions that died holding a step are completed first.
pub(super) fn claim(layout: &Layout, claimer: &str, lease: Duration) -> Result<(Option<u64>, bool)> {
    consume::recover_source(layout)?;
    let committed = layout.steps()?;
    let leases = current(layout)?;
    let now = now_ms();
    let mine = Lease { claimer: claimer.to_string(), expires_ms: now.saturating_add(lease.as_millis() as u64) };
    let bytes = serde_json::to_vec(&mine).expect("leases serialize");
    for &step in &committed {
        let generation = match leases.get(&step) {
            None => 0,
            Some((g, l)) if l.expires_ms <= now => g + 1,
            Some(_) => continue,
        };
        if take(layout, step, generation, &bytes)? {
            return Ok((Some(step), false));
        }
    }
    let in_flight = consume::in_flight(layout)?;
    // Lapsed leases of steps that are gone are litter.
    for (step, (g, l)) in &leases {
        if l.expires_ms <= now && committed.binary_search(step).is_err() && !in_flight.iter().any(|(s, _)| s == step) {
            let _ = std::fs::remove_file(layout.lease_path(*step, *g));
        }
    }
    let all_mine = committed.iter().all(|s| leases.get(s).is_some_and(|(_, l)| l.claimer == claimer && l.expires_ms > now));
    Ok((None, in_flight.is_empty() && all_mine && layout.finished()?))
}

/// Creates generation `generation` of `step`'s lease; returns whether this claimer has the step
/// now (not if another created that generation first, or the step is gone).
fn take(layout: &Layout, step: u64, generation: u32, lease: &[u8]) -> Result<bool> {
    let path = layout.lease_path(step, generation);
    if !publish_new(&path, lease, false, 0)? {
        return Ok(false);
    }
    // Consumed between this claimer's listings of steps and of leases (its holder dropped the
    // lease after taking the step): no step to hand out.
    if !layout.step_path(step).exists() {
        let _ = std::fs::remove_file(path);
        return Ok(false);
    }
    for g in 0..generation {
        let _ = std::fs::remove_file(layout.lease_path(step, g));
    }
    Ok(true)
}

/// Extends every live lease of `claimer` to `lease` from now; returns the steps it holds.
pub(super) fn renew(layout: &Layout, claimer: &str, lease: Duration) -> Result<Vec<u64>> {
    let until = now_ms().saturating_add(lease.as_millis() as u64);
    let mut held = Vec::new();
    for (step, (g, l)) in current(layout)? {
        if l.claimer == claimer {
            let renewed = Lease { expires_ms: l.expires_ms.max(until), ..l };
            publish(&layout.lease_path(step, g), &serde_json::to_vec(&renewed).expect("leases serialize"), false, 1)?;
            held.push(step);
        }
    }
    Ok(held)
}

/// Gives back every step `claimer` holds.
pub(super) fn unclaim(layout: &Layout, claimer: &str) -> Result<()> {
    for (step, (g, l)) in current(layout)? {
        if l.claimer == claimer {
            std::fs::remove_file(layout.lease_path(step, g))
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
                .map_err(|e| Error::io(format!("giving back the claim of step {step}"), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_taken_once_per_generation_and_never_once_gone() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), "ds");
        layout.create().unwrap();
        std::fs::write(layout.step_path(3), b"{}").unwrap();
        assert!(take(&layout, 3, 0, b"{}").unwrap());
        assert!(!take(&layout, 3, 0, b"{}").unwrap(), "generation 0 exists: the race is lost");
        assert!(take(&layout, 3, 1, b"{}").unwrap());
        assert_eq!(layout.list("claims").unwrap(), vec!["000000000003.000001.json"], "older generations go");
        std::fs::remove_file(layout.step_path(3)).unwrap();
        assert!(!take(&layout, 3, 2, b"{}").unwrap(), "a consumed step is not handed out");
        assert_eq!(layout.list("claims").unwrap(), vec!["000000000003.000001.json"]);
    }
}
