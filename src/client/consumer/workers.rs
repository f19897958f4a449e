//! The threads that run a push consumer's (blocking) listeners: up to `consume_threads`
//! OS threads over one queue of calls, RocketMQ's consume thread pool.
//!
//! Why not tokio's `spawn_blocking`: with a cheap listener most calls find the blocking
//! pool's threads asleep, so every call costs a thread wake-up and a context switch, which
//! dominated a consumer's CPU time. Here the first thread that runs out of calls keeps
//! looking for a short while (`SPIN`, yielding the core meanwhile) before it sleeps (one
//! at a time, so idle threads do not burn the cores). A queued call wakes (or starts) a
//! thread only when it has no taker yet: more calls queued than threads looking or
//! already woken. A thread that takes a call checks the same before running it, so a
//! burst of calls fans out over the threads, and a call never waits behind a slow one
//! while a thread sleeps. Callers also learn the average call time
//! ([`Workers::calls_are_cheap`]) to put several cheap calls into one job.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a thread without work keeps looking before it sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// Listener calls shorter than this on average are run several to a job.
pub(super) const CHEAP_CALL: Duration = Duration::from_micros(50);

pub(super) type Job = Box<dyn FnOnce() + Send>;

pub(super) struct Workers {
    inner: Arc<Inner>,
}

struct Inner {
    /// Average time of a listener call, ns (0: none measured yet); a moving average over
    /// about the last 8 calls, updated without a lock (a lost update is harmless).
    call_ns: AtomicU64,
    state: Mutex<State>,
    work: Condvar,
    /// Calls queued (mirrors `state.jobs.len()`), read by looking threads without the lock.
    queued: AtomicUsize,
    threads_max: usize,
    name: String,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    threads: usize,
    /// Threads asleep on `work`.
    sleeping: usize,
    /// Threads looking for work without the lock.
    looking: usize,
    /// Wake-ups sent to sleeping threads and not yet taken up.
    waking: usize,
    closed: bool,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // Jobs run outside the lock and catch their panics: a poisoned lock still holds
        // a valid queue.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes sure the queued calls have takers: when there are more calls than threads
    /// looking or already woken, wakes a sleeping thread, or starts one. Called after a
    /// call is queued and after one is taken, so that a burst of calls fans out over the
    /// threads one wake-up at a time, and a call never waits behind a slow one while a
    /// thread sleeps.
    fn find_taker(inner: &Arc<Inner>, mut state: MutexGuard<'_, State>) {
        if state.jobs.len() <= state.looking + state.waking {
            return;
        }
        if state.sleeping > state.waking {
            state.waking += 1;
            drop(state);
            inner.work.notify_one();
        } else if state.threads < inner.threads_max {
            state.threads += 1;
            let name = format!("{}-{}", inner.name, state.threads);
            drop(state);
            let worker = inner.clone();
            let started = std::thread::Builder::new()
                .name(name)
                .spawn(move || worker_loop(&worker));
            if started.is_err() {
                let mut state = inner.state();
                state.threads -= 1;
                if state.threads == 0 {
                    // No thread at all: run what is queued right here rather than
                    // leave it (and the messages it holds) waiting for good.
                    let jobs: Vec<Job> = state.jobs.drain(..).collect();
                    inner.queued.store(0, Ordering::Release);
                    drop(state);
                    jobs.into_iter().for_each(|job| job());
                }
            }
        }
        // Otherwise every thread is busy: the first one free takes it.
    }
}

impl Workers {
    /// A pool of at most `threads_max` threads, started as calls need them.
    pub(super) fn new(threads_max: usize, name: &str) -> Workers {
        Workers {
            inner: Arc::new(Inner {
                call_ns: AtomicU64::new(0),
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                queued: AtomicUsize::new(0),
                threads_max: threads_max.max(1),
                name: name.to_owned(),
            }),
        }
    }

    /// Runs `f` on a pool thread. `None` when the pool was closed before `f` ran (it does
    /// not run then); `Some(Err)` when it panicked.
    pub(super) async fn run<R, F>(&self, f: F) -> Option<std::thread::Result<R>>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = Box::new(move || {
            let _ = tx.send(std::panic::catch_unwind(AssertUnwindSafe(f)));
        });
        if !self.submit(job) {
            return None;
        }
        rx.await.ok()
    }

    /// Queues `job` (which must catch its own panics); false, and `job` dropped unrun,
    /// when the pool is closed.
    pub(super) fn submit(&self, job: Job) -> bool {
        let inner = &self.inner;
        let mut state = inner.state();
        if state.closed {
            return false;
        }
        state.jobs.push_back(job);
        inner.queued.store(state.jobs.len(), Ordering::Release);
        Inner::find_taker(inner, state);
        true
    }

    /// Records how long a listener call took.
    pub(super) fn record_call(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let avg = self.inner.call_ns.load(Ordering::Relaxed);
        let next = if avg == 0 {
            took.max(1)
        } else {
            (avg - avg / 8).saturating_add(took / 8).max(1)
        };
        self.inner.call_ns.store(next, Ordering::Relaxed);
    }

    /// True once calls are known to take less than [`CHEAP_CALL`] on average: then
    /// several may share one job (a hand-off costs more than running them in a row).
    pub(super) fn calls_are_cheap(&self) -> bool {
        let avg = self.inner.call_ns.load(Ordering::Relaxed);
        avg != 0 && avg < CHEAP_CALL.as_nanos() as u64
    }

    /// Stops taking calls; queued calls are dropped (their callers see `None`), running
    /// ones finish, and the threads end.
    pub(super) fn close(&self) {
        let dropped: Vec<Job> = {
            let mut state = self.inner.state();
            state.closed = true;
            self.inner.queued.store(0, Ordering::Release);
            state.jobs.drain(..).collect()
        };
        drop(dropped);
        self.inner.work.notify_all();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.close();
    }
}

