//! Reading runs and steps: by id or id prefix, listed, found by scope, and the row helpers
//! the other run operations share.

use crate::params;

use crate::errors::{LedgerError, Result};
use crate::events::json_array;
use crate::model::{Run, Step};
use crate::status::{run_state, RunStatus};
use crate::store::{sql, DbResult, Row, Store, Tx};

pub(crate) fn run_from_row(r: &dyn Row) -> DbResult<Run> {
    Ok(Run {
        run_id: r.get(0)?,
        workflow_ref: r.get(1)?,
        workflow_name: r.get(2)?,
        scope_key: r.get(3)?,
        status: r.get(4)?,
        current_step_id: r.get(5)?,
        parent_run_id: r.get(6)?,
        parent_unit_id: r.get(7)?,
        invocation_key: r.get(8)?,
        origin_session_id: r.get(9)?,
        params: r.get(10)?,
        outputs: r.get(11)?,
        revision: r.get(12)?,
        created_at: r.get(13)?,
        updated_at: r.get(14)?,
        completed_at: r.get(15)?,
        not_before: r.get(16)?,
        priority: r.get(17)?,
        concurrency_key: r.get(18)?,
    })
}

fn read_run(tx: &dyn Tx, run_id: &str) -> Result<Option<Run>> {
    tx.row(&sql::GET_RUN_SQL, params![run_id], run_from_row)
}

pub(crate) fn must_read_run(tx: &dyn Tx, run_id: &str) -> Result<Run> {
    read_run(tx, run_id)?.ok_or_else(|| LedgerError::RunNotFound {
        run_id: run_id.to_owned(),
    })
}

/// The run, or `None`.
pub fn get_run(store: &mut dyn Store, run_id: &str) -> Result<Option<Run>> {
    store.read("reading a run", |tx| read_run(tx, run_id))
}

/// The single run id starting with `prefix` (LIKE metacharacters literal).
pub fn resolve_run_id(store: &mut dyn Store, prefix: &str) -> Result<String> {
    if prefix.is_empty() {
        return Err(LedgerError::invalid(
            "prefix",
            "must not be empty; give the first characters of a run id",
        ));
    }
    let above = prefix_successor(prefix);
    let mut matches = store.read("resolving a run id", |tx| {
        tx.rows(&sql::RESOLVE_RUN_ID_SQL, params![prefix, &above], |r| {
            r.get::<String>(0)
        })
    })?;
    // Matches come in byte order, so an id equal to the prefix comes first; it wins over the
    // longer ids it is a prefix of (`deploy` beside `deploy-2`), or it could never be named.
    if matches.first().is_some_and(|m| m == prefix) {
        return Ok(matches.swap_remove(0));
    }
    match matches.len() {
        0 => Err(LedgerError::RunNotFound {
            run_id: prefix.to_owned(),
        }),
        1 => Ok(matches.remove(0)),
        _ => Err(LedgerError::AmbiguousRunId {
            prefix: prefix.to_owned(),
            matches,
        }),
    }
}

/// The least string above every string that starts with `prefix`, in code point order (which
/// is UTF-8 byte order): the prefix's last character that can be incremented, incremented, with
/// what follows it dropped. Run ids starting with `prefix` are exactly those in
/// `[prefix, successor)`, an index range, matched case-sensitively on both backends (SQLite's
/// `LIKE` ignores ASCII case, PostgreSQL's does not). A prefix of nothing but U+10FFFF has no
/// successor; ids are at most [`crate::ids::MAX_KEY_BYTES`] bytes, so a longer run of U+10FFFF
/// bounds them all.
fn prefix_successor(prefix: &str) -> String {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return chars.into_iter().collect();
        }
    }
    let mut above = prefix.to_owned();
    above.extend(std::iter::repeat_n(
        char::MAX,
        crate::ids::MAX_KEY_BYTES / 4 + 1,
    ));
    above
}

