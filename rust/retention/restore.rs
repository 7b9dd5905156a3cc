//! `restore`: read an archive line by line, checking everything before anything is written,
//! then insert every tree in one transaction, parents before the rows that refer to them.
//!
//! [`Reader`] checks one line at a time against the format: a header first (this format, the
//! same columns this library archives, a schema no newer than this library's), tree lines whose
//! rows have the header's widths and hold only what the ledger writes (every cell by the rules
//! of [`super::rules`]; statuses with their finish times; blobs that hash to their digests and
//! are canonical JSON; every row belonging to the tree's runs and every reference resolved
//! within the tree; event revisions 1, 2, ... per run; no key twice in the archive), and a
//! trailer whose counts match. A file that ends without its trailer is truncated.
//!
//! [`restore`] reads the archive twice. The first reading checks every line and asks the
//! ledger about every key a restored row must not share with a row already there (run ids,
//! event seqs, dispatch ids, idempotency keys). The second reads it again, each line compared
//! by digest with the one checked (a file may change in between), and inserts every tree in
//! **one** transaction, so a refusal
//! at any point, a conflict the checks could not foresee (a run started in between) or a
//! `kill -9` leaves the ledger exactly as it was: restore is all or nothing. The price is that
//! the ledger's write lock (SQLite) is held for the whole insert.

use std::collections::{HashMap, HashSet};

use serde_json::Value as JsonValue;
use sha2::{Digest as _, Sha256};

use super::archive::{self, Cell, Tree, BLOBS, DEFINITIONS, FORMAT, RUN_BLOB_COLUMNS};
use super::rules;
use crate::canonical::Json;
use crate::errors::{LedgerError, Result};
use crate::events::json_array;
use crate::params;
use crate::status::{AttemptStatus, RunStatus};
use crate::store::migrate::SCHEMA_VERSION;
use crate::store::{DbError, DbErrorKind, Store, ToSql, Tx};

/// The argument errors name.
const ARG: &str = "archive";

/// Trees are checked against the ledger in batches of about this many rows (one read each).
const CHECK_ROWS: usize = 20_000;

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
    /// Keys unique across the ledger, seen so far in this archive.
    seqs: HashSet<i64>,
    dispatch_ids: HashSet<String>,
    idempotency_keys: HashSet<String>,
    /// The highest event seq read.
    max_seq: i64,
    /// Lines this reader checked before, known byte for byte: parsed, not checked again.
    trusted: bool,
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

/// Where `column` sits in `table`'s rows.
///
/// # Panics
///
/// Never for the archived tables' own columns, the only ones asked for.
fn at(table: &str, column: &str) -> usize {
    archive::table(table).position(column)
}

fn int(cell: &Cell) -> Option<i64> {
    match cell {
        Cell::Int(v) => Some(*v),
        _ => None,
    }
}

impl Reader {
    /// A reader at the start of an archive.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reader of lines a reader made by [`Reader::new`] has checked, byte for byte.
    fn trusting() -> Self {
        Self {
            trusted: true,
            ..Self::default()
        }
    }

