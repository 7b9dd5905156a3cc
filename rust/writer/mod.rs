//! The group-commit writer: calls on one ledger that arrive while a transaction is in flight
//! share the next one.
//!
//! Leader/follower. A caller queues its call; if no one is leading, it leads at once (a lone
//! caller runs its call alone, exactly as without the writer). A leader takes the calls queued
//! at the front, up to a count and a weight, runs them as one group (see `group`), hands the
//! lead on, and only then answers the group's callers: every answer comes after its commit. A
//! leader serves one group, so its own caller returns promptly. The queue is bounded: a caller
//! waits for room.
//!
//! The lead passes to the writer's helper thread once callers overlap (the first call queued
//! behind a leader starts it), and the helper leads for as long as calls are queued; only a
//! caller that finds the writer idle leads itself. Handing the lead to the caller at the front
//! instead made a different thread lead every group, each woken for it and starting cold while
//! the callers it had just answered competed for the CPU (16 threads on SQLite `normal`: 15.6k
//! units/s led by callers, 18.0-19.6k by the helper; `full` and PostgreSQL unchanged). A
//! writer whose helper cannot be started goes on leading by its callers.
//!
//! Callers answered by a group call again at once, but only after the commit: a leader that
//! took the queue as it found it would run a group of those answered by the group before, so
//! every group would hold about half of the callers. Where a commit costs far more than a call
//! in a group (PostgreSQL, `durability="full"`: [`Config::fill`]), a leader that finds fewer
//! calls queued than the last group had waits until as many are, for at most half of what that
//! group held the store (`Writer::fill`); a lone caller (last group of one) never waits.
//!
//! An asynchronous call (`submit_async`) queues with an [`AsyncReply`] instead of a waiting
//! thread and returns at once; its caller never leads: the helper (started by the first
//! asynchronous call, if not before) leads in its place. Under [`Config::fill`], after a group of asynchronous calls the same wait
//! also ends once the event loops have run the callers it answered up to their next calls
//! ([`Writer::settle`]), and may last up to `SETTLE_LIMIT` (measured on
//! PostgreSQL with 10 coroutines on one Ledger: groups of 5 calls without the wait, 10 with
//! it, 3 000 -> 4 300 units/s). The replies of one group are delivered together, after the
//! commit, with no lock of the writer held: a reply may need a lock of its own (the GIL), and a
//! thread that holds that lock may be queueing a call at that moment.

mod group;
pub mod op;

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::errors::{LedgerError, Result};
use crate::observe;
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
    /// The most calls queued; a caller beyond waits for room. Also the most asynchronous
    /// calls queued, beyond which one is refused (an asynchronous caller cannot wait).
    pub capacity: usize,
    /// How long `close` waits for the queued calls to run before failing them.
    pub drain_ms: u64,
    /// Wait for a group to fill before running it (see `Writer::fill`): for a store whose
    /// commit costs far more than a call within a group (a round trip to PostgreSQL, a flush
    /// at `durability="full"`), so that halving the commits per call is worth a short wait.
    /// Not for SQLite at `normal`, whose commit is a write to the page cache: there the wait
    /// cost more than it saved (16 threads 13.0k -> 11.0k units/s, 10 coroutines 10.6k ->
    /// 9.8k, against +21% and +49% for 16 and 4 threads on PostgreSQL).
    pub fill: bool,
}