/// `list_runs` filters and page.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Ignore `scope_key` and list every scope.
    pub all_scopes: bool,
    /// The scope (`None` = runs without a scope) when not `all_scopes`.
    pub scope_key: Option<String>,
    /// Only these refs.
    pub workflow_refs: Option<Vec<String>>,
    /// Only `active` (the same as `statuses` of just `active`, and with them: both must hold).
    pub active_only: bool,
    /// Include child runs.
    pub include_children: bool,
    /// Only runs in these statuses (`None` = any).
    pub statuses: Option<Vec<String>>,
    /// At most this many runs, from 1 to [`crate::events::MAX_PAGE`] (`None` = all).
    pub limit: Option<i64>,
    /// Continue after this run: the last run of the page before.
    pub after: Option<RunCursor>,
    /// Only runs of this workflow name.
    pub workflow_name: Option<String>,
    /// Only runs last updated at or after this time (ms).
    pub updated_after: Option<i64>,
    /// Only runs last updated before this time (ms).
    pub updated_before: Option<i64>,
}

/// A place in `list_runs`' order: the `updated_at`, `created_at` and `run_id` of the last run
/// a page returned, as that page saw them. The next page starts strictly below it, so a run
/// that changed in between is neither repeated nor skipped because of that change (it is where
/// its new `updated_at` puts it: above the cursor, on the first page again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCursor {
    /// The run's `updated_at` (ms).
    pub updated_at: i64,
    /// The run's `created_at` (ms).
    pub created_at: i64,
    /// The run's id.
    pub run_id: String,
}

/// The sort key of `list_runs`: newest first, run ids bytewise.
fn recency(run: &Run) -> (i64, i64, &[u8]) {
    (run.updated_at, run.created_at, run.run_id.as_bytes())
}

/// Runs, most recently updated first; a page of them with `limit` and `after`.
pub fn list_runs(store: &mut dyn Store, f: &RunFilter) -> Result<Vec<Run>> {
    if let Some(limit) = f.limit {
        crate::events::check_page(limit, "; page on with after=")?;
    }
    let mut statuses = match &f.statuses {
        None => None,
        Some(names) => Some(
            names
                .iter()
                .map(|n| RunStatus::parse_argument("status", n))
                .collect::<Result<Vec<_>>>()?,
        ),
    };
    if f.active_only {
        let active = statuses
            .as_ref()
            .is_none_or(|s| s.contains(&RunStatus::Active));
        statuses = Some(if active {
            vec![RunStatus::Active]
        } else {
            Vec::new()
        });
    }
    if let Some(s) = statuses.as_mut() {
        s.sort_by_key(|s| s.as_str());
        s.dedup();
    }
    if let (Some(after), Some(before)) = (f.updated_after, f.updated_before) {
        if after >= before {
            return Err(LedgerError::invalid(
                "updated_before",
                "must be later than updated_after; give a time range that holds a moment",
            ));
        }
    }
    let refs = f.workflow_refs.as_deref().map(json_array);
    let mut start = f.after.as_ref().map_or((i64::MAX, i64::MAX, ""), |c| {
        (c.updated_at, c.created_at, c.run_id.as_str())
    });
    // `updated_before` is a place in the page order too: above every run updated at that time,
    // so the walk starts below it; the lower of it and the cursor is where the page starts.
    if let Some(before) = f.updated_before {
        start = start.min((before, i64::MIN, ""));
    }
    let (updated, created, after_id) = start;
    let floor = f.updated_after.unwrap_or(i64::MIN);
    let limit = f.limit.unwrap_or(i64::MAX);
    // A workflow name without statuses asks for every status: one range of
    // `runs_name_status_recent` each.
    if f.workflow_name.is_some() && statuses.is_none() {
        statuses = Some(RunStatus::ALL.to_vec());
    }
    store.read("listing runs", |tx| {
        let scope = (i64::from(f.all_scopes), &f.scope_key, &refs);
        let children = i64::from(f.include_children);
        let Some(statuses) = &statuses else {
            return tx.rows(
                &sql::LIST_RUNS_SQL,
                params![
                    scope.0, scope.1, scope.2, children, updated, created, after_id, limit, floor
                ],
                run_from_row,
            );
        };
        // One index range per status, each already in order and at most a page long; the
        // page is the newest `limit` of their union.
        let mut runs = Vec::new();
        for status in statuses {
            runs.extend(match &f.workflow_name {
                None => tx.rows(
                    &sql::LIST_RUNS_OF_STATUS_SQL,
                    params![
                        scope.0, scope.1, scope.2, children, updated, created, after_id, limit,
                        floor, status
                    ],
                    run_from_row,
                ),
                Some(name) => tx.rows(
                    &sql::LIST_RUNS_OF_NAME_SQL,
                    params![
                        scope.0, scope.1, scope.2, children, updated, created, after_id, limit,
                        floor, status, name
                    ],
                    run_from_row,
                ),
            }?);
        }
        runs.sort_by(|a, b| recency(b).cmp(&recency(a)));
        runs.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(runs)
    })
}