    /// The highest event seq read so far (0 before any).
    pub fn max_seq(&self) -> i64 {
        self.max_seq
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
            only_keys(n, &doc, &["fencepost_archive", "schema_version", "tables"])?;
            match doc.get("schema_version").and_then(JsonValue::as_i64) {
                Some(v) if (1..=SCHEMA_VERSION).contains(&v) => {}
                Some(v) if v > SCHEMA_VERSION => {
                    return Err(bad(
                        n,
                        format!(
                            "written by a ledger at schema {v}, newer than this library's \
                             {SCHEMA_VERSION}: restore it with the fencepost that wrote it, or \
                             a newer one"
                        ),
                    ))
                }
                _ => return Err(bad(n, "a header without a schema version")),
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
            only_keys(n, &doc, &["fencepost_archive_end"])?;
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
        if let Some(key) = doc
            .keys()
            .find(|k| *k != "tree" && archive::tables().all(|t| t.name != k.as_str()))
        {
            return Err(bad(
                n,
                format!("tree {root:?}: {key:?} is not a table this library archives"),
            ));
        }
        let mut tree = Tree {
            root: root.clone(),
            rows: Vec::new(),
        };
        for table in archive::tables() {
            let width = self
                .widths
                .get(table.name)
                .copied()
                .unwrap_or(table.columns.len());
            // A table the archive's header does not list (one added after it was written):
            // the tree has none of its rows.
            if width == 0 && archive::ADDED_TABLES.contains(&table.name) {
                if doc.contains_key(table.name) {
                    return Err(bad(
                        n,
                        format!(
                            "tree {root:?}: {} rows where the header lists no such table",
                            table.name
                        ),
                    ));
                }
                tree.rows.push((table.name, Vec::new()));
                continue;
            }
            let rows = doc
                .get(table.name)
                .and_then(JsonValue::as_array)
                .ok_or_else(|| bad(n, format!("tree {root:?}: no {} rows", table.name)))?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let cells = row.as_array().filter(|r| r.len() == width).ok_or_else(|| {
                    bad(
                        n,
                        format!("tree {root:?}: a {} row of the wrong width", table.name),
                    )
                })?;
                let mut cells = cells
                    .iter()
                    .zip(table.columns)
                    .map(|(c, column)| cell(c, table.name == BLOBS.name && *column == "bytes"))
                    .collect::<Option<Vec<Cell>>>()
                    .ok_or_else(|| {
                        bad(
                            n,
                            format!(
                                "tree {root:?}: a value in {} that is not an integer, text or \
                                 NULL (or an integer past 64 bits)",
                                table.name
                            ),
                        )
                    })?;
                // Columns the archive predates take the value the migration gave old rows.
                cells.extend(table.columns[width..].iter().map(|c| added(table.name, c)));
                out.push(cells);
            }
            tree.rows.push((table.name, out));
        }
        if self.trusted {
            return Ok(tree);
        }
        self.check_tree(&tree)
            .map_err(|why| bad(n, format!("tree {root:?}: {why}")))?;
        for id in tree.run_ids() {
            self.seen.insert(id.to_owned());
        }
        self.max_seq = self.max_seq.max(tree.highest_seq());
        let key_at = at("events", "idempotency_key");
        for row in tree.rows_of("events") {
            self.seqs.insert(int(&row[0]).unwrap_or(0));
            if let Some(key) = row[key_at].text() {
                self.idempotency_keys.insert(key.to_owned());
            }
        }
        let dispatch_at = at("attempts", "dispatch_id");
        for row in tree.rows_of("attempts") {
            if let Some(id) = row[dispatch_at].text() {
                self.dispatch_ids.insert(id.to_owned());
            }
        }
        Ok(tree)
    }

    /// Every rule a tree's rows must keep, in the order a reader would look: each value alone,
    /// then the rows' ties to each other, then keys against the rest of the archive.
    fn check_tree(&self, tree: &Tree) -> std::result::Result<(), String> {
        for (table, rows) in &tree.rows {
            let columns = archive::table(table).columns;
            for row in rows {
                for (column, value) in columns.iter().zip(row) {
                    if let Some(why) = rules::check(table, column, value) {
                        return Err(why);
                    }
                }
            }
        }
        let runs = tree.run_ids();
        if runs.first() != Some(&tree.root.as_str()) {
            return Err("the tree's first run is not its root".into());
        }
        let ids: HashSet<&str> = runs.iter().copied().collect();
        for table in &archive::RUN_TABLES {
            let key_at = table.key_position();
            if let Some(row) = tree
                .rows_of(table.name)
                .iter()
                .find(|row| row[key_at].text().is_none_or(|id| !ids.contains(id)))
            {
                return Err(format!(
                    "a {} row of run {}, which is not in the tree",
                    table.name, row[key_at]
                ));
            }
        }
        check_runs(tree)?;
        check_blobs(tree)?;
        unique(tree, "steps", &["run_id", "step_id"])?;
        unique(tree, "steps", &["run_id", "sequence_index"])?;
        unique(tree, "units", &["run_id", "unit_id"])?;
        unique(tree, "attempts", &["run_id", "unit_id", "attempt"])?;
        unique(tree, "leases", &["resource_id"])?;
        unique(tree, "messages", &["run_id", "seq"])?;
        check_messages(tree)?;
        check_attempts(tree)?;
        check_leases(tree)?;
        check_events(tree)?;
        for id in &runs {
            if self.seen.contains(*id) {
                return Err(format!("run {id} is archived twice"));
            }
        }
        let twice = |what: &str, key: &dyn std::fmt::Display| {
            Err(format!("{what} {key} is in the archive twice"))
        };
        // Against the trees before this one, and within this one.
        let (key_at, dispatch_at) = (
            at("events", "idempotency_key"),
            at("attempts", "dispatch_id"),
        );
        let (mut seqs, mut keys, mut dispatch_ids) =
            (HashSet::new(), HashSet::new(), HashSet::new());
        for row in tree.rows_of("events") {
            let seq = int(&row[0]).unwrap_or(0);
            if self.seqs.contains(&seq) || !seqs.insert(seq) {
                return twice("events.seq", &row[0]);
            }
            if let Some(key) = row[key_at].text() {
                if self.idempotency_keys.contains(key) || !keys.insert(key) {
                    return twice("events.idempotency_key", &Cell::Text(key.to_owned()));
                }
            }
        }
        for row in tree.rows_of("attempts") {
            if let Some(id) = row[dispatch_at].text() {
                if self.dispatch_ids.contains(id) || !dispatch_ids.insert(id) {
                    return twice("attempts.dispatch_id", &Cell::Text(id.to_owned()));
                }
            }
        }
        Ok(())
    }
}

