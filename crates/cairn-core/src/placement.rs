//! Where objects live: the servers on a logical ring ordered by failure domain (rack, then node),
//! so that consecutive ring positions sit in different domains. An object's primary position comes
//! from a stable hash of its place in the data; replication and erasure-coding groups are drawn
//! from the positions after it, never two members in one failure domain while enough exist
//! ([`spread_group`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One staging server as the cluster file lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSpec {
    /// Server id, unique in the cluster.
    pub id: u32,
    /// Node (host) it runs on: a failure domain.
    #[serde(default)]
    pub node: String,
    /// Rack of that node: the wider failure domain.
    #[serde(default)]
    pub rack: String,
    /// Spare servers hold nothing until they replace a failed one.
    #[serde(default)]
    pub spare: bool,
}

/// The active servers in ring order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    order: Vec<u32>,
    /// (node, rack) of each server, by id.
    domains: BTreeMap<u32, (String, String)>,
}

impl Ring {
    /// Orders the non-spare servers so that neighbours differ in rack, then node, as far as the
    /// topology allows: racks take turns, and within a rack its nodes take turns.
    pub fn new(servers: &[ServerSpec]) -> Ring {
        let domains = servers.iter().filter(|s| !s.spare).map(|s| (s.id, (s.node.clone(), s.rack.clone()))).collect();
        let mut racks: BTreeMap<&str, BTreeMap<&str, Vec<u32>>> = BTreeMap::new();
        for s in servers.iter().filter(|s| !s.spare) {
            racks.entry(&s.rack).or_default().entry(&s.node).or_default().push(s.id);
        }
        // Each rack becomes a queue of servers in which its nodes alternate.
        let mut queues: Vec<std::collections::VecDeque<u32>> = racks
            .into_values()
            .map(|nodes| {
                let mut nodes: Vec<std::collections::VecDeque<u32>> = nodes
                    .into_values()
                    .map(|mut ids| {
                        ids.sort_unstable();
                        ids.into()
                    })
                    .collect();
                let mut q = std::collections::VecDeque::new();
                while nodes.iter().any(|n| !n.is_empty()) {
                    for n in nodes.iter_mut() {
                        q.extend(n.pop_front());
                    }
                }
                q
            })
            .collect();
        let mut order = Vec::new();
        while queues.iter().any(|q| !q.is_empty()) {
            for q in queues.iter_mut() {
                order.extend(q.pop_front());
            }
        }
        Ring { order, domains }
    }

    /// Number of active servers.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the ring has no servers.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Server ids in ring order.
    pub fn servers(&self) -> &[u32] {
        &self.order
    }

    /// The server at the ring position `key` hashes to.
    ///
    /// # Panics
    /// On an empty ring (a cluster always has at least one active server).
    pub fn place(&self, key: u64) -> u32 {
        self.order[(key % self.order.len() as u64) as usize]
    }

    /// A group of `n` servers from `key`'s ring position on (see [`spread_group`]).
    pub fn group(&self, key: u64, n: usize) -> (Vec<u32>, Spread) {
        let start = (key % self.order.len() as u64) as usize;
        spread_group(&self.order, |id| self.domains.get(&id).map_or(("", ""), |(n, r)| (n.as_str(), r.as_str())), start, n)
    }
}

/// The failure domain a group's members are all in different ones of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Spread {
    /// Only distinct servers: fewer nodes than members.
    Server,
    /// Distinct nodes (hosts).
    Node,
    /// Distinct racks.
    Rack,
}

/// A replica or stripe group of `n` servers (capped at the ring's size) taken from ring order
/// `order` starting at position `start`: the next servers whose rack no member has, when there
/// are at least `n` racks; else whose node no member has, when there are `n` nodes; else the next
/// distinct servers. `domain` gives a server's (node, rack). So no two members share the widest
/// failure domain the topology allows, and the group is a function of the start position only.
pub fn spread_group<'a>(order: &[u32], domain: impl Fn(u32) -> (&'a str, &'a str), start: usize, n: usize) -> (Vec<u32>, Spread) {
    let n = n.min(order.len());
    if n <= 1 {
        // One copy (the writer's hot path for variables without redundancy): no domains to count.
        return (order.get(start % order.len().max(1)).into_iter().take(n).copied().collect(), Spread::Rack);
    }
    let distinct = |f: &dyn Fn(u32) -> (&'a str, &'a str)| order.iter().map(|s| f(*s)).collect::<std::collections::BTreeSet<_>>().len();
    let racks = distinct(&|s| ("", domain(s).1));
    let nodes = distinct(&|s| domain(s));
    let spread = if racks >= n {
        Spread::Rack
    } else if nodes >= n {
        Spread::Node
    } else {
        Spread::Server
    };
    // A node is named within its rack: (node, rack) is the node's identity.
    let key = |s: u32| -> (&'a str, &'a str, u32) {
        let (node, rack) = domain(s);
        match spread {
            Spread::Rack => ("", rack, 0),
            Spread::Node => (node, rack, 0),
            Spread::Server => ("", "", s),
        }
    };
    let mut taken = std::collections::BTreeSet::new();
    let mut group = Vec::with_capacity(n);
    for i in 0..order.len() {
        if group.len() == n {
            break;
        }
        let s = order[(start + i) % order.len()];
        if taken.insert(key(s)) {
            group.push(s);
        }
    }
    (group, spread)
}

