//! Membership: the cluster view every server and client places by. Ring *slots* (in failure-domain
//! order) map to server ids; a spare takes a slot by a view change; every change bumps the epoch.
//! Requests carry the sender's epoch and a server with a newer view answers `stale_epoch` with it.

use crate::cluster::{ClusterFile, ServerEntry};
use cairn_core::placement::{place_key, spread_group, Ring, Spread};
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
    /// Servers declared down (failed, hung or replaced); they hold nothing of this view. A down
    /// server still names its slot until a spare takes it: placement skips it meanwhile.
    #[serde(default)]
    pub down: Vec<u32>,
    /// Slot hand-overs `(lost server, the server that took its slot)`, oldest first: what a
    /// new control-plane leader still has to recover onto whom.
    #[serde(default)]
    pub took: Vec<(u32, u32)>,
    /// Servers leaving the cluster (`cairn cluster retire`, or a live server replaced by a
    /// spare): no slot, so nothing new is placed on them, but they still serve what they hold
    /// until recovery has moved it elsewhere; then they leave the view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retiring: Vec<u32>,
    /// Every server's entry (address, node, rack), active, spare, retiring or down.
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
            took: Vec::new(),
            retiring: Vec::new(),
            servers: file.servers.clone(),
        }
    }

    /// Checks a view that came from the network: slots, spares and down servers name listed
    /// servers, once each among slots and spares and once among down servers (a down server may
    /// still hold its slot, never be a spare).
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("cluster view of epoch {}: {why}", self.epoch)));
        if self.slots.is_empty() {
            return bad("it has no slots; a cluster needs at least one active server".into());
        }
        let known: BTreeSet<u32> = self.servers.iter().map(|s| s.spec.id).collect();
        if known.len() != self.servers.len() {
            return bad("a server is listed twice".into());
        }
        let (mut seen, mut down) = (BTreeSet::new(), BTreeSet::new());
        for id in self.slots.iter().chain(&self.spares).chain(&self.down).chain(&self.retiring) {
            if !known.contains(id) {
                return bad(format!("server {id} has a slot, is a spare or is down, but has no entry"));
            }
        }
        for id in self.slots.iter().chain(&self.spares).chain(&self.retiring) {
            if !seen.insert(*id) {
                return bad(format!("server {id} is listed twice among slots, spares and retiring servers"));
            }
        }
        for id in &self.down {
            if !down.insert(*id) || self.spares.contains(id) {
                return bad(format!("server {id} is listed twice among down servers, or is both down and a spare"));
            }
        }
        Ok(())
    }

    /// The server at the ring position `key` falls on (the next live one while its server is
    /// down).
    pub fn place(&self, key: u64) -> u32 {
        let start = (key % self.slots.len() as u64) as usize;
        (0..self.slots.len())
            .map(|i| self.slots[(start + i) % self.slots.len()])
            .find(|s| !self.down.contains(s))
            .unwrap_or(self.slots[start])
    }

    /// The servers holding the copies of keyed value `key` at the cluster's default `level`:
    /// its replica group of `level + 1` servers (at most the live ones). Clients place keys by
    /// it, and servers copy keys to the members a view change adds.
    pub fn key_group(&self, key: &str, level: u32) -> Vec<u32> {
        let n = (level as usize + 1).min(self.live().len());
        if n == 0 {
            return Vec::new();
        }
        self.group(place_key("", key, &[]), n).0
    }

    /// The replica or stripe group of `n` servers from the slot `key` falls on: no two members
    /// in one rack (or node, or server) while the topology has `n` of them. Down servers are
    /// passed over: a group with a down member takes the next live slot instead.
    pub fn group(&self, key: u64, n: usize) -> (Vec<u32>, Spread) {
        let start = (key % self.slots.len() as u64) as usize;
        let domain = |id: u32| self.server(id).map_or(("", ""), |e| (e.spec.node.as_str(), e.spec.rack.as_str()));
        if self.down.is_empty() {
            return spread_group(&self.slots, domain, start, n);
        }
        let order: Vec<u32> =
            (0..self.slots.len()).map(|i| self.slots[(start + i) % self.slots.len()]).filter(|s| !self.down.contains(s)).collect();
        spread_group(&order, domain, 0, n)
    }

    /// Servers holding a slot and not down, in ring order.
    pub fn live(&self) -> Vec<u32> {
        self.slots.iter().copied().filter(|s| !self.down.contains(s)).collect()
    }

    /// Whether server `id` holds a slot and is not down.
    pub fn is_live(&self, id: u32) -> bool {
        self.slots.contains(&id) && !self.down.contains(&id)
    }

    /// The server now holding the slot `id` held when it was last lost: the end of its chain of
    /// hand-overs (the spare that took its slot, then the spare that took that one's, ...).
    /// `id` itself when no server took its slot.
    pub fn heir(&self, id: u32) -> u32 {
        let Some(at) = self.took.iter().rposition(|(from, _)| *from == id) else { return id };
        self.took[at..].iter().fold(id, |cur, (from, to)| if *from == cur { *to } else { cur })
    }

    /// The next view, in which server `out` (holding a slot or a spare) is down. A down server
    /// keeps its slot until a spare takes it ([`ClusterView::replace`]).
    pub fn fail(&self, out: u32) -> Result<ClusterView> {
        if self.down.contains(&out) || !(self.slots.contains(&out) || self.spares.contains(&out)) {
            return Err(Error::InvalidArgument(format!("server {out} is not a live member in epoch {}", self.epoch)));
        }
        let mut next = self.clone();
        next.epoch += 1;
        next.spares.retain(|s| *s != out);
        next.down.push(out);
        Ok(next)
    }

    /// The next view, in which down server `id` (back, with nothing in memory) is a member
    /// again: it takes back its slot if no spare took it, else it becomes a spare.
    pub fn rejoin(&self, id: u32) -> Result<ClusterView> {
        if !self.down.contains(&id) {
            return Err(Error::InvalidArgument(format!("server {id} is not down in epoch {}", self.epoch)));
        }
        let mut next = self.clone();
        next.epoch += 1;
        next.down.retain(|s| *s != id);
        if !next.slots.contains(&id) {
            next.spares.push(id);
        }
        Ok(next)
    }

    /// The entry of server `id`.
    pub fn server(&self, id: u32) -> Result<&ServerEntry> {
        self.servers
            .iter()
            .find(|s| s.spec.id == id)
            .ok_or_else(|| Error::NotFound(format!("server {id} is not in the cluster view (epoch {})", self.epoch)))
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
        if !next.down.contains(&out) {
            next.down.push(out);
        }
        next.took.push((out, spare));
        Ok(next)
    }
}

