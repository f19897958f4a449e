//! Waiting for the log: the readable and durable watermarks, and the waits an
//! acknowledgement takes on them (failing when a cut dropped the record or the log is
//! poisoned).

use super::*;

/// An offset that only grows, with tasks waiting for it to pass a target.
#[derive(Default)]
pub(super) struct Watermark {
    pub(super) value: Cell<u64>,
    pub(super) waiters: RefCell<Vec<(u64, Waker)>>,
}

impl Watermark {
    pub(super) fn advance(&self, v: u64) {
        debug_assert!(v >= self.value.get());
        self.value.set(v);
        let ready: Vec<Waker> = {
            let mut w = self.waiters.borrow_mut();
            let mut ready = Vec::new();
            w.retain(|(target, waker)| {
                if *target <= v {
                    ready.push(waker.clone());
                    false
                } else {
                    true
                }
            });
            ready
        };
        ready.into_iter().for_each(Waker::wake);
    }
    pub(super) fn wake_all(&self) {
        let all: Vec<_> = self.waiters.borrow_mut().drain(..).collect();
        all.into_iter().for_each(|(_, w)| w.wake());
    }
}

impl CommitLog {
    /// Waits until the log is readable up to `end` (async flush mode acknowledgement), for
    /// records appended at the current epoch or already readable.
    pub fn wait_readable(&self, end: u64) -> WaitFor<'_> {
        self.wait(end, self.epoch(), false)
    }

    /// Waits until an fdatasync covers everything below `end` (appended at the current
    /// epoch or already readable).
    pub fn wait_durable(&self, end: u64) -> WaitFor<'_> {
        self.wait(end, self.epoch(), true)
    }

    /// Waits as the flush mode says an append is acknowledged (appended at the current
    /// epoch).
    pub fn wait_acked(&self, end: u64) -> WaitFor<'_> {
        self.wait_acked_since(end, self.epoch())
    }

    /// Waits as the flush mode says an append is acknowledged: the record appended at
    /// `epoch` (see [`Appended::epoch`]) ending at `end`. Fails with `DiskFull` if a cut
    /// dropped it meanwhile.
    pub fn wait_acked_since(&self, end: u64, epoch: u64) -> WaitFor<'_> {
        self.wait(end, epoch, self.inner.cfg.flush == FlushMode::Sync)
    }

    /// Waits until an fdatasync covers the record appended at `epoch` ending at `end`.
    pub fn wait_durable_since(&self, end: u64, epoch: u64) -> WaitFor<'_> {
        self.wait(end, epoch, true)
    }

    fn wait(&self, end: u64, epoch: u64, durable: bool) -> WaitFor<'_> {
        WaitFor {
            inner: &self.inner,
            target: end,
            epoch,
            durable,
        }
    }
}

/// A wait for a watermark; fails if the log is poisoned meanwhile, or if a cut dropped the
/// record waited for.
pub struct WaitFor<'a> {
    inner: &'a Inner,
    target: u64,
    /// The epoch the record was appended at.
    epoch: u64,
    durable: bool,
}

/// Most cuts remembered; a wait for a record appended before the oldest of them fails
/// (`CutUnknown`: the record may be stored, a retry stores it twice, nothing is lost).
pub(super) const CUTS_KEPT: usize = 1024;

impl Future for WaitFor<'_> {
    type Output = Result<(), LogError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mark = if self.durable {
            &self.inner.durable
        } else {
            &self.inner.readable
        };
        {
            let st = self.inner.st.borrow();
            if st.epoch != self.epoch {
                // Cuts after the append: did one drop bytes below the target?
                let forgotten = st.cuts.front().is_some_and(|&(e, _)| e > self.epoch + 1);
                let cut = st
                    .cuts
                    .iter()
                    .any(|&(e, at)| e > self.epoch && at < self.target);
                if cut || forgotten {
                    let reason = (st.full.clone()).unwrap_or_else(|| {
                        "disk full (or no file descriptor left): the log was cut".into()
                    });
                    return Poll::Ready(Err(match cut {
                        true => LogError::DiskFull { reason },
                        false => LogError::CutUnknown { reason },
                    }));
                }
            }
        }
        if mark.value.get() >= self.target {
            return Poll::Ready(Ok(()));
        }
        if let Some(reason) = &self.inner.st.borrow().poisoned {
            return Poll::Ready(Err(LogError::Poisoned {
                reason: reason.clone(),
            }));
        }
        mark.waiters
            .borrow_mut()
            .push((self.target, cx.waker().clone()));
        Poll::Pending
    }
}