impl Config {
    /// The settings of a ledger: grouping on or off, draining within the busy budget.
    /// `subtransactions_cost` says the store's savepoints are shared state (PostgreSQL).
    pub fn new(group_commit: bool, busy_timeout_ms: u64, subtransactions_cost: bool) -> Self {
        let max_calls = match (group_commit, subtransactions_cost) {
            (false, _) => 1,
            // PostgreSQL's subtransaction cache: more than 64 savepoints that write in one
            // transaction slow every session's snapshots.
            (true, true) => 32,
            // SQLite's savepoints are private to the connection; the weight cap bounds how
            // long a group holds the write lock. More calls per group share one sync more
            // widely when many callers wait (64 threads at `durability="full"`).
            (true, false) => 256,
        };
        Self {
            max_calls,
            max_weight: 2048,
            capacity: 4096,
            drain_ms: busy_timeout_ms.max(1000),
            fill: false,
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
    /// Groups the helper led.
    helper_groups: AtomicU64,
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

/// The answer to an asynchronous call, handed to the layer that queued it, which may need a
/// lock of its own (such as the GIL) to pass it on. The writer holds none of its locks while
/// it delivers, and delivers only after the call's commit.
pub trait AsyncReply: Any + Send {
    /// Answer the asynchronous calls of one group: this one with `out`, then `rest` in the
    /// group's order. Called once per group, so a lock the answers need is taken once.
    fn deliver(self: Box<Self>, out: Result<Output>, rest: Vec<Delivery>);
}

/// An asynchronous call's reply and its outcome.
pub type Delivery = (Box<dyn AsyncReply>, Result<Output>);

/// How a queued call's caller is answered.
enum Reply {
    /// A thread waits (and may be asked to lead).
    Wait(Arc<Waiter>),
    /// Delivered with the rest of its group's asynchronous answers.
    Deliver(Box<dyn AsyncReply>),
}

struct Entry {
    op: Op,
    reply: Reply,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Entry>,
    /// A caller or the helper is leading (invariant: not leading => nothing pending).
    leading: bool,
    closed: bool,
    /// The asynchronous calls in `pending`.
    async_len: usize,
    /// The helper leads next (the front call is asynchronous, or the helper is running).
    helper_wanted: bool,
    /// The helper thread, started by the first call queued behind a leader or the first
    /// asynchronous call; taken by `close`, which joins it (a closed writer takes no call, so
    /// it is not started again).
    helper: Option<JoinHandle<()>>,
    /// A leader waits for this many calls to be queued (0: none waits); see `Writer::fill`.
    want: usize,
    /// When the last group's answers went to their callers' side (event loops): how many of
    /// those deliveries have callers that have not yet run up to their next calls (see
    /// `Writer::settle`). `None`: the last group delivered nothing so.
    unsettled: Option<u32>,
}

/// A ledger's store and the queue of calls that write to it.
pub struct Writer {
    queue: Mutex<Queue>,
    /// Signalled when calls leave the queue.
    not_full: Condvar,
    /// Signalled when the last leader stops.
    idle: Condvar,
    /// Signalled when the helper should lead, or may stop.
    helper: Condvar,
    /// Signalled when as many calls are queued as a waiting leader wants, or when the callers
    /// of every delivery have run.
    filled: Condvar,
    /// The last group's calls and the time it held the store, in ns (see `Writer::fill`).
    last_calls: AtomicU64,
    last_hold_ns: AtomicU64,
    store: Mutex<Option<Box<dyn Store>>>,
    cfg: Config,
    stats: Stats,
}

/// The longest a leader waits for the callers of a delivery to call again: a loop that does
/// not get round to them by then (busy with work of its own) does not hold the store idle.
const SETTLE_LIMIT: Duration = Duration::from_millis(2);
/// The longest a leader waits for the queue to fill, as a share (in percent) of the time the
/// last group held the store.
const FILL_SHARE: u64 = 50;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error of a call that `close` found still queued.
fn closed_before(op: &Op) -> LedgerError {
    LedgerError::StoreError {
        operation: op.label().into(),
        message: "the ledger was closed before this call ran; nothing of it was written".into(),
    }
}

/// Count on their leases the fenced writes among `errors` that the fence refused, before their
/// callers are answered (so a caller that saw the refusal finds it counted). Best effort: the
/// refusal is the caller's answer whether or not the count lands, and a store that cannot
/// write the count now would have failed the write itself.
fn count_refused<'e>(store: &mut dyn Store, errors: impl Iterator<Item = &'e LedgerError>) {
    let mut runs: Vec<&str> = errors
        .filter_map(|e| match e {
            LedgerError::LeaseLost { run_id, .. } => Some(run_id.as_str()),
            _ => None,
        })
        .collect();
    if runs.is_empty() {
        return;
    }
    runs.sort_unstable();
    let _ = store.write("counting refused writes", |tx| {
        // Sorted like a group's run locks, so two of these cannot deadlock each other.
        for run in &runs {
            tx.exec(&crate::store::sql::REFUSED_WRITE_SQL, crate::params![run])?;
        }
        Ok(())
    });
}

/// Answer a group's asynchronous calls together; a panic in the layer above must not take
/// the leader (perhaps the helper) with it.
fn deliver(mut batch: Vec<Delivery>) {
    if batch.is_empty() {
        return;
    }
    let (first, out) = batch.remove(0);
    let _ = catch_unwind(AssertUnwindSafe(|| first.deliver(out, batch)));
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
            helper: Condvar::new(),
            filled: Condvar::new(),
            last_calls: AtomicU64::new(0),
            last_hold_ns: AtomicU64::new(0),
            store: Mutex::new(Some(store)),
            cfg,
            stats: Stats::default(),
        }
    }

