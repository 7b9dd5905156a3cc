//! The group-commit writer: calls on one ledger that arrive while a transaction is in flight
//! share the next one.
//!
//! Leader/follower with no timer. A caller queues its call; if no one is leading, it leads at
//! once (a lone caller runs its call alone, exactly as without the writer). A leader takes the
//! calls queued at the front, up to a count and a weight, runs them as one group (see
//! `group`), hands the lead to the caller now at the front, and only then answers the group's
//! callers: every answer comes after its commit. A leader serves one group, so its own caller
//! returns promptly. The queue is bounded: a caller waits for room. Nothing here takes the
//! GIL; callers submit detached, so a thread that holds the GIL never waits on these locks.

mod group;
pub mod op;

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::errors::{LedgerError, Result};
use crate::store::Store;
pub use group::{run_group, Outcome};
pub use op::{Op, Output};

/// How groups are formed.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The most calls in one group (1: every call alone).
    pub max_calls: usize,
    /// The most units (reservations, finishes) in one group, which bounds how long a group
    /// holds its locks; a single heavier call still runs, alone.
    pub max_weight: usize,
    /// The most calls queued; a caller beyond waits for room.
    pub capacity: usize,
    /// How long `close` waits for the queued calls to run before failing them.
    pub drain_ms: u64,
}

impl Config {
    /// The settings of a ledger: grouping on or off, draining within the busy budget.
    pub fn new(group_commit: bool, busy_timeout_ms: u64) -> Self {
        Self {
            // Bounded on PostgreSQL by its subtransaction cache: more than 64 savepoints that
            // write in one transaction slow every session's snapshots.
            max_calls: if group_commit { 32 } else { 1 },
            max_weight: 2048,
            capacity: 4096,
            drain_ms: busy_timeout_ms.max(1000),
        }
    }
}

/// Counts since the writer opened.
#[derive(Debug, Default)]
struct Stats {
    groups: AtomicU64,
    calls: AtomicU64,
    max_group: AtomicU64,
    fallbacks: AtomicU64,
    /// Time groups spend in `run_group`, holding the store (and its run locks), in ns.
    hold_ns_total: AtomicU64,
    hold_ns_max: AtomicU64,
}

enum State {
    Queued,
    /// The caller's call is at the front and no one leads: it leads next.
    Lead,
    Done(Result<Output>),
}

/// Where a queued call's caller waits.
struct Waiter {
    state: Mutex<State>,
    wake: Condvar,
}

impl Waiter {
    fn set(&self, state: State) {
        *lock(&self.state) = state;
        self.wake.notify_one();
    }
}

struct Entry {
    op: Op,
    waiter: Arc<Waiter>,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Entry>,
    /// A caller is leading (invariant: not leading => nothing pending).
    leading: bool,
    closed: bool,
}