/// Refuse keys a line of this kind does not have: an archive this library did not write.
fn only_keys(n: u64, doc: &serde_json::Map<String, JsonValue>, keys: &[&str]) -> Result<()> {
    match doc.keys().find(|k| !keys.contains(&k.as_str())) {
        Some(key) => Err(bad(n, format!("{key:?} is not a key of this line"))),
        None => Ok(()),
    }
}

/// No two rows of `table` share `columns`.
fn unique(tree: &Tree, table: &str, columns: &[&str]) -> std::result::Result<(), String> {
    let positions: Vec<usize> = columns.iter().map(|c| at(table, c)).collect();
    let mut seen = HashSet::new();
    for row in tree.rows_of(table) {
        let key: Vec<&Cell> = positions.iter().map(|&i| &row[i]).collect();
        if !seen.insert(key.clone()) {
            return Err(format!(
                "two {table} rows share ({}) = ({})",
                columns.join(", "),
                key.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(())
}

/// Runs: parents before children within the tree, a finish time exactly when finished, and
/// only finished runs (prune archives nothing else, and a live run restored beside the ledger's
/// own would meet its scope guard and its controllers); blob references held by the tree.
fn check_runs(tree: &Tree) -> std::result::Result<(), String> {
    let (status_at, completed_at, parent_at) = (
        at("runs", "status"),
        at("runs", "completed_at"),
        at("runs", "parent_run_id"),
    );
    let (definition_at, invocation_at) = (
        at("runs", "definition_digest"),
        at("runs", "invocation_key"),
    );
    let blobs: HashSet<&str> = tree
        .rows_of("blobs")
        .iter()
        .filter_map(|r| r[0].text())
        .collect();
    let definitions: HashSet<&str> = tree
        .rows_of("definitions")
        .iter()
        .filter_map(|r| r[0].text())
        .collect();
    let mut before: HashSet<&str> = HashSet::new();
    let mut invocations = HashSet::new();
    for (i, row) in tree.rows_of("runs").iter().enumerate() {
        let id = row[0].text().unwrap_or_default();
        let status = row[status_at].text().and_then(RunStatus::parse);
        let finished = status.is_some_and(RunStatus::is_terminal);
        if finished != (row[completed_at] != Cell::Null) {
            return Err(format!(
                "run {id}: runs.status {} with runs.completed_at {}: a run has a finish \
                 time exactly when it is completed, failed or cancelled",
                row[status_at], row[completed_at]
            ));
        }
        if !finished {
            return Err(format!(
                "run {id}: runs.status {}: an archive holds only finished runs",
                row[status_at]
            ));
        }
        match (i, row[parent_at].text()) {
            (0, None) => {}
            (0, Some(p)) => {
                return Err(format!(
                    "run {id}: runs.parent_run_id {p:?}: the root of a tree has no parent"
                ))
            }
            (_, Some(p)) if before.contains(p) => {}
            (_, p) => {
                return Err(format!(
                    "run {id}: runs.parent_run_id {p:?} is not a run before it in the tree"
                ))
            }
        }
        if let (Some(p), Some(key)) = (row[parent_at].text(), row[invocation_at].text()) {
            if !invocations.insert((p, key)) {
                return Err(format!(
                    "run {id}: runs.invocation_key {key:?} is its parent's twice"
                ));
            }
        }
        for column in RUN_BLOB_COLUMNS {
            if let Some(digest) = row[at("runs", column)].text() {
                if !blobs.contains(digest) {
                    return Err(format!(
                        "run {id}: runs.{column} {digest} has no blob in the tree"
                    ));
                }
            }
        }
        if let Some(d) = row[definition_at].text() {
            if !definitions.contains(d) {
                return Err(format!(
                    "run {id}: runs.definition_digest {d} has no definition in the tree"
                ));
            }
        }
        before.insert(id);
    }
    Ok(())
}

/// Blobs hash to their digests; a definition names a blob of the tree.
fn check_blobs(tree: &Tree) -> std::result::Result<(), String> {
    unique(tree, BLOBS.name, &["digest"])?;
    unique(tree, DEFINITIONS.name, &["definition_digest"])?;
    let mut digests = HashSet::new();
    for row in tree.rows_of(BLOBS.name) {
        let (Some(digest), Cell::Bytes(bytes)) = (row[0].text(), &row[1]) else {
            return Err("a malformed blob".into());
        };
        if Json::new(bytes.clone()).digest != digest {
            return Err(format!("blob {digest} does not hash to its digest"));
        }
        digests.insert(digest);
    }
    for row in tree.rows_of(DEFINITIONS.name) {
        if let Some(d) = row[0].text().filter(|d| !digests.contains(d)) {
            return Err(format!(
                "definitions.definition_digest {d} has no blob in the tree"
            ));
        }
    }
    Ok(())
}

/// Attempts: of a unit of the tree, running exactly while unfinished.
fn check_attempts(tree: &Tree) -> std::result::Result<(), String> {
    let units: HashSet<(&Cell, &Cell)> = tree
        .rows_of("units")
        .iter()
        .map(|r| (&r[0], &r[at("units", "unit_id")]))
        .collect();
    let (unit_at, status_at, finished_at) = (
        at("attempts", "unit_id"),
        at("attempts", "status"),
        at("attempts", "finished_at"),
    );
    for row in tree.rows_of("attempts") {
        if !units.contains(&(&row[0], &row[unit_at])) {
            return Err(format!(
                "an attempt of unit {}, which has no units row in the tree",
                row[unit_at]
            ));
        }
        let running =
            row[status_at].text().and_then(AttemptStatus::parse) == Some(AttemptStatus::Running);
        if running != (row[finished_at] == Cell::Null) {
            return Err(format!(
                "attempts.status {} with attempts.finished_at {}: an attempt has a finish \
                 time exactly when it is no longer running",
                row[status_at], row[finished_at]
            ));
        }
    }
    Ok(())
}

/// Leases: the owner's columns set and cleared together.
fn check_leases(tree: &Tree) -> std::result::Result<(), String> {
    let owner: Vec<usize> = [
        "owner_type",
        "owner_id",
        "token_hash",
        "acquired_at",
        "heartbeat_at",
        "expires_at",
    ]
    .iter()
    .map(|c| at("leases", c))
    .collect();
    for row in tree.rows_of("leases") {
        let set = owner.iter().filter(|&&i| row[i] != Cell::Null).count();
        if set != 0 && set != owner.len() {
            return Err(format!(
                "the lease of run {} has some of its owner's columns and not others",
                row[0]
            ));
        }
    }
    Ok(())
}

/// Events: each run's revisions are 1, 2, ... with no gap (a run's revision is its newest
/// event's, and every write takes the next one).
fn check_events(tree: &Tree) -> std::result::Result<(), String> {
    let (resource_at, revision_at) = (at("events", "resource_id"), at("events", "revision"));
    let mut revisions: HashMap<&str, Vec<i64>> = HashMap::new();
    for row in tree.rows_of("events") {
        if let (Some(run), Some(rev)) = (row[resource_at].text(), int(&row[revision_at])) {
            revisions.entry(run).or_default().push(rev);
        }
    }
    for (run, mut revs) in revisions {
        revs.sort_unstable();
        if let Some((want, got)) = (1..).zip(&revs).find(|(want, got)| want != *got) {
            return Err(format!(
                "run {run}: events.revision {got} where {want} comes next: a run's revisions \
                 are 1, 2, 3, ... without a gap or a repeat"
            ));
        }
    }
    Ok(())
}

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

/// Messages: a key at most once per run and topic (as `messages_key` holds), and a taken
/// message both when and under which generation it was taken.
fn check_messages(tree: &Tree) -> std::result::Result<(), String> {
    let (run_at, topic_at, key_at) = (
        at("messages", "run_id"),
        at("messages", "topic"),
        at("messages", "key"),
    );
    let (consumed_at, generation_at) = (
        at("messages", "consumed_at"),
        at("messages", "consumed_generation"),
    );
    let mut keys = HashSet::new();
    for row in tree.rows_of("messages") {
        if row[key_at] != Cell::Null && !keys.insert((&row[run_at], &row[topic_at], &row[key_at])) {
            return Err(format!(
                "two messages rows share (run_id, topic, key) = ({}, {}, {})",
                row[run_at], row[topic_at], row[key_at]
            ));
        }
        if (row[consumed_at] == Cell::Null) != (row[generation_at] == Cell::Null) {
            return Err(format!(
                "message {}/{}: consumed_at and consumed_generation are set together",
                row[run_at],
                row[at("messages", "seq")]
            ));
        }
    }
    Ok(())
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
        if !tables.contains_key(t.name) && archive::ADDED_TABLES.contains(&t.name) {
            widths.insert(t.name, 0);
            continue;
        }
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
    if tables.len() != widths.values().filter(|w| **w > 0).count() {
        return Err(bad(n, "it archives tables this library does not know"));
    }
    Ok(widths)
}

/// An archive's lines, read from the start each time [`Lines::rewind`] is called: restore reads
/// them twice, and a transaction that must run again reads them again.
pub trait Lines {
    /// Start over at the first line.
    fn rewind(&mut self) -> Result<()>;
    /// The next line (with or without its newline), or `None` at the end.
    fn next_line(&mut self) -> Result<Option<Vec<u8>>>;
}

/// An archive in memory.
#[derive(Debug)]
pub struct BytesLines<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> BytesLines<'a> {
    /// The lines of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }
}

impl Lines for BytesLines<'_> {
    fn rewind(&mut self) -> Result<()> {
        self.at = 0;
        Ok(())
    }

    fn next_line(&mut self) -> Result<Option<Vec<u8>>> {
        let rest = &self.bytes[self.at..];
        if rest.is_empty() {
            return Ok(None);
        }
        let end = rest
            .iter()
            .position(|b| *b == b'\n')
            .map_or(rest.len(), |i| i + 1);
        self.at += end;
        Ok(Some(rest[..end].to_vec()))
    }
}

/// Restore the archive `lines` holds: check it whole (the file, then its keys against the
/// ledger), then insert every tree in one transaction. `progress` sees the runs inserted so
/// far (they commit together at the end). The number of runs restored.
pub fn restore(
    store: &mut dyn Store,
    lines: &mut dyn Lines,
    progress: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<u64> {
    lines.rewind()?;
    let mut reader = Reader::new();
    let mut batch: Vec<Tree> = Vec::new();
    let mut rows = 0;
    // Each line's digest: the second reading must see exactly the lines the first checked (a
    // file can change in between), and then need not check them again.
    let mut digests: Vec<[u8; 32]> = Vec::new();
    while let Some(line) = lines.next_line()? {
        digests.push(Sha256::digest(&line).into());
        if let Some(tree) = reader.read(&line)? {
            rows += tree.rows.iter().map(|(_, r)| r.len()).sum::<usize>();
            batch.push(tree);
            if rows >= CHECK_ROWS {
                check_ledger(store, &batch)?;
                batch.clear();
                rows = 0;
            }
        }
    }
    reader.finish()?;
    check_ledger(store, &batch)?;
    drop(batch);
    // In a transaction of its own before the insert (see `raise_event_seq`): a restore that
    // then fails leaves a gap in the numbering, never a number handed out twice.
    if reader.max_seq() > 0 {
        super::raise_event_seq(store, reader.max_seq())?;
    }
    let changed = || {
        LedgerError::invalid(
            ARG,
            "the archive changed while it was being restored (its lines differ from the ones \
             checked); nothing was restored",
        )
    };
    store.write("restoring", |tx| {
        lines.rewind()?;
        let mut reader = Reader::trusting();
        let mut runs = 0;
        let mut at = 0;
        while let Some(line) = lines.next_line()? {
            let digest: [u8; 32] = Sha256::digest(&line).into();
            if digests.get(at) != Some(&digest) {
                return Err(changed());
            }
            at += 1;
            if let Some(tree) = reader.read(&line)? {
                runs += insert_tree(tx, &tree)?;
                progress(runs)?;
            }
        }
        if at != digests.len() {
            return Err(changed());
        }
        // Whatever is still queued goes out now, so a failure is this body's to name.
        tx.query(&super::sql::FLUSH_SQL, params![], &mut |_| Ok(true))
            .map_err(|e| refused(tx, "the last tree", &e))?;
        Ok(runs)
    })
}

/// Refuse the first tree of `trees` holding a key a row of the ledger holds already: a run id,
/// an event seq, a dispatch id or an idempotency key (each unique across the ledger, and never
/// renumbered by restore).
pub fn check_ledger(store: &mut dyn Store, trees: &[Tree]) -> Result<()> {
    if trees.is_empty() {
        return Ok(());
    }
    let text_keys = |table: &str, column: &str| -> Vec<String> {
        let i = at(table, column);
        trees
            .iter()
            .flat_map(|t| t.rows_of(table).iter().filter_map(|r| r[i].text()))
            .map(str::to_owned)
            .collect()
    };
    let runs = text_keys("runs", "run_id");
    let dispatch_ids = text_keys("attempts", "dispatch_id");
    let idempotency_keys = text_keys("events", "idempotency_key");
    let seqs: Vec<String> = trees
        .iter()
        .flat_map(|t| t.rows_of("events").iter().filter_map(|r| int(&r[0])))
        .map(|s| s.to_string())
        .collect();
    let found = store.read("restoring", |tx| {
        tx.rows(&super::sql::PLANNER_SQL, params![], |_| Ok(()))?;
        let mut found: Vec<(&str, &str, String)> = Vec::new();
        for (table, column, keys, sql) in [
            ("runs", "run_id", &runs, &super::sql::EXISTING_RUNS_SQL),
            ("events", "seq", &seqs, &super::sql::EXISTING_SEQS_SQL),
            (
                "attempts",
                "dispatch_id",
                &dispatch_ids,
                &super::sql::EXISTING_DISPATCH_IDS_SQL,
            ),
            (
                "events",
                "idempotency_key",
                &idempotency_keys,
                &super::sql::EXISTING_IDEMPOTENCY_KEYS_SQL,
            ),
        ] {
            for chunk in keys.chunks(500) {
                let hits = tx.rows(sql, params![json_array(chunk)], |r| r.get::<String>(0))?;
                if let Some(hit) = hits.into_iter().next() {
                    found.push((table, column, hit));
                    break;
                }
            }
        }
        Ok(found)
    })?;
    let Some((table, column, key)) = found.into_iter().next() else {
        return Ok(());
    };
    let i = at(table, column);
    let root = trees
        .iter()
        .find(|t| {
            t.rows_of(table).iter().any(|r| match &r[i] {
                Cell::Text(s) => *s == key,
                Cell::Int(v) => v.to_string() == key,
                _ => false,
            })
        })
        .map_or("?", |t| t.root.as_str());
    Err(LedgerError::invalid(
        ARG,
        format!(
            "tree {root:?}: {table}.{column} {key} exists in the ledger already; restore never \
             overwrites a row nor renumbers one (was this archive restored before?), so \
             nothing was restored"
        ),
    ))
}

/// Insert one checked tree's rows, blobs and definitions first (kept if already there: content
/// addressed), then its runs parents first, then their rows. The number of runs inserted.
fn insert_tree(tx: &dyn Tx, tree: &Tree) -> Result<u64> {
    for table in archive::tables() {
        let insert = &archive::statements(table).insert;
        for row in tree.rows_of(table.name) {
            let params: Vec<&dyn ToSql> = row.iter().map(|c| c as &dyn ToSql).collect();
            if table.name == "runs" {
                // Waited for: it also brings back the failure of anything queued before it.
                tx.exec_raw(insert, &params)
                    .map_err(|e| refused(tx, &tree.root, &e))?;
            } else {
                // Nothing to interpret: pipelined on PostgreSQL.
                tx.defer(insert, &params)
                    .map_err(|e| refused(tx, &tree.root, &e))?;
            }
        }
    }
    Ok(tree.rows_of("runs").len() as u64)
}

/// A statement of the restoring transaction failed. Contention stays the store's to retry; any
/// other failure is the archive's (the checks could not foresee it: a row the ledger gained
/// since they read it), and the whole transaction rolls back.
fn refused(tx: &dyn Tx, tree: &str, e: &DbError) -> LedgerError {
    match e.kind {
        DbErrorKind::Busy | DbErrorKind::Unavailable => tx.fail(e),
        _ => LedgerError::invalid(
            ARG,
            format!(
                "tree {tree:?} (or one just before it) conflicts with the ledger: {}; nothing \
                 was restored",
                e.message
            ),
        ),
    }
}
