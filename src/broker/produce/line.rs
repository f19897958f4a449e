//! Sends to one topic in arrival order while one of them is deferred. A send waits before
//! its append when its shard must first learn the topic or one of its queues (ask shard 0
//! about a creation or growth it missed, or create the topic through shard 0). It takes a
//! place in the topic's line on arrival, and so does every send naming a queue of that
//! topic after it, until the line is empty; each appends in its turn. Without the line, a
//! send arriving after the topic is applied here and before the deferred one resumes would
//! be appended first, though sent after it. A send that leaves the queue to the broker
//! takes no place: it expects no order.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::broker::turns::{Turn, Turns};

/// The lines of one shard, by topic: only topics with a place not yet ended.
#[derive(Default)]
pub(in crate::broker) struct SendLines {
    lines: RefCell<HashMap<String, Rc<Turns>>>,
}

/// A place in a topic's line of sends, taken on arrival. Its turn ends when it is dropped
/// (appended, refused or cancelled); the line goes once no place is left.
pub(in crate::broker) struct SendPlace {
    turn: Option<Turn>,
    line: Rc<Turns>,
    lines: Rc<SendLines>,
    topic: String,
}

impl SendLines {
    /// Whether a send naming a queue of `topic` must take a place in its line: a send to
    /// the topic arrived before it and has not been appended or refused yet.
    pub(in crate::broker) fn has(&self, topic: &str) -> bool {
        let lines = self.lines.borrow();
        !lines.is_empty() && lines.contains_key(topic)
    }

    /// Sends in a line, over all topics: deferred, or behind one that is.
    pub(in crate::broker) fn places(&self) -> usize {
        self.lines.borrow().values().map(|l| l.places()).sum()
    }

    /// The next place in `topic`'s line (the line starts with it if there is none).
    pub(in crate::broker) fn place(self: &Rc<Self>, topic: &str) -> SendPlace {
        let line = self
            .lines
            .borrow_mut()
            .entry(topic.to_owned())
            .or_default()
            .clone();
        SendPlace {
            turn: Some(line.take()),
            line,
            lines: self.clone(),
            topic: topic.to_owned(),
        }
    }
}

impl SendPlace {
    /// Waits until every send that arrived before this one is appended or refused.
    pub(in crate::broker) async fn wait(&self) {
        if let Some(turn) = &self.turn {
            turn.wait().await;
        }
    }
}

impl Drop for SendPlace {
    fn drop(&mut self) {
        drop(self.turn.take());
        if self.line.idle() {
            let mut lines = self.lines.lines.borrow_mut();
            if lines
                .get(&self.topic)
                .is_some_and(|l| Rc::ptr_eq(l, &self.line))
            {
                lines.remove(&self.topic);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_goes_once_its_last_place_ends_in_whatever_order() {
        let lines = Rc::new(SendLines::default());
        assert!(!lines.has("t"));
        let (first, second, third) = (lines.place("t"), lines.place("t"), lines.place("t"));
        let other = lines.place("u");
        assert!(lines.has("t") && lines.has("u"));
        assert_eq!(lines.places(), 4);
        drop(second);
        drop(first);
        assert!(lines.has("t"), "the third has not ended");
        drop(third);
        assert!(!lines.has("t"));
        assert!(lines.has("u"));
        drop(other);
        assert!(lines.lines.borrow().is_empty());
        assert_eq!(lines.places(), 0);
        // A new line starts with its first place's turn.
        let again = lines.place("t");
        assert!(!again.line.idle() && lines.has("t"));
    }

    #[test]
    fn places_append_in_the_order_taken() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, async {
            let lines = Rc::new(SendLines::default());
            let appended = Rc::new(RefCell::new(Vec::new()));
            let places: Vec<SendPlace> = (0..100).map(|_| lines.place("t")).collect();
            let mut tasks = Vec::new();
            // Started last to first.
            for (i, place) in places.into_iter().enumerate().rev() {
                let appended = appended.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    place.wait().await;
                    appended.borrow_mut().push(i);
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(*appended.borrow(), (0..100).collect::<Vec<_>>());
            assert!(!lines.has("t"));
        });
    }
}
