//! RFC 8785 (JSON Canonicalization Scheme): canonical bytes and their `sha256:` digests.
//!
//! Every value this module writes has:
//! - object members ordered by the UTF-16 code units of their keys (RFC 8785 §3.2.3);
//! - numbers as ECMAScript `Number::toString` writes them (RFC 8785 §3.2.2.3, via `ryu-js`);
//! - strings with the minimal escapes of RFC 8785 §3.2.2.2, otherwise raw UTF-8;
//! - no whitespace.
//!
//! A value reaches the writer as a [`Doc`]: a flat pre-order tape of nodes plus one buffer
//! holding every string's UTF-8. The Python walk (`py::convert`) fills the tape directly; Rust
//! callers build the small owned [`Value`] tree and write it through a tape ([`to_vec`]). The tape itself refuses what a JSON number cannot hold exactly (integers outside
//! ±(2^53−1), NaN and infinities: [`Doc::int`], [`Doc::float`]) and documents past its 32-bit
//! offsets ([`Doc::check_size`]); the front end refuses what only it can see (non-string keys,
//! cycles, nesting past [`MAX_DEPTH`], lone surrogates, unsupported types). Objects are sorted
//! only when written, and a digest is hashed while it is written ([`Doc::digest`]).
//!
//! [`Json`] is canonical text with its digest, made before a transaction begins so that the
//! write lock covers only SQL. Nothing here touches Python, so the binding serializes and
//! hashes with the interpreter detached.

use std::cell::Cell;
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
/// the writer sorts them.
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
                write_string(&mut quoted, k.as_bytes());
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
pub fn cmp_utf16(left: &[u8], right: &[u8]) -> Ordering {
    let Some(at) = left.iter().zip(right).position(|(l, r)| l != r) else {
        return left.len().cmp(&right.len());
    };
    let (l, r) = (left[at], right[at]);
    let high_bmp = |byte: u8| byte == 0xEE || byte == 0xEF;
    let supplementary = |byte: u8| byte >= 0xF0;
    if (high_bmp(l) && supplementary(r)) || (supplementary(l) && high_bmp(r)) {
        r.cmp(&l)
    } else {
        l.cmp(&r)
    }
}

/// One node of a [`Doc`] tape.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A string value: a byte range of [`Doc::text`]; `plain` when it needs no escapes (decided
    /// while the bytes are hot in cache, so the writer copies without scanning).
    Str {
        start: u32,
        len: u32,
        plain: bool,
    },
    /// An object key, always directly followed by its value's subtree.
    Key {
        start: u32,
        len: u32,
        plain: bool,
    },
    /// `len` elements follow; `span` counts every node of the subtree below this one.
    Array {
        len: u32,
        span: u32,
    },
    /// `len` (key, value) pairs follow; `span` as for arrays.
    Object {
        len: u32,
        span: u32,
    },
}

// Two nodes to a cache line's quarter: see `narrow`.
const _: () = assert!(std::mem::size_of::<Node>() == 16);

/// A JSON value as a flat pre-order tape plus one text buffer holding every string's UTF-8.
///
/// This is what the Python walk fills: one growing `Vec` of nodes and one of bytes instead of an
/// allocation per string and per container, which is most of the cost of reading a large
/// document. Objects are sorted only when written, by sorting their member positions.
#[derive(Debug, Default, Clone)]
pub struct Doc {
    nodes: Vec<Node>,
    text: Vec<u8>,
    /// The writer's output buffer, kept with the tape so that [`Doc::recycle`] keeps it too.
    out: Vec<u8>,
    /// Set when an offset, length or count did not fit the nodes' 32 bits (see [`narrow`]).
    too_large: bool,
}

/// `n` as a node field. Nodes hold 32-bit offsets, lengths and counts: 16 bytes a node instead
/// of 24, so a large document's tape is a third smaller in the cache (both passes read it
/// whole). A document past 4 GiB of text or 4 billion values sets `too_large`, and the walk
/// refuses it (see [`Doc::check_size`]) before anything is written.
#[inline]
fn narrow(n: usize, too_large: &mut bool) -> u32 {
    u32::try_from(n).unwrap_or_else(|_| {
        *too_large = true;
        u32::MAX
    })
}

