//! Python value -> canonical [`Value`] walk, done while attached so the serializer and the hash
//! can run detached (STYLE §6).
//!
//! Rules (DESIGN §4): `bool` is checked before `int` and is never a number; tuples and list
//! subclasses are arrays; dict subclasses are objects and their keys must be `str`; integers
//! must lie within ±(2^53−1); floats must be finite; strings must not hold lone surrogates;
//! a container that contains itself is a cycle; nesting is capped at
//! [`canonical::MAX_DEPTH`](crate::canonical::MAX_DEPTH). Errors carry the JSON path.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::canonical::{self, CanonicalError, PathSegment, Value, MAX_DEPTH};

/// Convert a Python object into a canonical value.
pub fn to_value(obj: &Bound<'_, PyAny>) -> Result<Value, CanonicalError> {
    let mut open = Vec::new();
    walk(obj, &mut open)
}

/// `open` holds the addresses of the containers on the path from the root to `obj`: its length
/// is the depth, and finding a container in it again means a cycle.
fn walk(obj: &Bound<'_, PyAny>, open: &mut Vec<usize>) -> Result<Value, CanonicalError> {
    // Most common types first; exact `bool` before `int` because bool subclasses int.
    if let Ok(s) = obj.cast::<PyString>() {
        return string(s).map(Value::Str);
    }
    if obj.is_exact_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.is_truthy().unwrap_or(false)));
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        return match i.extract::<i64>() {
            Ok(v) => canonical::check_int(v),
            Err(_) => Err(canonical::out_of_range_int(&big_int_text(i))),
        };
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return canonical::check_float(f.value());
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        enter(obj, open)?;
        let mut members = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let Ok(ks) = k.cast::<PyString>() else {
                return Err(CanonicalError::new(format!(
                    "dict key {} is {}, not str; JSON object keys must be strings",
                    repr(&k),
                    type_name(&k)
                )));
            };
            let key = string(ks).map_err(|_| {
                CanonicalError::new(format!(
                    "dict key {} contains a lone surrogate, which is not valid Unicode text",
                    repr(&k)
                ))
            })?;
            let value = walk(&v, open).map_err(|e| e.within(PathSegment::Key(key.clone())))?;
            members.push((key, value));
        }
        open.pop();
        return Ok(Value::Object(members));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        enter(obj, open)?;
        let mut items = Vec::with_capacity(l.len());
        for (i, item) in l.iter().enumerate() {
            items.push(walk(&item, open).map_err(|e| e.within(PathSegment::Index(i)))?);
        }
        open.pop();
        return Ok(Value::Array(items));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        enter(obj, open)?;
        let mut items = Vec::with_capacity(t.len());
        for (i, item) in t.iter().enumerate() {
            items.push(walk(&item, open).map_err(|e| e.within(PathSegment::Index(i)))?);
        }
        open.pop();
        return Ok(Value::Array(items));
    }
    Err(CanonicalError::new(format!(
        "unsupported type {}; use None, bool, int, float, str, list, tuple or dict",
        type_name(obj)
    )))
}

fn enter(obj: &Bound<'_, PyAny>, open: &mut Vec<usize>) -> Result<(), CanonicalError> {
    let addr = obj.as_ptr() as usize;
    if open.contains(&addr) {
        return Err(CanonicalError::new(
            "cycle: this container contains itself; JSON values must be trees",
        ));
    }
    if open.len() >= MAX_DEPTH {
        return Err(CanonicalError::new(format!(
            "nested deeper than {MAX_DEPTH} levels; flatten the structure"
        )));
    }
    open.push(addr);
    Ok(())
}

fn string(s: &Bound<'_, PyString>) -> Result<String, CanonicalError> {
    // `to_str` is PyUnicode_AsUTF8AndSize (stable ABI since 3.10): zero-copy for ASCII and
    // cached for the rest; it fails exactly on lone surrogates, which UTF-8 cannot encode.
    s.to_str().map(str::to_owned).map_err(|_| {
        CanonicalError::new(
            "string contains a lone surrogate (U+D800..U+DFFF), which is not valid Unicode text",
        )
    })
}

fn big_int_text(i: &Bound<'_, PyInt>) -> String {
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
