//! Python value -> canonical [`Doc`] walk, done while attached so the serializer and the hash
//! run detached (the GIL and the store's lock are held only as long as they must be).
//!
//! Rules: `bool` is checked before `int` and is never a number; tuples and list subclasses are
//! arrays; dict subclasses are objects and their keys must be `str`; integers must lie within
//! ±(2^53−1); floats must be finite; strings must not hold lone surrogates; a container that
//! contains itself is a cycle; nesting is capped at [`MAX_DEPTH`](crate::canonical::MAX_DEPTH).
//! Errors carry the JSON path.
//!
//! This is the hot half of `fencepost.digest`, so it reads objects through the C API with
//! *borrowed* references (`PyDict_Next`, `PyList_GetItem`): under the stable ABI every
//! `Py_INCREF` is a function call, and the walk would otherwise pay two per node.
//!
//! # Why borrowing is sound
//! A borrowed pointer stays valid while its container is neither mutated nor freed, and only
//! Python code can do either. So the walk guarantees that **no Python code runs from the first
//! borrow to the last read of any borrowed pointer**:
//! - The GIL is held throughout, so no other thread runs Python code meanwhile: the module
//!   declares `gil_used = true` (`lib.rs`), so even a free-threaded interpreter runs it with
//!   the GIL on. None of the C API calls used below releases the GIL.
//! - The calls the walk makes on user objects (type checks, `PyDict_Next`, `PyList_GetItem`,
//!   `PyTuple_GetItem`, `PyUnicode_AsUTF8AndSize`, `PyLong_AsLongLongAndOverflow` on an `int`
//!   or subclass, `PyFloat_AsDouble` on a `float` or subclass) read the objects' C-level
//!   storage and never dispatch to `__hash__`, `__eq__`, `__iter__`, `__index__`, `__float__`
//!   or any other method a subclass may define.
//! - The cyclic garbage collector is disabled for the walk ([`GcPause`]): an allocation (the
//!   exception a lone surrogate raises) could otherwise start a collection whose finalizers
//!   (`__del__`, weakref callbacks) are arbitrary Python code.
//! - Error messages that need Python code (`repr` of a bad key, `str` of a huge int) are not
//!   built during the walk: the failing leaf keeps a *strong* reference to the object
//!   ([`Pending`]) and the message is rendered after the walk has ended and the collector is
//!   back on. While the error unwinds, keys are named from the tape's own copies
//!   ([`Doc::key_text`]), never by reading a borrowed key again.
//! - Cycle detection compares container addresses and never dereferences them.

use std::os::raw::c_int;
use std::ptr::addr_of_mut;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::canonical::{self, CanonicalError, Doc, PathSegment, MAX_DEPTH};

/// Convert a Python object into a canonical tape.
pub fn to_doc(obj: &Bound<'_, PyAny>) -> Result<Doc, CanonicalError> {
    // The thread's recycled buffers, or new ones sized so that a typical ~2 KB definition never
    // reallocates.
    let mut walk = Walk {
        py: obj.py(),
        doc: Doc::reuse(),
        open: Vec::with_capacity(16),
        pending: None,
    };
    let walked = {
        let _gc = GcPause::new();
        // SAFETY: `obj` is a live reference held for the whole call, we hold the GIL, and the
        // collector is paused (module docs: why borrowing is sound).
        unsafe { walk.value(obj.as_ptr()) }
            .map_err(|e| *e)
            .and_then(|()| walk.doc.check_size())
    };
    match walked {
        Ok(()) => Ok(walk.doc),
        Err(mut e) => {
            walk.doc.recycle();
            // Only now, with no borrowed pointer left to read, may Python code run.
            if let Some(pending) = walk.pending.take() {
                e.reason = pending.render(obj.py());
            }
            Err(e)
        }
    }
}

/// The cyclic garbage collector switched off for as long as this lives (see the module docs),
/// and back on afterwards if it was on before.
struct GcPause {
    was_enabled: bool,
}

