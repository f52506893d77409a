//! Keyed values and sets on a staging cluster: the store `cairn.tasks` keeps task inputs,
//! results, step markers and memo buckets in. A key lives on the server its hash places it on;
//! many keys go as one request per server (puts in batches of bounded size).

use super::conn::Cluster;
use crate::config::Transport;
use cairn_core::{Error, Result};
use cairn_proto::batch::{kv_batches, KV_BATCH_BYTES};
use cairn_proto::message::{unexpected, Request, Response, MAX_KEYS};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Keys per request (keeps its JSON header well under the frame limit).
const BATCH_KEYS: usize = MAX_KEYS;

/// A client of a cluster's keyed values.
#[derive(Debug, Clone)]
pub struct KvStore {
    cluster: Arc<Cluster>,
}

impl KvStore {
    /// Connects (lazily) to the cluster in the cluster file `path`; every call has `timeout`
    /// to make progress.
    pub fn open(path: &Path, timeout: std::time::Duration) -> Result<KvStore> {
        Ok(KvStore { cluster: Cluster::open(path, timeout, Transport::Auto)? })
    }

    /// Indices of `keys` grouped by the server holding them in the current view.
    /// Copies each key has: the cluster's default level + 1 (at most the active servers).
    fn copies(&self) -> usize {
        (self.cluster.policy().redundancy as usize + 1).min(self.cluster.view().live().len())
    }

    /// The keys `idx` of `keys` grouped by the server holding their copy number `copy` (copies
    /// go to a replica group in different failure domains, like objects).
    fn by_server(&self, keys: &[&str], idx: &[usize], copy: usize) -> BTreeMap<u32, Vec<usize>> {
        let view = self.cluster.view();
        let level = self.cluster.policy().redundancy;
        let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &i in idx {
            let group = view.key_group(keys[i], level);
            groups.entry(group[copy.min(group.len() - 1)]).or_default().push(i);
        }
        groups
    }

    fn send(&self, server: u32, req: &Request, payload: &[&[u8]]) -> Result<Response> {
        let resp = self.cluster.with(server, |c| {
            c.send(req, payload)?;
            Ok(c.recv(0, "kv_put")?.0)
        })?;
        self.cluster.settle(resp)
    }

