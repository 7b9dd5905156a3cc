//! SQLite's errors classified onto the store's [`DbError`]: what may be retried, which
//! constraint was violated, and the conditions a user can act on (not a database, cannot open,
//! corrupt, disk full, read-only), each with the sentence that says what to do.

use rusqlite::ErrorCode;

use crate::errors::LedgerError;
use crate::store::{ledger_error, DbError, DbErrorKind};

/// Map a rusqlite error onto the ledger's errors: busy/locked are retryable and become
/// [`LedgerError::StoreBusy`] once retries run out (the caller decides); everything else is a
/// [`LedgerError::StoreError`] that names the operation and the database.
pub(super) fn store_error(operation: &str, label: &str, err: &rusqlite::Error) -> LedgerError {
    ledger_error(operation, label, &classify(label, err))
}

/// Classify a rusqlite error; the conditions a user can act on get their explanation here.
pub(super) fn classify(label: &str, err: &rusqlite::Error) -> DbError {
    if let rusqlite::Error::SqliteFailure(f, Some(msg)) = err {
        if f.code == ErrorCode::ConstraintViolation && msg.contains("UNIQUE") {
            return DbError::new(
                DbErrorKind::Unique {
                    target: msg.clone(),
                },
                msg.clone(),
            );
        }
    }
    if matches!(
        err,
        rusqlite::Error::InvalidColumnType(..) | rusqlite::Error::FromSqlConversionFailure(..)
    ) {
        return DbError::new(DbErrorKind::Type, err.to_string());
    }
    let (kind, message) = match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => (
            DbErrorKind::Unavailable,
            format!(
                "{label} is not a fencepost database (not SQLite); point fencepost at a new file"
            ),
        ),
        Some(ErrorCode::CannotOpen) => (
            DbErrorKind::Unavailable,
            format!("cannot open {label}: check that its directory exists and is writable"),
        ),
        Some(ErrorCode::DatabaseCorrupt) => (
            DbErrorKind::Unavailable,
            format!("{label} is corrupt; run `fencepost doctor` and restore it from a backup"),
        ),
        Some(ErrorCode::DiskFull) => (
            DbErrorKind::Unavailable,
            format!("the disk holding {label} is full"),
        ),
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => (
            DbErrorKind::Unavailable,
            format!("{label} is read-only here; check the file's permissions"),
        ),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => (
            DbErrorKind::Busy,
            format!("{label} stayed locked by another writer"),
        ),
        _ => (DbErrorKind::Other, err.to_string()),
    };
    DbError::new(kind, message)
}