impl GcPause {
    fn new() -> Self {
        // SAFETY: PyGC_Disable (stable ABI since 3.10) only flips the collector's flag; the GIL
        // is held by our caller.
        Self {
            was_enabled: unsafe { ffi::PyGC_Disable() } != 0,
        }
    }
}

impl Drop for GcPause {
    fn drop(&mut self) {
        if self.was_enabled {
            // SAFETY: as in `new`; the GIL is still held (the guard never leaves the thread).
            unsafe { ffi::PyGC_Enable() };
        }
    }
}

/// An error whose message needs Python code, rendered after the walk (see the module docs).
struct Pending {
    /// A strong reference: valid whatever the rendering's Python code does to the containers.
    obj: Py<PyAny>,
    what: Render,
}

enum Render {
    /// A dict key that is not a `str`.
    KeyNotStr,
    /// A `str` dict key holding a lone surrogate.
    KeySurrogate,
    /// An `int` outside ±(2^53−1) that does not even fit 64 bits.
    BigInt,
    /// A value of a type JSON has no form for.
    Unsupported,
}

impl Pending {
    fn render(&self, py: Python<'_>) -> String {
        let obj = self.obj.bind(py);
        match self.what {
            Render::KeyNotStr => format!(
                "dict key {} is {}, not str; JSON object keys must be strings",
                repr(obj),
                type_name(obj)
            ),
            Render::KeySurrogate => format!(
                "dict key {} contains a lone surrogate, which is not valid Unicode text",
                repr(obj)
            ),
            Render::BigInt => canonical::out_of_range_int(&big_int_text(obj)).reason,
            Render::Unsupported => format!(
                "unsupported type {}; use None, bool, int, float, str, list, tuple or dict",
                type_name(obj)
            ),
        }
    }
}

/// Errors travel boxed through the recursion: a one-word `Result` comes back in a register,
/// where the unboxed error (a `Vec` and a `String`) would be returned through memory at every
/// level of every value.
type Boxed = Box<CanonicalError>;

struct Walk<'py> {
    py: Python<'py>,
    doc: Doc,
    /// The containers on the path from the root to the current value: its length is the depth,
    /// and meeting a container in it again means a cycle.
    open: Vec<*mut ffi::PyObject>,
    /// The failing leaf's object, when its message needs Python code.
    pending: Option<Pending>,
}