/// Reconfiguration (`cairn cluster add / retire / replace`): each a view change, committed
/// through the control plane like the failure handling's.
impl ClusterView {
    /// The next view, in which the servers of `entries` (running, not yet members) take new
    /// ring slots after the existing ones: placement uses them from this view on, and nothing
    /// already stored moves (the index names each object's servers).
    pub fn add(&self, entries: Vec<ServerEntry>) -> Result<ClusterView> {
        let mut next = self.clone();
        next.epoch += 1;
        for e in entries {
            if self.servers.iter().any(|s| s.spec.id == e.spec.id) {
                return Err(Error::InvalidArgument(format!("server {} is already in the cluster (epoch {})", e.spec.id, self.epoch)));
            }
            next.slots.push(e.spec.id);
            next.servers.push(e);
        }
        next.validate()?;
        Ok(next)
    }

    /// The next view, in which live server `id` gives up its slot and retires: recovery moves
    /// its pieces to live servers (at their level), reading them from it, and
    /// [`ClusterView::retired`] then removes it.
    pub fn retire(&self, id: u32) -> Result<ClusterView> {
        if !self.is_live(id) {
            return Err(Error::InvalidArgument(format!("server {id} is not a live member in epoch {}; only those retire", self.epoch)));
        }
        if self.live().len() < 2 {
            return Err(Error::InvalidArgument(format!("server {id} is the last live server; add one before retiring it")));
        }
        let mut next = self.clone();
        next.epoch += 1;
        next.slots.retain(|s| *s != id);
        next.retiring.push(id);
        Ok(next)
    }

    /// The next view, in which spare `spare` takes the slot of live server `id`, which retires:
    /// its pieces are copied to the spare (from it, so even single copies move), then it leaves.
    pub fn hand_over(&self, id: u32, spare: u32) -> Result<ClusterView> {
        if !self.is_live(id) {
            return Err(Error::InvalidArgument(format!("server {id} is not a live member in epoch {}", self.epoch)));
        }
        let mut next = self.replace(id, spare)?;
        next.down.retain(|s| *s != id);
        next.retiring.push(id);
        Ok(next)
    }

