//! The one migration runner: numbered, forward-only migrations embedded in the crate, recorded
//! in the database's `schema_migrations` ledger, run over the store's [`Tx`] for either backend.
//!
//! The recorded versions must be an exact ordered prefix of the known migrations: a version
//! this library does not know means the database is newer ([`LedgerError::SchemaError`]); a gap
//! or a renamed migration means the ledger is inconsistent, and fencepost will not guess which
//! schema the tables have. Pending migrations run with their ledger rows in one write
//! transaction, so a failed migration leaves the database exactly as it was. A database with
//! tables but no ledger belongs to another application: nothing is written into it.
//!
//! Each backend supplies a [`Dialect`]: its own migration files (the same versions and names
//! in both), the lock that keeps two openers from migrating at once, how its ledger is made,
//! and its words for a refusal.

use crate::errors::{LedgerError, Result};
use crate::params;
use crate::store::{ledger_error, Sql, Store, Tx};

/// One migration: its version (1, 2, ...), a name, and its SQL.
#[derive(Debug)]
pub struct Migration {
    /// Position in the sequence, starting at 1.
    pub version: i64,
    /// Short name, recorded alongside the version.
    pub name: &'static str,
    /// The statements, run as one script.
    pub sql: &'static str,
}

/// Both dialects' migration lists from one table of (version, name, file), so that SQLite and
/// PostgreSQL cannot drift apart: the same versions and names, each dialect's own SQL file of
/// that name under `sqlite/migrations/` and `postgres/migrations/`.
macro_rules! migrations {
    ($($version:literal $name:literal $file:literal;)+) => {
        /// Every migration this library knows, in SQLite's dialect, in order.
        pub const SQLITE_MIGRATIONS: &[Migration] = &[$(Migration {
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
    3 "prune" "0003_prune.sql";
    4 "reads" "0004_reads.sql";
    5 "queue" "0005_queue.sql";
    6 "fencing" "0006_fencing.sql";
    7 "seq_floor" "0007_seq_floor.sql";
    8 "schedule" "0008_schedule.sql";
    9 "retry" "0009_retry.sql";
    10 "fan_in" "0010_fan_in.sql";
    11 "messages" "0011_messages.sql";
    12 "schedules" "0012_schedules.sql";
    13 "views" "0013_views.sql";
}

/// The newest schema version this library knows.
pub const SCHEMA_VERSION: i64 = 13;

/// A backend's part of migrating: what cannot be said in one text for both dialects.
#[derive(Debug)]
pub struct Dialect {
    /// This backend's migration files.
    pub migrations: &'static [Migration],
    /// A script run first in the migrating transaction, so that processes opening a fresh
    /// database at once wait for the first and then find nothing to do (`None` where the write
    /// transaction already excludes every other writer).
    pub lock: Option<String>,
    /// The script that makes the migration ledger (and whatever it lives in).
    pub create_ledger: String,
    /// The refusal of a database that holds other tables and no ledger.
    pub foreign: String,
    /// The refusal of a database without a ledger when it may not get one (opened with
    /// `create=False`), or `None` when it may.
    pub missing: Option<String>,
}

/// The operation named in the migration's errors.
const MIGRATING: &str = "applying schema migrations";

/// Whether the migration ledger exists. PostgreSQL's `current_schema()` is the schema the
/// connection's `search_path` names, or NULL while that schema does not exist yet.
const HAS_LEDGER_SQL: Sql = Sql::split(
    "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'schema_migrations'",
    "SELECT count(*) FROM information_schema.tables
    WHERE table_schema = current_schema() AND table_name = 'schema_migrations'",
);
/// The tables beside the ledger (SQLite's own `sqlite_%` tables are not anyone's data).
const OTHER_TABLES_SQL: Sql = Sql::split(
    "SELECT count(*) FROM sqlite_schema WHERE type = 'table'
    AND name NOT LIKE 'sqlite_%' AND name <> 'schema_migrations'",
    "SELECT count(*) FROM information_schema.tables
    WHERE table_schema = current_schema() AND table_name <> 'schema_migrations'",
);
const LIST_APPLIED_SQL: Sql =
    Sql::same("SELECT version, name FROM schema_migrations ORDER BY version");
const RECORD_SQL: Sql =
    Sql::same("INSERT INTO schema_migrations(version, name, applied_at) VALUES (?1, ?2, ?3)");

/// Refuse a database fencepost must not write to — another application's tables without our
/// migration ledger, a newer schema, an inconsistent ledger — by reading only, so a refused
/// database is left exactly as it was. Returns the versions already applied, or `None` for a
/// database without a ledger yet (new or empty).
pub fn vet(tx: &dyn Tx, dialect: &Dialect, label: &str) -> Result<Option<Vec<(i64, String)>>> {
    let count = |sql: &Sql| tx.row(sql, params![], |r| r.get::<i64>(0));
    if count(&HAS_LEDGER_SQL)?.unwrap_or(0) == 0 {
        if count(&OTHER_TABLES_SQL)?.unwrap_or(0) > 0 {
            return Err(LedgerError::StoreError {
                operation: MIGRATING.into(),
                message: dialect.foreign.clone(),
            });
        }
        return Ok(None);
    }
    let applied = tx.rows(&LIST_APPLIED_SQL, params![], |r| Ok((r.get(0)?, r.get(1)?)))?;
    pending(&applied, dialect.migrations, label)?;
    Ok(Some(applied))
}

/// Bring the store's database up to [`SCHEMA_VERSION`]; returns the version it is at
/// afterwards. Vetted again inside the write transaction: another process may have migrated
/// the database (or been pointed at it by mistake) since the store's first look.
pub fn migrate(store: &mut dyn Store, dialect: &Dialect, now_ms: i64) -> Result<i64> {
    let label = store.label().to_owned();
    // The version found, once the transaction that moved it forward has committed.
    let mut from = SCHEMA_VERSION;
    store.write(MIGRATING, |tx| {
        if let Some(lock) = &dialect.lock {
            tx.execute_script(lock).map_err(|e| tx.fail(&e))?;
        }
        let applied = if let Some(applied) = vet(tx, dialect, &label)? {
            applied
        } else {
            if let Some(message) = &dialect.missing {
                return Err(LedgerError::StoreError {
                    operation: "opening the database".into(),
                    message: message.clone(),
                });
            }
            tx.execute_script(&dialect.create_ledger)
                .map_err(|e| tx.fail(&e))?;
            Vec::new()
        };
        from = applied.last().map_or(0, |a| a.0);
        for m in pending(&applied, dialect.migrations, &label)? {
            let step = format!("applying schema migration {} ({})", m.version, m.name);
            tx.execute_script(m.sql)
                .map_err(|e| ledger_error(&step, &label, &e))?;
            tx.execute(&RECORD_SQL, params![m.version, m.name, now_ms], false)
                .map_err(|e| ledger_error(&step, &label, &e))?;
        }
        Ok(SCHEMA_VERSION)
    })?;
    if from < SCHEMA_VERSION {
        crate::observe::push(crate::observe::Notice::Migrated {
            from,
            to: SCHEMA_VERSION,
        });
    }
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
            return Err(LedgerError::SchemaError {
                database_version: newest,
                library_version: SCHEMA_VERSION,
            });
        }
    }
    for (i, (version, name)) in applied.iter().enumerate() {
        let expected = &known[i];
        if *version != expected.version || name != expected.name {
            return Err(LedgerError::StoreError {
                operation: MIGRATING.into(),
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
        for (i, m) in SQLITE_MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i64::try_from(i).unwrap() + 1);
        }
        assert_eq!(SQLITE_MIGRATIONS.last().unwrap().version, SCHEMA_VERSION);
    }
}
