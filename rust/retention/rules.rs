//! What a restored row may hold: the rules the API applies when it writes a value, applied again
//! to every cell of an archive before anything is inserted.
//!
//! An archive is a file anybody can edit, so restore trusts none of it: a value the ledger
//! would never have written (a NUL in a key, non-canonical JSON, a timestamp no reader can turn
//! into a date, a status without its finish time) is refused with the line, the tree and the
//! column, instead of reaching the database (whose constraints would fail halfway through, with
//! a raw message) or, worse, being stored and breaking every later read of its run.

use crate::blobs::check_digest;
use crate::canonical::{self, Value, MAX_SAFE_INTEGER};
use crate::ids::{check_name, check_prose, check_run_id, check_text, MAX_NAME, MAX_RUN_ID, PROSE};
use crate::leases::{MAX_CLOCK_MS, MAX_LEASE_MS};
use crate::queue::{MAX_PRIORITY, MIN_PRIORITY};
use crate::status::{AttemptStatus, RunStatus, StepStatus, UnitStatus};

use super::archive::Cell;

/// The latest timestamp the ledger writes (a clock reading plus the longest lease), and so the
/// latest one a restored row may hold: every reader turns these into dates, and a later one
/// would make its run unreadable.
pub const LAST_MS: i64 = MAX_CLOCK_MS + MAX_LEASE_MS;

/// The highest event seq restore accepts. The log continues from the highest seq it holds, so a
/// restored seq near the top of the 64-bit range would leave no room to count on (SQLite then
/// picks free numbers at random, below the cursor of every follower); and a seq is read by
/// JSON clients (the dashboard), which keep integers exact only up to 2^53 - 1.
pub const MAX_SEQ: i64 = MAX_SAFE_INTEGER;

/// What one column holds.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A run id (the API's run id rule).
    RunId,
    /// A step or unit id, or a workflow reference: 1-256 characters, no control characters.
    Name,
    /// An identifier or key: no NUL, at most `MAX_KEY_BYTES` bytes.
    Key,
    /// Free text: no NUL, no bound.
    Prose,
    /// Canonical JSON text.
    Json,
    /// A `sha256:` digest.
    Digest,
    /// Epoch milliseconds, `0..=LAST_MS`.
    Time,
    /// An integer in `min..=max`.
    Int(i64, i64),
    /// One of the listed values.
    Enum(fn(&str) -> bool),
    /// A blob's bytes: canonical JSON.
    Bytes,
    /// A retry policy as the ledger stores it.
    Policy,
}

/// A column's kind and whether it may be NULL.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// What a value holds.
    pub kind: Kind,
    /// Whether NULL is allowed.
    pub null: bool,
}

const COUNT: Kind = Kind::Int(0, MAX_SAFE_INTEGER);
const POSITIVE: Kind = Kind::Int(1, MAX_SAFE_INTEGER);

fn run_status(v: &str) -> bool {
    RunStatus::parse(v).is_some()
}
fn step_status(v: &str) -> bool {
    StepStatus::parse(v).is_some()
}
fn unit_status(v: &str) -> bool {
    UnitStatus::parse(v).is_some()
}
fn attempt_status(v: &str) -> bool {
    AttemptStatus::parse(v).is_some()
}
fn phase(v: &str) -> bool {
    matches!(v, "unit" | "gate")
}
fn owner_type(v: &str) -> bool {
    matches!(v, "host" | "session")
}

