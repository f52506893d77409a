//! The one shape of the server's long-lived background work (the CoREC encoder, recovery,
//! failure detection, view pushes): a task that runs a round when woken, then looks again. A
//! wake that arrives while a round runs is kept (`Notify` stores it), so the next look sees what
//! it announced: no work is ever left behind until some later wake. The worker owns its task and
//! stops on the server's shutdown or when dropped.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinHandle;

/// What a round asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing left: sleep until woken.
    Idle,
    /// Run again at once (more work is queued).
    Again,
    /// Run again after this long, or sooner when woken.
    After(Duration),
}

/// A background task run in rounds (see the module comment).
#[derive(Debug, Default)]
pub struct Worker {
    wake: Arc<Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Worker {
    /// Starts the task unless it runs: `round` is called once at once, then whenever
    /// [`Worker::wake`] is called or the delay it asked for passes, until `shutdown` fires.
    /// Must be called within a tokio runtime.
    pub fn start<F, Fut>(&self, mut shutdown: broadcast::Receiver<()>, mut round: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Next> + Send,
    {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let wake = self.wake.clone();
        *task = Some(tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    n = round() => n,
                    _ = shutdown.recv() => return,
                };
                let sleep = async {
                    match next {
                        Next::Again => {}
                        Next::Idle => std::future::pending().await,
                        Next::After(d) => tokio::time::sleep(d).await,
                    }
                };
                tokio::select! {
                    () = sleep => {}
                    () = wake.notified() => {}
                    _ = shutdown.recv() => return,
                }
            }
        }));
    }

    /// Starts the task unless it runs (see [`Worker::start`]), then asks for a round: what a
    /// service does when it queues work.
    pub fn run<F, Fut>(&self, shutdown: broadcast::Receiver<()>, round: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Next> + Send,
    {
        self.start(shutdown, round);
        self.wake();
    }

    /// Asks for a round: at once when the worker sleeps, else right after the one running.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Whether the task was started and has not stopped.
    pub fn running(&self) -> bool {
        self.task.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(t) = self.task.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The lost wake-up of the encoder before this worker: work announced while a round finds
    /// nothing to do (a step committed while the encoder looks at an empty plan) must get a
    /// round of its own. The old encoder cleared its `running` flag after an empty plan without
    /// looking again; the same interleaving left this test's second item unprocessed.
    #[tokio::test(start_paused = true)]
    async fn work_announced_during_a_round_gets_a_round() {
        let worker = Arc::new(Worker::default());
        let queue = Arc::new(Mutex::new(Vec::<u32>::new()));
        let done = Arc::new(Mutex::new(Vec::<u32>::new()));
        let rounds = Arc::new(AtomicUsize::new(0));
        let (stop, _) = broadcast::channel(1);
        let (w, q, d, n) = (worker.clone(), queue.clone(), done.clone(), rounds.clone());
        worker.start(stop.subscribe(), move || {
            let (w, q, d, n) = (w.clone(), q.clone(), d.clone(), n.clone());
            async move {
                let plan: Vec<u32> = std::mem::take(&mut *q.lock().unwrap());
                if n.fetch_add(1, Ordering::SeqCst) == 1 {
                    // The second round finds its plan empty; just then a commit queues an item
                    // and wakes the worker, before this round reports that it is idle.
                    q.lock().unwrap().push(2);
                    w.wake();
                    tokio::task::yield_now().await;
                }
                d.lock().unwrap().extend(plan);
                Next::Idle
            }
        });
        let settle = || async {
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        };
        settle().await;
        // A wake with nothing queued: the second round's plan is empty.
        worker.wake();
        settle().await;
        assert_eq!(*done.lock().unwrap(), vec![2], "the item queued during an empty round waits for no later wake");
        assert_eq!(rounds.load(Ordering::SeqCst), 3);
        // Shutdown stops the task.
        stop.send(()).unwrap();
        settle().await;
        assert!(!worker.running());
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_asking_for_a_delay_runs_again_after_it() {
        let worker = Worker::default();
        let rounds = Arc::new(AtomicUsize::new(0));
        let (stop, _) = broadcast::channel(1);
        let n = rounds.clone();
        worker.start(stop.subscribe(), move || {
            let n = n.clone();
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                Next::After(Duration::from_secs(1))
            }
        });
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 4, "at 0, 1, 2 and 3 s");
    }
}
