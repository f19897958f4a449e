//! Sends to one topic in arrival order while one of them is deferred. A send waits before
//! its append when its shard must first learn the topic (ask shard 0 about a creation or
//! growth it missed, or create the topic through shard 0): it takes a place in the topic's
//! line on arrival, and so does every send naming a queue of that topic after it, until the
//! line is empty. Without the line, a send arriving after the topic is applied here and
//! before the deferred one resumes would be appended first, though sent after it.
//! A send that leaves the queue to the broker takes no place: it expects no order.

use std::rc::Rc;

use crate::broker::turns::{Turn, Turns};
use crate::broker::ShardCtx;

/// A place in a topic's line of sends, taken on arrival. Its turn ends when it is dropped
/// (appended, refused or cancelled); the line goes once no place is left.
pub(in crate::broker) struct SendPlace {
    turn: Option<Turn>,
    line: Rc<Turns>,
    ctx: Rc<ShardCtx>,
    topic: String,
}

impl ShardCtx {
    /// Whether a send naming a queue of `topic` must take a place in its line: a send to
    /// the topic is deferred.
    pub(in crate::broker) fn sends_in_line(&self, topic: &str) -> bool {
        let lines = self.send_lines.borrow();
        !lines.is_empty() && lines.contains_key(topic)
    }

    /// The next place in `topic`'s line (the line starts with it if there is none).
    pub(in crate::broker) fn send_place(self: &Rc<Self>, topic: &str) -> SendPlace {
        let line = self
            .send_lines
            .borrow_mut()
            .entry(topic.to_owned())
            .or_default()
            .clone();
        SendPlace {
            turn: Some(line.take()),
            line,
            ctx: self.clone(),
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
            let mut lines = self.ctx.send_lines.borrow_mut();
            if lines
                .get(&self.topic)
                .is_some_and(|l| Rc::ptr_eq(l, &self.line))
            {
                lines.remove(&self.topic);
            }
        }
    }
}