/// Where [`Doc::key`] copied a key into the tape's text (full-width offsets, valid even when
/// the nodes' 32-bit fields overflowed).
#[derive(Debug, Clone, Copy)]
pub struct KeyAt {
    start: usize,
    len: usize,
}

/// A container opened on a [`Doc`] and not yet closed.
#[derive(Debug, Clone, Copy)]
#[must_use = "close the container with Doc::end_array / Doc::end_object"]
pub struct Open(usize);

thread_local! {
    /// The buffers of the last tape this thread finished with (see [`Doc::reuse`]).
    static SPARE: Cell<Option<Doc>> = const { Cell::new(None) };
}

/// A tape whose buffers together exceed this many bytes is freed, not kept for reuse: one
/// huge document should not pin its memory to the thread for good.
const SPARE_MAX_BYTES: usize = 4 << 20;

impl Doc {
    /// An empty tape on the buffers this thread recycled last, or a new one. A 100 KB
    /// document's tape is about half a megabyte; allocating it afresh on every call costs page
    /// faults (measured: ~10% of a digest in the kernel), so hot callers reuse one per thread.
    pub fn reuse() -> Self {
        SPARE.take().unwrap_or_else(|| Self::with_capacity(256))
    }

    /// Hand this tape's buffers back for the thread's next [`Doc::reuse`].
    pub fn recycle(mut self) {
        let bytes = self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.text.capacity()
            + self.out.capacity();
        if bytes <= SPARE_MAX_BYTES {
            self.nodes.clear();
            self.text.clear();
            self.out.clear();
            self.too_large = false;
            SPARE.set(Some(self));
        }
    }

    /// An empty tape with room for about `nodes` nodes.
    pub fn with_capacity(nodes: usize) -> Self {
        Self {
            nodes: Vec::with_capacity(nodes),
            text: Vec::with_capacity(nodes * 8),
            out: Vec::new(),
            too_large: false,
        }
    }

    /// Append `null`.
    pub fn null(&mut self) {
        self.nodes.push(Node::Null);
    }

    /// Append a boolean.
    pub fn bool(&mut self, value: bool) {
        self.nodes.push(Node::Bool(value));
    }

    /// Append an integer after the I-JSON range check.
    pub fn int(&mut self, value: i64) -> Result<(), CanonicalError> {
        check_int(value)?;
        self.nodes.push(Node::Int(value));
        Ok(())
    }

    /// Append a finite double.
    pub fn float(&mut self, value: f64) -> Result<(), CanonicalError> {
        check_float(value)?;
        self.nodes.push(Node::Float(value));
        Ok(())
    }

    /// Append a string value.
    #[inline]
    pub fn str(&mut self, value: &str) {
        let (start, len, plain) = self.push_text(value);
        self.nodes.push(Node::Str { start, len, plain });
    }

    /// Append an object key; its value must be appended next. Returns where the tape keeps
    /// its copy, so an error found inside the value can name the key without reading the
    /// caller's (possibly changed) original again.
    #[inline]
    pub fn key(&mut self, key: &str) -> KeyAt {
        let at = KeyAt {
            start: self.text.len(),
            len: key.len(),
        };
        let (start, len, plain) = self.push_text(key);
        self.nodes.push(Node::Key { start, len, plain });
        at
    }

    /// The tape's copy of a key appended by [`Doc::key`].
    pub fn key_text(&self, at: KeyAt) -> String {
        self.text
            .get(at.start..at.start + at.len)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }

    /// Copy `s` into the text buffer: its place there, and whether it needs no escapes.
    #[inline]
    fn push_text(&mut self, s: &str) -> (u32, u32, bool) {
        let start = narrow(self.text.len(), &mut self.too_large);
        let plain = put_plain(&mut self.text, s.as_bytes());
        (start, narrow(s.len(), &mut self.too_large), plain)
    }

