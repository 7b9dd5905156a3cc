//! RFC 8785 (JSON Canonicalization Scheme) over a small owned [`Value`] tree.
//!
//! Guarantees (DESIGN §4 "Canonical JSON"):
//! - object members are ordered by the UTF-16 code units of their keys (RFC 8785 §3.2.3);
//! - numbers are written with ECMAScript `Number::toString` (RFC 8785 §3.2.2.3, via `ryu-js`);
//! - strings use the minimal escapes of RFC 8785 §3.2.2.2 and are otherwise raw UTF-8;
//! - no whitespace.
//!
//! The tree is built by a front end (the Python walk in `py::convert`, or Rust callers) that
//! enforces I-JSON limits; this module only orders and writes. It never touches Python, so the
//! Python binding serializes and hashes with the interpreter detached.

use std::cmp::Ordering;
use std::fmt::Write as _;

use sha2::{Digest as _, Sha256};

/// The largest integer magnitude that survives a round trip through an IEEE-754 double
/// (I-JSON, RFC 7493 §2.2): integers outside `±(2^53 − 1)` are rejected, never rounded.
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Containers nested deeper than this are rejected with a clear error instead of exhausting the
/// stack. The root container is at depth 1, so a 512-deep list is accepted and a 513-deep one is
/// not. (`orjson` stops at 255, `serde_json` at 128; workflow documents stay far below either.)
pub const MAX_DEPTH: usize = 512;

/// A JSON value ready to be canonicalized. Object members keep insertion order until
/// [`to_vec`] sorts them.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// An integer already checked to lie within `±MAX_SAFE_INTEGER`.
    Int(i64),
    /// A finite double (NaN and infinities are rejected by the front end).
    Float(f64),
    /// A string of Unicode scalar values (lone surrogates cannot be represented).
    Str(String),
    /// An array.
    Array(Vec<Value>),
    /// An object; keys are unique (the front end guarantees it).
    Object(Vec<(String, Value)>),
}

/// One step of a JSON path, collected while an error unwinds so the happy path pays nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSegment {
    /// An object member.
    Key(String),
    /// An array element.
    Index(usize),
}

/// Why a value cannot be canonicalized, and where: `path` is `$`, `$.a[3].b` or
/// `$["key with spaces"]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot canonicalize the value at {}: {reason}", render_path(.segments))]
pub struct CanonicalError {
    /// Path segments from the root, outermost first.
    pub segments: Vec<PathSegment>,
    /// What is wrong with the value at that path and how to fix it.
    pub reason: String,
}

impl CanonicalError {
    /// An error at the current position; callers add segments with [`CanonicalError::within`]
    /// as the error travels back towards the root.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            segments: Vec::new(),
            reason: reason.into(),
        }
    }

    /// Prefix the path with one more (outer) segment.
    #[must_use]
    pub fn within(mut self, segment: PathSegment) -> Self {
        self.segments.push(segment);
        self
    }

    /// The JSON path of the offending value, e.g. `$.a[3].b`.
    pub fn path(&self) -> String {
        render_path(&self.segments)
    }
}

/// Segments are stored innermost first (they are pushed while unwinding).
fn render_path(segments: &[PathSegment]) -> String {
    let mut out = String::from("$");
    for seg in segments.iter().rev() {
        match seg {
            PathSegment::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
            PathSegment::Key(k) if is_identifier(k) => {
                out.push('.');
                out.push_str(k);
            }
            PathSegment::Key(k) => {
                let mut quoted = Vec::with_capacity(k.len() + 2);
                write_string(&mut quoted, k);
                out.push('[');
                out.push_str(&String::from_utf8_lossy(&quoted));
                out.push(']');
            }
        }
    }
    out
}

fn is_identifier(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Check an integer against the I-JSON range.
pub fn check_int(value: i64) -> Result<Value, CanonicalError> {
    if (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&value) {
        Ok(Value::Int(value))
    } else {
        Err(out_of_range_int(&value.to_string()))
    }
}

/// The error for an integer outside `±(2^53 − 1)`; `shown` is its decimal text.
pub fn out_of_range_int(shown: &str) -> CanonicalError {
    CanonicalError::new(format!(
        "integer {shown} is outside ±(2^53-1) and cannot be represented exactly in JSON \
         (RFC 7493); store it as a string"
    ))
}

/// Check a double: NaN and infinities have no JSON form.
pub fn check_float(value: f64) -> Result<Value, CanonicalError> {
    if value.is_finite() {
        Ok(Value::Float(value))
    } else {
        Err(CanonicalError::new(format!(
            "{value} is not a JSON number; use null or a string for non-finite values"
        )))
    }
}

/// Order two keys by their UTF-16 code units (RFC 8785 §3.2.3).
///
/// UTF-8 byte order equals code point order, which equals UTF-16 order except when a character
/// in U+E000..=U+FFFF (UTF-8 lead byte 0xEE/0xEF) meets a supplementary character (lead byte
/// 0xF0..=0xF4): in UTF-16 the latter starts with a surrogate (0xD800..) and sorts first. Only
/// the first differing byte matters; if it is a continuation byte, both characters share their
/// lead byte and hence their UTF-16 class.
pub fn cmp_utf16(left: &str, right: &str) -> Ordering {
    let (lb, rb) = (left.as_bytes(), right.as_bytes());
    let Some(at) = lb.iter().zip(rb).position(|(l, r)| l != r) else {
        return lb.len().cmp(&rb.len());
    };
    let (l, r) = (lb[at], rb[at]);
    let high_bmp = |byte: u8| byte == 0xEE || byte == 0xEF;
    let supplementary = |byte: u8| byte >= 0xF0;
    if (high_bmp(l) && supplementary(r)) || (supplementary(l) && high_bmp(r)) {
        r.cmp(&l)
    } else {
        l.cmp(&r)
    }
}

/// Sort every object's members, recursively, into canonical order.
fn sort_members(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(sort_members),
        Value::Object(members) => {
            members.sort_unstable_by(|(a, _), (b, _)| cmp_utf16(a, b));
            for (_, v) in members.iter_mut() {
                sort_members(v);
            }
        }
        _ => {}
    }
}

