//! The writer's trace buffer: fine-grained per-process records (QMCPack TRACES: each walker's
//! energy, each particle's position) appended step after step in the application's memory and
//! written every `trace_flush` steps as one write, so per-particle output costs little.
//!
//! Each step's records of a variable become that writer's block of the (local) variable in that
//! step, so readers find them like any local block.

use cairn_core::{Error, Region, Result};
use std::collections::BTreeMap;

/// Records of one step in a variable's buffer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Piece {
    pub(crate) step: u64,
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// The step's block: at the origin, records (first extent) by the record's own extents.
    pub(crate) region: Region,
}

#[derive(Debug, Default)]
struct VarBuf {
    bytes: Vec<u8>,
    pieces: Vec<Piece>,
}

/// Buffered trace records of every traced variable, in step order.
#[derive(Debug, Default)]
pub(crate) struct TraceBuffer {
    vars: BTreeMap<String, VarBuf>,
}

impl TraceBuffer {
    /// Appends records (`records.count[0]` of them, each of extents `records.count[1..]`, the
    /// box at the origin) of `var` at `step`. Records appended to one step must have the same
    /// extents; a later step may differ.
    pub(crate) fn append(&mut self, var: &str, step: u64, bytes: &[u8], records: Region) -> Result<()> {
        let count = &records.count;
        let buf = self.vars.entry(var.to_string()).or_default();
        let start = buf.bytes.len();
        match buf.pieces.last_mut() {
            Some(p) if p.step == step => {
                let have = &mut p.region.count;
                if have[1..] != count[1..] {
                    return Err(Error::InvalidArgument(format!(
                        "trace records of '{var}' at step {step} have extents {:?} but earlier ones this step have {:?}; \
                         records of one step must have the same shape after the first axis",
                        &count[1..],
                        &have[1..]
                    )));
                }
                have[0] = have[0]
                    .checked_add(count[0])
                    .ok_or_else(|| Error::InvalidArgument(format!("trace records of '{var}' at step {step} overflow a 64-bit count")))?;
                p.end += bytes.len();
            }
            Some(p) if p.step > step => {
                return Err(Error::Conflict(format!("trace of '{var}' at step {step} after step {}: steps must increase", p.step)));
            }
            _ => buf.pieces.push(Piece { step, start, end: start + bytes.len(), region: records }),
        }
        buf.bytes.extend_from_slice(bytes);
        Ok(())
    }

    /// Whether any record waits for a flush.
    pub(crate) fn is_empty(&self) -> bool {
        self.vars.values().all(|b| b.pieces.is_empty())
    }

    /// Whether `var` has records at `step`.
    pub(crate) fn has(&self, var: &str, step: u64) -> bool {
        self.vars.get(var).is_some_and(|b| b.pieces.iter().any(|p| p.step == step))
    }

    /// Bytes buffered.
    pub(crate) fn len(&self) -> usize {
        self.vars.values().map(|b| b.bytes.len()).sum()
    }

    /// Forgets the records of `step` (an aborted step: always the newest in each buffer).
    pub(crate) fn drop_step(&mut self, step: u64) {
        for buf in self.vars.values_mut() {
            if let Some(p) = buf.pieces.last().filter(|p| p.step == step) {
                buf.bytes.truncate(p.start);
                buf.pieces.pop();
            }
        }
    }

    /// Every buffered piece: (variable, piece, its bytes).
    pub(crate) fn pieces(&self) -> impl Iterator<Item = (&str, &Piece, &[u8])> {
        self.vars.iter().flat_map(|(v, b)| b.pieces.iter().map(move |p| (v.as_str(), p, &b.bytes[p.start..p.end])))
    }

    /// Empties the buffer after a flush, keeping its memory for the next steps.
    pub(crate) fn clear(&mut self) {
        for b in self.vars.values_mut() {
            b.bytes.clear();
            b.pieces.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(count: &[u64]) -> Region {
        Region::new(vec![0; count.len()], count.to_vec()).unwrap()
    }

    #[test]
    fn appends_merge_within_a_step_and_split_across_steps() {
        let mut t = TraceBuffer::default();
        t.append("e", 1, &[1, 2], at(&[2])).unwrap();
        t.append("e", 1, &[3], at(&[1])).unwrap();
        t.append("e", 2, &[], at(&[0])).unwrap();
        t.append("x", 2, &[9; 6], at(&[2, 3])).unwrap();
        let got: Vec<_> = t.pieces().map(|(v, p, b)| (v.to_string(), p.step, p.region.count.clone(), b.to_vec())).collect();
        assert_eq!(
            got,
            vec![("e".into(), 1, vec![3], vec![1, 2, 3]), ("e".into(), 2, vec![0], vec![]), ("x".into(), 2, vec![2, 3], vec![9; 6]),]
        );
        assert!(t.has("x", 2) && !t.has("x", 1));
        assert_eq!(t.len(), 9);
    }

    #[test]
    fn mismatched_record_shapes_and_decreasing_steps_are_refused() {
        let mut t = TraceBuffer::default();
        t.append("x", 3, &[0; 6], at(&[2, 3])).unwrap();
        let e = t.append("x", 3, &[0; 4], at(&[2, 2])).unwrap_err().to_string();
        assert!(e.contains("[2]") && e.contains("[3]"), "{e}");
        assert!(t.append("x", 2, &[0; 3], at(&[1, 3])).is_err());
        // A later step may use another record shape.
        t.append("x", 4, &[0; 4], at(&[2, 2])).unwrap();
    }

    #[test]
    fn dropping_a_step_keeps_earlier_records() {
        let mut t = TraceBuffer::default();
        t.append("e", 1, &[1, 2], at(&[2])).unwrap();
        t.append("e", 2, &[3, 4, 5], at(&[3])).unwrap();
        t.drop_step(2);
        assert_eq!(t.pieces().map(|(_, _, b)| b.to_vec()).collect::<Vec<_>>(), vec![vec![1, 2]]);
        t.clear();
        assert!(t.is_empty());
    }
}