    /// Open an array; append its elements, then [`Doc::end_array`].
    pub fn begin_array(&mut self) -> Open {
        self.nodes.push(Node::Array { len: 0, span: 0 });
        Open(self.nodes.len() - 1)
    }

    /// Close an array of `len` elements.
    pub fn end_array(&mut self, open: Open, len: usize) {
        let span = narrow(self.nodes.len() - open.0 - 1, &mut self.too_large);
        let len = narrow(len, &mut self.too_large);
        self.nodes[open.0] = Node::Array { len, span };
    }

    /// Open an object; append `key` + value pairs, then [`Doc::end_object`]. Keys must be unique.
    pub fn begin_object(&mut self) -> Open {
        self.nodes.push(Node::Object { len: 0, span: 0 });
        Open(self.nodes.len() - 1)
    }

    /// Close an object of `len` members.
    pub fn end_object(&mut self, open: Open, len: usize) {
        let span = narrow(self.nodes.len() - open.0 - 1, &mut self.too_large);
        let len = narrow(len, &mut self.too_large);
        self.nodes[open.0] = Node::Object { len, span };
    }

    /// Append a whole [`Value`].
    pub fn push_value(&mut self, value: &Value) {
        match value {
            Value::Null => self.null(),
            Value::Bool(b) => self.bool(*b),
            // Values built through `check_int`/`check_float` are in range; a hand-built one that
            // is not is written as given (the checks are the front end's job).
            Value::Int(i) => self.nodes.push(Node::Int(*i)),
            Value::Float(f) => self.nodes.push(Node::Float(*f)),
            Value::Str(s) => self.str(s),
            Value::Array(items) => {
                let open = self.begin_array();
                for item in items {
                    self.push_value(item);
                }
                self.end_array(open, items.len());
            }
            Value::Object(members) => {
                let open = self.begin_object();
                for (k, v) in members {
                    self.key(k);
                    self.push_value(v);
                }
                self.end_object(open, members.len());
            }
        }
    }

    /// The canonical UTF-8 bytes (RFC 8785). An empty tape writes nothing.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut w = Writer::new(self, Vec::new(), None);
        w.run();
        w.out
    }

    /// The canonical UTF-8 bytes, written into the tape's own (recycled) output buffer.
    pub fn write(&mut self) -> &[u8] {
        self.run_writer(None);
        &self.out
    }

    /// `"sha256:<hex>"` of [`Doc::to_vec`], hashed as it is written so a large document is
    /// never held in memory twice.
    pub fn digest(&mut self) -> String {
        let mut hasher = self.run_writer(Some(Sha256::new())).unwrap_or_default();
        hasher.update(&self.out);
        hex_digest(&hasher.finalize())
    }

    /// Write the tape into its own output buffer (only the last unhashed chunk stays there when
    /// `hasher` is given); the hasher comes back.
    fn run_writer(&mut self, hasher: Option<Sha256>) -> Option<Sha256> {
        let out = std::mem::take(&mut self.out);
        let mut w = Writer::new(self, out, hasher);
        w.run();
        let Writer { out, hasher, .. } = w;
        self.out = out;
        hasher
    }

    fn text(&self, start: u32, len: u32) -> &[u8] {
        let start = start as usize;
        &self.text[start..start + len as usize]
    }

    /// Refuse a tape whose offsets did not fit its nodes (more than 4 GiB of text or 4 billion
    /// values): its writer would write garbage.
    pub fn check_size(&self) -> Result<(), CanonicalError> {
        if self.too_large {
            return Err(CanonicalError::new(
                "the document is larger than 4 GiB of text or 4 billion values; split it",
            ));
        }
        Ok(())
    }
}

/// Nodes in the subtree rooted at `node`, itself included.
fn extent(node: Node) -> usize {
    match node {
        Node::Array { span, .. } | Node::Object { span, .. } => span as usize + 1,
        _ => 1,
    }
}

/// When hashing, the output buffer is fed to SHA-256 and cleared once it holds this much: big
/// enough to amortize the hasher call, small enough to stay in L1/L2.
const HASH_CHUNK: usize = 16 * 1024;

