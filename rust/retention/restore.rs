//! `restore`: read an archive line by line, checking everything before anything is written,
//! then insert its trees, parents before the rows that refer to them.
//!
//! [`Reader`] checks one line at a time against the format: a header first (this format, the
//! same columns this library archives), tree lines whose rows have the header's widths and only
//! integers, text and NULL, whose blobs hash to their digests and whose rows all belong to the
//! tree's runs, and a trailer whose counts match. A file that ends without its trailer is
//! truncated. The caller reads the whole archive once through a `Reader` (and asks
//! [`existing_runs`] about every run id) before the second reading inserts: a bad line anywhere
//! means nothing is written.

use std::collections::{HashMap, HashSet};

use serde_json::Value as JsonValue;

use super::archive::{self, Cell, Tree, BLOBS, FORMAT};
use crate::canonical::Json;
use crate::errors::{LedgerError, Result};
use crate::events::json_array;
use crate::params;
use crate::status::{AttemptStatus, RunStatus, StepStatus, UnitStatus};
use crate::store::{Store, ToSql};

/// The argument errors name.
const ARG: &str = "archive";

/// Reads an archive's lines in order, checking each.
#[derive(Debug, Default)]
pub struct Reader {
    line: u64,
    /// Inside a section (after its header, before its trailer).
    open: bool,
    sections: u64,
    trees: u64,
    runs: u64,
    /// Every run id seen, to refuse a run archived twice.
    seen: HashSet<String>,
    /// Each table's width in the open section's header: fewer columns than this library's
    /// when the archive predates the columns of [`archive::ADDED_COLUMNS`].
    widths: HashMap<&'static str, usize>,
}

fn bad(line: u64, why: impl std::fmt::Display) -> LedgerError {
    LedgerError::invalid(
        ARG,
        format!("line {line} is not a fencepost archive line ({why}); nothing was restored"),
    )
}

impl Reader {
    /// A reader at the start of an archive.
    pub fn new() -> Self {
        Self::default()
    }

    /// Check one line; the tree it holds, if it is a tree line.
    pub fn read(&mut self, text: &[u8]) -> Result<Option<Tree>> {
        self.line += 1;
        let n = self.line;
        let text = text.strip_suffix(b"\n").unwrap_or(text);
        if text.is_empty() {
            return Err(bad(n, "an empty line"));
        }
        let doc: JsonValue =
            serde_json::from_slice(text).map_err(|e| bad(n, format!("not JSON: {e}")))?;
        let JsonValue::Object(doc) = doc else {
            return Err(bad(n, "not a JSON object"));
        };
        if let Some(format) = doc.get("fencepost_archive") {
            if self.open {
                return Err(bad(
                    n,
                    "a header inside a section: the section before it is truncated",
                ));
            }
            if format.as_i64() != Some(FORMAT) {
                return Err(bad(
                    n,
                    format!("archive format {format}, this library reads {FORMAT}"),
                ));
            }
            self.widths = check_columns(n, doc.get("tables"))?;
            self.open = true;
            self.sections += 1;
            self.trees = 0;
            self.runs = 0;
            return Ok(None);
        }
        if !self.open {
            return Err(bad(
                n,
                "no header before it: not a fencepost archive, or its start is missing",
            ));
        }
        if let Some(end) = doc.get("fencepost_archive_end") {
            let trees = end.get("trees").and_then(JsonValue::as_u64);
            let runs = end.get("runs").and_then(JsonValue::as_u64);
            if trees != Some(self.trees) || runs != Some(self.runs) {
                return Err(bad(
                    n,
                    format!(
                        "the trailer counts {} trees and {} runs, the section holds {} and {}",
                        trees.map_or("?".into(), |t| t.to_string()),
                        runs.map_or("?".into(), |t| t.to_string()),
                        self.trees,
                        self.runs
                    ),
                ));
            }
            self.open = false;
            return Ok(None);
        }
        let tree = self.tree(n, &doc)?;
        self.trees += 1;
        self.runs += tree.run_ids().len() as u64;
        Ok(Some(tree))
    }

