//! PostgreSQL's errors classified onto the store's [`DbError`]: what may be retried, which
//! constraint was violated, and when the connection is gone — each with the sentence a user
//! needs, naming the server but never the password.

use std::error::Error as StdError;

use tokio_postgres::error::SqlState;
use tokio_postgres::Error as PgError;

use super::target::Target;
use crate::store::{DbError, DbErrorKind};

/// Remove a password from a message, in case a driver ever echoes it.
pub(super) fn scrub(text: &str, password: Option<&[u8]>) -> String {
    match password.and_then(|p| std::str::from_utf8(p).ok()) {
        Some(p) if !p.is_empty() => text.replace(p, "***"),
        _ => text.to_owned(),
    }
}

/// The most useful text of a driver error: the server's message (and detail) if it sent one.
pub(super) fn error_text(e: &PgError) -> String {
    if let Some(db) = e.as_db_error() {
        return match db.detail() {
            Some(detail) => format!("{}: {detail}", db.message()),
            None => db.message().to_owned(),
        };
    }
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Classify a driver error.
pub(super) fn classify(target: &Target, e: &PgError) -> DbError {
    if let Some(code) = e.code() {
        if *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::LOCK_NOT_AVAILABLE
        {
            return DbError::new(
                DbErrorKind::Busy,
                format!(
                    "{} stayed locked by another writer ({})",
                    target.label,
                    error_text(e)
                ),
            );
        }
        if *code == SqlState::UNIQUE_VIOLATION {
            let constraint = e
                .as_db_error()
                .and_then(|d| d.constraint())
                .unwrap_or_default()
                .to_owned();
            return DbError::new(DbErrorKind::Unique { target: constraint }, error_text(e));
        }
        if *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
        {
            return unavailable(target, e);
        }
        if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
            return DbError::new(
                DbErrorKind::Unavailable,
                format!(
                    "PostgreSQL at {} is read-only (a standby, or a primary a failover demoted), \
                     so nothing was written; give the URL every host with \
                     target_session_attrs=read-write and fencepost finds the writable one",
                    target.server
                ),
            );
        }
        if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            return DbError::new(
                DbErrorKind::Unavailable,
                format!(
                    "the PostgreSQL user of {} may not do this ({}); grant it rights on schema {}",
                    target.label,
                    error_text(e),
                    target.schema
                ),
            );
        }
        if (*code == SqlState::DUPLICATE_PSTATEMENT
            || *code == SqlState::INVALID_SQL_STATEMENT_NAME)
            && !target.pooled
        {
            // A statement this session prepared is gone, or its name was taken: the session
            // is being shared, which is what a pooler in transaction mode does.
            return DbError::new(
                DbErrorKind::Other,
                format!(
                    "{}; {} hands this ledger's transactions to server sessions it shares: \
                     behind a pooler in transaction mode (PgBouncer's pool_mode = transaction) \
                     add pooler=transaction to the URL",
                    error_text(e),
                    target.server
                ),
            );
        }
        return DbError::new(DbErrorKind::Other, error_text(e));
    }
    // Only a closed session or a failed socket means the connection is gone (and is rebuilt
    // on the next call); a value the driver could not bind or decode is an ordinary error.
    let io = e
        .source()
        .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some());
    if e.is_closed() || io {
        return unavailable(target, e);
    }
    DbError::new(DbErrorKind::Other, error_text(e))
}

fn unavailable(target: &Target, e: &PgError) -> DbError {
    DbError::new(
        DbErrorKind::Unavailable,
        format!(
            "lost the connection to PostgreSQL at {} ({}); check that the server is running, \
             then retry (fencepost reconnects on the next call)",
            target.server,
            scrub(&error_text(e), target.password())
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_scrubbed_from_messages() {
        assert_eq!(
            scrub("auth failed for hunter2", Some(b"hunter2")),
            "auth failed for ***"
        );
        assert_eq!(scrub("no password here", None), "no password here");
        assert_eq!(scrub("empty", Some(b"")), "empty");
    }
}