/// An object member while its object is sorted.
#[derive(Clone, Copy)]
struct Member<'a> {
    name: &'a [u8],
    plain: bool,
    value: usize,
}

struct Writer<'a> {
    doc: &'a Doc,
    out: Vec<u8>,
    /// `Some` when only the digest is wanted: `out` is then a bounded staging buffer.
    hasher: Option<Sha256>,
    /// Scratch stack of members used to sort each object; an object uses the slice it pushed
    /// and truncates it when done.
    members: Vec<Member<'a>>,
    floats: ryu_js::Buffer,
    ints: itoa::Buffer,
}

impl<'a> Writer<'a> {
    fn new(doc: &'a Doc, mut out: Vec<u8>, hasher: Option<Sha256>) -> Self {
        // Every node writes at least about two bytes beyond its text (quotes, separators).
        let estimate = doc.text.len() + doc.nodes.len() * 3 + 16;
        let capacity = if hasher.is_some() {
            estimate.min(HASH_CHUNK * 2)
        } else {
            estimate
        };
        out.clear();
        out.reserve(capacity);
        Self {
            doc,
            out,
            hasher,
            members: Vec::with_capacity(32),
            floats: ryu_js::Buffer::new(),
            ints: itoa::Buffer::new(),
        }
    }

    fn run(&mut self) {
        if !self.doc.nodes.is_empty() {
            self.value(0);
        }
    }

    /// Hand the staged bytes to the hasher (digest mode only).
    #[inline]
    fn spill(&mut self) {
        if self.out.len() >= HASH_CHUNK {
            if let Some(h) = self.hasher.as_mut() {
                h.update(&self.out);
                self.out.clear();
            }
        }
    }

    /// Write the subtree at `at`. Scalars are written in place (inlined into the container
    /// loops), so only containers pay for a call frame; most nodes of a document are scalars.
    #[allow(
        clippy::inline_always,
        reason = "measured: keeps scalars out of call frames"
    )]
    #[inline(always)]
    fn value(&mut self, at: usize) {
        match self.doc.nodes[at] {
            Node::Array { len, .. } => self.array(at, len as usize),
            Node::Object { len, .. } => self.object(at, len as usize),
            scalar => self.scalar(scalar),
        }
    }

    #[allow(
        clippy::inline_always,
        reason = "measured: keeps scalars out of call frames"
    )]
    #[inline(always)]
    fn scalar(&mut self, node: Node) {
        match node {
            Node::Null => self.out.extend_from_slice(b"null"),
            Node::Bool(true) => self.out.extend_from_slice(b"true"),
            Node::Bool(false) => self.out.extend_from_slice(b"false"),
            Node::Int(i) => put(&mut self.out, self.ints.format(i).as_bytes()),
            Node::Float(f) => put(&mut self.out, self.floats.format_finite(f).as_bytes()),
            Node::Str { start, len, plain } | Node::Key { start, len, plain } => {
                write_str(&mut self.out, self.doc.text(start, len), plain);
            }
            Node::Array { .. } | Node::Object { .. } => unreachable!("containers are not scalars"),
        }
    }

    #[inline(never)]
    fn array(&mut self, at: usize, len: usize) {
        let doc = self.doc;
        self.out.push(b'[');
        let mut child = at + 1;
        for i in 0..len {
            if i > 0 {
                self.out.push(b',');
            }
            self.value(child);
            self.spill();
            child += extent(doc.nodes[child]);
        }
        self.out.push(b']');
    }

    #[inline(never)]
    fn object(&mut self, at: usize, len: usize) {
        let doc = self.doc;
        let base = self.members.len();
        let mut key = at + 1;
        for _ in 0..len {
            let Node::Key { start, len, plain } = doc.nodes[key] else {
                unreachable!("object members start with a key")
            };
            let name = doc.text(start, len);
            self.members.push(Member {
                name,
                plain,
                value: key + 1,
            });
            key += 1 + extent(doc.nodes[key + 1]);
        }
        self.members[base..].sort_unstable_by(|a, b| cmp_utf16(a.name, b.name));
        self.out.push(b'{');
        for i in 0..len {
            if i > 0 {
                self.out.push(b',');
            }
            let Member {
                name, plain, value, ..
            } = self.members[base + i];
            write_str(&mut self.out, name, plain);
            self.out.push(b':');
            self.value(value);
            self.spill();
        }
        self.out.push(b'}');
        self.members.truncate(base);
    }
}

