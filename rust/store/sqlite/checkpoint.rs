//! Checkpoints off the write path.
//!
//! In WAL mode a commit appends frames to the `-wal` file and returns; a *checkpoint* later
//! copies those pages back into the database file and fsyncs both. SQLite's default runs that
//! checkpoint inside the commit that crossed 1000 frames, so one caller in every ~200 pays for
//! copying and two fsyncs on behalf of all of them. Measured on the dispatcher's reserve+finish
//! loop that doubled the average cost of a commit (benches/RESULTS.md).
//!
//! Here the writer's WAL hook only *signals* a background thread, which runs a `PASSIVE`
//! checkpoint on its own connection: it never takes the write lock, so commits go on while it
//! copies. Durability is unchanged: WAL frames are what a commit relies on, and checkpoints only
//! move pages that are already durable (or, with `synchronous=NORMAL`, as durable as SQLite's
//! own checkpoints make them).
//!
//! Copying does not bound the log. A log starts over from its beginning only when a writer finds
//! it fully copied *and* no reader still reads any of its frames. With several processes
//! writing and reading all the time both are rarely true at once (a commit lands while a
//! passive checkpoint copies, and some transaction always holds a snapshot in the log), so the
//! log and its file grew without end: four dispatcher processes took it past 100 MB, and every
//! read through a long log's index got slower. So once the log passes [`HARD_FRAMES`], the
//! writer that crossed it runs a `RESTART` checkpoint right after its commit: it takes the
//! write lock (no new frames meanwhile), copies what the thread left, and waits for the
//! readers of the log to finish — new readers read the database file, which by then holds
//! everything — so the next commit starts the log afresh. Right after a commit is when that
//! writer can get the lock at once: the others are still asleep in their busy handlers. The
//! checkpoint waits at most [`RESTART_WAIT_MS`] for the lock and for each reader, so no writer
//! stalls behind a long reader; if one outlasts it, the checkpoint ends as a passive one and
//! the next 250 frames try again. `journal_size_limit` (set by the store) truncates the file
//! when the log starts over, so its size on disk stays bounded too.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, OpenFlags};

use super::busy::Budget;

/// WAL frames after which the background thread is asked to checkpoint (SQLite's default
/// `wal_autocheckpoint`).
pub const SOFT_FRAMES: i32 = 1000;
/// WAL frames after which the writer makes the log start over (a `RESTART` checkpoint).
pub const HARD_FRAMES: i32 = 4 * SOFT_FRAMES;
/// How long the `RESTART` checkpoint waits for the write lock and for each reader of the log.
/// Fencepost's readers are single statements of a few milliseconds.
pub const RESTART_WAIT_MS: u64 = 100;
/// Bytes the `-wal` file is truncated to when the log starts over. Well above the ~4 MiB the
/// hard limit's frames take (1 KiB pages plus 24-byte frame headers) and a large batch commit
/// on top: truncating a file that the next commits grow again cost a single-process batch
/// writer ~5% (measured with the limit at 5 MiB), and only a file grown past this is cut.
pub const JOURNAL_SIZE_LIMIT: i64 = 16 << 20;

#[derive(Default)]
struct State {
    pending: bool,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two flags: a panic elsewhere cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The background checkpoint thread of one writer connection. Dropping it stops the thread and
/// waits for it, so that the writer's connection, closed after it, is the database's last and
/// removes the `-wal` file.
pub struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The process that started the thread: a forked child inherits this value but not the
    /// thread, and must not wait for it.
    pid: u32,
}

impl Checkpointer {
    /// Start the thread on its own connection to `path` and hook `writer`'s commits to it.
    /// `synchronous` is the writer's setting (`NORMAL`/`FULL`), which decides how checkpoints
    /// fsync. If the second connection cannot be opened, checkpoints stay in the writer (the
    /// SQLite default): slower, never wrong.
    pub fn start(
        writer: &mut Connection,
        path: &str,
        synchronous: &str,
        busy: Arc<Budget>,
    ) -> Option<Self> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .ok()?;
        conn.execute_batch(&format!("PRAGMA synchronous = {synchronous}"))
            .ok()?;
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("fencepost-checkpoint".into())
                .spawn(move || run(&conn, &shared))
                .ok()?
        };
        let hook = Arc::clone(&shared);
        // Signal once per SOFT_FRAMES new frames, not on every commit past the mark: each
        // checkpoint fsyncs both files, and a checkpoint per commit would cost more than
        // SQLite's default. Past the hard limit, try a restart every 250 frames until the log
        // starts over.
        let (mut next, mut last) = (SOFT_FRAMES, 0);
        let hooked = writer.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, frames| {
            if frames < last {
                next = SOFT_FRAMES; // the log restarted
            }
            last = frames;
            if frames >= HARD_FRAMES {
                if frames >= next {
                    next = frames + SOFT_FRAMES / 4;
                    let normal = busy.get();
                    busy.set(RESTART_WAIT_MS);
                    // Busy (another checkpoint runs, or a reader outlasted the wait) is fine:
                    // what could be copied was, and a later commit tries again.
                    let _ = wal.checkpoint_v2(CheckpointMode::RESTART);
                    busy.set(normal);
                }
            } else if frames >= next {
                next = frames + SOFT_FRAMES;
                let mut state = hook.lock();
                state.pending = true;
                hook.wake.notify_one();
            }
            Ok(())
        }));
        let me = Self {
            shared,
            thread: Some(thread),
            pid: std::process::id(),
        };
        // Without the hook the thread would never be woken; SQLite's own checkpoints stay on.
        hooked.ok().map(|()| me)
    }
}

fn run(conn: &Connection, shared: &Shared) {
    loop {
        {
            let mut state = shared.lock();
            while !state.pending && !state.stop {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if state.stop {
                return;
            }
            state.pending = false;
        }
        // A failed checkpoint (busy, or a reader pinning old frames) loses nothing: the frames
        // stay in the log and the next signal tries again.
        let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stop = true;
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            if self.pid == std::process::id() {
                let _ = thread.join();
            }
        }
    }
}