    /// Sets each key to its value or, with `member`, adds each value to the set at its key.
    pub fn put_many(&self, items: &[(&str, &[u8])], member: bool) -> Result<()> {
        let keys: Vec<&str> = items.iter().map(|(k, _)| *k).collect();
        let all: Vec<usize> = (0..items.len()).collect();
        for (server, idx) in self.by_server(&keys, &all, 0) {
            // The server refuses a frame larger than its memory as malformed and hangs up: say why
            // here, and keep batches within it.
            let limit = self.cluster.memory(server)?;
            if let Some(&i) = idx.iter().find(|&&i| items[i].1.len() as u64 > limit) {
                return Err(Error::Capacity(format!(
                    "value of {} bytes for key '{}' exceeds the {limit}-byte memory of staging server {server}; \
                     store it in pieces or start servers with more --memory",
                    items[i].1.len(),
                    items[i].0
                )));
            }
            // Each batch goes to every copy before the next: a batch that fails anywhere is
            // deleted from every copy (values are replicated whole or not at all).
            for batch in kv_batches(&idx, limit.min(KV_BATCH_BYTES), |&i| items[i].1.len() as u64, |_, _| false) {
                let put = || -> Result<()> {
                    for copy in 0..self.copies() {
                        for (to, part) in self.by_server(&keys, batch, copy) {
                            let req = Request::KvPut {
                                keys: part.iter().map(|&i| items[i].0.to_string()).collect(),
                                sizes: part.iter().map(|&i| items[i].1.len() as u64).collect(),
                                member,
                            };
                            let vals: Vec<&[u8]> = part.iter().map(|&i| items[i].1).collect();
                            self.send(to, &req, &vals)?;
                        }
                    }
                    Ok(())
                };
                if let Err(e) = put() {
                    if !member {
                        let gone: Vec<&str> = batch.iter().map(|&i| keys[i]).collect();
                        let _ = self.delete(&gone, false);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The value of each key (`None` if absent) or, with `members`, every member of each set
    /// (absent: empty). Values come as `Vec<Vec<u8>>` per key: zero or one entries for values.
    pub fn get_many(&self, keys: &[&str], members: bool) -> Result<Vec<Vec<Vec<u8>>>> {
        let mut out = vec![Vec::new(); keys.len()];
        let mut todo: Vec<usize> = (0..keys.len()).collect();
        let copies = self.copies();
        for copy in 0..copies {
            let mut next = Vec::new();
            for (server, idx) in self.by_server(keys, &todo, copy) {
                match self.get_from(server, keys, &idx, members, &mut out) {
                    // A failed server's keys are read from their next copy.
                    Err(e) if e.kind() == cairn_core::ErrorKind::Unavailable && copy + 1 < copies => next.extend(idx),
                    // So are keys it lacks: a server a view change just put in the key's group
                    // gets its copy from the holders a moment later (see the server's `rehome`).
                    Ok(()) if copy + 1 < copies => next.extend(idx.into_iter().filter(|&i| out[i].is_empty())),
                    r => r?,
                }
            }
            todo = next;
            if todo.is_empty() {
                break;
            }
        }
        Ok(out)
    }

    /// Reads keys `all` of `keys` from `server` into `out`.
    fn get_from(&self, server: u32, keys: &[&str], all: &[usize], members: bool, out: &mut [Vec<Vec<u8>>]) -> Result<()> {
        {
            let limit = self.cluster.memory(server)?;
            for idx in all.chunks(BATCH_KEYS) {
                let req = Request::KvGet { keys: idx.iter().map(|&i| keys[i].to_string()).collect(), members };
                let (sizes, bytes) = self.cluster.with(server, |c| {
                    c.send(&req, &[])?;
                    let (resp, len) = c.recv(limit, "kv_get")?;
                    let Response::Values { sizes } = self.cluster.settle(resp)? else {
                        return Err(Error::Corrupt("unexpected reply to kv_get; are client and server the same Cairn version?".into()));
                    };
                    let mut bytes = vec![0u8; len as usize];
                    c.read_payload(&mut [&mut bytes], "kv_get")?;
                    Ok((sizes, bytes))
                })?;
                let total: u64 = sizes.iter().flatten().sum();
                if sizes.len() != idx.len() || total != bytes.len() as u64 {
                    return Err(Error::Corrupt(format!("server {server} answered kv_get with sizes that do not match its payload")));
                }
                let mut at = 0usize;
                for (&i, lens) in idx.iter().zip(sizes) {
                    out[i] = lens
                        .iter()
                        .map(|&n| {
                            let v = bytes[at..at + n as usize].to_vec();
                            at += n as usize;
                            v
                        })
                        .collect();
                }
            }
        }
        Ok(())
    }

    /// Compare-and-set through the control plane (replicated by Raft, answered by its leader):
    /// sets `key` to `value` (or deletes it, with `None`) if its version is `expect` (`None`: the
    /// key must not exist). Returns whether it took and the key's version now (0: absent). For
    /// claims, leases and markers; values are at most 64 KiB.
    pub fn cas(&self, key: &str, expect: Option<u64>, value: Option<&[u8]>) -> Result<(bool, u64)> {
        // One id for every try of this call: a retry after a lost reply is not decided twice.
        let call = Some(cairn_proto::auth::new_nonce()?);
        let req = Request::MetaCas { key: key.to_string(), expect, delete: value.is_none(), call };
        match self.cluster.leader_call(&req, &[value.unwrap_or_default()], 0)?.0 {
            Response::Cas { ok, version } => Ok((ok, version)),
            other => Err(unexpected("meta_cas", &other)),
        }
    }

    /// A compare-and-set value and its version, read at the control plane's leader.
    pub fn cas_get(&self, key: &str) -> Result<Option<(u64, Vec<u8>)>> {
        let req = Request::MetaGet { key: key.to_string() };
        match self.cluster.leader_call(&req, &[], cairn_proto::message::MAX_CAS_VALUE)? {
            (Response::Cas { ok: true, version }, value) => Ok(Some((version, value))),
            (Response::Cas { ok: false, .. }, _) => Ok(None),
            (other, _) => Err(unexpected("meta_get", &other)),
        }
    }

    /// Deletes `keys` or, with `prefix`, every key starting with one of them (asking every
    /// server); returns how many.
    pub fn delete(&self, keys: &[&str], prefix: bool) -> Result<u64> {
        let all: Vec<usize> = (0..keys.len()).collect();
        // Per copy, the keys it deleted; a server that is gone has lost its copies anyway.
        let mut n = 0;
        let copies = if prefix { 1 } else { self.copies() };
        for copy in 0..copies {
            let groups: Vec<(u32, Vec<usize>)> = if prefix {
                self.cluster.view().live().into_iter().map(|s| (s, all.clone())).collect()
            } else {
                self.by_server(keys, &all, copy).into_iter().collect()
            };
            let mut here = 0;
            for (server, idx) in groups {
                let req = Request::KvDelete { keys: idx.iter().map(|&i| keys[i].to_string()).collect(), prefix };
                match self.cluster.call(server, &req) {
                    Ok(Response::Deleted { count }) => here += count,
                    Ok(other) => return Err(unexpected("kv_delete", &other)),
                    Err(e) if e.kind() == cairn_core::ErrorKind::Unavailable && copies > 1 => {}
                    Err(e) => return Err(e),
                }
            }
            n = n.max(here);
        }
        // A prefix delete asks every server: each key counted once per copy.
        Ok(if prefix { n / self.copies() as u64 } else { n })
    }
}