/// Canonical bytes as text, for TEXT columns. The writer only ever emits UTF-8 (it copies
/// `&str` contents and ASCII), so the lossy branch is unreachable in practice.
pub fn into_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The canonical UTF-8 bytes of `value` (RFC 8785).
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut doc = Doc::default();
    doc.push_value(value);
    doc.to_vec()
}

/// Which bytes need an escape: 0 = none, 1 = `\u00xx`, else the letter after the backslash.
const ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = 1;
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// Append `s` to `out`. Most JSON strings are short, and `extend_from_slice` pays a call to
/// `memcpy` for each one; up to 16 bytes are moved with two possibly overlapping loads and
/// stores instead (the usual small-copy trick; 1 to 3 bytes as first, middle and last byte,
/// since a byte loop is turned back into a `memcpy` call by the compiler).
#[inline]
fn put(out: &mut Vec<u8>, s: &[u8]) {
    if s.len() > 16 {
        out.extend_from_slice(s);
    } else {
        put_short(out, s);
    }
}

/// [`put`] of at most 16 bytes. Returns two words that together hold every byte of `s` (bytes
/// the string does not fill are `a`, which needs no escape), for [`put_plain`]'s scan.
#[inline]
fn put_short(out: &mut Vec<u8>, s: &[u8]) -> (u64, u64) {
    out.reserve(16);
    let len = out.len();
    // SAFETY: 16 writable bytes past `len` (reserved), and `copy_short` writes `s.len() <= 16`.
    unsafe {
        let words = copy_short(out.as_mut_ptr().add(len), s);
        out.set_len(len + s.len());
        words
    }
}

/// Copy `s` (at most 16 bytes) to `dst` with a few whole-word moves; returns [`put_short`]'s
/// words.
///
/// # Safety
/// `dst` must be valid for writing `s.len()` bytes; nothing past them is written.
#[inline]
unsafe fn copy_short(dst: *mut u8, s: &[u8]) -> (u64, u64) {
    /// Eight 'a's: filler that needs no escape.
    const PAD: u64 = 0x6161_6161_6161_6161;
    let n = s.len();
    debug_assert!(n <= 16);
    let src = s.as_ptr();
    // SAFETY: every load stays inside `s` and every store inside `dst[..n]` (the caller's
    // contract): the head and tail words overlap rather than overrun.
    unsafe {
        if n >= 8 {
            let head = src.cast::<u64>().read_unaligned();
            let tail = src.add(n - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(head);
            dst.add(n - 8).cast::<u64>().write_unaligned(tail);
            (head, tail)
        } else if n >= 4 {
            let head = src.cast::<u32>().read_unaligned();
            let tail = src.add(n - 4).cast::<u32>().read_unaligned();
            dst.cast::<u32>().write_unaligned(head);
            dst.add(n - 4).cast::<u32>().write_unaligned(tail);
            let pad = PAD << 32;
            (u64::from(head) | pad, u64::from(tail) | pad)
        } else if n > 0 {
            let (first, middle, last) = (*src, *src.add(n / 2), *src.add(n - 1));
            *dst = first;
            *dst.add(n / 2) = middle;
            *dst.add(n - 1) = last;
            let word =
                u64::from(first) | (u64::from(middle) << 8) | (u64::from(last) << 16) | (PAD << 24);
            (word, word)
        } else {
            (PAD, PAD)
        }
    }
}

/// [`put`] and `!`[`needs_escape`] in one pass: a string of up to 16 bytes is scanned in the
/// (overlapping) words that copy it, while they are in registers.
#[inline]
fn put_plain(out: &mut Vec<u8>, s: &[u8]) -> bool {
    if s.len() > 16 {
        out.extend_from_slice(s);
        return !needs_escape(s);
    }
    let (head, tail) = put_short(out, s);
    !(word_needs_escape(head) | word_needs_escape(tail))
}

/// Whether any of the eight bytes of `w` is a control character, `"` or `\\` (SWAR: "has a
/// zero byte" / "has a byte below n" bit tricks).
#[inline]
fn word_needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_below = |w: u64, n: u8| w.wrapping_sub(ONES * u64::from(n)) & !w & HIGHS != 0;
    let has_byte = |w: u64, b: u8| has_below(w ^ (ONES * u64::from(b)), 1);
    has_below(w, 0x20) || has_byte(w, b'"') || has_byte(w, b'\\')
}

