//! Numbered, forward-only migrations embedded in the crate, recorded in `schema_migrations`.
//!
//! The recorded versions must be an exact ordered prefix of [`MIGRATIONS`] (akm-cli's ledger
//! rule): a version this library does not know means the database is newer
//! ([`LedgerError::Schema`]); a gap or a renamed migration means it is inconsistent. Pending
//! migrations run with their ledger rows in one IMMEDIATE transaction, so a failed migration
//! leaves the database exactly as it was.

use rusqlite::{params, Connection, TransactionBehavior};

use crate::errors::{LedgerError, Result};
use crate::store::sqlite::store_error;

/// One migration: its version (1, 2, ...), a name, and its SQL.
pub struct Migration {
    /// Position in the sequence, starting at 1.
    pub version: i64,
    /// Short name, recorded alongside the version.
    pub name: &'static str,
    /// The statements, run as one batch.
    pub sql: &'static str,
}

/// Both dialects' migration lists from one table of (version, name, file), so that SQLite and
/// PostgreSQL cannot drift apart: the same versions and names, each dialect's own SQL file of
/// that name under `sqlite/migrations/` and `postgres/migrations/`.
macro_rules! migrations {
    ($($version:literal $name:literal $file:literal;)+) => {
        /// Every SQLite migration this library knows, in order.
        pub const MIGRATIONS: &[Migration] = &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("sqlite/migrations/", $file)),
        }),+];

        /// The same migrations in PostgreSQL's dialect: one schema history for both backends.
        #[cfg(feature = "postgres")]
        pub const POSTGRES_MIGRATIONS: &[Migration] = &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("postgres/migrations/", $file)),
        }),+];
    };
}

migrations! {
    1 "init" "0001_init.sql";
    2 "fillfactor" "0002_fillfactor.sql";
}

/// The newest schema version this library knows.
pub const SCHEMA_VERSION: i64 = 2;

const CREATE_LEDGER_SQL: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT";
const LIST_APPLIED_SQL: &str = "SELECT version, name FROM schema_migrations ORDER BY version";
const RECORD_SQL: &str =
    "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?1, ?2, ?3)";
// A database with tables but no migration ledger belongs to someone else: refuse to write ours
// into it.
const FOREIGN_TABLES_SQL: &str = "SELECT count(*) FROM sqlite_schema WHERE type = 'table'
    AND name NOT LIKE 'sqlite_%' AND name <> 'schema_migrations'";
const HAS_LEDGER_SQL: &str =
    "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'schema_migrations'";

/// Refuse a database fencepost must not write to — another application's tables without our
/// migration ledger, a newer schema, an inconsistent ledger — by reading only. The store calls
/// it before it sets anything that writes to the file (switching the journal to WAL rewrites
/// the header), so a refused file is left byte for byte as it was. Returns the versions
/// already applied, or `None` for a database without a ledger yet (new or empty).
pub fn vet(conn: &Connection, label: &str) -> Result<Option<Vec<(i64, String)>>> {
    let op = "applying schema migrations";
    let has_ledger: i64 = conn
        .query_row(HAS_LEDGER_SQL, [], |r| r.get(0))
        .map_err(|e| store_error(op, label, &e))?;
    if has_ledger == 0 {
        let foreign: i64 = conn
            .query_row(FOREIGN_TABLES_SQL, [], |r| r.get(0))
            .map_err(|e| store_error(op, label, &e))?;
        if foreign > 0 {
            return Err(LedgerError::Store {
                operation: op.into(),
                message: format!(
                    "{label} is not a fencepost database (it holds other tables and no \
                     schema_migrations); point fencepost at a new file"
                ),
            });
        }
        return Ok(None);
    }
    let applied: Vec<(i64, String)> = {
        let mut stmt = conn
            .prepare(LIST_APPLIED_SQL)
            .map_err(|e| store_error(op, label, &e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|e| store_error(op, label, &e))?;
        rows.collect::<Result<_, _>>()
            .map_err(|e| store_error(op, label, &e))?
    };
    pending(&applied, MIGRATIONS, label)?;
    Ok(Some(applied))
}

/// Bring the database up to [`SCHEMA_VERSION`]; returns the version it is at afterwards.
pub fn migrate(conn: &mut Connection, label: &str, now_ms: i64) -> Result<i64> {
    let op = "applying schema migrations";
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| store_error(op, label, &e))?;
    // Vetted again inside the write lock: another process may have migrated (or been pointed
    // at this file by mistake) since the store's first look.
    let applied = if let Some(applied) = vet(&tx, label)? {
        applied
    } else {
        tx.execute(CREATE_LEDGER_SQL, [])
            .map_err(|e| store_error(op, label, &e))?;
        Vec::new()
    };
    for m in pending(&applied, MIGRATIONS, label)? {
        let step = format!("applying schema migration {} ({})", m.version, m.name);
        tx.execute_batch(m.sql)
            .map_err(|e| store_error(&step, label, &e))?;
        tx.execute(RECORD_SQL, params![m.version, m.name, now_ms])
            .map_err(|e| store_error(&step, label, &e))?;
    }
    tx.commit().map_err(|e| store_error(op, label, &e))?;
    Ok(SCHEMA_VERSION)
}

