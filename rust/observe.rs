//! What the ledger tells its operator about its own work: contention it waited out, a session
//! it had to reconnect, a schema it migrated, and (while metrics are on) the size of each
//! committed group.
//!
//! These happen on whichever thread meets them (a writer's lead, a reconnecting store), often
//! with the GIL released and sometimes with no Python caller at all, so they are queued here
//! and handed to Python by the next call that returns there (`py::observe`), which logs them
//! through the `fencepost` logger and counts them. The queue is process-wide and bounded: an
//! application that never calls the ledger again loses nothing it needs, and one whose
//! handler is slow cannot make the writers wait on it. Fencing (takeovers, refused writes) is
//! reported where its result reaches the caller instead, since only a committed claim and a
//! returned refusal are facts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// One thing worth telling the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Contended writes tried again `count` times (consecutive retries are merged into one
    /// notice, so a busy spell costs one report, not one per try), the longest having waited
    /// `waited_ms` since its first try.
    BusyRetries { count: u64, waited_ms: u64 },
    /// A PostgreSQL session was found dead and a new one opened.
    Reconnected { reason: String },
    /// The schema moved forward from version `from` (0: a new ledger) to `to`.
    Migrated { from: i64, to: i64 },
    /// A group of `size` calls committed as one transaction (queued only while
    /// [`set_groups`] is on: it is one notice per commit).
    Group { size: u64 },
    /// A failed attempt used up its unit's retry policy (held until its transaction commits).
    Exhausted {
        run_id: String,
        unit_id: String,
        attempts: i64,
    },
}

/// The most notices kept before the oldest are dropped (counted in [`dropped`]).
pub const CAPACITY: usize = 4096;

/// A bounded queue of notices: the oldest go first when it is full.
#[derive(Debug)]
struct Queue {
    notices: VecDeque<Notice>,
    capacity: usize,
    dropped: u64,
}

impl Queue {
    const fn new(capacity: usize) -> Self {
        Self {
            notices: VecDeque::new(),
            capacity,
            dropped: 0,
        }
    }

    fn push(&mut self, notice: Notice) {
        if self.notices.len() >= self.capacity {
            self.notices.pop_front();
            self.dropped += 1;
        }
        self.notices.push_back(notice);
    }

    fn take(&mut self) -> Vec<Notice> {
        self.notices.drain(..).collect()
    }
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue::new(CAPACITY));
/// Set while the queue holds something: the check every call makes costs one load.
static PENDING: AtomicBool = AtomicBool::new(false);
static GROUPS: AtomicBool = AtomicBool::new(false);

fn queue() -> MutexGuard<'static, Queue> {
    QUEUE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Queue `notice` for the next call that returns to Python.
pub fn push(notice: Notice) {
    queue().push(notice);
    PENDING.store(true, Ordering::Release);
}

/// Count one more retry of a contended write that has waited `waited_ms` so far: merged into
/// the newest notice while that is a [`Notice::BusyRetries`].
pub fn busy_retry(waited_ms: u64) {
    let mut q = queue();
    if let Some(Notice::BusyRetries {
        count,
        waited_ms: longest,
    }) = q.notices.back_mut()
    {
        *count += 1;
        *longest = (*longest).max(waited_ms);
    } else {
        q.push(Notice::BusyRetries {
            count: 1,
            waited_ms,
        });
    }
    PENDING.store(true, Ordering::Release);
}

thread_local! {
    /// Notices of the write transaction running on this thread, queued only if it commits:
    /// a rolled-back transaction (or a try run again after contention) reports nothing.
    static HELD: std::cell::RefCell<Vec<Notice>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Hold `notice` until the write transaction running on this thread ends: [`settle_held`]
/// queues it if the transaction committed.
pub fn hold(notice: Notice) {
    HELD.with(|h| h.borrow_mut().push(notice));
}

/// Forget what the transaction running on this thread held (it starts, or starts over).
pub fn forget_held() {
    HELD.with(|h| h.borrow_mut().clear());
}

/// The transaction running on this thread ended: queue what it held if it `committed`.
pub fn settle_held(committed: bool) {
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    if committed && !held.is_empty() {
        let mut q = queue();
        for notice in held {
            q.push(notice);
        }
        PENDING.store(true, Ordering::Release);
    }
}

/// Whether anything is queued (cheap: one atomic load).
pub fn pending() -> bool {
    PENDING.load(Ordering::Acquire)
}

/// Everything queued, oldest first, leaving the queue empty.
pub fn take() -> Vec<Notice> {
    let mut q = queue();
    PENDING.store(false, Ordering::Release);
    q.take()
}

/// Queue a [`Notice::Group`] per committed group from now on (`true`) or stop (`false`).
pub fn set_groups(on: bool) {
    GROUPS.store(on, Ordering::Relaxed);
}

/// Whether group sizes are being queued.
pub fn groups() -> bool {
    GROUPS.load(Ordering::Relaxed)
}

/// Notices dropped because the queue was full, since the process started.
pub fn dropped() -> u64 {
    queue().dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_its_oldest_and_counts_them() {
        let mut q = Queue::new(3);
        for size in 0..5 {
            q.push(Notice::Group { size });
        }
        assert_eq!(q.dropped, 2);
        let sizes: Vec<u64> = q
            .take()
            .into_iter()
            .map(|n| match n {
                Notice::Group { size } => size,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(sizes, [2, 3, 4]);
        assert!(q.take().is_empty());
    }

    #[test]
    fn busy_retries_in_a_row_are_one_notice() {
        busy_retry(3);
        busy_retry(9);
        busy_retry(5);
        // Other tests of this process may retry too: only the merged sum is certain.
        let merged: Vec<(u64, u64)> = take()
            .into_iter()
            .filter_map(|n| match n {
                Notice::BusyRetries { count, waited_ms } => Some((count, waited_ms)),
                _ => None,
            })
            .collect();
        assert!(merged.iter().map(|m| m.0).sum::<u64>() >= 3);
        assert!(merged.iter().any(|m| m.0 >= 3 && m.1 >= 9), "{merged:?}");
    }
}
