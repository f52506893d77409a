//! Locks that outlive a panic.

use std::sync::{Mutex, MutexGuard};

/// Locks a std mutex whether or not a panicking thread poisoned it: server state is kept
/// consistent by validating before locking, so one failed request must not disable the rest.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