/// The kind of `table.column`; `None` for a column this module does not know (a test checks
/// that every archived column has one).
pub fn column(table: &str, column: &str) -> Option<Column> {
    const REQ: bool = false;
    const OPT: bool = true;
    let (kind, null) = match (table, column) {
        ("blobs", "digest") | ("definitions", "definition_digest") => (Kind::Digest, REQ),
        ("blobs", "bytes") => (Kind::Bytes, REQ),
        (
            "runs",
            "definition_digest" | "params" | "input" | "launch_options" | "source" | "plan"
            | "outputs",
        ) => (Kind::Digest, OPT),
        ("runs" | "steps" | "units" | "attempts" | "messages", "run_id")
        | ("leases" | "events", "resource_id") => (Kind::RunId, REQ),
        ("runs", "parent_run_id") => (Kind::RunId, OPT),
        ("runs", "workflow_ref") | ("steps", "step_id") | ("messages", "topic") => {
            (Kind::Name, REQ)
        }
        ("messages", "key") => (Kind::Name, OPT),
        ("runs" | "definitions", "workflow_name")
        | ("units" | "attempts", "unit_id")
        | ("attempts", "dispatch_id")
        | ("events", "type") => (Kind::Key, REQ),
        ("runs", "guarded") | ("leases", "run_ended") => (Kind::Int(0, 1), REQ),
        ("runs", "priority") => (Kind::Int(MIN_PRIORITY, MAX_PRIORITY), REQ),
        ("runs", "status") => (Kind::Enum(run_status), REQ),
        ("steps", "status") => (Kind::Enum(step_status), REQ),
        ("units", "status") => (Kind::Enum(unit_status), REQ),
        ("attempts", "status") => (Kind::Enum(attempt_status), REQ),
        ("units" | "attempts", "phase") => (Kind::Enum(phase), REQ),
        ("leases", "owner_type") => (Kind::Enum(owner_type), OPT),
        ("runs", "plan_version") | ("units" | "attempts", "tokens") | ("events", "generation") => {
            (COUNT, OPT)
        }
        ("attempts", "lease_generation") | ("messages", "consumed_generation") => (POSITIVE, OPT),
        ("steps", "sequence_index")
        | ("units", "attempts")
        | ("attempts", "reclaims")
        | ("leases", "generation" | "takeovers" | "refused_writes") => (COUNT, REQ),
        ("attempts", "attempt") | ("events", "revision") | ("messages", "seq") => (POSITIVE, REQ),
        ("events", "seq") => (Kind::Int(1, MAX_SEQ), REQ),
        ("steps", "completion" | "evidence") | ("units" | "attempts", "result") => {
            (Kind::Json, OPT)
        }
        ("events" | "messages", "payload") => (Kind::Json, REQ),
        ("runs" | "steps", "retry_policy") => (Kind::Policy, OPT),
        ("blobs" | "definitions" | "runs", "created_at")
        | ("runs", "updated_at")
        | ("units", "first_started_at" | "started_at")
        | ("attempts", "started_at")
        | ("events", "ts")
        | ("messages", "sent_at") => (Kind::Time, REQ),
        ("runs" | "steps", "completed_at")
        | ("runs", "not_before")
        | ("units" | "attempts", "finished_at")
        | ("units", "retry_at")
        | ("messages", "consumed_at")
        | ("leases", "acquired_at" | "heartbeat_at" | "expires_at") => (Kind::Time, OPT),
        ("steps", "title" | "instructions") => (Kind::Prose, REQ),
        (_, "claim_holder") => (Kind::Prose, OPT),
        (_, c) if PROSE.contains(&c) => (Kind::Prose, OPT),
        (
            "runs",
            "scope_key" | "current_step_id" | "parent_unit_id" | "invocation_key"
            | "origin_session_id" | "runner_id" | "concurrency_key",
        )
        | (
            "units" | "attempts",
            "step_id" | "node_id" | "parent_unit_id" | "input_hash" | "session_id",
        )
        | ("attempts", "trace_context")
        | ("leases", "owner_id" | "token_hash")
        | ("events", "actor_type" | "actor_id" | "idempotency_key") => (Kind::Key, OPT),
        _ => return None,
    };
    Some(Column { kind, null })
}

/// `table.column` in a message, written only when there is one to write.
#[derive(Clone, Copy)]
struct Field<'a>(&'a str, &'a str);

impl std::fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// A cell as a message shows it: long text cut short.
fn shown(c: &Cell) -> String {
    match c {
        Cell::Text(s) if s.chars().count() > 40 => {
            format!("{:?}...", s.chars().take(40).collect::<String>())
        }
        other => other.to_string(),
    }
}

/// Why `cell` may not stand in `table.column`, if it may not. Nothing is allocated for a cell
/// that may: restore checks every cell of an archive.
pub fn check(table: &str, name: &str, cell: &Cell) -> Option<String> {
    let Some(col) = column(table, name) else {
        return Some("is not a column this library restores".into());
    };
    let field = Field(table, name);
    let wrong = |what: &str| Some(format!("{field} {} is {what}", shown(cell)));
    match (cell, col.kind) {
        (Cell::Null, _) if col.null => None,
        (Cell::Null, _) => Some(format!("{field} is NULL, which the ledger never writes")),
        (Cell::Int(v), Kind::Time) => (!(0..=LAST_MS).contains(v)).then(|| {
            format!(
                "{field} {v} is outside the epoch milliseconds the ledger writes (0 to \
                 {LAST_MS}, 1970 to 9999)"
            )
        }),
        (Cell::Int(v), Kind::Int(min, max)) => {
            (!(min..=max).contains(v)).then(|| format!("{field} {v} is outside {min} to {max}"))
        }
        (Cell::Int(_), _) => wrong("an integer where the ledger writes text"),
        (Cell::Text(_) | Cell::Bytes(_), Kind::Time | Kind::Int(..)) => {
            wrong("text where the ledger writes an integer")
        }
        (Cell::Bytes(b), Kind::Bytes) => match std::str::from_utf8(b) {
            Ok(text) => canonical_fault(text).map(|why| format!("{field} {why}")),
            Err(_) => wrong("not UTF-8"),
        },
        (Cell::Bytes(_), _) => wrong("bytes where the ledger writes text"),
        (Cell::Text(s), kind) => text_fault(field, s, kind),
    }
}

