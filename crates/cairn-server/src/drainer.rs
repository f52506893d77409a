//! The data-plane side of the drain (the plan and the commit are the leader's,
//! [`crate::control::drain`]): a server writes the blocks of a committed step it was given into
//! one new data file of its own under the drain folder, each block gathered whole from its
//! objects (this server's pieces, or its peers', [`crate::gather`]), so the drain's bandwidth is
//! every server's. Nothing refers to the file until the leader commits the step's index.

use crate::state::State;
use cairn_core::assemble::{copy_box, Layout as Box};
use cairn_core::index::StepIndex;
use cairn_core::{Error, Result};
use cairn_file::drain::{write_part, DrainOptions, Part};
use cairn_file::layout::Layout;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// A test-only cap on each server's drain writes, bytes per second (`CAIRN_DRAIN_BPS`): one
/// node's link to a parallel file system, for the drain scaling bench on a machine whose own
/// disk and cores would be the bottleneck instead.
static LINK: LazyLock<Option<f64>> = LazyLock::new(|| std::env::var("CAIRN_DRAIN_BPS").ok()?.parse::<f64>().ok().filter(|b| *b > 0.0));

/// How drained steps are written by every server: raw (the file engine's default codecs), in
/// chunks of the default size, flushed before the step counts as drained; the cluster's id is
/// the step's identity. `hook` is the fail points' (a no-op outside tests).
pub fn options<'a>(state: &State, cluster: &'a str) -> DrainOptions<'a> {
    DrainOptions {
        compression: None,
        chunk: cairn_core::checksum::DEFAULT_CHUNK,
        fsync: true,
        tag: state.id,
        cluster,
        hook: &crate::failpoint::hit,
    }
}

/// Writes every block of `index` (a committed step's index cut to this server's part) of
/// `dataset` under drain folder `path`; the records come back in the index's block order.
pub async fn part(state: &Arc<State>, path: &Path, dataset: &str, index: StepIndex) -> Result<Part> {
    let cluster = cairn_proto::auth::cluster_id(&state.secret);
    let (state, path, dataset) = (state.clone(), path.to_path_buf(), dataset.to_string());
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let all: Vec<usize> = (0..index.blocks.len()).collect();
        let (started, sent) = (Instant::now(), AtomicU64::new(0));
        // One block gathered at a time, the next while one is written (write_part's reader).
        write_part(&Layout::new(&path, &dataset), &index, &all, options(&state, &cluster), |at| {
            let bytes = rt.block_on(block(&state, &dataset, &index, at))?;
            if let Some(bps) = *LINK {
                let total = sent.fetch_add(bytes.len() as u64, Ordering::Relaxed) + bytes.len() as u64;
                let due = started + Duration::from_secs_f64(total as f64 / bps);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            Ok(bytes)
        })
    })
    .await
    .map_err(|e| Error::Unavailable(format!("the drain's part writer failed: {e}")))?
}

/// Block `at` of `index`, whole: its objects gathered and laid into the block's box.
async fn block(state: &Arc<State>, dataset: &str, index: &StepIndex, at: usize) -> Result<Vec<u8>> {
    let b = &index.blocks[at];
    let def = index.vars.get(&b.var).ok_or_else(|| Error::Corrupt(format!("step {} names no variable {}", index.step, b.var)))?;
    let elem = def.dtype.size();
    let objects = crate::gather::objects(state, dataset, index.step, &b.objects, elem as u64).await?;
    let mut out = vec![0u8; b.len as usize];
    for (o, bytes) in b.objects.iter().zip(&objects) {
        copy_box(bytes, Box { layout: &o.region, base: 0 }, &mut out, Box { layout: &b.region, base: 0 }, &o.region, elem);
    }
    Ok(out)
}
