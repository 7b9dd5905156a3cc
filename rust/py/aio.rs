//! Asynchronous calls: `fencepost._core.Ledger` methods called with `future=`.
//!
//! Such a call reads its arguments and builds its operation on the event loop's thread (so a
//! bad argument raises at once, before anything is queued), queues it on the writer with a
//! [`PyReply`] holding the asyncio future, and returns `None` without waiting. No thread is
//! spent per call: the writer's helper (or whichever caller leads the group) delivers the
//! group's answers after its commit, attaching once per group to build the records and
//! exceptions, then asks each loop once to resolve its futures
//! (`loop.call_soon_threadsafe(fencepost.aio._resolve_many, items)`). Futures are only ever
//! touched on their loop's thread.
//!
//! A delivery must never attach once the interpreter is finalizing: a thread that takes the
//! GIL then may hang or be killed. An `atexit` hook (registered with the first asynchronous
//! call) closes a gate before finalization starts and waits out the deliveries in flight;
//! deliveries after it drop their answers, whose loops are gone by then. A forked child finds
//! the gate open and empty: the deliveries in flight at the fork were the parent's threads'.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyList, PyTuple};

use crate::errors::Result;
use crate::py::args;
use crate::py::errors::to_pyerr;
use crate::writer::{AsyncReply, Delivery, Op, Output, Writer};

/// How a method turns its operation's output into its Python result.
pub type Build = for<'py> fn(Python<'py>, Output) -> PyResult<Bound<'py, PyAny>>;

/// An asynchronous call's answer slot: its future, the future's loop, and how to build the
/// result.
pub struct PyReply {
    future: Py<PyAny>,
    event_loop: Py<PyAny>,
    build: Build,
    /// The writer to tell when the loop has run the callers this answer wakes; weak, so an
    /// answer kept by a loop never keeps a closed ledger's writer alive.
    writer: Weak<Writer>,
}

/// Called on a loop after the callers its delivery woke have run ([`Writer::settle`]); settles
/// the delivery when dropped uncalled too (a loop closed first), so the writer never waits for
/// it.
#[pyclass(module = "fencepost._core")]
pub struct Settled {
    writer: std::sync::Mutex<Option<Weak<Writer>>>,
}

impl Settled {
    fn fire(&self) {
        let taken = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(writer) = taken.and_then(|w| w.upgrade()) {
            writer.settle();
        }
    }
}

#[pymethods]
impl Settled {
    fn __call__(&self) {
        self.fire();
    }
}

impl Drop for Settled {
    fn drop(&mut self) {
        self.fire();
    }
}

/// Queue `op` on `writer`, to resolve `future` (an `asyncio.Future`) with `build`'s result or
/// the call's exception. Returns once queued.
pub fn submit(
    py: Python<'_>,
    writer: &Arc<Writer>,
    future: &Bound<'_, PyAny>,
    op: Op,
    build: Build,
) -> PyResult<()> {
    HOOKED.get_or_try_init(py, || {
        let hook = wrap_pyfunction!(close_gate, py)?;
        py.import("atexit")?.call_method1("register", (hook,))?;
        PyResult::Ok(())
    })?;
    let event_loop = future.call_method0("get_loop").map_err(|_| {
        args::invalid(
            py,
            "future",
            format!("must be an asyncio.Future, not {}", args::type_name(future)),
        )
    })?;
    let reply = PyReply {
        future: future.clone().unbind(),
        event_loop: event_loop.unbind(),
        build,
        writer: Arc::downgrade(writer),
    };
    writer
        .submit_async(op, Box::new(reply))
        .map_err(|e| to_pyerr(py, e))
}

static HOOKED: PyOnceLock<()> = PyOnceLock::new();
static RESOLVE_MANY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether deliveries may still attach, and how many are attached now, as one word: the
/// process that last changed it (high 32 bits), [`CLOSED`], and the count. One atomic word
/// rather than a lock and a count, because a forked child inherits both as the fork found
/// them: a count of parent threads that do not exist in the child (its `atexit` hook would
/// wait for them forever) and perhaps a lock one of them held. A word last changed in another
/// process reads as open with nothing attached.
static GATE: AtomicU64 = AtomicU64::new(0);
const CLOSED: u64 = 1 << 31;
const ATTACHED: u64 = CLOSED - 1;
/// How often the `atexit` hook looks whether the deliveries attached have left.
const GATE_POLL: Duration = Duration::from_millis(1);

/// This process's id, as the gate's high bits.
fn gate_owner() -> u64 {
    u64::from(std::process::id()) << 32
}