/// The rule `kind` names, applied to `s`.
fn text_fault(field: Field<'_>, s: &str, kind: Kind) -> Option<String> {
    let cell = || shown(&Cell::Text(s.to_owned()));
    // The API's checks name their argument; a field's name is made only for a refusal.
    let named = |check: fn(&str, &str) -> crate::errors::Result<()>| {
        check("", s).is_err().then(|| {
            check(&field.to_string(), s)
                .err()
                .map_or_else(String::new, |e| e.to_string())
        })
    };
    match kind {
        Kind::RunId => check_run_id("", s).is_err().then(|| {
            format!(
                "{field} {} is not a run id (1-{MAX_RUN_ID} characters of A-Z a-z 0-9 . _ : -)",
                cell()
            )
        }),
        Kind::Name => check_name("", s).is_err().then(|| {
            format!(
                "{field} {} is not valid: 1-{MAX_NAME} characters, no control characters",
                cell()
            )
        }),
        // "" is not a PROSE argument, so `check_text` bounds it as a key.
        Kind::Key => named(check_text),
        Kind::Prose => named(check_prose),
        Kind::Json => canonical_fault(s).map(|why| format!("{field} {why}")),
        Kind::Digest => check_digest("", s)
            .is_err()
            .then(|| format!("{field} {} is not a sha256: digest", cell())),
        Kind::Enum(known) => {
            (!known(s)).then(|| format!("{field} {} is not a value the ledger writes", cell()))
        }
        Kind::Policy => (crate::retry::RetryPolicy::from_text(s).map(|p| p.to_text())
            != Some(s.to_owned()))
        .then(|| format!("{field} {} is not a retry policy the ledger writes", cell())),
        Kind::Time | Kind::Int(..) | Kind::Bytes => None,
    }
}

/// Why `text` is not canonical JSON (RFC 8785) as the ledger writes it, if it is not: it must
/// parse, and writing what it holds canonically must give back exactly the same text. That one
/// comparison covers member order, whitespace, number forms, escapes, duplicate keys and
/// integers beyond what a double holds exactly; a lone surrogate does not parse.
pub fn canonical_fault(text: &str) -> Option<String> {
    if depth(text.as_bytes()) > canonical::MAX_DEPTH {
        return Some(format!(
            "nests deeper than {} levels, which the ledger never writes",
            canonical::MAX_DEPTH
        ));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    // The depth was bounded above, so the parser's own limit (128) may go: the ledger stores
    // documents up to 512 deep.
    de.disable_recursion_limit();
    let mut values = de.into_iter::<serde_json::Value>();
    let parsed = match values.next() {
        Some(Ok(v)) if values.byte_offset() == text.len() => v,
        Some(Ok(_)) => return Some("is not one JSON value".into()),
        Some(Err(e)) => return Some(format!("is not JSON ({e})")),
        None => return Some("is empty, not JSON".into()),
    };
    let value = match to_value(&parsed) {
        Ok(v) => v,
        Err(why) => return Some(why),
    };
    (canonical::to_vec(&value) != text.as_bytes())
        .then(|| "is not canonical JSON (RFC 8785), which is all the ledger writes".into())
}

fn to_value(v: &serde_json::Value) -> Result<Value, String> {
    Ok(match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => canonical::check_int(i).map_err(|e| e.reason)?,
            (None, Some(f)) if n.is_f64() => canonical::check_float(f).map_err(|e| e.reason)?,
            _ => return Err(canonical::out_of_range_int(&n.to_string()).reason),
        },
        serde_json::Value::String(s) => Value::Str(s.clone()),
        serde_json::Value::Array(items) => {
            Value::Array(items.iter().map(to_value).collect::<Result<_, _>>()?)
        }
        serde_json::Value::Object(members) => Value::Object(
            members
                .iter()
                .map(|(k, v)| Ok((k.clone(), to_value(v)?)))
                .collect::<Result<_, String>>()?,
        ),
    })
}

/// The deepest nesting of arrays and objects in JSON text, brackets inside strings aside: read
/// before parsing, so a hostile document cannot take the parser's recursion past the stack.
fn depth(text: &[u8]) -> usize {
    let (mut deepest, mut now, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                now += 1;
                deepest = deepest.max(now);
            }
            b']' | b'}' => now = now.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retention::archive;

    #[test]
    fn every_archived_column_has_a_kind() {
        for t in archive::tables() {
            for c in t.columns {
                assert!(column(t.name, c).is_some(), "{}.{c} has no kind", t.name);
            }
        }
    }

    #[test]
    fn canonical_text_is_recognized_exactly() {
        for ok in [
            "null",
            "{}",
            r#"{"a":1,"b":[true,false,null],"c":"\u0000"}"#,
            "1e+21",
            "0.1",
            r#""é""#,
        ] {
            assert_eq!(canonical_fault(ok), None, "{ok}");
        }
        for bad in [
            "",
            "{ }",
            r#"{"b":1,"a":2}"#,
            r#"{"a":1,"a":1}"#,
            "1.0",
            "-0",
            "1E21",
            r#""\u0041""#,
            r#""\ud800""#,
            "9007199254740993",
            "not json",
            "1 2",
        ] {
            assert!(canonical_fault(bad).is_some(), "{bad}");
        }
        let deep = format!("{}{}", "[".repeat(512), "]".repeat(512));
        assert_eq!(canonical_fault(&deep), None);
        for bad in [
            format!("{}{}", "[".repeat(513), "]".repeat(513)),
            "[".repeat(1_000_000),
        ] {
            assert!(canonical_fault(&bad).is_some());
        }
    }
}