    /// The next view, in which retiring server `id`, whose pieces have all moved, is no longer
    /// a member (its entry goes too: nobody is to send it anything).
    pub fn retired(&self, id: u32) -> Result<ClusterView> {
        if !self.retiring.contains(&id) {
            return Err(Error::InvalidArgument(format!("server {id} is not retiring in epoch {}", self.epoch)));
        }
        let mut next = self.clone();
        next.epoch += 1;
        next.retiring.retain(|s| *s != id);
        next.servers.retain(|s| s.spec.id != id);
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
                metrics: None,
            })
            .collect();
        ClusterFile { secret: "s".into(), servers, redundancy: Default::default(), drain: None }
    }

    #[test]
    fn servers_join_retire_and_hand_over_by_view_changes() {
        let v = ClusterView::initial(&file(2, 1));
        let mut new = file(6, 0).servers[5].clone();
        let a = v.add(vec![new.clone()]).unwrap();
        assert_eq!((a.slots.clone(), a.spares.clone(), a.epoch), (vec![0, 1, 5], vec![2], 2));
        new.spec.id = 2;
        assert!(v.add(vec![new]).is_err(), "already a member");
        let v = ClusterView::initial(&file(3, 1));
        let r = v.retire(1).unwrap();
        assert_eq!((r.slots.clone(), r.retiring.clone(), r.is_live(1)), (vec![0, 2], vec![1], false));
        assert!(r.validate().is_ok() && r.retire(1).is_err());
        let gone = r.retired(1).unwrap();
        assert!(gone.retiring.is_empty() && gone.server(1).is_err() && gone.validate().is_ok());
        let h = v.hand_over(2, 3).unwrap();
        assert_eq!((h.slots.clone(), h.retiring.clone(), h.down.clone(), h.heir(2)), (vec![0, 1, 3], vec![2], vec![], 3));
        assert!(h.validate().is_ok());
    }

    #[test]
    fn a_lost_slot_passes_down_its_chain_of_spares() {
        let v = ClusterView::initial(&file(3, 3));
        assert_eq!(v.heir(1), 1, "nobody took it");
        let v = v.fail(1).unwrap().replace(1, 3).unwrap();
        assert_eq!((v.heir(1), v.heir(0)), (3, 0));
        // The first spare dies before its slot is refilled: the next one inherits both.
        let v = v.fail(3).unwrap().replace(3, 4).unwrap();
        assert_eq!((v.heir(1), v.heir(3)), (4, 4));
        assert!(v.is_live(v.heir(1)));
        // Server 1 back as a spare, taking another lost slot, then lost again: what it held
        // last goes to the spare that took that slot.
        let v = v.rejoin(1).unwrap().fail(2).unwrap().replace(2, 1).unwrap();
        assert_eq!((v.heir(2), v.heir(1)), (1, 4));
        let v = v.fail(1).unwrap().replace(1, 5).unwrap();
        assert_eq!((v.heir(1), v.heir(2)), (5, 5));
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
        let mut v = ClusterView::initial(&file(2, 1));
        v.down.push(v.spares[0]);
        assert!(v.validate().is_err(), "a spare cannot be down");
        v.down = vec![v.slots[0], v.slots[0]];
        assert!(v.validate().is_err(), "down twice");
    }

    #[test]
    fn a_down_server_is_passed_over_then_replaced_or_rejoins() {
        let v = ClusterView::initial(&file(4, 1));
        let (g, _) = v.group(0, 2);
        let failed = v.fail(g[0]).unwrap();
        failed.validate().unwrap();
        assert_eq!((failed.epoch, failed.live().len(), failed.slots.len()), (2, 3, 4));
        let (h, _) = failed.group(0, 2);
        assert!(!h.contains(&g[0]) && h.len() == 2, "the group skips the down member: {g:?} -> {h:?}");
        assert!((0..64).all(|k| failed.place(k) != g[0]));
        assert!(failed.fail(g[0]).is_err(), "already down");
        // A spare takes the slot: the group is the first one with the spare in the member's place.
        let replaced = failed.replace(g[0], 4).unwrap();
        replaced.validate().unwrap();
        assert_eq!((replaced.down.clone(), replaced.group(0, 2).0), (vec![g[0]], vec![4, g[1]]));
        // Back with nothing in memory: a spare now (its slot is taken), or its slot again.
        let back = replaced.rejoin(g[0]).unwrap();
        back.validate().unwrap();
        assert_eq!((back.spares.clone(), back.down.len()), (vec![g[0]], 0));
        let again = failed.rejoin(g[0]).unwrap();
        assert_eq!((again.group(0, 2).0, again.spares.clone()), (g.clone(), vec![4]));
    }
}