/// The most a `run_counts` count may be asked to reach.
pub const RUN_COUNT_MAX: i64 = 1_000_000;

/// Every run (children included) counted by status, in lifecycle order, each count stopping at
/// `count_max` (0 to [`RUN_COUNT_MAX`]): a count equal to it means at least that many. One
/// read, one bounded index walk per status.
pub fn run_counts(store: &mut dyn Store, count_max: i64) -> Result<Vec<(RunStatus, i64)>> {
    if !(0..=RUN_COUNT_MAX).contains(&count_max) {
        return Err(LedgerError::invalid(
            "count_max",
            format!("must be from 0 to {RUN_COUNT_MAX}, not {count_max}"),
        ));
    }
    let found: Vec<(String, i64)> = store.read("counting runs", |tx| {
        tx.rows(&sql::RUN_COUNTS_SQL, params![count_max], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
    })?;
    Ok(RunStatus::ALL
        .iter()
        .map(|status| {
            let n = found.iter().find(|(s, _)| s == status.as_str());
            (*status, n.map_or(0, |(_, n)| *n))
        })
        .collect())
}

/// The newest top-level active run of `refs` in (or, with `outside`, outside) `scope_key`.
pub fn find_active_run(
    store: &mut dyn Store,
    refs: &[String],
    scope_key: &str,
    outside: bool,
) -> Result<Option<Run>> {
    if refs.is_empty() {
        return Ok(None);
    }
    let refs = json_array(refs);
    store.read("finding an active run", |tx| {
        tx.row(
            &sql::FIND_ACTIVE_RUN_SQL,
            params![refs, scope_key, i64::from(outside)],
            run_from_row,
        )
    })
}

/// The newest top-level active or blocked run in `scope_key`.
pub fn find_scope_occupant(store: &mut dyn Store, scope_key: &str) -> Result<Option<Run>> {
    store.read("finding the scope occupant", |tx| {
        tx.row(
            &sql::FIND_SCOPE_OCCUPANT_SQL,
            params![scope_key],
            run_from_row,
        )
    })
}

/// Children of a run, oldest first.
pub fn child_runs(store: &mut dyn Store, parent_run_id: &str) -> Result<Vec<Run>> {
    store.read("listing child runs", |tx| {
        tx.rows(&sql::CHILD_RUNS_SQL, params![parent_run_id], run_from_row)
    })
}

/// A parent's children by status (in lifecycle order, statuses with none left out), counted
/// by the database; `RunNotFound` for an unknown parent. Its children have all ended (or it has
/// none) when no status but a terminal one is counted: what `children.settled` announces.
pub fn child_summary(store: &mut dyn Store, parent_run_id: &str) -> Result<Vec<(RunStatus, i64)>> {
    store.read("counting child runs", |tx| {
        run_state(tx, parent_run_id)?;
        let mut counts: Vec<(RunStatus, i64)> =
            tx.rows(&sql::CHILD_COUNTS_SQL, params![parent_run_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        counts.sort_by_key(|(s, _)| RunStatus::ALL.iter().position(|a| a == s));
        Ok(counts)
    })
}

/// The run's steps in plan order.
pub fn steps(store: &mut dyn Store, run_id: &str) -> Result<Vec<Step>> {
    store.read("listing steps", |tx| {
        run_state(tx, run_id)?;
        tx.rows(&sql::LIST_STEPS_SQL, params![run_id], |r| {
            Ok(Step {
                run_id: r.get(0)?,
                step_id: r.get(1)?,
                title: r.get(2)?,
                instructions: r.get(3)?,
                sequence_index: r.get(4)?,
                status: r.get(5)?,
                notes: r.get(6)?,
                evidence: r.get::<Option<String>>(7)?.map(String::into_bytes),
                summary: r.get(8)?,
                completed_at: r.get(9)?,
            })
        })
    })
}
