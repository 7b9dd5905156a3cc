//! Python arguments -> owned Rust values, read while attached.
//!
//! Every reader names the argument it refuses: a wrong value raises `InvalidArgument` whose
//! `argument` is the facade's keyword (or the list argument an item came from), so the caller
//! sees which of a dozen keywords was wrong. JSON arguments are walked into a canonical tape
//! here and serialized later, detached (`into_request` on the argument structs).
//!
//! A method with many keywords takes them as one dict (the facade builds it from its keyword
//! arguments, the stub types it as a `TypedDict`) and reads it through [`Fields`], the same
//! reader the dict items of `steps`, `units` and `finishes` go through. One dict literal is the
//! cheapest way to pass a dozen named values: `**kwargs` would build two dicts (the
//! interpreter's, then a copy). The keyword sets and their readers are in [`keywords`].

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyNone, PyString, PyTuple};

use crate::canonical::Json;
use crate::canonical::{self, Doc};
use crate::errors::LedgerError;
use crate::leases::Fence;
use crate::py::convert;
use crate::py::errors::to_pyerr;

mod keywords;

pub use keywords::{
    run_filter, unit_arg, units_arg, ChildRunArgs, FinishArgs, QueuedRunArgs, StartRunArgs,
    StepResultArgs,
};

/// `InvalidArgument` naming `argument`.
pub fn invalid(py: Python<'_>, argument: &str, message: impl Into<String>) -> PyErr {
    to_pyerr(py, LedgerError::invalid(argument, message))
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// Walk `value` (the Python argument named `argument`) into a canonical tape while attached;
/// callers then serialize and hash it detached.
pub fn read_doc(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    argument: &str,
) -> PyResult<canonical::Doc> {
    convert::to_doc(value).map_err(|e| to_pyerr(py, LedgerError::canonical(argument, e)))
}

/// A required `str` argument, refused with `InvalidArgument` naming it. The text rules of
/// [`crate::ids::check_text`] apply (no NUL; identifiers and keys bounded).
pub fn text(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<String> {
    let s = any_str(obj, argument)?;
    crate::ids::check_text(argument, &s).map_err(|e| to_pyerr(obj.py(), e))?;
    Ok(s)
}

/// A `str` that is free text wherever it appears (a step's title or instructions inside
/// `steps`, a path or URL): NUL refused, no length bound.
fn prose(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<String> {
    let s = any_str(obj, argument)?;
    crate::ids::check_prose(argument, &s).map_err(|e| to_pyerr(obj.py(), e))?;
    Ok(s)
}

fn any_str(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<String> {
    obj.extract::<String>().map_err(|_| {
        let message = if obj.is_instance_of::<PyString>() {
            // The only str that is not UTF-8: one holding half of a surrogate pair.
            "contains a lone surrogate (U+D800..U+DFFF), which is not valid Unicode text".to_owned()
        } else {
            format!("must be a str, not {}", type_name(obj))
        };
        invalid(obj.py(), argument, message)
    })
}

/// `None`, or what `read` makes of the argument.
fn optional<'py, T>(
    obj: &Bound<'py, PyAny>,
    argument: &str,
    read: fn(&Bound<'py, PyAny>, &str) -> PyResult<T>,
) -> PyResult<Option<T>> {
    if obj.is_none() {
        Ok(None)
    } else {
        read(obj, argument).map(Some)
    }
}

/// An optional `str` argument.
pub fn opt_text(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<String>> {
    optional(obj, argument, text)
}

/// An optional free-text `str` argument.
pub fn opt_prose(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<String>> {
    optional(obj, argument, prose)
}

/// A `bool` flag; `0`, `1` or `None` are refused rather than guessed at.
pub fn flag(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<bool> {
    obj.cast::<PyBool>()
        .map(PyBoolMethods::is_true)
        .map_err(|_| {
            invalid(
                obj.py(),
                argument,
                format!("must be True or False, not {}", type_name(obj)),
            )
        })
}

/// An `int` argument (`bool` refused: `True` is not a count).
pub fn int(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(invalid(obj.py(), argument, "must be an int, not bool"));
    }
    obj.extract::<i64>().map_err(|_| {
        let message = if obj.is_instance_of::<PyInt>() {
            "is out of range: it must fit in a signed 64-bit integer".to_owned()
        } else {
            format!("must be an int, not {}", type_name(obj))
        };
        invalid(obj.py(), argument, message)
    })
}

pub fn opt_int(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<i64>> {
    optional(obj, argument, int)
}

/// An optional JSON argument, walked now and serialized later (detached).
pub fn opt_doc(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<Doc>> {
    if obj.is_none() {
        Ok(None)
    } else {
        read_doc(obj.py(), obj, argument).map(Some)
    }
}

fn json(doc: Option<Doc>) -> Option<Json> {
    doc.map(|d| Json::new(d.to_vec()))
}

fn json_text(doc: Option<Doc>) -> Option<String> {
    doc.map(|d| canonical::into_text(d.to_vec()))
}

/// An optional list of `str` (the facade turns one `str` or any iterable into a list).
pub fn str_list(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Option<Vec<String>>> {
    if obj.is_none() {
        return Ok(None);
    }
    let Ok(list) = obj.cast::<PyList>() else {
        return Err(invalid(obj.py(), argument, "must be a list of str"));
    };
    list.iter()
        .map(|item| text(&item, argument))
        .collect::<PyResult<_>>()
        .map(Some)
}

/// The dicts of a list argument (`steps`, `units`, `finishes`).
fn dicts<'py>(obj: &Bound<'py, PyAny>, argument: &str) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = obj.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = obj.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Err(invalid(
            obj.py(),
            argument,
            format!("must be a list of dicts, not {}", type_name(obj)),
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item.cast_into::<PyDict>() {
            Ok(d) => out.push(d),
            Err(e) => {
                return Err(invalid(
                    obj.py(),
                    argument,
                    format!(
                        "item {i} must be a dict, not {}",
                        type_name(&e.into_inner())
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// A keyword set: its names, and the same names as interned Python strings. The keys of a dict
/// literal are interned, so a key is matched by pointer before any text is compared.
struct Keys {
    names: &'static [&'static str],
    interned: PyOnceLock<Vec<Py<PyString>>>,
}

/// The most keywords a set has (a queued run: `reserve_run`'s, with `not_before` in two).
const MAX_KEYS: usize = 16;

impl Keys {
    const fn new(names: &'static [&'static str]) -> Self {
        assert!(names.len() <= MAX_KEYS);
        Self {
            names,
            interned: PyOnceLock::new(),
        }
    }

    /// The index of `key` in the set, or its text (or type) to show when it is not in it.
    fn position(&self, key: &Bound<'_, PyAny>) -> Result<usize, String> {
        let interned = self.interned.get_or_init(key.py(), || {
            self.names
                .iter()
                .map(|n| PyString::intern(key.py(), n).unbind())
                .collect()
        });
        if let Some(i) = interned.iter().position(|k| k.as_ptr() == key.as_ptr()) {
            return Ok(i);
        }
        // Borrowed UTF-8 of the key (no copy): a key built at run time is not interned.
        let key_str = key.cast::<PyString>().ok();
        let name = key_str.as_ref().and_then(|s| s.to_str().ok());
        match name.and_then(|n| self.names.iter().position(|&known| known == n)) {
            Some(i) => Ok(i),
            None => Err(name.map_or_else(
                || format!("of type {}", type_name(key)),
                |n| format!("{n:?}"),
            )),
        }
    }
}

/// The keywords a method takes as one dict, or the items of one dict argument, read by
/// iterating the dict once: a key is never looked up, so no key's own `__eq__` or `__hash__`
/// runs.
struct Fields<'py> {
    keys: &'static Keys,
    /// By the key's index in `keys`; `None` where the dict leaves the key out.
    values: [Option<Bound<'py, PyAny>>; MAX_KEYS],
    none: Borrowed<'py, 'py, PyNone>,
}

impl<'py> Fields<'py> {
    /// The keywords `keys` of a method, passed as one dict. Only the facade calls these
    /// methods, always with known keywords, so an unknown one is the `TypeError` Python raises
    /// for a bad keyword; a left-out one reads as `None`.
    fn keywords(d: &Bound<'py, PyDict>, keys: &'static Keys) -> PyResult<Self> {
        Self::collect(d, keys, |shown| {
            PyTypeError::new_err(format!("unexpected keyword argument {shown}"))
        })
    }

    /// Item `i` of the list argument `argument`; a key that is not a `str` or not one of `keys`
    /// (a typo must not be silently ignored) is refused.
    fn item(
        d: &Bound<'py, PyDict>,
        argument: &str,
        i: usize,
        keys: &'static Keys,
    ) -> PyResult<Self> {
        Self::collect(d, keys, |shown| {
            invalid(
                d.py(),
                argument,
                format!(
                    "item {i} has unknown key {shown}; allowed: {}",
                    keys.names.join(", ")
                ),
            )
        })
    }

    /// The items of `d` whose keys are among `keys`; `unknown` builds the error for any other
    /// key (shown as its text, or its type when it is not a `str`).
    fn collect(
        d: &Bound<'py, PyDict>,
        keys: &'static Keys,
        unknown: impl FnOnce(String) -> PyErr,
    ) -> PyResult<Self> {
        let mut values = [const { None }; MAX_KEYS];
        for (k, v) in d.iter() {
            match keys.position(&k) {
                // Two keys of the same text (a `str` subclass can make that) read as the first.
                Ok(i) => {
                    values[i].get_or_insert(v);
                }
                Err(shown) => return Err(unknown(shown)),
            }
        }
        Ok(Self {
            keys,
            values,
            none: PyNone::get(d.py()),
        })
    }

    /// The value under `key`, or `None` when it was left out.
    fn get(&self, key: &str) -> &Bound<'py, PyAny> {
        let i = self.keys.names.iter().position(|&k| k == key);
        debug_assert!(
            i.is_some(),
            "{key:?} is not in the keyword set {:?}",
            self.keys.names
        );
        match i.and_then(|i| self.values[i].as_ref()) {
            Some(v) => v,
            None => self.none.as_any(),
        }
    }
}

/// A claim (`fencepost.Claim`) as a fence: its token is hashed here, before any transaction.
pub fn fence_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Fence>> {
    if obj.is_none() {
        return Ok(None);
    }
    claim_arg(obj).map(|(fence, _)| Some(fence))
}

/// A `Claim` argument: the fence (token hashed now) and the plaintext token.
pub fn claim_arg(obj: &Bound<'_, PyAny>) -> PyResult<(Fence, String)> {
    if obj.is_none() {
        // Most often the `None` that `claim()` answers while another owner's lease is live.
        return Err(invalid(
            obj.py(),
            "claim",
            "is None; ledger.claim() returns None while another owner's lease on the run is \
             live, so check its result before passing it on (or use claim_next)",
        ));
    }
    let read = || -> PyResult<(Fence, String)> {
        let run_id: String = obj.getattr("run_id")?.extract()?;
        let generation: i64 = obj.getattr("generation")?.extract()?;
        let token: String = obj.getattr("token")?.extract()?;
        Ok((Fence::from_token(&run_id, generation, &token), token))
    };
    read().map_err(|_| {
        invalid(
            obj.py(),
            "claim",
            "must be the Claim returned by ledger.claim() or prepare_or_adopt()",
        )
    })
}