/// A ledger's store and the queue of calls that write to it.
pub struct Writer {
    queue: Mutex<Queue>,
    /// Signalled when calls leave the queue.
    not_full: Condvar,
    /// Signalled when the last leader stops.
    idle: Condvar,
    store: Mutex<Option<Box<dyn Store>>>,
    cfg: Config,
    stats: Stats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error of a call on a closed ledger.
pub fn closed() -> LedgerError {
    LedgerError::StoreError {
        operation: "using the ledger".into(),
        message: "the ledger is closed; open it again with fencepost.Ledger.open()".into(),
    }
}

impl Writer {
    /// A writer over `store`.
    pub fn new(store: Box<dyn Store>, cfg: Config) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            not_full: Condvar::new(),
            idle: Condvar::new(),
            store: Mutex::new(Some(store)),
            cfg,
            stats: Stats::default(),
        }
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        lock(&self.queue).closed
    }

    /// Run `f` on the store directly, outside the queue (reads and the calls the writer does
    /// not group); it waits only for the group in flight.
    pub fn with_store<T>(&self, f: impl FnOnce(&mut dyn Store) -> Result<T>) -> Result<T> {
        match lock(&self.store).as_mut() {
            Some(store) => f(store.as_mut()),
            None => Err(closed()),
        }
    }

    /// Queue `op` and wait for its outcome, which comes after its group's commit.
    pub fn submit(&self, op: Op) -> Result<Output> {
        let waiter = Arc::new(Waiter {
            state: Mutex::new(State::Queued),
            wake: Condvar::new(),
        });
        {
            let mut q = lock(&self.queue);
            while !q.closed && q.pending.len() >= self.cfg.capacity {
                q = self
                    .not_full
                    .wait(q)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if q.closed {
                return Err(closed());
            }
            q.pending.push_back(Entry {
                op,
                waiter: Arc::clone(&waiter),
            });
            if !q.leading {
                q.leading = true;
                drop(q);
                self.lead();
            }
        }
        let mut state = lock(&waiter.state);
        loop {
            match std::mem::replace(&mut *state, State::Queued) {
                State::Done(out) => return out,
                State::Lead => {
                    drop(state);
                    self.lead();
                    state = lock(&waiter.state);
                }
                State::Queued => {
                    state = waiter
                        .wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }

    /// Run one group from the front of the queue, hand the lead on, answer the group.
    fn lead(&self) {
        let group = self.take_group();
        self.not_full.notify_all();
        let ops: Vec<&Op> = group.iter().map(|e| &e.op).collect();
        // A panic in a group must not wedge the queue: its calls get an error and the lead
        // still passes on.
        let ran = catch_unwind(AssertUnwindSafe(|| {
            let mut store = lock(&self.store);
            match store.as_mut() {
                Some(store) => {
                    let start = Instant::now();
                    let ran = run_group(store.as_mut(), &ops);
                    let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.stats.hold_ns_total.fetch_add(ns, Ordering::Relaxed);
                    self.stats.hold_ns_max.fetch_max(ns, Ordering::Relaxed);
                    ran
                }
                None => (
                    ops.iter().map(|_| Err(closed())).collect(),
                    Outcome::default(),
                ),
            }
        }));
        let outs = match ran {
            Ok((outs, outcome)) => {
                if outcome.fell_back {
                    self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                }
                outs
            }
            Err(_) => ops
                .iter()
                .map(|op| {
                    Err(LedgerError::StoreError {
                        operation: op.label().into(),
                        message: "the writer failed while running this call (a bug in \
                                  fencepost; please report it); its transaction was rolled back"
                            .into(),
                    })
                })
                .collect(),
        };
        self.hand_off();
        let n = group.len() as u64;
        self.stats.groups.fetch_add(1, Ordering::Relaxed);
        self.stats.calls.fetch_add(n, Ordering::Relaxed);
        self.stats.max_group.fetch_max(n, Ordering::Relaxed);
        for (entry, out) in group.into_iter().zip(outs) {
            entry.waiter.set(State::Done(out));
        }
    }

    /// The calls at the front: at least one, up to the count and weight caps.
    fn take_group(&self) -> Vec<Entry> {
        let mut q = lock(&self.queue);
        let mut group = Vec::new();
        let mut weight = 0;
        while let Some(front) = q.pending.front() {
            let w = front.op.weight();
            if !group.is_empty()
                && (group.len() >= self.cfg.max_calls || weight + w > self.cfg.max_weight)
            {
                break;
            }
            weight += w;
            group.extend(q.pending.pop_front());
        }
        group
    }

    /// Pass the lead to the caller at the front, or stop leading.
    fn hand_off(&self) {
        let mut q = lock(&self.queue);
        if let Some(front) = q.pending.front() {
            front.waiter.set(State::Lead);
        } else {
            q.leading = false;
            self.idle.notify_all();
        }
    }

    /// Refuse new calls, let the queued ones run (within the drain bound), fail the rest, and
    /// close the store.
    pub fn close(&self) {
        let mut q = lock(&self.queue);
        q.closed = true;
        self.not_full.notify_all();
        let deadline = Instant::now() + Duration::from_millis(self.cfg.drain_ms);
        while q.leading {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = self
                .idle
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        for entry in q.pending.drain(..) {
            entry.waiter.set(State::Done(Err(LedgerError::StoreError {
                operation: entry.op.label().into(),
                message: "the ledger was closed before this call ran; nothing of it was written"
                    .into(),
            })));
        }
        drop(q);
        drop(lock(&self.store).take());
    }

    /// `(groups, calls, max_group, fallbacks, hold_us_total, hold_us_max)` since the writer
    /// opened; `hold_us_*` is the time groups spent in their transaction, in µs.
    pub fn stats(&self) -> [(&'static str, u64); 6] {
        let s = &self.stats;
        [
            ("groups", s.groups.load(Ordering::Relaxed)),
            ("calls", s.calls.load(Ordering::Relaxed)),
            ("max_group", s.max_group.load(Ordering::Relaxed)),
            ("fallbacks", s.fallbacks.load(Ordering::Relaxed)),
            (
                "hold_us_total",
                s.hold_ns_total.load(Ordering::Relaxed) / 1000,
            ),
            ("hold_us_max", s.hold_ns_max.load(Ordering::Relaxed) / 1000),
        ]
    }
}