impl Walk<'_> {
    /// # Safety
    /// `obj` must be a valid object pointer kept alive by its container (or the caller) for the
    /// duration of the call, with the GIL held.
    ///
    /// The exact-type fast path is inlined into the container loops, so scalars (most of a
    /// document) never pay for a call frame; containers and everything rarer go out of line.
    #[allow(
        clippy::inline_always,
        reason = "measured: keeps scalars out of call frames"
    )]
    #[inline(always)]
    unsafe fn value(&mut self, obj: *mut ffi::PyObject) -> Result<(), Boxed> {
        // SAFETY (whole body): the caller's contract; every pointer we read comes from a C API
        // call on a live object and is borrowed from a container we keep alive.
        unsafe {
            // Exact-type pointer compares first (no function call under abi3).
            let ty = ffi::Py_TYPE(obj);
            if ty == addr_of_mut!(ffi::PyUnicode_Type) {
                self.str(obj)
            } else if ty == addr_of_mut!(ffi::PyLong_Type) {
                self.int(obj)
            } else if ty == addr_of_mut!(ffi::PyFloat_Type) {
                self.doc.float(ffi::PyFloat_AsDouble(obj)).map_err(Box::new)
            } else if ty == addr_of_mut!(ffi::PyDict_Type) {
                self.dict(obj)
            } else if ty == addr_of_mut!(ffi::PyList_Type) {
                self.list(obj)
            } else if obj == ffi::Py_None() {
                self.doc.null();
                Ok(())
            } else if obj == ffi::Py_True() {
                self.doc.bool(true);
                Ok(())
            } else if obj == ffi::Py_False() {
                self.doc.bool(false);
                Ok(())
            } else {
                self.other(obj)
            }
        }
    }

    /// Tuples and subclasses of the JSON types (`bool` cannot be subclassed, and both its
    /// instances were handled above, so `int` subclasses here are never booleans).
    #[inline(never)]
    unsafe fn other(&mut self, obj: *mut ffi::PyObject) -> Result<(), Boxed> {
        // SAFETY: as for `value`.
        unsafe {
            if ffi::PyTuple_Check(obj) != 0 {
                self.sequence(obj, ffi::PyTuple_Size, ffi::PyTuple_GetItem)
            } else if ffi::PyUnicode_Check(obj) != 0 {
                self.str(obj)
            } else if ffi::PyLong_Check(obj) != 0 {
                self.int(obj)
            } else if ffi::PyFloat_Check(obj) != 0 {
                self.doc.float(ffi::PyFloat_AsDouble(obj)).map_err(Box::new)
            } else if ffi::PyDict_Check(obj) != 0 {
                self.dict(obj)
            } else if ffi::PyList_Check(obj) != 0 {
                self.list(obj)
            } else {
                Err(self.defer(obj, Render::Unsupported))
            }
        }
    }

    #[inline]
    unsafe fn str(&mut self, obj: *mut ffi::PyObject) -> Result<(), Boxed> {
        // SAFETY: `obj` is a str (checked by the caller).
        let s = unsafe { Self::utf8(obj) }.ok_or_else(|| Box::new(lone_surrogate()))?;
        self.doc.str(s);
        Ok(())
    }

    unsafe fn int(&mut self, obj: *mut ffi::PyObject) -> Result<(), Boxed> {
        let mut overflow: c_int = 0;
        // SAFETY: `obj` is an int (checked by the caller).
        let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(obj, &raw mut overflow) };
        if overflow != 0 || (v == -1 && unsafe { !ffi::PyErr_Occurred().is_null() }) {
            unsafe { ffi::PyErr_Clear() };
            return Err(self.defer(obj, Render::BigInt));
        }
        self.doc.int(v).map_err(Box::new)
    }

    #[inline(never)]
    unsafe fn dict(&mut self, obj: *mut ffi::PyObject) -> Result<(), Boxed> {
        self.enter(obj)?;
        let open = self.doc.begin_object();
        let (mut pos, mut len) = (0, 0);
        let mut key: *mut ffi::PyObject = std::ptr::null_mut();
        let mut value: *mut ffi::PyObject = std::ptr::null_mut();
        // SAFETY: PyDict_Next yields borrowed references owned by the dict, which the caller
        // keeps alive; no Python code runs in the loop (module docs), so the dict is neither
        // mutated nor freed while we hold them.
        while unsafe { ffi::PyDict_Next(obj, &raw mut pos, &raw mut key, &raw mut value) } != 0 {
            // Exact-type compare first: PyUnicode_Check is a function call under abi3.
            if unsafe {
                ffi::Py_TYPE(key) != addr_of_mut!(ffi::PyUnicode_Type)
                    && ffi::PyUnicode_Check(key) == 0
            } {
                return Err(self.defer(key, Render::KeyNotStr));
            }
            // SAFETY: `key` is a str (checked above), borrowed from the live dict.
            let Some(k) = (unsafe { Self::utf8(key) }) else {
                return Err(self.defer(key, Render::KeySurrogate));
            };
            let at = self.doc.key(k);
            // SAFETY: `value` is borrowed from the live dict, as above.
            if let Err(e) = unsafe { self.value(value) } {
                // The tape's copy names the key: by now the failing leaf may have raised (and
                // a raise allocates), so the borrowed key is not read again.
                return Err(Box::new(e.within(PathSegment::Key(self.doc.key_text(at)))));
            }
            len += 1;
        }
        self.doc.end_object(open, len);
        self.open.pop();
        Ok(())
    }

    unsafe fn list(&mut self, obj: *mut ffi::PyObject) -> Result<(), Boxed> {
        // SAFETY: forwarded contract; `obj` is a list.
        unsafe { self.sequence(obj, ffi::PyList_Size, ffi::PyList_GetItem) }
    }

    /// Lists and tuples: `size` and `get` are the matching C API pair (borrowed items).
    #[inline(never)]
    unsafe fn sequence(
        &mut self,
        obj: *mut ffi::PyObject,
        size: unsafe extern "C" fn(*mut ffi::PyObject) -> ffi::Py_ssize_t,
        get: unsafe extern "C" fn(*mut ffi::PyObject, ffi::Py_ssize_t) -> *mut ffi::PyObject,
    ) -> Result<(), Boxed> {
        self.enter(obj)?;
        let open = self.doc.begin_array();
        // SAFETY: `obj` matches `size`/`get`; indices stay below the size read here, and no
        // Python code runs between the reads (the size cannot change under us).
        let n = unsafe { size(obj) };
        for i in 0..n {
            let item = unsafe { get(obj, i) };
            if let Err(e) = unsafe { self.value(item) } {
                return Err(Box::new(e.within(PathSegment::Index(i.unsigned_abs()))));
            }
        }
        self.doc.end_array(open, n.unsigned_abs());
        self.open.pop();
        Ok(())
    }

    fn enter(&mut self, obj: *mut ffi::PyObject) -> Result<(), Boxed> {
        if self.open.contains(&obj) {
            return Err(fail(
                "cycle: this container contains itself; JSON values must be trees",
            ));
        }
        if self.open.len() >= MAX_DEPTH {
            return Err(fail(format!(
                "nested deeper than {MAX_DEPTH} levels; flatten the structure"
            )));
        }
        self.open.push(obj);
        Ok(())
    }

    /// The UTF-8 of a `str`, or `None` for a lone surrogate (the only thing UTF-8 cannot hold).
    ///
    /// `PyUnicode_AsUTF8AndSize` (stable ABI since 3.10) is zero-copy for ASCII and caches the
    /// encoding on the object otherwise, so the slice lives as long as the string does.
    unsafe fn utf8<'a>(s: *mut ffi::PyObject) -> Option<&'a str> {
        let mut size: ffi::Py_ssize_t = 0;
        // SAFETY: `s` is a str; the buffer belongs to it and stays valid while it lives.
        let ptr = unsafe { ffi::PyUnicode_AsUTF8AndSize(s, &raw mut size) };
        if ptr.is_null() {
            unsafe { ffi::PyErr_Clear() };
            return None;
        }
        // SAFETY: CPython guarantees `size` bytes of valid UTF-8 at `ptr`.
        Some(unsafe {
            std::str::from_utf8_unchecked(std::slice::from_raw_parts(
                ptr.cast(),
                size.unsigned_abs(),
            ))
        })
    }

    /// Keep a strong reference to the failing `obj` so that its message can be rendered once
    /// the walk is over; the returned error's reason is filled in by [`to_doc`].
    #[allow(
        clippy::unnecessary_box_returns,
        reason = "the walk's error type is deliberately boxed"
    )]
    fn defer(&mut self, obj: *mut ffi::PyObject, what: Render) -> Boxed {
        // SAFETY: `obj` is live (borrowed from its container, which no Python code has run
        // against since); from_borrowed_ptr takes a new strong reference (an incref, which
        // runs no Python code).
        let obj = unsafe { Bound::from_borrowed_ptr(self.py, obj).unbind() };
        self.pending = Some(Pending { obj, what });
        fail(String::new())
    }
}

fn lone_surrogate() -> CanonicalError {
    CanonicalError::new(
        "string contains a lone surrogate (U+D800..U+DFFF), which is not valid Unicode text",
    )
}

fn big_int_text(i: &Bound<'_, PyAny>) -> String {
    // str() refuses ints above 4300 digits (CPython's int_max_str_digits); say so instead.
    i.str()
        .map_or_else(|_| "of more than 4300 digits".to_owned(), |s| s.to_string())
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "<unrepresentable>".to_owned(), |r| r.to_string())
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "<unknown>".to_owned(), |n| n.to_string())
}

#[allow(
    clippy::unnecessary_box_returns,
    reason = "the walk's error type is deliberately boxed"
)]
fn fail(reason: impl Into<String>) -> Boxed {
    Box::new(CanonicalError::new(reason))
}
