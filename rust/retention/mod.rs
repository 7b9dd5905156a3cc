//! Retention: `prune` removes whole terminal run trees (optionally archiving each first) in
//! short transactions, and `restore` puts archived trees back.
//!
//! **What goes.** A tree is a top-level run with its children and continuations, followed down
//! `parent_run_id`. It goes only whole, and only when every run in it is terminal, has a status
//! the caller named and finished before the cutoff: a parent never leaves without its children,
//! and a live child keeps its whole tree. With the tree go its steps, units, attempts, lease
//! and events, then the definitions and blobs its runs referred to that nothing else refers to.
//!
//! **Short transactions.** One batch of trees per transaction, the batch sized to take about
//! [`TARGET_MS`]: it grows while batches finish quickly and shrinks when one runs long, so a
//! dispatcher writing beside a prune waits at most about that long for the write lock. A single
//! tree is never split (never half a run), so one huge tree takes as long as it takes.
//!
//! **Archive before delete.** With an archive, each batch's trees are read, written to the
//! archive and flushed inside the transaction that deletes them, before the deletes run: a
//! crash before the commit leaves the trees in the ledger (and perhaps in the archive too), never
//! gone from both.

pub mod archive;
mod restore;
mod rules;
pub(crate) mod sql;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

pub use restore::{check_ledger, restore, BytesLines, Lines, Reader};

use crate::errors::{LedgerError, Result};
use crate::events::json_array;
use crate::params;
use crate::status::RunStatus;
use crate::store::migrate::SCHEMA_VERSION;
use crate::store::{Store, Tx};
use archive::{Cell, Table, Tree, BLOBS, DEFINITIONS, RUN_BLOB_COLUMNS, RUN_TABLES};

/// Number every event written from now on above `seq`, in a write transaction of its own.
/// Restore calls it with the highest `seq` of the archive's events ([`Tree::highest_seq`])
/// before it inserts them: archived events keep their numbers, which in another ledger can lie
/// above the next number it would hand out, and a new event must never take one of them nor
/// be numbered below them (a reader whose cursor passed them would skip it). Never lowers
/// anything: a `seq` the ledger's numbering has passed changes nothing. In a transaction of
/// its own, not restore's: on PostgreSQL it holds every event writer back from its lock to
/// its commit, which here is one statement later.
pub fn raise_event_seq(store: &mut dyn Store, seq: i64) -> Result<()> {
    store.write("restoring", |tx| {
        tx.rows(&sql::SEQ_LOCK_SQL, params![], |_| Ok(()))?;
        tx.rows(&sql::SEQ_AT_LEAST_SQL, params![seq], |_| Ok(()))?;
        Ok(())
    })
}

/// The time a prune transaction aims for, in milliseconds.
pub const TARGET_MS: u128 = 40;

/// Trees in the first batch, and the most in one. The first is one tree: on a cold cache a
/// tree of a thousand attempts takes tens of milliseconds, and the size doubles per quick
/// batch from there.
const FIRST_BATCH: i64 = 1;
const MAX_BATCH: i64 = 4096;
/// The time a reclaim transaction aims for. Lower than a batch's: moving pages fills the
/// write-ahead log quickly, and every few transactions one also pays for the checkpoint that
/// starts the log over (about 50 ms at a million attempts), so the typical one stays short
/// enough that those stay under 100 ms.
pub const RECLAIM_TARGET_MS: u128 = 20;
/// Free pages given back in the first reclaim transaction, and the most in one.
const FIRST_RECLAIM: i64 = 256;
const MAX_RECLAIM: i64 = 1 << 16;

/// The size of the next transaction's work after one of `size` took `took`: scaled toward
/// `target_ms`, at most doubled or halved at a time (one slow outlier, a checkpoint or a
/// cold page, does not collapse it), never below 1 nor above `max`.
fn resize(size: i64, took: std::time::Duration, target_ms: u128, max: i64) -> i64 {
    let took_us = i64::try_from(took.as_micros()).unwrap_or(i64::MAX).max(1);
    let aim_us = i64::try_from(target_ms * 1000).unwrap_or(i64::MAX);
    let aimed = size.saturating_mul(aim_us) / took_us;
    aimed.clamp(size / 2, size.saturating_mul(2)).clamp(1, max)
}

