//! The archive format and the statements that read, remove and re-insert whole run trees.
//!
//! An archive is JSON lines in sections. A section opens with a header naming the format, the
//! schema version and every archived table's columns, holds one line per run tree (every row of
//! every table that belongs to the tree, as arrays in the header's column order, with the blobs
//! and definitions the tree's runs refer to), and closes with a trailer counting its trees and
//! runs. The trailer is what tells a complete section from a truncated one, and sections may
//! follow each other (two prunes into one file, or concatenated gzip members).
//!
//! Rows travel as they are stored: integers, text, NULL; canonical JSON columns keep their
//! exact text, and a blob's bytes (canonical JSON, so UTF-8) travel as a string whose digest
//! `restore` recomputes. A column's order is the header's, so an archive names what it holds
//! instead of relying on the reader's schema matching the writer's.

use std::sync::OnceLock;

use serde_json::{Map, Value as JsonValue};

use crate::errors::{LedgerError, Result};
use crate::store::{DbResult, Row, Sql, SqlValue, ToSql};

/// The format's version, in every header.
pub const FORMAT: i64 = 1;

/// Columns a later schema appended to an archived table, with the value a row archived before
/// them takes on restore: an older archive's header lists the table's columns without them (a
/// prefix of today's), and its rows are as wide as its header. Appended only at a table's end,
/// so what an older header lists is always a prefix.
pub const ADDED_COLUMNS: [(&str, &str, Cell); 10] = [
    ("attempts", "trace_context", Cell::Null),
    ("leases", "takeovers", Cell::Int(0)),
    ("leases", "refused_writes", Cell::Int(0)),
    ("runs", "not_before", Cell::Null),
    ("runs", "priority", Cell::Int(0)),
    ("runs", "concurrency_key", Cell::Null),
    // Every archived run has ended (only terminal trees are pruned).
    ("leases", "run_ended", Cell::Int(1)),
    // No retry policy, and no unit waiting for a retry.
    ("runs", "retry_policy", Cell::Null),
    ("steps", "retry_policy", Cell::Null),
    ("units", "retry_at", Cell::Null),
];

/// Tables a later schema added to a run tree: an older archive's header does not list them,
/// and its trees have none of their rows.
pub const ADDED_TABLES: [&str; 1] = ["messages"];

/// One archived table: its columns in schema order, the column that ties a row to its run (or
/// digest), and the order rows are read in (their primary key, so an archive is deterministic).
#[derive(Debug)]
pub struct Table {
    /// The table.
    pub name: &'static str,
    /// Every column, in schema order.
    pub columns: &'static [&'static str],
    /// The run id (or digest) column the statements select by.
    pub key: &'static str,
    /// `ORDER BY` of the read.
    pub order: &'static str,
}

impl Table {
    /// Where `column` sits in this table's rows.
    ///
    /// # Panics
    ///
    /// When the table has no such column: callers name columns of the tables above.
    pub fn position(&self, column: &str) -> usize {
        self.columns
            .iter()
            .position(|c| *c == column)
            .unwrap_or_else(|| panic!("{} has no column {column}", self.name))
    }

    /// Where this table's key column sits.
    pub fn key_position(&self) -> usize {
        self.position(self.key)
    }
}

/// The archived table named `name`.
///
/// # Panics
///
/// When no archived table has that name: callers name the tables above.
pub fn table(name: &str) -> &'static Table {
    tables()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} is not an archived table"))
}

