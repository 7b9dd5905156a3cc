//! The two dialects describe one schema: after every migration, SQLite and PostgreSQL have the
//! same tables with the same columns, so the statements written once read both (SQLite's
//! `event_seq_floor` aside: PostgreSQL numbers events with a sequence instead). Run with the
//! `postgres` feature, against the server `FENCEPOST_PG_URL` names; an unreachable server fails
//! the test.

use std::collections::BTreeSet;

use crate::params;
use crate::store::testing::{postgres_fresh, sqlite_memory};
use crate::store::{Sql, Store};

/// Every (table, column) pair the catalog query `text` lists.
fn columns(store: &mut dyn Store, text: &'static str) -> BTreeSet<(String, String)> {
    store
        .read("reading the catalog", |tx| {
            tx.rows(&Sql::native(text), params![], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
        })
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn both_dialects_have_the_same_tables_and_columns() {
    let mut sqlite = sqlite_memory();
    let (mut postgres, _dropper) = postgres_fresh();
    // SQLite's own `sqlite_%` tables (e.g. `sqlite_sequence`) are not the ledger's, and
    // `event_seq_floor` stands in for PostgreSQL's identity sequence: only SQLite's halves of
    // the statements name it.
    let on_sqlite = columns(
        &mut *sqlite,
        "SELECT m.name, p.name FROM sqlite_schema m, pragma_table_info(m.name) p
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name <> 'event_seq_floor'",
    );
    // `current_schema()`: the fresh schema the connection's search_path names.
    let on_postgres = columns(
        &mut *postgres,
        "SELECT CAST(table_name AS TEXT), CAST(column_name AS TEXT)
         FROM information_schema.columns WHERE table_schema = current_schema()",
    );
    let tables = |set: &BTreeSet<(String, String)>| -> BTreeSet<String> {
        set.iter().map(|(t, _)| t.clone()).collect()
    };
    assert!(
        tables(&on_sqlite).contains("runs") && tables(&on_sqlite).contains("schema_migrations"),
        "{on_sqlite:?}"
    );
    assert_eq!(
        tables(&on_sqlite),
        tables(&on_postgres),
        "the tables differ"
    );
    let only_sqlite: Vec<_> = on_sqlite.difference(&on_postgres).collect();
    let only_postgres: Vec<_> = on_postgres.difference(&on_sqlite).collect();
    assert!(
        only_sqlite.is_empty() && only_postgres.is_empty(),
        "columns only on SQLite: {only_sqlite:?}; only on PostgreSQL: {only_postgres:?}"
    );
}