/// What a prune is asked to do, checked.
#[derive(Debug, Clone)]
pub struct PruneSpec {
    /// Trees whose runs finished at or after this (epoch ms) stay.
    cutoff_ms: i64,
    statuses: Vec<RunStatus>,
    limit: Option<u64>,
    dry_run: bool,
}

impl PruneSpec {
    /// A spec from the caller's arguments: `statuses` must be terminal statuses (at least one),
    /// `limit` at least 1.
    pub fn new(
        cutoff_ms: i64,
        statuses: &[String],
        limit: Option<i64>,
        dry_run: bool,
    ) -> Result<Self> {
        if statuses.is_empty() {
            return Err(LedgerError::invalid(
                "statuses",
                "name at least one terminal status (completed, failed, cancelled)",
            ));
        }
        let mut parsed = Vec::with_capacity(statuses.len());
        for s in statuses {
            let status = RunStatus::parse_argument("statuses", s)?;
            if !status.is_terminal() {
                return Err(LedgerError::invalid(
                    "statuses",
                    format!(
                        "{s:?} is not terminal; prune removes only finished runs (completed, \
                         failed, cancelled)"
                    ),
                ));
            }
            parsed.push(status);
        }
        let limit = match limit {
            None => None,
            Some(n) if n >= 1 => Some(n.unsigned_abs()),
            Some(n) => {
                return Err(LedgerError::invalid(
                    "limit",
                    format!("must be at least 1 (or None for no limit), not {n}"),
                ))
            }
        };
        Ok(Self {
            cutoff_ms,
            statuses: parsed,
            limit,
            dry_run,
        })
    }

    /// The cutoff for "older than `age_ms`" at `now_ms`.
    pub fn cutoff_for_age(age_ms: i64, now_ms: i64) -> Result<i64> {
        if age_ms < 0 {
            return Err(LedgerError::invalid(
                "older_than",
                format!(
                    "must not be negative, got {age_ms} ms; pass an age such as timedelta(days=30)"
                ),
            ));
        }
        Ok(now_ms.saturating_sub(age_ms))
    }
}

/// What a prune removed (or, on a dry run, would remove).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Runs removed, children included.
    pub runs: u64,
    /// Attempts removed.
    pub attempts: u64,
    /// Events removed.
    pub events: u64,
    /// Blobs removed (no remaining row referred to them).
    pub blobs: u64,
    /// Bytes written to the archive (on a dry run: the bytes it would hold).
    pub archived_bytes: u64,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Bytes of freed pages given back to the file system (SQLite files with incremental
    /// auto-vacuum; 0 elsewhere and on a dry run).
    pub reclaimed_bytes: u64,
    /// Transactions that removed something or gave pages back.
    pub transactions: u64,
    /// The longest of them, in microseconds, from `BEGIN` to `COMMIT` (and the checkpoint a
    /// large commit runs before it returns).
    pub longest_transaction_us: u64,
}

impl PruneReport {
    fn count_transaction(&mut self, took: std::time::Duration) {
        self.transactions += 1;
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.longest_transaction_us = self.longest_transaction_us.max(us);
    }
}

/// Where archive lines go: written and flushed before the call returns.
pub type Sink<'a, 'f> = &'a mut (dyn FnMut(&[u8]) -> Result<()> + 'f);

/// A prune in progress: call [`Pruner::step`] until it returns `false`.
#[derive(Debug)]
pub struct Pruner {
    spec: PruneSpec,
    /// The last candidate looked at, `(completed_at, run_id)`: the next batch starts after it,
    /// so a tree that cannot go yet is not looked at again.
    after: (i64, String),
    batch: i64,
    /// Free pages the next reclaim transaction gives back.
    reclaim: i64,
    report: PruneReport,
    trees: u64,
    /// Trees whose lines are in the archive, so a transaction run again after contention does
    /// not write them twice.
    archived: HashSet<String>,
    header_written: bool,
}

/// What one batch did, kept only if its transaction commits.
#[derive(Default)]
struct Batch {
    after: Option<(i64, String)>,
    runs: u64,
    attempts: u64,
    events: u64,
    blobs: u64,
    trees: u64,
    archived_bytes: u64,
    /// Candidates were found (the end is reached when none are).
    looked: bool,
}

impl Pruner {
    /// A prune of `spec`.
    pub fn new(spec: PruneSpec) -> Self {
        let dry_run = spec.dry_run;
        Self {
            spec,
            after: (i64::MIN, String::new()),
            batch: FIRST_BATCH,
            reclaim: FIRST_RECLAIM,
            report: PruneReport {
                dry_run,
                ..PruneReport::default()
            },
            trees: 0,
            archived: HashSet::new(),
            header_written: false,
        }
    }

