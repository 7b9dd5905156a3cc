//! Identifier rules: run ids, unit and step ids, text arguments, generated ids. (Claim tokens
//! are the leases' business: [`crate::leases`].)
//!
//! - A run id is 1–128 characters of `[A-Za-z0-9._:-]`; generated ones are UUIDv7 so they sort
//!   by creation time.
//! - Unit and step ids are free-form but bounded: 1–256 characters, no control characters.
//! - Dispatch ids are UUIDv4: unguessable, stable across reclaims of one attempt.
//! - Every text argument, on both backends alike ([`check_text`]): no NUL character (PostgreSQL
//!   cannot store one in `text`, so SQLite must not either, or the backends would disagree on
//!   what a ledger can hold), and identifiers and keys at most [`MAX_KEY_BYTES`] bytes of
//!   UTF-8 (they are indexed, and an index entry must fit a PostgreSQL page). Free text (titles,
//!   notes, failure reasons...) has no length bound. JSON values are not text arguments: their
//!   strings may hold U+0000, stored as the escape `\u0000` of canonical JSON.

use crate::errors::{LedgerError, Result};

/// The longest accepted run id.
pub const MAX_RUN_ID: usize = 128;
/// The longest accepted unit, step or other free-form id.
pub const MAX_NAME: usize = 256;

/// Check a caller-supplied run id; `argument` names the parameter in the error.
pub fn check_run_id(argument: &str, run_id: &str) -> Result<()> {
    let ok = !run_id.is_empty()
        && run_id.len() <= MAX_RUN_ID
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            argument,
            format!(
                "{run_id:?} is not a valid run id: use 1-{MAX_RUN_ID} characters of \
                 A-Z a-z 0-9 . _ : -"
            ),
        ))
    }
}

/// Check a free-form id (unit, step, node, holder...).
pub fn check_name(argument: &str, value: &str) -> Result<()> {
    if value.is_empty() || value.chars().count() > MAX_NAME || value.chars().any(char::is_control) {
        Err(LedgerError::invalid(
            argument,
            format!("{value:?} is not valid: use 1-{MAX_NAME} characters, no control characters"),
        ))
    } else {
        Ok(())
    }
}

/// The longest identifier or key, in bytes of UTF-8: indexed columns, alone or with one or two
/// other keys (`runs(scope_key, workflow_ref, status)`), stay under PostgreSQL's limit of about
/// 2700 bytes for one B-tree entry.
pub const MAX_KEY_BYTES: usize = 1024;

/// The text arguments that are free text — stored, shown, never indexed or compared — and so
/// have no length bound. Every other text argument is an identifier or key.
pub const PROSE: &[&str] = &[
    "title",
    "instructions",
    "notes",
    "summary",
    "failure_reason",
    "holder",
    "runner",
    "engine",
    "model",
    "worktree_path",
    "agent_harness",
    "agent_session_id",
];

/// Check a text argument named `argument`: no NUL, and at most [`MAX_KEY_BYTES`] unless the
/// argument is free text ([`PROSE`]).
pub fn check_text(argument: &str, value: &str) -> Result<()> {
    check_prose(argument, value)?;
    if value.len() > MAX_KEY_BYTES && !PROSE.contains(&argument) {
        return Err(LedgerError::invalid(
            argument,
            format!(
                "is {} bytes long; identifiers and keys are at most {MAX_KEY_BYTES} bytes of \
                 UTF-8 (keep long text in a JSON argument)",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Check free text: no NUL character.
pub fn check_prose(argument: &str, value: &str) -> Result<()> {
    match value.find('\0') {
        None => Ok(()),
        Some(at) => Err(LedgerError::invalid(
            argument,
            format!(
                "contains a NUL character (\\x00) at byte {at}; text arguments cannot hold NUL \
                 (put binary data in a JSON argument, encoded)"
            ),
        )),
    }
}

/// A new time-ordered run id (UUIDv7, lowercase hyphenated).
pub fn new_run_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

/// A new dispatch id: time-ordered (UUIDv7), like run ids. The ledger indexes every attempt's
/// dispatch id (it is unique across the ledger), and random ids would land each new entry on a
/// random page of that index: once the index outgrows the page cache, a batch of 1 000
/// reservations dirtied about 1 000 pages (1 000 more WAL frames per commit, each read from disk
/// first). Ordered ids append at the index's right edge. A dispatch id is a dedupe key, not a
/// secret (the claim token is the secret); its 74 random bits keep it unique.
pub fn new_dispatch_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids() {
        for good in ["a", "run-1.a:b_c", &"x".repeat(128)] {
            assert!(check_run_id("run_id", good).is_ok(), "{good}");
        }
        for bad in ["", "has space", "slash/no", "é", &"x".repeat(129)] {
            let err = check_run_id("run_id", bad).unwrap_err();
            assert!(
                matches!(err, LedgerError::InvalidArgument { ref argument, .. } if argument == "run_id")
            );
        }
        let a = new_run_id();
        let b = new_run_id();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "7");
        assert!(a < b || a[..13] == b[..13], "UUIDv7 ids sort by time");
        assert!(check_run_id("run_id", &a).is_ok());
    }

    #[test]
    fn names() {
        assert!(check_name("unit_id", "unit/1 with spaces").is_ok());
        assert!(check_name("unit_id", "").is_err());
        assert!(check_name("unit_id", "a\nb").is_err());
        assert!(check_name("unit_id", &"é".repeat(257)).is_err());
        assert_ne!(new_dispatch_id(), new_dispatch_id());
    }

    #[test]
    fn text_refuses_nul_everywhere_and_bounds_keys_only() {
        let nul = check_text("failure_reason", "bad\0reason").unwrap_err();
        assert!(
            matches!(nul, LedgerError::InvalidArgument { ref argument, ref message }
                if argument == "failure_reason" && message.contains("byte 3")),
            "{nul:?}"
        );
        assert!(check_text("scope_key", "a\0").is_err());
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(check_text("scope_key", &"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(check_text("scope_key", &long).is_err());
        assert!(check_text("failure_reason", &long).is_ok());
        assert!(check_prose("steps", &long).is_ok());
        assert!(check_prose("steps", "\0").is_err());
    }
}