    /// A group's answers were handed to their callers' side (an event loop);
    /// [`Writer::settle`] follows exactly once, when those callers have run up to their next
    /// wait, so that the calls they make next are queued.
    pub fn expect_settle(&self) {
        let mut q = lock(&self.queue);
        q.unsettled = Some(q.unsettled.unwrap_or(0) + 1);
    }

    /// The callers of a delivery have run (see [`Writer::expect_settle`]).
    pub fn settle(&self) {
        let mut q = lock(&self.queue);
        // A settle from a group before the last one may land here too: it only ends a wait
        // early.
        if let Some(n) = q.unsettled.as_mut() {
            *n = n.saturating_sub(1);
            if *n == 0 && q.want > 0 {
                self.filled.notify_one();
            }
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
            Some(store) => {
                let out = f(store.as_mut());
                if let Err(e) = &out {
                    count_refused(store.as_mut(), std::iter::once(e));
                }
                out
            }
            None => Err(closed()),
        }
    }

    /// Queue `op` and wait for its outcome, which comes after its group's commit.
    pub fn submit(self: &Arc<Self>, op: Op) -> Result<Output> {
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
                reply: Reply::Wait(Arc::clone(&waiter)),
            });
            if q.want > 0 && q.pending.len() >= q.want {
                self.filled.notify_one();
            }
            if !q.leading {
                q.leading = true;
                drop(q);
                self.lead();
            } else if q.helper.is_none() {
                // Callers overlap: from now on the helper leads every group that queued
                // behind another (see `hand_off`). Without a thread the callers lead, as
                // before.
                q.helper = self.start_helper().ok();
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

    /// Queue `op` without waiting: `reply` gets its outcome after its group's commit. Refuses
    /// (`StoreBusy`) rather than wait when the queue holds `capacity` asynchronous calls; the
    /// caller is expected to bound its own calls well below that. Never leads, so it may be
    /// called by a thread holding a lock a delivery needs.
    pub fn submit_async(self: &Arc<Self>, op: Op, reply: Box<dyn AsyncReply>) -> Result<()> {
        let mut q = lock(&self.queue);
        if q.closed {
            return Err(closed());
        }
        if q.async_len >= self.cfg.capacity {
            return Err(LedgerError::StoreBusy {
                waited_ms: 0,
                retries: 0,
            });
        }
        if q.helper.is_none() {
            q.helper = Some(self.start_helper().map_err(|e| LedgerError::StoreError {
                operation: op.label().into(),
                message: format!("could not start the writer's thread: {e}"),
            })?);
        }
        q.pending.push_back(Entry {
            op,
            reply: Reply::Deliver(reply),
        });
        if q.want > 0 && q.pending.len() >= q.want {
            self.filled.notify_one();
        }
        q.async_len += 1;
        if !q.leading {
            q.leading = true;
            q.helper_wanted = true;
            self.helper.notify_one();
        }
        Ok(())
    }

    fn start_helper(self: &Arc<Self>) -> std::io::Result<JoinHandle<()>> {
        let writer = Arc::clone(self);
        std::thread::Builder::new()
            .name("fencepost-writer".into())
            .spawn(move || writer.help())
    }

    /// The helper thread: leads whenever a group ends with calls queued, or an asynchronous call
    /// is queued and no caller leads; stops once the writer is closed and nothing is left to
    /// lead.
    fn help(&self) {
        let mut q = lock(&self.queue);
        loop {
            if q.helper_wanted {
                q.helper_wanted = false;
                drop(q);
                self.stats.helper_groups.fetch_add(1, Ordering::Relaxed);
                self.lead();
                q = lock(&self.queue);
            } else if q.closed && !q.leading {
                return;
            } else {
                q = self.helper.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }

    /// Run one group from the front of the queue, hand the lead on, answer the group.
    fn lead(&self) {
        self.fill();
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
                    self.last_hold_ns.store(ns, Ordering::Relaxed);
                    self.stats.hold_ns_total.fetch_add(ns, Ordering::Relaxed);
                    self.stats.hold_ns_max.fetch_max(ns, Ordering::Relaxed);
                    count_refused(
                        store.as_mut(),
                        ran.0.iter().filter_map(|out| out.as_ref().err()),
                    );
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
        if observe::groups() {
            observe::push(observe::Notice::Group { size: n });
        }
        self.stats.groups.fetch_add(1, Ordering::Relaxed);
        self.stats.calls.fetch_add(n, Ordering::Relaxed);
        self.stats.max_group.fetch_max(n, Ordering::Relaxed);
        self.last_calls.store(n, Ordering::Relaxed);
        let mut batch = Vec::new();
        for (entry, out) in group.into_iter().zip(outs) {
            match entry.reply {
                Reply::Wait(waiter) => waiter.set(State::Done(out)),
                Reply::Deliver(reply) => batch.push((reply, out)),
            }
        }
        deliver(batch);
    }

    /// Before taking a group: when the last group had several calls and fewer are queued now,
    /// wait until as many are (or the queue closes), for at most a fraction of what the last
    /// group held the store. A caller answered by the last group calls again at once, but only
    /// after its answer, which comes after the commit: without the wait the next group holds
    /// only those answered by the group before it. When that group's answers went to event
    /// loops, the wait also ends once every loop has run its callers (they have made whatever
    /// calls they will make), and may last up to `SETTLE_LIMIT`: a loop's turn does not scale
    /// with the group's time.
    fn fill(&self) {
        let n = usize::try_from(self.last_calls.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        if !self.cfg.fill || n < 2 {
            return;
        }
        let held = self.last_hold_ns.load(Ordering::Relaxed);
        let mut limit = Duration::from_nanos(held.saturating_mul(FILL_SHARE) / 100);
        let mut q = lock(&self.queue);
        if q.unsettled.is_some() {
            limit = limit.max(SETTLE_LIMIT);
        }
        let deadline = Instant::now() + limit;
        while !q.closed && q.pending.len() < n && q.unsettled != Some(0) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q.want = n;
            q = self
                .filled
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        q.want = 0;
    }

    /// The calls at the front: at least one, up to the count and weight caps.
    fn take_group(&self) -> Vec<Entry> {
        let mut q = lock(&self.queue);
        // Set again if this group's answers go to event loops (`Writer::expect_settle`).
        q.unsettled = None;
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
            if let Some(entry) = q.pending.pop_front() {
                if matches!(entry.reply, Reply::Deliver(_)) {
                    q.async_len -= 1;
                }
                group.push(entry);
            }
        }
        group
    }

    /// Pass the lead to the helper (to the caller at the front if there is no helper), or
    /// stop leading.
    fn hand_off(&self) {
        let mut q = lock(&self.queue);
        match q.pending.front().map(|e| &e.reply) {
            Some(Reply::Wait(waiter)) if q.helper.is_none() => waiter.set(State::Lead),
            Some(_) => {
                q.helper_wanted = true;
                self.helper.notify_one();
            }
            None => {
                q.leading = false;
                self.idle.notify_all();
                if q.closed {
                    self.helper.notify_one();
                }
            }
        }
    }

    /// Refuse new calls without waiting for anything: what is queued still runs, led by its
    /// callers or the helper, which then stops. For a ledger dropped unclosed, whose thread
    /// may hold the lock a delivery needs.
    pub fn shut(&self) {
        let mut q = lock(&self.queue);
        q.closed = true;
        self.not_full.notify_all();
        self.helper.notify_one();
    }

    /// Refuse new calls, let the queued ones run (within the drain bound), fail the rest
    /// (asynchronous ones included), close the store and stop the helper.
    pub fn close(&self) {
        let mut q = lock(&self.queue);
        q.closed = true;
        self.not_full.notify_all();
        self.helper.notify_one();
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
        let left: Vec<Entry> = q.pending.drain(..).collect();
        q.async_len = 0;
        let helper = q.helper.take();
        drop(q);
        let mut batch = Vec::new();
        for entry in left {
            let out = Err(closed_before(&entry.op));
            match entry.reply {
                Reply::Wait(waiter) => waiter.set(State::Done(out)),
                Reply::Deliver(reply) => batch.push((reply, out)),
            }
        }
        deliver(batch);
        drop(lock(&self.store).take());
        if let Some(helper) = helper {
            // The helper's own delivery may close the ledger (a finalizer): it cannot join itself.
            if helper.thread().id() != std::thread::current().id() {
                let _ = helper.join();
            }
        }
    }

    /// `(groups, calls, max_group, fallbacks, helper_groups, hold_us_total, hold_us_max)` since
    /// the writer opened; `hold_us_*` is the time groups spent in their transaction, in µs.
    pub fn stats(&self) -> [(&'static str, u64); 7] {
        let s = &self.stats;
        [
            ("groups", s.groups.load(Ordering::Relaxed)),
            ("calls", s.calls.load(Ordering::Relaxed)),
            ("max_group", s.max_group.load(Ordering::Relaxed)),
            ("fallbacks", s.fallbacks.load(Ordering::Relaxed)),
            ("helper_groups", s.helper_groups.load(Ordering::Relaxed)),
            (
                "hold_us_total",
                s.hold_ns_total.load(Ordering::Relaxed) / 1000,
            ),
            ("hold_us_max", s.hold_ns_max.load(Ordering::Relaxed) / 1000),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, Receiver, Sender};

    use super::*;
    use crate::attempts::UnitSpec;
    use crate::runs::{self, NewRun, StepSpec};
    use crate::store::testing::sqlite_memory;

    const WAIT: Duration = Duration::from_secs(10);

    /// An answer as the test sees it: the call's number, its outcome, and how many answers its
    /// delivery carried.
    type Answer = (usize, Result<Output>, usize);

    struct Sent {
        id: usize,
        tx: Sender<Answer>,
    }

    impl AsyncReply for Sent {
        fn deliver(self: Box<Self>, out: Result<Output>, rest: Vec<Delivery>) {
            let n = rest.len() + 1;
            let _ = self.tx.send((self.id, out, n));
            for (reply, out) in rest {
                let reply: Box<dyn Any + Send> = reply;
                let sent = reply.downcast::<Self>().expect("only test replies");
                let _ = sent.tx.send((sent.id, out, n));
            }
        }
    }

    fn writer(capacity: usize) -> Arc<Writer> {
        let mut store = sqlite_memory();
        let req = NewRun {
            workflow_ref: "wf".into(),
            steps: vec![StepSpec {
                id: "s".into(),
                title: String::new(),
                instructions: String::new(),
                completion: None,
                retry: None,
            }],
            run_id: Some("r".into()),
            force: true,
            ..NewRun::default()
        };
        runs::start_run(store.as_mut(), &req, 0).expect("start_run");
        let cfg = Config {
            max_calls: 32,
            max_weight: 2048,
            capacity,
            drain_ms: 50,
            fill: false,
        };
        Arc::new(Writer::new(store, cfg))
    }

    fn reserve(unit_id: &str) -> Op {
        let unit = UnitSpec {
            unit_id: unit_id.into(),
            step_id: "s".into(),
            phase: "unit".into(),
            ..UnitSpec::default()
        };
        Op::reserve("r".into(), vec![unit], None, 1).expect("a valid reserve")
    }

    fn submit(w: &Arc<Writer>, id: usize, tx: &Sender<Answer>) -> Result<()> {
        let reply = Box::new(Sent { id, tx: tx.clone() });
        w.submit_async(reserve(&format!("u{id}")), reply)
    }

    fn answers(rx: &Receiver<Answer>, n: usize) -> Vec<Answer> {
        (0..n)
            .map(|_| rx.recv_timeout(WAIT).expect("every call is answered"))
            .collect()
    }

    fn until(done: impl Fn() -> bool, what: &str) {
        let deadline = Instant::now() + WAIT;
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::yield_now();
        }
    }

    /// Wait until the leader has taken every queued call into its group.
    fn taken(w: &Writer) {
        until(
            || lock(&w.queue).pending.is_empty(),
            "the leader never took the call",
        );
    }

    #[test]
    fn async_calls_are_led_by_the_helper_and_answered_a_group_at_a_time() {
        let w = writer(4096);
        let (tx, rx) = channel();
        for id in 0..300 {
            submit(&w, id, &tx).expect("queued");
        }
        let got = answers(&rx, 300);
        for (id, out, _) in &got {
            let r = out
                .clone()
                .and_then(Output::reservations)
                .expect("reserved");
            assert_eq!(r[0].unit_id, format!("u{id}"));
        }
        assert!(
            got.iter().any(|(_, _, n)| *n > 1),
            "no group answered together"
        );
        assert!(w.stats.max_group.load(Ordering::Relaxed) > 1);
        w.close();
        assert!(lock(&w.queue).helper.is_none());
        assert!(matches!(
            submit(&w, 300, &tx),
            Err(LedgerError::StoreError { .. })
        ));
        // close joined the helper, which let go of its handle on the writer.
        assert_eq!(Arc::strong_count(&w), 1);
    }

    #[test]
    fn a_caller_queued_behind_a_leader_is_led_by_the_helper() {
        let w = writer(4096);
        let (a, b) = w
            .with_store(|_| {
                // `a` leads its own call and waits for the store this test holds.
                let wa = Arc::clone(&w);
                let a = std::thread::spawn(move || wa.submit(reserve("a")));
                until(|| lock(&w.queue).leading, "a never led");
                taken(&w);
                // `b` queues behind it, which starts the helper.
                let wb = Arc::clone(&w);
                let b = std::thread::spawn(move || wb.submit(reserve("b")));
                until(|| !lock(&w.queue).pending.is_empty(), "b never queued");
                assert!(lock(&w.queue).helper.is_some());
                Ok((a, b))
            })
            .expect("held the store");
        for (t, unit) in [(a, "a"), (b, "b")] {
            let out = t.join().expect("caller").expect("reserved");
            assert_eq!(out.reservations().expect("reserved")[0].unit_id, unit);
        }
        let stats: std::collections::HashMap<_, _> = w.stats().into_iter().collect();
        assert_eq!((stats["groups"], stats["helper_groups"]), (2, 1));
        w.close();
        assert_eq!(Arc::strong_count(&w), 1);
    }

    #[test]
    fn close_fails_the_queued_async_calls_it_could_not_run() {
        let w = writer(4096);
        let (tx, rx) = channel();
        let closer = w.with_store(|_| {
            // The helper takes the first call and waits for the store this test holds.
            submit(&w, 0, &tx).expect("queued");
            taken(&w);
            for id in 1..=5 {
                submit(&w, id, &tx).expect("queued");
            }
            let closing = Arc::clone(&w);
            let closer = std::thread::spawn(move || closing.close());
            let mut failed = answers(&rx, 5);
            failed.sort_by_key(|(id, _, _)| *id);
            for (id, (got, out, _)) in (1..=5).zip(failed) {
                assert_eq!(got, id);
                let Err(LedgerError::StoreError { message, .. }) = out else {
                    panic!("call {id}: {out:?}");
                };
                assert!(message.contains("closed before this call ran"), "{message}");
            }
            Ok(closer)
        });
        closer.expect("held").join().expect("close");
        // The call in flight ran or met the closed store; either way it was answered.
        let (id, out, _) = answers(&rx, 1).remove(0);
        assert_eq!(id, 0);
        assert!(
            matches!(&out, Ok(_) | Err(LedgerError::StoreError { .. })),
            "{out:?}"
        );
        assert_eq!(Arc::strong_count(&w), 1);
    }

    #[test]
    fn a_full_queue_refuses_async_calls_instead_of_waiting() {
        let w = writer(4);
        let (tx, rx) = channel();
        w.with_store(|_| {
            submit(&w, 0, &tx).expect("queued");
            taken(&w);
            for id in 1..=4 {
                submit(&w, id, &tx).expect("room");
            }
            assert!(matches!(
                submit(&w, 5, &tx),
                Err(LedgerError::StoreBusy { .. })
            ));
            Ok(())
        })
        .expect("held");
        let got = answers(&rx, 5);
        assert!(got.iter().all(|(_, out, _)| out.is_ok()), "{got:?}");
        w.close();
    }

    #[test]
    fn a_shut_writer_runs_what_is_queued_then_lets_go_of_the_helper() {
        let w = writer(4096);
        let (tx, rx) = channel();
        w.with_store(|_| {
            for id in 0..50 {
                submit(&w, id, &tx).expect("queued");
            }
            w.shut();
            Ok(())
        })
        .expect("held");
        let got = answers(&rx, 50);
        assert!(got.iter().all(|(_, out, _)| out.is_ok()), "{got:?}");
        let deadline = Instant::now() + WAIT;
        while Arc::strong_count(&w) > 1 {
            assert!(Instant::now() < deadline, "the helper did not stop");
            std::thread::yield_now();
        }
    }
}