/// The tables of a run tree, parents before the rows that refer to them (the order `restore`
/// inserts in; `prune` deletes in the reverse).
pub const RUN_TABLES: [Table; 7] = [
    Table {
        name: "runs",
        columns: &[
            "run_id",
            "workflow_ref",
            "workflow_name",
            "definition_digest",
            "scope_key",
            "guarded",
            "status",
            "params",
            "input",
            "launch_options",
            "source",
            "plan",
            "plan_version",
            "current_step_id",
            "outputs",
            "parent_run_id",
            "parent_unit_id",
            "invocation_key",
            "origin_session_id",
            "runner_id",
            "agent_harness",
            "agent_session_id",
            "created_at",
            "updated_at",
            "completed_at",
            // The scheduling a run was queued with. Its lane (`queue_lane`, `due_at`) is not
            // archived: only terminal runs are, and they are in no lane.
            "not_before",
            "priority",
            "concurrency_key",
            "retry_policy",
        ],
        key: "run_id",
        order: "run_id",
    },
    Table {
        name: "steps",
        columns: &[
            "run_id",
            "step_id",
            "title",
            "instructions",
            "completion",
            "sequence_index",
            "status",
            "notes",
            "evidence",
            "summary",
            "completed_at",
            "retry_policy",
        ],
        key: "run_id",
        order: "run_id, step_id",
    },
    Table {
        name: "units",
        columns: &[
            "run_id",
            "unit_id",
            "step_id",
            "node_id",
            "parent_unit_id",
            "phase",
            "runner",
            "engine",
            "model",
            "input_hash",
            "worktree_path",
            "status",
            "claim_holder",
            "attempts",
            "result",
            "tokens",
            "failure_reason",
            "session_id",
            "first_started_at",
            "started_at",
            "finished_at",
            "retry_at",
        ],
        key: "run_id",
        order: "run_id, unit_id",
    },
    Table {
        name: "attempts",
        columns: &[
            "run_id",
            "unit_id",
            "attempt",
            "dispatch_id",
            "step_id",
            "node_id",
            "phase",
            "input_hash",
            "status",
            "holder",
            "lease_generation",
            "reclaims",
            "result",
            "tokens",
            "failure_reason",
            "session_id",
            "started_at",
            "finished_at",
            "trace_context",
        ],
        key: "run_id",
        order: "run_id, unit_id, attempt",
    },
    Table {
        name: "leases",
        columns: &[
            "resource_id",
            "generation",
            "owner_type",
            "owner_id",
            "token_hash",
            "acquired_at",
            "heartbeat_at",
            "expires_at",
            "takeovers",
            "refused_writes",
            "run_ended",
        ],
        key: "resource_id",
        order: "resource_id",
    },
    Table {
        name: "events",
        columns: &[
            "seq",
            "resource_id",
            "revision",
            "type",
            "actor_type",
            "actor_id",
            "generation",
            "payload",
            "idempotency_key",
            "ts",
        ],
        key: "resource_id",
        // The key's own index order: `ORDER BY seq` made SQLite walk the whole log in seq
        // order (checking each row against the list) rather than read each run's range.
        order: "resource_id, revision",
    },
    Table {
        name: "messages",
        columns: &[
            "run_id",
            "seq",
            "topic",
            "key",
            "payload",
            "sent_at",
            "consumed_at",
            "consumed_generation",
        ],
        key: "run_id",
        order: "run_id, seq",
    },
];

/// Blobs a tree's runs and definitions refer to.
pub const BLOBS: Table = Table {
    name: "blobs",
    columns: &["digest", "bytes", "created_at"],
    key: "digest",
    order: "digest",
};

/// Definitions a tree's runs refer to.
pub const DEFINITIONS: Table = Table {
    name: "definitions",
    columns: &["definition_digest", "workflow_name", "created_at"],
    key: "definition_digest",
    order: "definition_digest",
};

/// The runs columns that hold a blob's digest (`definition_digest` too: a definition is
/// stored as a blob under its own digest).
pub const RUN_BLOB_COLUMNS: [&str; 7] = [
    "definition_digest",
    "params",
    "input",
    "launch_options",
    "source",
    "plan",
    "outputs",
];

/// Every table an archive holds, in insert order.
pub fn tables() -> impl Iterator<Item = &'static Table> {
    [&BLOBS, &DEFINITIONS].into_iter().chain(RUN_TABLES.iter())
}

