//! Where the concurrency curve's limit is, without Python: reserve + finish per unit in
//! batches, in commit groups of one-unit calls run by one thread, and from Rust threads through
//! one writer. A measurement, printed, not asserted (speed is asserted nowhere in the tests):
//! run it by hand, `cargo test --release -- --ignored --nocapture writer_curve`
//! (`FP_CURVE_THREADS=n` runs the threads part for n only; `FP_CURVE_SKIP=1` skips the
//! batches and groups, so that a profiler run over the process sees only the threads;
//! `FP_CURVE_FILL=1` turns on the wait for groups to fill, `writer::Config::fill`).
//!
//! `handoff` measures what every call from a waiting thread pays at least twice, whatever the
//! store: one thread waking another through a `Mutex` and `Condvar` (the writer's own
//! primitives), `cargo test --release -- --ignored --nocapture handoff`.

use std::io::Write as _;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use super::{finish, started, unit, T0};
use crate::store::{self, Store};
use crate::writer::{run_group, Config, Op, Output, Writer};

const UNITS: u32 = 32_000;

fn report(what: &str, since: Instant, extra: &str) {
    let rate = f64::from(UNITS) / since.elapsed().as_secs_f64();
    let _ = writeln!(std::io::stdout(), "{what}: {rate:.0} units/s {extra}");
}

fn reserve(run: &str, unit_ids: impl IntoIterator<Item = String>) -> Op {
    let units = unit_ids.into_iter().map(|u| unit(&u)).collect();
    Op::reserve(run.into(), units, None, T0).expect("reserve op")
}

fn finishing(run: &str, out: Output) -> Op {
    let finishes = out
        .reservations()
        .expect("reserved")
        .iter()
        .map(|r| finish(run, &r.unit_id, r.attempt, &r.dispatch_id))
        .collect();
    Op::finish(finishes, None, T0).expect("finish op")
}

/// One thread: batches of `size` units, a reserve call and a finish call each.
fn batches(writer: &Arc<Writer>, size: u32) {
    let run = format!("b{size}");
    let since = Instant::now();
    for b in 0..UNITS / size {
        let out = writer
            .submit(reserve(&run, (0..size).map(|i| format!("{b}-{i}"))))
            .expect("reserved");
        writer.submit(finishing(&run, out)).expect("finished");
    }
    report(&format!("batches of {size}"), since, "");
}

/// One thread: groups of 16 one-unit reserve calls, then the 16 finishes, through
/// `run_group` itself (what 16 concurrent callers would make of them at best).
fn groups(writer: &Writer) {
    let run = "g16";
    let since = Instant::now();
    for b in 0..UNITS / 16 {
        let ops: Vec<Op> = (0..16)
            .map(|i| reserve(run, [format!("{b}-{i}")]))
            .collect();
        let outs = writer
            .with_store(|s| Ok(run_group(s, &ops.iter().collect::<Vec<_>>()).0))
            .expect("group");
        let fins: Vec<Op> = outs
            .into_iter()
            .map(|o| finishing(run, o.expect("reserved")))
            .collect();
        writer
            .with_store(|s| Ok(run_group(s, &fins.iter().collect::<Vec<_>>()).0))
            .expect("group");
    }
    report("groups of 16 one-unit calls, one thread", since, "");
}

/// `n` threads, each reserving and finishing its own units one call at a time.
fn threads(writer: &Arc<Writer>, n: u32) {
    let run = format!("t{n}");
    let since = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|t| {
            let (w, run) = (Arc::clone(writer), run.clone());
            std::thread::spawn(move || {
                for i in 0..UNITS / n {
                    let out = w.submit(reserve(&run, [format!("{t}-{i}")])).expect("r");
                    let won = w.submit(finishing(&run, out)).expect("f");
                    assert_eq!(won.finished().expect("finished"), [true]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    report(
        &format!("{n} threads"),
        since,
        &format!("{:?}", writer.stats()),
    );
}

#[test]
#[ignore = "a measurement, printed: run by hand"]
fn writer_curve() {
    let dir = std::env::temp_dir().join(format!("fp-curve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("c.db");
    let opts = store::OpenOptions::default();
    let mut store: Box<dyn Store> =
        store::open(Some(path.to_str().expect("path")), None, None, &opts, T0).expect("open");
    for run in ["b16", "b256", "g16", "t1", "t4", "t16", "t64"] {
        started(store.as_mut(), run);
    }
    let mut cfg = Config::new(true, 5000, false);
    cfg.fill = std::env::var("FP_CURVE_FILL").is_ok();
    let writer = Arc::new(Writer::new(store, cfg));
    if std::env::var("FP_CURVE_SKIP").is_err() {
        batches(&writer, 16);
        batches(&writer, 256);
        groups(&writer);
    }
    let only: Option<u32> = std::env::var("FP_CURVE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok());
    for n in [1, 4, 16, 64] {
        if only.is_none_or(|o| o == n) {
            threads(&writer, n);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Take every turn whose number has parity `mine`, until `end` turns were taken: wait for the
/// other thread's turn to pass, take one, wake the other.
fn take_turns(turn: &(Mutex<u64>, Condvar), mine: u64, end: u64) {
    let (m, c) = turn;
    let mut t = m.lock().unwrap_or_else(PoisonError::into_inner);
    while *t < end {
        if *t % 2 == mine {
            *t += 1;
            c.notify_one();
        } else {
            t = c.wait(t).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Two threads passing a turn back and forth, `n` times each way: the time of one hand-off.
fn ping_pong(n: u64) -> f64 {
    let turn = Arc::new((Mutex::new(0_u64), Condvar::new()));
    let other = Arc::clone(&turn);
    let since = Instant::now();
    let answerer = std::thread::spawn(move || take_turns(&other, 1, 2 * n));
    take_turns(&turn, 0, 2 * n);
    answerer.join().expect("answerer");
    #[allow(clippy::cast_precision_loss)]
    let per = since.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64;
    per
}

#[test]
#[ignore = "a measurement, printed: run by hand"]
fn handoff() {
    for _ in 0..3 {
        let us = ping_pong(100_000);
        let _ = writeln!(std::io::stdout(), "one thread waking another: {us:.2} us");
    }
}
