//! A first-come, first-served turnstile: work that awaits part-way and must still run one
//! piece at a time in the order the pieces arrived (topic changes shard 0 sends to the other
//! shards: a creation still opening its queues must not be overtaken by the deletion sent
//! after it; sends to a topic while one waits to learn it). A number is taken synchronously
//! on arrival; a lock taken inside each spawned task would order them by their first poll
//! instead. Each place is woken alone when its turn comes, so a long line costs one wake-up
//! per place.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Turns {
    /// The number the next arrival takes.
    next: Cell<u64>,
    /// The number whose turn it is.
    serving: Cell<u64>,
    /// Numbers dropped before their turn came: skipped when it does.
    abandoned: RefCell<BTreeSet<u64>>,
    /// The places not ended, each with what wakes it when its turn comes.
    places: RefCell<HashMap<u64, Rc<Notify>>>,
}

/// One place in the line; the turn ends when this is dropped (done, failed or cancelled).
pub(crate) struct Turn {
    turns: Rc<Turns>,
    number: u64,
    woken: Rc<Notify>,
}

impl Turns {
    /// Takes the next place in the line: the order of these calls is the order of turns.
    pub(crate) fn take(self: &Rc<Self>) -> Turn {
        let number = self.next.get();
        self.next.set(number + 1);
        let woken = Rc::new(Notify::new());
        self.places.borrow_mut().insert(number, woken.clone());
        Turn {
            turns: self.clone(),
            number,
            woken,
        }
    }

    /// Places taken and not ended.
    pub(crate) fn places(&self) -> usize {
        self.places.borrow().len()
    }

    /// Whether every place taken has had its turn and ended (a place abandoned before its
    /// turn ends when dropped, and is skipped).
    pub(crate) fn idle(&self) -> bool {
        self.places() == 0
    }

    /// Passes the turn on from `number`, past any places abandoned meanwhile.
    fn end(&self, number: u64) {
        let mut next = number + 1;
        {
            let mut abandoned = self.abandoned.borrow_mut();
            while abandoned.remove(&next) {
                next += 1;
            }
        }
        self.serving.set(next);
        // Kept if that place is not waiting yet (its wait sees `serving` and returns).
        if let Some(woken) = self.places.borrow().get(&next) {
            woken.notify_one();
        }
    }
}

impl Turn {
    /// Whether a place after this one has been taken.
    pub(crate) fn later_taken(&self) -> bool {
        self.turns.next.get() > self.number + 1
    }

    /// Waits until every earlier place's turn has ended.
    pub(crate) async fn wait(&self) {
        while self.turns.serving.get() != self.number {
            self.woken.notified().await;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.places.borrow_mut().remove(&self.number);
        if self.turns.serving.get() == self.number {
            self.turns.end(self.number);
        } else {
            self.turns.abandoned.borrow_mut().insert(self.number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_local(fut: impl std::future::Future<Output = ()>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, fut);
    }

    #[test]
    fn turns_run_in_the_order_taken_whatever_order_they_start_in() {
        run_local(async {
            let turns = Rc::new(Turns::default());
            let done = Rc::new(RefCell::new(Vec::new()));
            let taken: Vec<(usize, Turn)> = (0..4).map(|i| (i, turns.take())).collect();
            let mut tasks = Vec::new();
            // Started last to first; the first holds its turn across several awaits.
            for (i, turn) in taken.into_iter().rev() {
                let done = done.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    turn.wait().await;
                    done.borrow_mut().push((i, "start"));
                    for _ in 0..3 {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    done.borrow_mut().push((i, "end"));
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let expected: Vec<(usize, &str)> =
                (0..4).flat_map(|i| [(i, "start"), (i, "end")]).collect();
            assert_eq!(*done.borrow(), expected);
        });
    }

    #[test]
    fn a_place_dropped_before_its_turn_is_skipped() {
        run_local(async {
            let turns = Rc::new(Turns::default());
            let (first, second, third) = (turns.take(), turns.take(), turns.take());
            drop(second);
            let later = tokio::task::spawn_local(async move {
                third.wait().await;
            });
            first.wait().await;
            tokio::task::yield_now().await;
            assert!(!later.is_finished(), "the third waits for the first");
            assert!(!turns.idle());
            drop(first);
            tokio::time::timeout(std::time::Duration::from_secs(5), later)
                .await
                .expect("the third's turn comes once the first ends")
                .unwrap();
            // The third ended with its task: the line is idle, the skipped place included.
            assert!(turns.idle());
            // A place taken now has its turn at once.
            tokio::time::timeout(std::time::Duration::from_secs(5), turns.take().wait())
                .await
                .expect("nobody is ahead");
        });
    }

    #[test]
    fn a_wait_given_up_can_be_taken_up_again_and_a_place_dropped_while_waiting_is_skipped() {
        run_local(async {
            let turns = Rc::new(Turns::default());
            let (first, second, third) = (turns.take(), turns.take(), turns.take());
            let soon = std::time::Duration::from_millis(20);
            // The second's wait, given up before its turn: the place keeps its number.
            assert!(tokio::time::timeout(soon, second.wait()).await.is_err());
            // The third waits in a task, which is then dropped with its place.
            let third = tokio::task::spawn_local(async move { third.wait().await });
            tokio::task::yield_now().await;
            third.abort();
            assert!(third.await.unwrap_err().is_cancelled());
            // Waiting again, parked when the first ends.
            let second = tokio::task::spawn_local(async move {
                second.wait().await;
                second
            });
            tokio::task::yield_now().await;
            drop(first);
            let second = tokio::time::timeout(std::time::Duration::from_secs(5), second)
                .await
                .expect("the second's turn comes once the first ends")
                .unwrap();
            assert!(!turns.idle());
            drop(second);
            assert!(turns.idle(), "the dropped third is skipped");
            tokio::time::timeout(std::time::Duration::from_secs(5), turns.take().wait())
                .await
                .expect("nobody is ahead");
        });
    }
}