fn worker_loop(inner: &Arc<Inner>) {
    let mut state = inner.state();
    loop {
        if let Some(job) = state.jobs.pop_front() {
            inner.queued.store(state.jobs.len(), Ordering::Release);
            // Calls left behind get a taker before this one runs (it may be slow).
            Inner::find_taker(inner, state);
            job();
            state = inner.state();
            continue;
        }
        if state.closed {
            break;
        }
        // One thread at a time looks without the lock for a while; the others sleep.
        if state.looking == 0 {
            state.looking += 1;
            drop(state);
            let until = Instant::now() + SPIN;
            // Yielding, not spinning: on a busy machine the core goes to whoever needs it.
            while inner.queued.load(Ordering::Acquire) == 0 && Instant::now() < until {
                std::thread::yield_now();
            }
            state = inner.state();
            state.looking -= 1;
        }
        if state.jobs.is_empty() && !state.closed {
            state.sleeping += 1;
            state = inner
                .work
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.sleeping -= 1;
            // Taken up (a spurious wake-up may take another's: that one then finds the
            // queue as it is and acts on it, so no call is left without a taker).
            state.waking = state.waking.saturating_sub(1);
        }
    }
    state.threads -= 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn runs_every_call_and_reports_panics() {
        runtime().block_on(async {
            let workers = Arc::new(Workers::new(4, "test-worker"));
            let sum = Arc::new(AtomicU64::new(0));
            let mut calls = Vec::new();
            for i in 0..1000u64 {
                let (workers, sum) = (workers.clone(), sum.clone());
                calls.push(tokio::spawn(async move {
                    workers
                        .run(move || sum.fetch_add(i, Ordering::Relaxed))
                        .await
                }));
            }
            for call in calls {
                assert!(matches!(call.await.unwrap(), Some(Ok(_))));
            }
            assert_eq!(sum.load(Ordering::Relaxed), 999 * 1000 / 2);
            let panicked = workers.run(|| -> u32 { panic!("listener bug") }).await;
            assert!(matches!(panicked, Some(Err(_))));
            // The pool still works after a panic.
            assert_eq!(workers.run(|| 7).await.map(Result::unwrap), Some(7));
            let threads = workers.inner.state().threads;
            assert!((1..=4).contains(&threads), "{threads} threads");
        });
    }

    #[test]
    fn slow_calls_run_in_parallel_up_to_the_limit() {
        runtime().block_on(async {
            let workers = Arc::new(Workers::new(4, "test-worker"));
            let started = Instant::now();
            let mut calls = Vec::new();
            for _ in 0..4 {
                let workers = workers.clone();
                calls.push(tokio::spawn(async move {
                    workers
                        .run(|| std::thread::sleep(Duration::from_millis(300)))
                        .await
                }));
            }
            for call in calls {
                assert!(matches!(call.await.unwrap(), Some(Ok(()))));
            }
            // One after another would take 1.2 s.
            let took = started.elapsed();
            assert!(took < Duration::from_millis(900), "took {took:?}");
            assert_eq!(workers.inner.state().threads, 4);
        });
    }

    #[test]
    fn calls_queued_together_get_threads_of_their_own() {
        runtime().block_on(async {
            let workers = Arc::new(Workers::new(4, "test-worker"));
            for _ in 0..50 {
                // A thread is around (looking for work) when both calls arrive; the
                // first waits for the second, so they must run on two threads.
                assert!(workers.run(|| ()).await.is_some());
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let waiter = workers.run(move || rx.recv_timeout(Duration::from_secs(10)));
                let sender = workers.run(move || tx.send(()));
                let (waited, sent) = tokio::join!(waiter, sender);
                assert!(
                    matches!(waited, Some(Ok(Ok(())))),
                    "the first call was released"
                );
                assert!(matches!(sent, Some(Ok(Ok(())))));
            }
        });
    }

    #[test]
    fn average_call_time_decides_whether_calls_are_cheap() {
        let workers = Workers::new(1, "test-worker");
        assert!(!workers.calls_are_cheap(), "unknown until measured");
        for _ in 0..20 {
            workers.record_call(Duration::from_micros(2));
        }
        assert!(workers.calls_are_cheap());
        for _ in 0..40 {
            workers.record_call(Duration::from_millis(5));
        }
        assert!(!workers.calls_are_cheap());
    }

    #[test]
    fn a_closed_pool_runs_nothing_more() {
        runtime().block_on(async {
            let workers = Workers::new(1, "test-worker");
            assert!(workers.run(|| ()).await.is_some());
            workers.close();
            let ran = Arc::new(AtomicU64::new(0));
            let r = ran.clone();
            assert!(workers
                .run(move || r.fetch_add(1, Ordering::Relaxed))
                .await
                .is_none());
            assert_eq!(ran.load(Ordering::Relaxed), 0);
        });
    }
}