/// The canonical UTF-8 bytes of `value` (RFC 8785).
pub fn to_vec(mut value: Value) -> Vec<u8> {
    sort_members(&mut value);
    let mut out = Vec::with_capacity(256);
    write_value(
        &mut out,
        &value,
        &mut ryu_js::Buffer::new(),
        &mut itoa::Buffer::new(),
    );
    out
}

fn write_value(out: &mut Vec<u8>, value: &Value, fb: &mut ryu_js::Buffer, ib: &mut itoa::Buffer) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Int(i) => out.extend_from_slice(ib.format(*i).as_bytes()),
        Value::Float(f) => out.extend_from_slice(fb.format_finite(*f).as_bytes()),
        Value::Str(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item, fb, ib);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            out.push(b'{');
            for (i, (key, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, key);
                out.push(b':');
                write_value(out, item, fb, ib);
            }
            out.push(b'}');
        }
    }
}

/// Write `s` as a JSON string with RFC 8785's minimal escapes: `"` and `\`, the two-letter forms
/// for \b \f \n \r \t, `\u00xx` (lowercase hex) for the other controls, everything else raw.
fn write_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if short.is_empty() {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        } else {
            out.extend_from_slice(short);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// `"sha256:" + lowercase hex(SHA-256(bytes))`, the one textual digest form (`PRIOR_ART` C4.2).
pub fn digest_bytes(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in hash {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// Canonicalize and hash in one call.
pub fn digest(value: Value) -> String {
    digest_bytes(&to_vec(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(members: &[(&str, Value)]) -> Value {
        Value::Object(
            members
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        )
    }

    fn canon(v: Value) -> String {
        String::from_utf8(to_vec(v)).unwrap()
    }

    #[test]
    fn orders_keys_by_utf16_code_units() {
        // U+E000 is one code unit 0xE000; U+1F600 starts with the surrogate 0xD83D.
        let v = obj(&[
            ("\u{e000}", Value::Int(1)),
            ("\u{1f600}", Value::Int(2)),
            ("a", Value::Int(3)),
        ]);
        assert_eq!(canon(v), "{\"a\":3,\"\u{1f600}\":2,\"\u{e000}\":1}");
        // Integer-like keys sort as strings, not numbers (the JavaScript own-property trap).
        let v = obj(&[
            ("b", Value::Int(1)),
            ("10", Value::Int(2)),
            ("9", Value::Int(3)),
        ]);
        assert_eq!(canon(v), r#"{"10":2,"9":3,"b":1}"#);
        assert_eq!(cmp_utf16("ab", "abc"), Ordering::Less);
        assert_eq!(cmp_utf16("\u{ffff}", "\u{10000}"), Ordering::Greater);
        assert_eq!(cmp_utf16("\u{d7ff}", "\u{10000}"), Ordering::Less);
    }

    #[test]
    fn formats_numbers_like_ecmascript() {
        let cases = [
            (0.0, "0"),
            (-0.0, "0"),
            (56.0, "56"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e-7, "1e-7"),
            (0.000_001, "0.000001"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (0.1 + 0.2, "0.30000000000000004"),
        ];
        for (f, want) in cases {
            assert_eq!(canon(check_float(f).unwrap()), want, "{f:e}");
        }
        assert_eq!(
            canon(check_int(MAX_SAFE_INTEGER).unwrap()),
            "9007199254740991"
        );
        assert_eq!(
            canon(check_int(-MAX_SAFE_INTEGER).unwrap()),
            "-9007199254740991"
        );
        assert!(check_int(MAX_SAFE_INTEGER + 1).is_err());
        assert!(check_int(i64::MIN).is_err());
        assert!(check_float(f64::NAN).is_err());
        assert!(check_float(f64::NEG_INFINITY).is_err());
    }

    #[test]
    fn escapes_minimally() {
        let v = Value::Str("\"\\/\u{8}\u{c}\n\r\t\u{0}\u{1f}\u{7f}é\u{2028}".to_owned());
        assert_eq!(
            canon(v),
            "\"\\\"\\\\/\\b\\f\\n\\r\\t\\u0000\\u001f\u{7f}é\u{2028}\""
        );
    }

    #[test]
    fn renders_paths() {
        let e = CanonicalError::new("bad")
            .within(PathSegment::Key("b".into()))
            .within(PathSegment::Index(3))
            .within(PathSegment::Key("a".into()));
        assert_eq!(e.path(), "$.a[3].b");
        let e = CanonicalError::new("bad").within(PathSegment::Key("two words\n".into()));
        assert_eq!(e.path(), r#"$["two words\n"]"#);
        assert_eq!(CanonicalError::new("bad").path(), "$");
        assert!(e.to_string().contains("two words"));
    }

    #[test]
    fn digests_with_prefix() {
        // sha256 of the two bytes `{}`.
        assert_eq!(
            digest(Value::Object(vec![])),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        let nested = Value::Array(vec![
            Value::Null,
            Value::Bool(true),
            obj(&[("k", Value::Bool(false))]),
        ]);
        assert_eq!(canon(nested), r#"[null,true,{"k":false}]"#);
    }
}
