//! The busy handler of a writer connection: how it waits for another process's write lock.
//!
//! SQLite's own handler sleeps 1, 2, 5, 10 ... up to 100 ms between tries, so a process that
//! has waited a while polls ten times less often than one that just arrived, and loses the
//! lock to it again and again: with four dispatcher processes single calls took 1-4 s against
//! a 5 s budget while the median was under a millisecond. Here every waiter tries again within
//! [`MAX_SLEEP`], whatever it has waited already, until the budget is spent; the sleeps are
//! still long enough that a waiter never takes the lock holder's core from it.
//!
//! The budget is shared with the checkpointer, which lowers it for the one `RESTART`
//! checkpoint it runs from the WAL hook (a writer must never wait long on a reader there).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// The longest sleep between two tries for a lock.
const MAX_SLEEP: Duration = Duration::from_millis(4);

/// How long a connection waits for a lock before SQLite reports it busy, in milliseconds.
#[derive(Debug)]
pub struct Budget(AtomicU64);

impl Budget {
    /// Wait at most `ms` from now on.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Install the handler on `conn` with a budget of `budget_ms`; the returned budget can be
/// changed later.
pub fn install(conn: &mut Connection, budget_ms: u64) -> rusqlite::Result<Arc<Budget>> {
    let budget = Arc::new(Budget(AtomicU64::new(budget_ms)));
    let mine = Arc::clone(&budget);
    let mut since = Instant::now();
    conn.busy_handler(Some(move |tries: i32| {
        // `tries` starts at 0 for each lock the connection waits for.
        if tries == 0 {
            since = Instant::now();
        }
        let left = Duration::from_millis(mine.get()).saturating_sub(since.elapsed());
        if left.is_zero() {
            return false;
        }
        crate::observe::busy_retry(u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX));
        // 1, 2, 3, then MAX_SLEEP milliseconds: short waits stay short.
        let step = Duration::from_millis(u64::try_from(tries).unwrap_or(0).saturating_add(1));
        std::thread::sleep(step.min(MAX_SLEEP).min(left));
        true
    }))?;
    Ok(budget)
}
