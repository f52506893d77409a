//! A thread that calls a closure every period until stopped: what keeps a claimer's leases and
//! a streaming reader's registration alive while its process lives (and lets them lapse when it
//! dies or hangs).

use cairn_core::{Error, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A running heartbeat; stopped (and its thread joined) by [`Heartbeat::stop`] or on drop.
pub(crate) struct Heartbeat {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts thread `name` calling `beat` every `period` (at least a millisecond). A beat that
    /// fails is the caller's to ignore: the next one tries again.
    pub(crate) fn start(name: &str, period: Duration, mut beat: impl FnMut() + Send + 'static) -> Result<Heartbeat> {
        let period = period.max(Duration::from_millis(1));
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                let (stopped, wake) = &*flag;
                let stopped = stopped.lock().unwrap_or_else(|e| e.into_inner());
                let (stopped, _) = wake.wait_timeout_while(stopped, period, |s| !*s).unwrap_or_else(|e| e.into_inner());
                if *stopped {
                    return;
                }
                drop(stopped); // no lock held across the beat (a request with a deadline)
                beat();
            })
            .map_err(|e| Error::Unavailable(format!("cannot start the {name} heartbeat thread: {e}")))?;
        Ok(Heartbeat { stop, thread: Some(thread) })
    }

    /// Stops the beats and waits for a beat under way to end.
    pub(crate) fn stop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn beats_until_stopped_and_not_after() {
        let n = Arc::new(AtomicU32::new(0));
        let counted = n.clone();
        let mut h = Heartbeat::start("test", Duration::from_millis(5), move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let t0 = std::time::Instant::now();
        while n.load(Ordering::SeqCst) < 3 {
            assert!(t0.elapsed() < Duration::from_secs(10), "no beats");
            std::thread::yield_now();
        }
        h.stop();
        let at_stop = n.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(n.load(Ordering::SeqCst), at_stop, "a stopped heartbeat beats no more");
    }

    #[test]
    fn stop_does_not_wait_for_the_period() {
        let mut h = Heartbeat::start("test", Duration::from_secs(3600), || {}).unwrap();
        let t0 = std::time::Instant::now();
        h.stop();
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