    /// The end of the file: every section closed, at least one read.
    pub fn finish(&self) -> Result<()> {
        if self.open || self.sections == 0 {
            return Err(LedgerError::invalid(
                ARG,
                format!(
                    "the archive ends at line {} without its trailer: it is truncated (or a \
                     prune that wrote it did not finish); nothing was restored",
                    self.line
                ),
            ));
        }
        Ok(())
    }

    fn tree(&mut self, n: u64, doc: &serde_json::Map<String, JsonValue>) -> Result<Tree> {
        let root = doc
            .get("tree")
            .and_then(JsonValue::as_str)
            .ok_or_else(|| bad(n, "no \"tree\" run id"))?
            .to_owned();
        let mut tree = Tree {
            root: root.clone(),
            rows: Vec::new(),
        };
        for table in archive::tables() {
            let rows = doc
                .get(table.name)
                .and_then(JsonValue::as_array)
                .ok_or_else(|| bad(n, format!("no {} rows", table.name)))?;
            let width = self
                .widths
                .get(table.name)
                .copied()
                .unwrap_or(table.columns.len());
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let cells = row
                    .as_array()
                    .filter(|r| r.len() == width)
                    .ok_or_else(|| bad(n, format!("a {} row of the wrong width", table.name)))?;
                let mut cells = cells
                    .iter()
                    .zip(table.columns)
                    .map(|(c, column)| cell(c, table.name == BLOBS.name && *column == "bytes"))
                    .collect::<Option<Vec<Cell>>>()
                    .ok_or_else(|| bad(n, format!("a {} value that is not stored", table.name)))?;
                // Columns the archive predates take the value the migration gave old rows.
                cells.extend(table.columns[width..].iter().map(|c| added(table.name, c)));
                out.push(cells);
            }
            tree.rows.push((table.name, out));
        }
        let runs: Vec<String> = tree.run_ids().iter().map(|s| (*s).to_owned()).collect();
        if runs.first() != Some(&root) {
            return Err(bad(n, "the tree's first run is not its root"));
        }
        let ids: HashSet<&str> = runs.iter().map(String::as_str).collect();
        for table in &archive::RUN_TABLES {
            let key_at = table
                .columns
                .iter()
                .position(|c| *c == table.key)
                .unwrap_or(0);
            if tree
                .rows_of(table.name)
                .iter()
                .any(|row| row[key_at].text().is_none_or(|id| !ids.contains(id)))
            {
                return Err(bad(n, format!("a {} row of another run", table.name)));
            }
        }
        for (table, column, known) in ENUMS {
            let at = archive::tables()
                .find(|t| t.name == table)
                .and_then(|t| t.columns.iter().position(|c| *c == column))
                .expect("an enumerated column of an archived table");
            if let Some(row) = tree
                .rows_of(table)
                .iter()
                .find(|row| row[at].text().is_none_or(|v| !known(v)))
            {
                return Err(bad(
                    n,
                    format!(
                        "{table}.{column} {:?} is not a value the ledger writes",
                        row[at]
                    ),
                ));
            }
        }
        for row in tree.rows_of(BLOBS.name) {
            let (Some(digest), Cell::Bytes(bytes)) = (row[0].text(), &row[1]) else {
                return Err(bad(n, "a malformed blob"));
            };
            if Json::new(bytes.clone()).digest != digest {
                return Err(bad(n, format!("blob {digest} does not hash to its digest")));
            }
        }
        for id in runs {
            if !self.seen.insert(id.clone()) {
                return Err(bad(n, format!("run {id} is archived twice")));
            }
        }
        Ok(tree)
    }
}

/// The enumerated columns, checked before anything is written, so an edited archive is refused
/// whole instead of failing halfway through its inserts.
/// `(table, column, is a value the ledger writes)`.
type Enumerated = (&'static str, &'static str, fn(&str) -> bool);

const ENUMS: [Enumerated; 6] = [
    ("runs", "status", |v| RunStatus::parse(v).is_some()),
    ("steps", "status", |v| StepStatus::parse(v).is_some()),
    ("units", "status", |v| UnitStatus::parse(v).is_some()),
    ("attempts", "status", |v| AttemptStatus::parse(v).is_some()),
    ("units", "phase", |v| matches!(v, "unit" | "gate")),
    ("attempts", "phase", |v| matches!(v, "unit" | "gate")),
];