/// Whether any byte of `s` is a control character, `"` or `\\`, eight bytes at a time.
fn needs_escape(s: &[u8]) -> bool {
    let mut chunks = s.chunks_exact(8);
    for chunk in &mut chunks {
        if word_needs_escape(u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]))) {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| ESCAPE[usize::from(b)] != 0)
}

/// Write UTF-8 `s` as a JSON string with RFC 8785's minimal escapes: `"` and `\`, the two-letter
/// forms for \b \f \n \r \t, `\u00xx` (lowercase hex) for the other controls, everything else raw.
fn write_string(out: &mut Vec<u8>, s: &[u8]) {
    write_str(out, s, !needs_escape(s));
}

/// [`write_string`] with the escape scan already done: `plain` strings are copied as they are.
#[inline]
fn write_str(out: &mut Vec<u8>, s: &[u8], plain: bool) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push(b'"');
    if plain {
        // The common case: one copy, no per-byte branches.
        put(out, s);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let esc = ESCAPE[usize::from(b)];
        if esc == 0 {
            continue;
        }
        out.extend_from_slice(&s[start..i]);
        if esc == 1 {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', esc]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

/// `"sha256:" + lowercase hex(SHA-256(bytes))`: the one textual form of a digest, so a digest
/// computed anywhere (here, in Python, by a caller) compares equal as a string.
pub fn digest_bytes(bytes: &[u8]) -> String {
    hex_digest(&Sha256::digest(bytes))
}

fn hex_digest(hash: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for &b in hash {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// Canonical JSON as stored: the text and its digest, serialized and hashed before the
/// transaction that stores it begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Json {
    /// The canonical text.
    pub text: String,
    /// `sha256:<hex>` of the text.
    pub digest: String,
}

impl Json {
    /// Wrap canonical bytes.
    pub fn new(bytes: Vec<u8>) -> Self {
        let digest = digest_bytes(&bytes);
        Self {
            text: into_text(bytes),
            digest,
        }
    }
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

    fn canon(v: &Value) -> String {
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
        assert_eq!(canon(&v), "{\"a\":3,\"\u{1f600}\":2,\"\u{e000}\":1}");
        // Integer-like keys sort as strings, not numbers (the JavaScript own-property trap).
        let v = obj(&[
            ("b", Value::Int(1)),
            ("10", Value::Int(2)),
            ("9", Value::Int(3)),
        ]);
        assert_eq!(canon(&v), r#"{"10":2,"9":3,"b":1}"#);
        assert_eq!(cmp_utf16(b"ab", b"abc"), Ordering::Less);
        assert_eq!(
            cmp_utf16("\u{ffff}".as_bytes(), "\u{10000}".as_bytes()),
            Ordering::Greater
        );
        assert_eq!(
            cmp_utf16("\u{d7ff}".as_bytes(), "\u{10000}".as_bytes()),
            Ordering::Less
        );
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
            assert_eq!(canon(&check_float(f).unwrap()), want, "{f:e}");
        }
        assert_eq!(
            canon(&check_int(MAX_SAFE_INTEGER).unwrap()),
            "9007199254740991"
        );
        assert_eq!(
            canon(&check_int(-MAX_SAFE_INTEGER).unwrap()),
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
            canon(&v),
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
            digest_bytes(&to_vec(&Value::Object(vec![]))),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        let nested = Value::Array(vec![
            Value::Null,
            Value::Bool(true),
            obj(&[("k", Value::Bool(false))]),
        ]);
        assert_eq!(canon(&nested), r#"[null,true,{"k":false}]"#);
    }

    #[test]
    fn streaming_digest_matches_hash_of_bytes() {
        // Well past HASH_CHUNK, with escapes, so the staged buffer spills many times.
        let mut doc = Doc::default();
        let outer = doc.begin_object();
        for i in 0..4000 {
            doc.key(&format!("key-{i:05}\n"));
            let inner = doc.begin_array();
            doc.str("é\"\u{1}");
            doc.int(i).unwrap();
            doc.float(f64::from(u32::try_from(i).unwrap()) / 7.0)
                .unwrap();
            doc.end_array(inner, 3);
        }
        doc.end_object(outer, 4000);
        let bytes = doc.to_vec();
        assert!(bytes.len() > 4 * HASH_CHUNK);
        assert_eq!(doc.digest(), digest_bytes(&bytes));
        assert!(bytes.starts_with("{\"key-00000\\n\":[\"é\\\"\\u0001\",0,0]".as_bytes()));
    }

    #[test]
    fn tape_sorts_nested_objects_and_rejects_out_of_range() {
        let mut doc = Doc::default();
        let outer = doc.begin_object();
        doc.key("b");
        let inner = doc.begin_object();
        doc.key("y");
        doc.null();
        doc.key("x");
        doc.bool(true);
        doc.end_object(inner, 2);
        doc.key("a");
        let arr = doc.begin_array();
        doc.end_array(arr, 0);
        doc.end_object(outer, 2);
        assert_eq!(doc.to_vec(), br#"{"a":[],"b":{"x":true,"y":null}}"#);
        assert!(doc.int(MAX_SAFE_INTEGER + 1).is_err());
        assert!(doc.float(f64::NAN).is_err());
        assert_eq!(Doc::default().to_vec(), b"");
    }

    #[test]
    fn short_copies_and_scans_agree_with_the_plain_ones() {
        // Every length the word tricks distinguish (0, 1-3, 4-7, 8-16, over 16), each with
        // every byte that needs an escape, and none, at every position.
        for n in 0..=20 {
            for at in 0..n.max(1) {
                for bad in [
                    None,
                    Some(b'"'),
                    Some(b'\\'),
                    Some(0x00),
                    Some(0x1f),
                    Some(0x7f),
                ] {
                    let mut s: Vec<u8> = (0..n)
                        .map(|i| b'a' + u8::try_from(i % 26).unwrap())
                        .collect();
                    if let (Some(b), true) = (bad, n > 0) {
                        s[at] = b;
                    }
                    let mut out = b"xy".to_vec();
                    let plain = put_plain(&mut out, &s);
                    assert_eq!(&out[2..], &s[..], "copy of {s:?}");
                    assert_eq!(
                        plain,
                        !s.iter().any(|&b| ESCAPE[usize::from(b)] != 0),
                        "scan of {s:?}"
                    );
                    let mut out = Vec::new();
                    put(&mut out, &s);
                    assert_eq!(out, s);
                }
            }
        }
    }

    #[test]
    fn offsets_past_32_bits_make_the_tape_refuse_itself() {
        let mut too_large = false;
        assert_eq!(narrow(7, &mut too_large), 7);
        assert!(!too_large);
        assert_eq!(narrow(1 << 32, &mut too_large), u32::MAX);
        assert!(too_large);
        let mut doc = Doc::default();
        doc.str("fits");
        assert!(doc.check_size().is_ok());
        doc.too_large = true;
        let e = doc.check_size().unwrap_err();
        assert!(e.to_string().contains("4 GiB"), "{e}");
        doc.recycle();
        let again = Doc::reuse();
        assert!(again.check_size().is_ok(), "a recycled tape starts clean");
    }
}