    /// The totals so far.
    pub fn report(&self) -> &PruneReport {
        &self.report
    }

    /// Run one batch in one transaction; `false` when there is nothing left to look at (or
    /// the limit is reached).
    pub fn step(&mut self, store: &mut dyn Store, mut sink: Option<Sink<'_, '_>>) -> Result<bool> {
        let remaining = match self.spec.limit {
            Some(limit) if self.trees >= limit => return Ok(false),
            Some(limit) => i64::try_from(limit - self.trees).unwrap_or(i64::MAX),
            None => i64::MAX,
        };
        if let Some(sink) = sink.as_deref_mut() {
            if !self.header_written && !self.spec.dry_run {
                sink(&archive::header(SCHEMA_VERSION))?;
                self.header_written = true;
            }
        }
        let started = Instant::now();
        let archive = sink.is_some();
        let mut written = HashSet::new();
        let out = if self.spec.dry_run {
            // The batch runs as it would, and is rolled back: the counts are exact.
            let mut kept = None;
            let result = store.write("pruning (dry run)", |tx| {
                kept = Some(self.batch_in(tx, remaining, archive, None, &mut HashSet::new())?);
                Err(dry_run_rollback())
            });
            match (result, kept) {
                (Err(e), Some(batch)) if is_dry_run_rollback(&e) => batch,
                (Err(e), _) => return Err(e),
                (Ok(()), _) => unreachable!("a dry run never commits"),
            }
        } else {
            let written = &mut written;
            store.write("pruning", |tx| {
                self.batch_in(tx, remaining, archive, sink.as_deref_mut(), written)
            })?
        };
        let took = started.elapsed();
        if let Some(after) = out.after {
            self.after = after;
        }
        self.archived.extend(written);
        let r = &mut self.report;
        r.runs += out.runs;
        r.attempts += out.attempts;
        r.events += out.events;
        r.blobs += out.blobs;
        r.archived_bytes += out.archived_bytes;
        self.trees += out.trees;
        if out.runs > 0 {
            r.count_transaction(took);
        }
        self.batch = resize(self.batch, took, TARGET_MS, MAX_BATCH);
        Ok(out.looked && self.spec.limit.is_none_or(|l| self.trees < l))
    }

    /// Give one transaction's worth of the freed pages back to the file system (see
    /// [`Store::reclaim`]); `false` when none are left to give, or the store keeps them (a
    /// SQLite file without incremental auto-vacuum, PostgreSQL) or this is a dry run. Sized by
    /// time like the batches, so a writer waits at most about [`TARGET_MS`] behind it.
    pub fn reclaim_step(&mut self, store: &mut dyn Store) -> Result<bool> {
        if self.spec.dry_run || self.report.runs == 0 {
            return Ok(false);
        }
        let started = Instant::now();
        let pages = u32::try_from(self.reclaim).unwrap_or(u32::MAX);
        let freed = store.reclaim(pages)?;
        if freed == 0 {
            return Ok(false);
        }
        let took = started.elapsed();
        self.report.reclaimed_bytes += freed;
        self.report.count_transaction(took);
        self.reclaim = resize(self.reclaim, took, RECLAIM_TARGET_MS, MAX_RECLAIM);
        Ok(true)
    }

    /// Close the archive: the trailer that marks it complete.
    pub fn finish(&mut self, sink: Option<Sink<'_, '_>>) -> Result<()> {
        if let Some(sink) = sink {
            if !self.spec.dry_run {
                if !self.header_written {
                    sink(&archive::header(SCHEMA_VERSION))?;
                    self.header_written = true;
                }
                sink(&archive::trailer(self.trees, self.report.runs))?;
            }
        }
        Ok(())
    }