/// A hash of an object's place in the data that every process computes alike: FNV-1a over the
/// dataset, variable and block offset. (std's hasher is not promised stable across builds, and
/// clients and servers of different builds must agree.)
pub fn place_key(dataset: &str, var: &str, offset: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(dataset.as_bytes());
    eat(&[0]);
    eat(var.as_bytes());
    eat(&[0]);
    for o in offset {
        eat(&o.to_le_bytes());
    }
    // FNV's low bits barely change between neighbouring offsets; a final avalanche (murmur3's
    // fmix64) spreads them, since placement takes the hash modulo a small server count.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: u32, node: &str, rack: &str) -> ServerSpec {
        ServerSpec { id, node: node.into(), rack: rack.into(), spare: false }
    }

    #[test]
    fn neighbours_sit_in_different_racks_and_nodes() {
        let servers = vec![
            spec(0, "n0", "r0"),
            spec(1, "n0", "r0"),
            spec(2, "n1", "r0"),
            spec(3, "n2", "r1"),
            spec(4, "n2", "r1"),
            spec(5, "n3", "r1"),
        ];
        let ring = Ring::new(&servers);
        assert_eq!(ring.len(), 6);
        let rack = |id: u32| &servers[id as usize].rack;
        let o = ring.servers();
        for i in 0..o.len() {
            assert_ne!(rack(o[i]), rack(o[(i + 1) % o.len()]), "{o:?}");
        }
        // Groups of 2 never share a rack; of 3, a node (there are only two racks).
        for k in 0..6 {
            let (g, spread) = ring.group(k, 2);
            assert_eq!(spread, Spread::Rack);
            assert_ne!(rack(g[0]), rack(g[1]));
            let (g, spread) = ring.group(k, 3);
            assert_eq!(spread, Spread::Node);
            let nodes: std::collections::BTreeSet<_> = g.iter().map(|s| &servers[*s as usize].node).collect();
            assert_eq!(nodes.len(), 3, "{g:?}");
        }
    }

    #[test]
    fn spares_hold_nothing_and_keys_are_stable() {
        let mut s = vec![spec(0, "a", ""), spec(1, "a", ""), spec(2, "b", "")];
        s[2].spare = true;
        let ring = Ring::new(&s);
        assert_eq!(ring.servers(), &[0, 1]);
        assert_eq!(place_key("d", "v", &[1, 2]), place_key("d", "v", &[1, 2]));
        assert_ne!(place_key("d", "v", &[1, 2]), place_key("d", "v", &[2, 1]));
        assert_ne!(place_key("dv", "", &[]), place_key("d", "v", &[]));
        assert_eq!(ring.group(5, 9).0.len(), 2);
    }

    proptest::proptest! {
        /// Over random topologies, a group has `n` distinct servers, no two in one domain of the
        /// widest level that has `n` domains, and that level is the widest possible.
        #[test]
        fn groups_never_put_two_members_in_one_failure_domain(
            layout in proptest::collection::vec((0u8..4, 0u8..4), 1..24),
            n in 1usize..7,
            start in 0usize..64,
        ) {
            let servers: Vec<ServerSpec> = layout
                .iter()
                .enumerate()
                .map(|(i, (rack, node))| spec(i as u32, &format!("n{node}"), &format!("r{rack}")))
                .collect();
            let ring = Ring::new(&servers);
            let (g, spread) = ring.group(start as u64, n);
            let want = n.min(servers.len());
            let of = |s: u32| &servers[s as usize];
            proptest::prop_assert_eq!(g.len(), want);
            proptest::prop_assert_eq!(g.iter().collect::<std::collections::BTreeSet<_>>().len(), want);
            let racks = servers.iter().map(|s| &s.rack).collect::<std::collections::BTreeSet<_>>().len();
            let nodes = servers.iter().map(|s| (&s.rack, &s.node)).collect::<std::collections::BTreeSet<_>>().len();
            let distinct = |f: &dyn Fn(u32) -> String| g.iter().map(|s| f(*s)).collect::<std::collections::BTreeSet<_>>().len();
            match spread {
                Spread::Rack => proptest::prop_assert_eq!(distinct(&|s| of(s).rack.clone()), want),
                Spread::Node => {
                    proptest::prop_assert!(racks < want);
                    proptest::prop_assert_eq!(distinct(&|s| format!("{}/{}", of(s).rack, of(s).node)), want);
                }
                Spread::Server => proptest::prop_assert!(nodes < want),
            }
        }
    }

    #[test]
    fn neighbouring_blocks_spread_over_servers() {
        let ring = Ring::new(&(0..4).map(|i| spec(i, &format!("n{i}"), "")).collect::<Vec<_>>());
        let mut per = [0; 4];
        for x in 0..64u64 {
            per[ring.place(place_key("demo", "t", &[x * 32, 0, 0])) as usize] += 1;
        }
        assert!(per.iter().all(|&n| n >= 8), "{per:?}");
    }
}
