//! Writer sessions: every rank of one launch of an application passes the same session, and a
//! restart passes a new one, so fragments a crashed launch left behind never complete a step of
//! its restart. This module finds the session when the caller names none (docs/guide.md, Sessions).

use cairn_core::{Error, Result};
use std::hash::{BuildHasher, Hasher};

/// Environment variable that names the session of processes started without a launcher.
pub const SESSION_VAR: &str = "CAIRN_SESSION";

/// The session the environment names: `$CAIRN_SESSION`, else the launcher's (PMIx namespace,
/// Open MPI's HNP URI, the PMI KVS name, or Slurm's job and step), else none.
pub fn env_session() -> Option<String> {
    from_env(|k| std::env::var(k).ok())
}

/// The session of writer `rank` of `nranks` whose caller names none: [`env_session`], else for a
/// single writer a fresh random one. Several writers without one are refused: processes started
/// separately cannot agree on a random session, and a fixed default would let a crashed launch's
/// leftovers complete the steps of the next.
pub fn default_session(rank: u32, nranks: u32) -> Result<String> {
    resolve(env_session(), rank, nranks)
}

fn resolve(env: Option<String>, rank: u32, nranks: u32) -> Result<String> {
    match env {
        Some(s) => Ok(s),
        None if nranks <= 1 => Ok(random_session()),
        None => Err(Error::InvalidArgument(format!(
            "rank {rank} of {nranks} writers and no session: ranks started separately must share one; pass the same \
             session=\"...\" to every rank (Python), or an mpi4py comm=, or set ${SESSION_VAR}, or start them with \
             mpirun or srun; a restarted run needs a new session"
        ))),
    }
}

fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    let env = |k: &str| var(k).filter(|v| !v.is_empty());
    env(SESSION_VAR)
        .or_else(|| env("PMIX_NAMESPACE"))
        .or_else(|| env("OMPI_MCA_orte_hnp_uri"))
        .or_else(|| env("PMI_KVSNAME"))
        .or_else(|| Some(format!("slurm-{}.{}", env("SLURM_JOB_ID")?, env("SLURM_STEP_ID").unwrap_or_default())))
}

/// 128 random bits in hex. `RandomState` keys come from the operating system's generator; the
/// process id and the time keep two processes apart even if that generator were to repeat.
pub fn random_session() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(salt);
        h.write_u32(std::process::id());
        h.write_u128(now);
        h.finish()
    };
    format!("random-{:016x}{:016x}", half(0), half(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_environment_names_the_session_in_order() {
        assert_eq!(from_env(env_of(&[])), None);
        assert_eq!(from_env(env_of(&[("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "2")])).unwrap(), "slurm-7.2");
        assert_eq!(from_env(env_of(&[("SLURM_JOB_ID", "7"), ("PMIX_NAMESPACE", "ns")])).unwrap(), "ns");
        assert_eq!(from_env(env_of(&[("CAIRN_SESSION", "mine"), ("PMIX_NAMESPACE", "ns")])).unwrap(), "mine");
        assert_eq!(from_env(env_of(&[("CAIRN_SESSION", ""), ("PMI_KVSNAME", "kvs")])).unwrap(), "kvs");
    }

    #[test]
    fn without_one_a_single_writer_gets_a_fresh_session_and_several_are_refused() {
        let (a, b) = (resolve(None, 0, 1).unwrap(), resolve(None, 0, 1).unwrap());
        assert!(a != b && a.len() == "random-".len() + 32, "{a} {b}");
        let e = resolve(None, 1, 4).unwrap_err();
        assert_eq!(e.kind(), cairn_core::ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("rank 1 of 4") && e.to_string().contains("$CAIRN_SESSION"), "{e}");
        assert_eq!(resolve(Some("ns".into()), 1, 4).unwrap(), "ns");
    }
}