    /// One batch inside `tx`.
    fn batch_in(
        &self,
        tx: &dyn Tx,
        remaining: i64,
        archive: bool,
        sink: Option<Sink<'_, '_>>,
        written: &mut HashSet<String>,
    ) -> Result<Batch> {
        let spec = &self.spec;
        let mut out = Batch::default();
        tx.rows(&sql::PLANNER_SQL, params![], |_| Ok(()))?;
        let candidates: Vec<(String, i64)> = tx.rows(
            &sql::CANDIDATES_SQL,
            params![
                spec.cutoff_ms,
                self.after.0,
                self.after.1,
                self.batch.min(remaining)
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let Some((last_id, last_at)) = candidates.last().cloned() else {
            return Ok(out);
        };
        out.looked = true;
        out.after = Some((last_at, last_id));
        let roots: Vec<String> = candidates.into_iter().map(|(id, _)| id).collect();
        let tree: Vec<(String, String, i64)> =
            tx.rows(&sql::TREE_SQL, params![json_array(&roots)], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        let all: Vec<String> = tree.iter().map(|(_, id, _)| id.clone()).collect();
        let states: HashMap<String, (String, Option<i64>)> = tx
            .rows(&sql::STATES_SQL, params![json_array(&all)], |r| {
                Ok((r.get(0)?, (r.get(1)?, r.get(2)?)))
            })?
            .into_iter()
            .collect();
        // Root -> its runs with depth; a tree goes only if every run in it may.
        let mut members: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
        for (root, id, depth) in &tree {
            members.entry(root).or_default().push((id, *depth));
        }
        let may_go = |id: &str| {
            states.get(id).is_some_and(|(status, completed)| {
                RunStatus::parse(status).is_some_and(|s| spec.statuses.contains(&s))
                    && completed.is_some_and(|at| at < spec.cutoff_ms)
            })
        };
        let mut going: Vec<(&str, Vec<&str>)> = Vec::new();
        for root in &roots {
            let Some(runs) = members.get_mut(root.as_str()) else {
                continue; // taken by another prune since the candidates were read
            };
            if runs.iter().all(|(id, _)| may_go(id)) {
                runs.sort_by_key(|(id, depth)| (*depth, *id));
                going.push((root, runs.iter().map(|(id, _)| *id).collect()));
            }
        }
        if going.is_empty() {
            return Ok(out);
        }
        let ids: Vec<String> = going
            .iter()
            .flat_map(|(_, runs)| runs.iter().map(|id| (*id).to_owned()))
            .collect();
        let ids_json = json_array(&ids);
        if archive {
            let lines = archive_lines(tx, &going, &ids_json)?;
            out.archived_bytes = lines.iter().map(|(_, l)| l.len() as u64).sum();
            if let Some(sink) = sink {
                let mut bytes = Vec::new();
                for (root, line) in lines {
                    if !self.archived.contains(&root) && !written.contains(&root) {
                        bytes.extend_from_slice(&line);
                        written.insert(root);
                    }
                }
                sink(&bytes)?;
            }
        }
        let digests = referenced_digests(tx, &ids_json)?;
        // Queued: on PostgreSQL its no-op goes out with the next statement, not on its own.
        tx.exec_later(&sql::SEQ_FLOOR_SQL, params![])?;
        tx.exec(&sql::PRUNING_INSERT_SQL, params![ids_json])?;
        for table in RUN_TABLES.iter().rev() {
            let n = tx.exec(&archive::statements(table).delete, params![ids_json])? as u64;
            match table.name {
                "runs" => out.runs = n,
                "attempts" => out.attempts = n,
                "events" => out.events = n,
                _ => {}
            }
        }
        tx.exec(&sql::PRUNING_CLEAR_SQL, params![])?;
        let digests = json_array(&digests);
        tx.exec(&sql::DEFINITIONS_DELETE_SQL, params![digests])?;
        out.blobs = tx.exec(&sql::BLOBS_DELETE_SQL, params![digests])? as u64;
        out.trees = going.len() as u64;
        Ok(out)
    }

    /// Run the whole prune (tests and tools; the Python layer steps it itself to report
    /// progress and let other callers in between batches).
    pub fn run(
        mut self,
        store: &mut dyn Store,
        mut sink: Option<Sink<'_, '_>>,
    ) -> Result<PruneReport> {
        while self.step(store, sink.as_deref_mut())? {}
        self.finish(sink)?;
        Ok(self.report)
    }
}

/// The digests the runs in `ids_json` refer to, each once.
fn referenced_digests(tx: &dyn Tx, ids_json: &str) -> Result<Vec<String>> {
    let runs = archive::statements(&RUN_TABLES[0]);
    let positions = blob_positions();
    let mut out: Vec<String> = Vec::new();
    tx.rows(&runs.select, params![ids_json], |r| {
        for &i in &positions {
            if let Some(d) = r.get::<Option<String>>(i)? {
                out.push(d);
            }
        }
        Ok(())
    })?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Where the blob columns sit in a runs row.
fn blob_positions() -> Vec<usize> {
    RUN_BLOB_COLUMNS
        .iter()
        .map(|c| RUN_TABLES[0].position(c))
        .collect()
}

/// Read every row of the trees in `going` (whose runs are `ids_json`) and make one archive line
/// per tree.
fn archive_lines(
    tx: &dyn Tx,
    going: &[(&str, Vec<&str>)],
    ids_json: &str,
) -> Result<Vec<(String, Vec<u8>)>> {
    let root_of: HashMap<&str, &str> = going
        .iter()
        .flat_map(|(root, runs)| runs.iter().map(move |id| (*id, *root)))
        .collect();
    let mut trees: HashMap<&str, Tree> = going
        .iter()
        .map(|(root, _)| {
            let tree = Tree {
                root: (*root).to_owned(),
                rows: archive::tables().map(|t| (t.name, Vec::new())).collect(),
            };
            (*root, tree)
        })
        .collect();
    let positions = blob_positions();
    // Each tree's digests, for its blobs and definitions.
    let mut digests: HashMap<&str, Vec<String>> = HashMap::new();
    for table in &RUN_TABLES {
        let rows = read_rows(tx, table, ids_json)?;
        let key_at = table.key_position();
        for row in rows {
            let Some(root) = row[key_at].text().and_then(|id| root_of.get(id)) else {
                continue;
            };
            if table.name == "runs" {
                let d = digests.entry(root).or_default();
                d.extend(
                    positions
                        .iter()
                        .filter_map(|&i| row[i].text().map(str::to_owned)),
                );
            }
            push_row(trees.get_mut(root), table.name, row);
        }
    }
    let all: Vec<String> = {
        let mut all: Vec<String> = digests.values().flatten().cloned().collect();
        all.sort_unstable();
        all.dedup();
        all
    };
    let all_json = json_array(&all);
    let blobs: HashMap<String, Vec<Cell>> = keyed(read_rows(tx, &BLOBS, &all_json)?);
    let definitions: HashMap<String, Vec<Cell>> = keyed(read_rows(tx, &DEFINITIONS, &all_json)?);
    let mut out = Vec::with_capacity(going.len());
    for (root, runs) in going {
        let mut tree = trees.remove(root).expect("a tree per root");
        // Parents before children: the order restore inserts in.
        let order: HashMap<&str, usize> = runs.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        if let Some((_, rows)) = tree.rows.iter_mut().find(|(t, _)| *t == "runs") {
            rows.sort_by_key(|row| row[0].text().and_then(|id| order.get(id)).copied());
        }
        let mut mine = digests.remove(root).unwrap_or_default();
        mine.sort_unstable();
        mine.dedup();
        for d in &mine {
            if let Some(row) = definitions.get(d) {
                push_row(Some(&mut tree), DEFINITIONS.name, row.clone());
            }
            if let Some(row) = blobs.get(d) {
                push_row(Some(&mut tree), BLOBS.name, row.clone());
            }
        }
        let line = tree.to_line()?;
        out.push(((*root).to_owned(), line));
    }
    Ok(out)
}

fn read_rows(tx: &dyn Tx, table: &Table, keys_json: &str) -> Result<Vec<Vec<Cell>>> {
    let width = table.columns.len();
    tx.rows(
        &archive::statements(table).select,
        params![keys_json],
        |r| archive::read_row(r, width),
    )
}

fn keyed(rows: Vec<Vec<Cell>>) -> HashMap<String, Vec<Cell>> {
    rows.into_iter()
        .filter_map(|row| row[0].text().map(str::to_owned).map(|k| (k, row)))
        .collect()
}

fn push_row(tree: Option<&mut Tree>, table: &str, row: Vec<Cell>) {
    if let Some(tree) = tree {
        if let Some((_, rows)) = tree.rows.iter_mut().find(|(t, _)| *t == table) {
            rows.push(row);
        }
    }
}

/// The error a dry run's batch returns to roll its transaction back.
fn dry_run_rollback() -> LedgerError {
    LedgerError::StoreError {
        operation: DRY_RUN.into(),
        message: "a dry run rolls back".into(),
    }
}

const DRY_RUN: &str = "pruning (dry run): rolled back";

fn is_dry_run_rollback(e: &LedgerError) -> bool {
    matches!(e, LedgerError::StoreError { operation, .. } if operation == DRY_RUN)
}