/// The closed bit and count of `word` in the process `owner` names.
fn gate_state(word: u64, owner: u64) -> u64 {
    if word & !(CLOSED | ATTACHED) == owner {
        word & (CLOSED | ATTACHED)
    } else {
        0
    }
}

/// Change the gate with `f` (given this process's state, `None`: leave it); whether it did.
fn update_gate(f: impl Fn(u64) -> Option<u64>) -> bool {
    let owner = gate_owner();
    GATE.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
        f(gate_state(word, owner)).map(|state| owner | state)
    })
    .is_ok()
}

/// The `atexit` hook: no delivery attaches from now on; wait (detached, so they can finish)
/// for those attached.
#[pyfunction]
fn close_gate(py: Python<'_>) {
    update_gate(|state| Some(state | CLOSED));
    py.detach(|| {
        while gate_state(GATE.load(Ordering::Acquire), gate_owner()) & ATTACHED > 0 {
            std::thread::sleep(GATE_POLL);
        }
    });
}

/// Run `f` attached, unless the gate is closed (then the answers are dropped without
/// attaching: Python frees them never, or at the next attach).
fn through_gate(f: impl for<'py> FnOnce(Python<'py>)) {
    let entered = update_gate(|state| (state & CLOSED == 0).then_some(state + 1));
    if !entered {
        return;
    }
    let _ = Python::try_attach(f);
    update_gate(|state| Some((state & CLOSED) | (state & ATTACHED).saturating_sub(1)));
}

impl AsyncReply for PyReply {
    fn deliver(self: Box<Self>, out: Result<Output>, rest: Vec<Delivery>) {
        let mut mine = Vec::with_capacity(rest.len() + 1);
        mine.push((self, out));
        for (reply, out) in rest {
            if (&*reply as &dyn Any).is::<Self>() {
                let any: Box<dyn Any + Send> = reply;
                if let Ok(reply) = any.downcast::<Self>() {
                    mine.push((reply, out));
                }
            } else {
                reply.deliver(out, Vec::new());
            }
        }
        through_gate(|py| {
            crate::py::observe::flush(py);
            resolve(py, mine);
        });
    }
}

/// Build every answer, then hand each loop its futures' answers in one call.
fn resolve(py: Python<'_>, answers: Vec<(Box<PyReply>, Result<Output>)>) {
    let resolve_many = match RESOLVE_MANY.get_or_try_init(py, || {
        PyResult::Ok(
            py.import("fencepost.aio")?
                .getattr("_resolve_many")?
                .unbind(),
        )
    }) {
        Ok(f) => f,
        Err(e) => {
            e.write_unraisable(py, None);
            return;
        }
    };
    // Few loops per group (usually one): a linear search beats hashing Python objects.
    let mut loops: Vec<(Py<PyAny>, Vec<Bound<'_, PyTuple>>)> = Vec::new();
    let mut writer = None;
    for (reply, out) in answers {
        let PyReply {
            future,
            event_loop,
            build,
            writer: w,
        } = *reply;
        writer.get_or_insert(w);
        let built = out
            .map_err(|e| to_pyerr(py, e))
            .and_then(|out| build(py, out));
        let (failed, value) = match built {
            Ok(value) => (false, value),
            Err(e) => (true, e.into_value(py).into_bound(py).into_any()),
        };
        let item = match PyTuple::new(
            py,
            [
                future.into_bound(py),
                PyBool::new(py, failed).to_owned().into_any(),
                value,
            ],
        ) {
            Ok(item) => item,
            Err(e) => {
                e.write_unraisable(py, None);
                continue;
            }
        };
        match loops.iter_mut().find(|(l, _)| l.is(&event_loop)) {
            Some((_, items)) => items.push(item),
            None => loops.push((event_loop, vec![item])),
        }
    }
    for (event_loop, items) in loops {
        let settled = writer.as_ref().and_then(Weak::upgrade).map(|w| {
            w.expect_settle();
            Settled {
                writer: std::sync::Mutex::new(Some(Arc::downgrade(&w))),
            }
        });
        let sent = PyList::new(py, items).and_then(|items| {
            let settled = match settled {
                Some(s) => Some(Py::new(py, s)?),
                None => None,
            };
            event_loop.call_method1(py, "call_soon_threadsafe", (resolve_many, items, settled))
        });
        match sent {
            Ok(_) => {}
            // A closed loop: the coroutines that awaited these futures are gone.
            Err(e) if e.is_instance_of::<PyRuntimeError>(py) => {}
            Err(e) => e.write_unraisable(py, Some(event_loop.bind(py))),
        }
    }
}