/// The statements over one table, made once from its [`Table`] (both dialects).
#[derive(Debug)]
pub struct TableSql {
    /// Rows whose key is in the JSON array `?1`, in the table's order.
    pub select: Sql,
    /// Delete the rows whose key is in the JSON array `?1`.
    pub delete: Sql,
    /// Insert one row, every column bound (`?1..?n`). Blobs and definitions are content
    /// addressed: a row already there is the same row, and is kept.
    pub insert: Sql,
}

/// `IN` over a JSON array parameter: SQLite reads it with `json_each`; PostgreSQL compares with
/// an array built from it, which the planner turns into index probes of the key (a join with a
/// set-returning function would be estimated at 100 rows and may scan).
const SQLITE_IN: &str = "IN (SELECT value FROM json_each(?1))";
const POSTGRES_IN: &str = "= ANY (ARRAY(SELECT json_array_elements_text(CAST(?1 AS TEXT)::json)))";

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

fn table_sql(t: &Table) -> TableSql {
    let columns = t.columns.join(", ");
    let select = |inn: &str| {
        format!(
            "SELECT {columns} FROM {} WHERE {} {inn} ORDER BY {}",
            t.name, t.key, t.order
        )
    };
    let delete = |inn: &str| format!("DELETE FROM {} WHERE {} {inn}", t.name, t.key);
    let placeholders: Vec<String> = (1..=t.columns.len()).map(|i| format!("?{i}")).collect();
    let placeholders = placeholders.join(", ");
    let conflict = if t.name == BLOBS.name || t.name == DEFINITIONS.name {
        " ON CONFLICT DO NOTHING"
    } else {
        ""
    };
    // `seq` is an identity column on PostgreSQL: an archived event keeps its number.
    let overriding = if t.name == "events" {
        " OVERRIDING SYSTEM VALUE"
    } else {
        ""
    };
    TableSql {
        select: Sql::split(leak(select(SQLITE_IN)), leak(select(POSTGRES_IN))),
        delete: Sql::split(leak(delete(SQLITE_IN)), leak(delete(POSTGRES_IN))),
        insert: Sql::split(
            leak(format!(
                "INSERT INTO {} ({columns}) VALUES ({placeholders}){conflict}",
                t.name
            )),
            leak(format!(
                "INSERT INTO {} ({columns}){overriding} VALUES ({placeholders}){conflict}",
                t.name
            )),
        ),
    }
}

/// The statements of `t`, made on first use and kept for the process (each backend caches its
/// prepared statements by text, so the texts must live as long).
///
/// # Panics
///
/// Never: every table `tables()` lists has its statements.
pub fn statements(t: &Table) -> &'static TableSql {
    static ALL: OnceLock<Vec<(&'static str, TableSql)>> = OnceLock::new();
    let all = ALL.get_or_init(|| tables().map(|t| (t.name, table_sql(t))).collect());
    all.iter()
        .find(|(name, _)| *name == t.name)
        .map(|(_, s)| s)
        .expect("every archived table has statements")
}

/// One stored value, owned: what a row's cell holds in an archive and binds back on restore.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cell {
    /// NULL.
    Null,
    /// An integer.
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes (a blob's canonical JSON).
    Bytes(Vec<u8>),
}

impl ToSql for Cell {
    fn to_sql(&self) -> SqlValue<'_> {
        match self {
            Self::Null => SqlValue::Null,
            Self::Int(v) => SqlValue::Int(*v),
            Self::Text(s) => SqlValue::Text(s),
            Self::Bytes(b) => SqlValue::Blob(b),
        }
    }
}

/// As a message shows a cell: NULL, a number, quoted text.
impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Null => f.write_str("NULL"),
            Self::Int(v) => write!(f, "{v}"),
            Self::Text(s) => write!(f, "{s:?}"),
            Self::Bytes(b) => write!(f, "{} bytes", b.len()),
        }
    }
}

