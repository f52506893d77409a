//! Membership: the cluster view every server and client places by. Ring *slots* (in failure-domain
//! order) map to server ids; a spare takes a slot by a view change; every change bumps the epoch.
//! Requests carry the sender's epoch and a server with a newer view answers `stale_epoch` with it.

use crate::cluster::{ClusterFile, ServerEntry};
use cairn_core::placement::{spread_group, Ring, Spread};
use cairn_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Who is in the cluster and where each ring position points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// Bumped at every change; 1 for the view a cluster file starts with.
    pub epoch: u64,
    /// Server id at each ring position (placement takes keys modulo the number of slots).
    pub slots: Vec<u32>,
    /// Servers that hold nothing until they take a slot.
    pub spares: Vec<u32>,
    /// Servers that left their slot (failed or replaced); they hold nothing of this view.
    #[serde(default)]
    pub down: Vec<u32>,
    /// Every server's entry (address, node, rack), active, spare or down.
    pub servers: Vec<ServerEntry>,
}

impl ClusterView {
    /// The first view of a cluster: its active servers in failure-domain ring order.
    pub fn initial(file: &ClusterFile) -> ClusterView {
        let ring = Ring::new(&file.servers.iter().map(|s| s.spec.clone()).collect::<Vec<_>>());
        ClusterView {
            epoch: 1,
            slots: ring.servers().to_vec(),
            spares: file.servers.iter().filter(|s| s.spec.spare).map(|s| s.spec.id).collect(),
            down: Vec::new(),
            servers: file.servers.clone(),
        }
    }

    /// Checks a view that came from the network: slots, spares and down servers name listed
    /// servers, once each.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("cluster view of epoch {}: {why}", self.epoch)));
        if self.slots.is_empty() {
            return bad("it has no slots; a cluster needs at least one active server".into());
        }
        let known: BTreeSet<u32> = self.servers.iter().map(|s| s.spec.id).collect();
        if known.len() != self.servers.len() {
            return bad("a server is listed twice".into());
        }
        let mut seen = BTreeSet::new();
        for id in self.slots.iter().chain(&self.spares).chain(&self.down) {
            if !known.contains(id) {
                return bad(format!("server {id} has a slot, is a spare or is down, but has no entry"));
            }
            if !seen.insert(*id) {
                return bad(format!("server {id} is listed twice among slots, spares and down servers"));
            }
        }
        Ok(())
    }

    /// The server at the ring position `key` falls on.
    pub fn place(&self, key: u64) -> u32 {
        self.slots[(key % self.slots.len() as u64) as usize]
    }

    /// The replica or stripe group of `n` servers from the slot `key` falls on: no two members
    /// in one rack (or node, or server) while the topology has `n` of them.
    pub fn group(&self, key: u64, n: usize) -> (Vec<u32>, Spread) {
        let start = (key % self.slots.len() as u64) as usize;
        let domain = |id: u32| self.server(id).map_or(("", ""), |e| (e.spec.node.as_str(), e.spec.rack.as_str()));
        spread_group(&self.slots, domain, start, n)
    }

    /// The entry of server `id`.
    pub fn server(&self, id: u32) -> Result<&ServerEntry> {
        self.servers
            .iter()
            .find(|s| s.spec.id == id)
            .ok_or_else(|| Error::NotFound(format!("server {id} is not in the cluster view (epoch {})", self.epoch)))
    }

    /// Active servers (those holding a slot), in ring order.
    pub fn active(&self) -> &[u32] {
        &self.slots
    }

    /// The next view, in which spare `spare` takes the slot(s) of server `out`, which is down.
    pub fn replace(&self, out: u32, spare: u32) -> Result<ClusterView> {
        if !self.spares.contains(&spare) {
            return Err(Error::InvalidArgument(format!(
                "server {spare} is not a spare in epoch {}; spares: {:?}",
                self.epoch, self.spares
            )));
        }
        if !self.slots.contains(&out) {
            return Err(Error::InvalidArgument(format!("server {out} holds no slot in epoch {}", self.epoch)));
        }
        let mut next = self.clone();
        next.epoch += 1;
        next.slots.iter_mut().filter(|s| **s == out).for_each(|s| *s = spare);
        next.spares.retain(|s| *s != spare);
        next.down.push(out);
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::placement::ServerSpec;

    fn file(active: u32, spares: u32) -> ClusterFile {
        let servers = (0..active + spares)
            .map(|id| ServerEntry {
                spec: ServerSpec { id, node: format!("n{}", id / 2), rack: format!("r{}", id % 2), spare: id >= active },
                addr: format!("127.0.0.1:{}", 4000 + id),
                unix: None,
                host: "h".into(),
                pid: 0,
                memory: 1,
            })
            .collect();
        ClusterFile { secret: "s".into(), servers, redundancy: Default::default() }
    }

    #[test]
    fn a_spare_takes_a_slot_and_placement_moves_only_there() {
        let v = ClusterView::initial(&file(4, 1));
        v.validate().unwrap();
        assert_eq!((v.epoch, v.spares.clone()), (1, vec![4]));
        let before: Vec<u32> = (0..64).map(|k| v.place(k)).collect();
        let next = v.replace(2, 4).unwrap();
        next.validate().unwrap();
        assert_eq!((next.epoch, next.down.clone()), (2, vec![2]));
        for (k, b) in before.iter().enumerate() {
            let now = next.place(k as u64);
            assert_eq!(now, if *b == 2 { 4 } else { *b }, "only server 2's positions move, to the spare");
        }
        assert!(next.replace(1, 4).is_err(), "the spare is used up");
        assert!(v.replace(9, 4).is_err());
    }

    #[test]
    fn groups_follow_the_slots_through_a_replacement() {
        let v = ClusterView::initial(&file(4, 1));
        let (g, spread) = v.group(0, 2);
        assert_eq!((g.len(), spread), (2, Spread::Rack));
        let next = v.replace(g[0], 4).unwrap();
        let (h, _) = next.group(0, 2);
        assert_eq!(h[0], 4, "the spare takes the member's place: {g:?} -> {h:?}");
    }

    #[test]
    fn malformed_views_are_refused() {
        let mut v = ClusterView::initial(&file(2, 0));
        v.slots.push(v.slots[0]);
        assert!(v.validate().is_err());
        v.slots = vec![];
        assert!(v.validate().is_err());
        v.slots = vec![7];
        assert!(v.validate().unwrap_err().to_string().contains("server 7"));
        let mut v = ClusterView::initial(&file(2, 0));
        v.down.push(v.slots[0]);
        assert!(v.validate().is_err(), "a server with a slot cannot be down");
    }
}
