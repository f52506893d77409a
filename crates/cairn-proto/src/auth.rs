//! Authentication: the cluster secret and the challenge–response `hello`.
//!
//! On every connection the server speaks first with a fresh random nonce; the client answers
//! with HMAC-SHA256(secret, "cairn-hello\0" ‖ nonce) in hex. The secret never crosses the
//! network, and a captured `hello` is worthless on any other connection (another nonce). What
//! the secret protects, and what it does not, is in `docs/protocol.md` ("Threat model").

use cairn_core::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a nonce (sent as hex).
const NONCE_BYTES: usize = 16;
/// Bytes of a generated secret (written as 64 hex digits).
const SECRET_BYTES: usize = 32;

fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| Error::Unavailable(format!("the OS random source failed: {e}")))?;
    Ok(hex(&buf))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new cluster secret: 64 hex digits from the OS's random source.
pub fn new_secret() -> Result<String> {
    random_hex(SECRET_BYTES)
}

/// A new challenge nonce.
pub fn new_nonce() -> Result<String> {
    random_hex(NONCE_BYTES)
}

/// The answer to `nonce` that proves knowledge of `secret`.
pub fn answer(secret: &str, nonce: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(b"cairn-hello\0");
    mac.update(nonce.as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// The cluster's id: 16 hex digits derived from its secret (random, made at `cluster start`),
/// so every launcher's cluster has one and it tells nothing of the secret. Drained steps carry it
/// (a drain takes a step on disk for its own only when the ids match).
pub fn cluster_id(secret: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(b"cairn-cluster-id\0");
    hex(&mac.finalize().into_bytes()[..8])
}

/// Whether `given` answers `nonce` for `secret`, compared in time independent of where it differs.
pub fn verify(secret: &str, nonce: &str, given: &str) -> bool {
    let expected = answer(secret, nonce);
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_bind_secret_and_nonce() {
        let (s, n) = (new_secret().unwrap(), new_nonce().unwrap());
        assert_eq!(s.len(), 64);
        assert_ne!(n, new_nonce().unwrap(), "nonces are fresh");
        let a = answer(&s, &n);
        assert!(verify(&s, &n, &a));
        assert!(!verify(&s, &new_nonce().unwrap(), &a), "a replayed answer fails on another nonce");
        assert!(!verify("other", &n, &a));
        assert!(!verify(&s, &n, &a[..10]));
        assert!(!verify(&s, &n, ""));
    }

    #[test]
    fn answer_is_the_documented_hmac() {
        // HMAC-SHA256(key "k", "cairn-hello\0" + "n"), computed independently with Python's hmac module.
        assert_eq!(answer("k", "n"), "aef20eaaecafe9bb509cc353dbd1ad95bb656d0ce5ebba09fa0911e09ca07e41");
    }
}