impl Cell {
    /// The JSON an archive line holds for this cell.
    pub fn to_json(&self) -> Result<JsonValue> {
        Ok(match self {
            Self::Null => JsonValue::Null,
            Self::Int(v) => JsonValue::from(*v),
            Self::Text(s) => JsonValue::String(s.clone()),
            Self::Bytes(b) => JsonValue::String(String::from_utf8(b.clone()).map_err(|_| {
                LedgerError::StoreError {
                    operation: "archiving".into(),
                    message: "a stored blob is not UTF-8 canonical JSON".into(),
                }
            })?),
        })
    }

    /// The text, if this is text.
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::Text(s) => Some(s),
            _ => None,
        }
    }
}

/// One stored row, read column by column.
pub fn read_row(r: &dyn Row, width: usize) -> DbResult<Vec<Cell>> {
    (0..width)
        .map(|i| {
            Ok(match r.value(i)? {
                SqlValue::Null => Cell::Null,
                SqlValue::Int(v) => Cell::Int(v),
                SqlValue::Text(s) => Cell::Text(s.to_owned()),
                SqlValue::Blob(b) => Cell::Bytes(b.to_vec()),
            })
        })
        .collect()
}

/// The header line of a section.
pub fn header(schema_version: i64) -> Vec<u8> {
    let mut columns = Map::new();
    for t in tables() {
        columns.insert(t.name.into(), JsonValue::from(t.columns.to_vec()));
    }
    let mut doc = Map::new();
    doc.insert("fencepost_archive".into(), JsonValue::from(FORMAT));
    doc.insert("schema_version".into(), JsonValue::from(schema_version));
    doc.insert("tables".into(), JsonValue::Object(columns));
    line(&JsonValue::Object(doc))
}

/// The trailer line of a section.
pub fn trailer(trees: u64, runs: u64) -> Vec<u8> {
    let mut counts = Map::new();
    counts.insert("trees".into(), JsonValue::from(trees));
    counts.insert("runs".into(), JsonValue::from(runs));
    let mut doc = Map::new();
    doc.insert("fencepost_archive_end".into(), JsonValue::Object(counts));
    line(&JsonValue::Object(doc))
}

/// A JSON document as one line.
///
/// # Panics
///
/// Never: a `serde_json::Value` always serializes.
pub fn line(doc: &JsonValue) -> Vec<u8> {
    let mut out = serde_json::to_vec(doc).expect("a JSON value serializes");
    out.push(b'\n');
    out
}

/// One run tree's rows, table by table (`tables()` names), as an archive holds them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tree {
    /// The top-level run.
    pub root: String,
    /// `(table, rows)` in `tables()` order.
    pub rows: Vec<(&'static str, Vec<Vec<Cell>>)>,
}

impl Tree {
    /// The rows of `table`.
    pub fn rows_of(&self, table: &str) -> &[Vec<Cell>] {
        self.rows
            .iter()
            .find(|(name, _)| *name == table)
            .map_or(&[], |(_, rows)| rows.as_slice())
    }

    /// The tree's run ids, parents before children (the order they are inserted in).
    pub fn run_ids(&self) -> Vec<&str> {
        self.rows_of("runs")
            .iter()
            .filter_map(|row| row.first().and_then(Cell::text))
            .collect()
    }

    /// The highest `seq` among the tree's events (0 when it has none): what
    /// [`raise_event_seq`](super::raise_event_seq) must be given before the tree is restored.
    pub fn highest_seq(&self) -> i64 {
        self.rows_of("events")
            .iter()
            .filter_map(|row| match row.first() {
                Some(Cell::Int(seq)) => Some(*seq),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// The archive line of this tree.
    pub fn to_line(&self) -> Result<Vec<u8>> {
        let mut doc = Map::new();
        doc.insert("tree".into(), JsonValue::String(self.root.clone()));
        for (table, rows) in &self.rows {
            let rows = rows
                .iter()
                .map(|row| {
                    row.iter()
                        .map(Cell::to_json)
                        .collect::<Result<Vec<_>>>()
                        .map(JsonValue::Array)
                })
                .collect::<Result<Vec<_>>>()?;
            doc.insert((*table).into(), JsonValue::Array(rows));
        }
        Ok(line(&JsonValue::Object(doc)))
    }
}