/// The migrations still to apply after `applied` (the ledger's rows, in version order): a
/// newer database is `SchemaError`; a gap or a renamed migration is an inconsistent ledger.
pub fn pending<'m>(
    applied: &[(i64, String)],
    known: &'m [Migration],
    label: &str,
) -> Result<&'m [Migration]> {
    if let Some(&(newest, _)) = applied.last() {
        if newest > SCHEMA_VERSION {
            return Err(LedgerError::Schema {
                database_version: newest,
                library_version: SCHEMA_VERSION,
            });
        }
    }
    for (i, (version, name)) in applied.iter().enumerate() {
        let expected = &known[i];
        if *version != expected.version || name != expected.name {
            return Err(LedgerError::Store {
                operation: "applying schema migrations".into(),
                message: format!(
                    "{label} has an inconsistent migration ledger (found {version} {name:?} \
                     where {} {:?} belongs); restore it from a backup",
                    expected.version, expected.name
                ),
            });
        }
    }
    Ok(&known[applied.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_dense_and_schema_version_is_the_last() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i64::try_from(i).unwrap() + 1);
        }
        assert_eq!(MIGRATIONS.last().unwrap().version, SCHEMA_VERSION);
    }

    #[test]
    fn fresh_then_noop_then_newer_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut conn, ":memory:", 1).unwrap(), SCHEMA_VERSION);
        assert_eq!(migrate(&mut conn, ":memory:", 2).unwrap(), SCHEMA_VERSION);
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, SCHEMA_VERSION);
        let at: i64 = conn
            .query_row(
                "SELECT applied_at FROM schema_migrations WHERE version = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(at, 1, "re-running is a no-op");
        conn.execute(RECORD_SQL, params![SCHEMA_VERSION + 41, "future", 0])
            .unwrap();
        let err = migrate(&mut conn, ":memory:", 3).unwrap_err();
        assert_eq!(
            err,
            LedgerError::Schema {
                database_version: SCHEMA_VERSION + 41,
                library_version: SCHEMA_VERSION
            }
        );
    }

    #[test]
    fn an_older_database_migrates_forward_and_keeps_its_rows() {
        // A database as the first release left it: migration 1 only, with a run in it.
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(CREATE_LEDGER_SQL).unwrap();
        conn.execute_batch(MIGRATIONS[0].sql).unwrap();
        conn.execute(RECORD_SQL, params![1, "init", 7]).unwrap();
        conn.execute(
            "INSERT INTO runs(run_id, workflow_ref, workflow_name, status, created_at, \
             updated_at) VALUES ('r1', 'wf', 'wf', 'active', 1, 1)",
            [],
        )
        .unwrap();
        assert_eq!(migrate(&mut conn, ":memory:", 9).unwrap(), SCHEMA_VERSION);
        let rows: Vec<(i64, String, i64)> = conn
            .prepare("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows,
            vec![(1, "init".into(), 7), (2, "fillfactor".into(), 9)]
        );
        let kept: String = conn
            .query_row("SELECT status FROM runs WHERE run_id = 'r1'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(kept, "active");
    }

    #[test]
    fn inconsistent_and_foreign_databases_are_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(CREATE_LEDGER_SQL).unwrap();
        conn.execute(RECORD_SQL, params![1, "renamed", 0]).unwrap();
        let err = migrate(&mut conn, "x.db", 1).unwrap_err();
        assert!(
            matches!(err, LedgerError::Store { ref message, .. } if message.contains("inconsistent"))
        );

        let mut other = Connection::open_in_memory().unwrap();
        other.execute_batch("CREATE TABLE theirs(x)").unwrap();
        let err = migrate(&mut other, "theirs.db", 1).unwrap_err();
        assert!(
            matches!(err, LedgerError::Store { ref message, .. } if message.contains("not a fencepost database"))
        );
        let count: i64 = other
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = 'schema_migrations'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(count, 0, "nothing written into a foreign database");
    }

    #[test]
    fn a_failing_migration_rolls_back() {
        // Simulate: the tables of migration 1 exist already (as if half-applied by hand), so
        // the batch fails; the ledger must stay empty.
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(CREATE_LEDGER_SQL).unwrap();
        conn.execute_batch("CREATE TABLE blobs(x)").unwrap();
        assert!(migrate(&mut conn, ":memory:", 1).is_err());
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0);
    }
}