/// A stored value from its archive JSON: integers, text and NULL (a blob's bytes as text).
fn cell(v: &JsonValue, bytes: bool) -> Option<Cell> {
    Some(match v {
        JsonValue::Null => Cell::Null,
        JsonValue::Number(n) => Cell::Int(n.as_i64()?),
        JsonValue::String(s) if bytes => Cell::Bytes(s.as_bytes().to_vec()),
        JsonValue::String(s) => Cell::Text(s.clone()),
        _ => return None,
    })
}

/// The value a column of [`archive::ADDED_COLUMNS`] takes in a row archived before it.
fn added(table: &str, column: &str) -> Cell {
    archive::ADDED_COLUMNS
        .iter()
        .find(|(t, c, _)| *t == table && *c == column)
        .map_or(Cell::Null, |(_, _, value)| value.clone())
}

/// The header's tables must be this library's: the same tables, each with this library's
/// columns in the same order, or (an archive written before some columns were added) a prefix
/// of them that leaves out only columns of [`archive::ADDED_COLUMNS`]. Returns each table's
/// width in the archive.
fn check_columns(n: u64, tables: Option<&JsonValue>) -> Result<HashMap<&'static str, usize>> {
    let tables = tables
        .and_then(JsonValue::as_object)
        .ok_or_else(|| bad(n, "a header without its tables"))?;
    let mut widths = HashMap::new();
    for t in archive::tables() {
        let width = tables
            .get(t.name)
            .and_then(JsonValue::as_array)
            .filter(|cols| {
                cols.len() <= t.columns.len()
                    && cols
                        .iter()
                        .zip(t.columns)
                        .all(|(a, b)| a.as_str() == Some(b))
                    && t.columns[cols.len()..].iter().all(|c| {
                        archive::ADDED_COLUMNS
                            .iter()
                            .any(|(table, column, _)| *table == t.name && column == c)
                    })
            })
            .map(Vec::len)
            .ok_or_else(|| {
                bad(
                    n,
                    format!("its {} columns differ from this library's", t.name),
                )
            })?;
        widths.insert(t.name, width);
    }
    if tables.len() != archive::tables().count() {
        return Err(bad(n, "it archives tables this library does not know"));
    }
    Ok(widths)
}

/// Which of `run_ids` are in the ledger.
pub fn existing_runs(store: &mut dyn Store, run_ids: &[String]) -> Result<Vec<String>> {
    store.read("restoring", |tx| {
        tx.rows(&super::sql::PLANNER_SQL, params![], |_| Ok(()))?;
        let mut found = Vec::new();
        for chunk in run_ids.chunks(500) {
            found.extend(tx.rows(
                &super::sql::EXISTING_RUNS_SQL,
                params![json_array(chunk)],
                |r| r.get::<String>(0),
            )?);
        }
        Ok(found)
    })
}

/// Insert `trees` in one transaction: blobs and definitions first (kept if already there, as
/// content addressed rows), then each tree's runs parents first, then their rows. A run id that
/// exists by now fails the transaction. The number of runs inserted.
pub fn insert_trees(store: &mut dyn Store, trees: &[Tree]) -> Result<u64> {
    store.write("restoring", |tx| {
        let mut runs = 0;
        for table in archive::tables() {
            let insert = &archive::statements(table).insert;
            for tree in trees {
                for row in tree.rows_of(table.name) {
                    let params: Vec<&dyn ToSql> = row.iter().map(|c| c as &dyn ToSql).collect();
                    if table.name != "runs" {
                        // Nothing to interpret: pipelined on PostgreSQL, any failure fails the
                        // commit.
                        tx.exec_later(insert, &params)?;
                        continue;
                    }
                    match tx.exec_raw(insert, &params) {
                        Ok(_) => {}
                        Err(e) if e.is_unique("runs_pkey", "runs.run_id") => {
                            return Err(LedgerError::invalid(
                                ARG,
                                format!(
                                    "run {} exists in the ledger (restored or started since the \
                                     archive was checked); restore never overwrites a run",
                                    row[0].text().unwrap_or("?")
                                ),
                            ))
                        }
                        Err(e) => return Err(tx.fail(&e)),
                    }
                }
                if table.name == "runs" {
                    runs += tree.rows_of("runs").len() as u64;
                }
            }
        }
        Ok(runs)
    })
}
