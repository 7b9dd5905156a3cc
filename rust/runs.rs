//! Runs and steps, the orchestrator's operations (DESIGN §3, §4 "Runs and steps").
//!
//! Each write is one IMMEDIATE transaction: the run spine (run, steps, plan, first event) is
//! written whole or not at all; every status change goes through [`transition`], which bumps the
//! revision and appends `run.status`; terminal runs are never revived. The start guard is a
//! partial unique index (`runs_scope_guard`), so racing processes cannot both start.

use crate::params;

use crate::canonical::{digest_bytes, Value};
use crate::errors::{LedgerError, Result};
use crate::events::{self, json_array, Actor};
use crate::ids::{check_name, check_run_id, new_run_id};
use crate::leases::{self, Fence};
use crate::model::{Run, Step};
use crate::store::{sql, Store, Tx};
use crate::{blobs, canonical};

/// The statuses no transition leaves.
pub const TERMINAL: [&str; 3] = ["completed", "failed", "cancelled"];

/// Canonical JSON, serialized and hashed before the transaction begins (STYLE §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Json {
    /// The canonical text.
    pub text: String,
    /// `sha256:<hex>` of the text.
    pub digest: String,
}

impl Json {
    /// Wrap canonical bytes.
    pub fn new(bytes: Vec<u8>) -> Self {
        let digest = digest_bytes(&bytes);
        Self {
            text: canonical::into_text(bytes),
            digest,
        }
    }

    /// The canonical form of `value`.
    pub fn of(value: &Value) -> Self {
        Self::new(canonical::to_vec(value))
    }
}

/// One step of a new run's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepSpec {
    /// Unique within the run.
    pub id: String,
    /// Title (default empty).
    pub title: String,
    /// Instructions (default empty).
    pub instructions: String,
    /// Canonical JSON completion rule, if any.
    pub completion: Option<String>,
}

/// `start_run`'s arguments.
#[derive(Debug, Clone, Default)]
pub struct NewRun {
    /// Workflow reference.
    pub workflow_ref: String,
    /// Scope key (required while the guard is on).
    pub scope_key: Option<String>,
    /// The plan's steps, at least one.
    pub steps: Vec<StepSpec>,
    /// Params (`{}` when absent).
    pub params: Option<Json>,
    /// Frozen plan.
    pub plan: Option<Json>,
    /// Caller-chosen id (else a UUIDv7).
    pub run_id: Option<String>,
    /// Display name (default: the ref).
    pub title: Option<String>,
    /// Refs the guard covers (default: the run's own ref).
    pub guard_refs: Option<Vec<String>>,
    /// Skip the scope guard.
    pub force: bool,
    /// Agent harness.
    pub agent_harness: Option<String>,
    /// Agent session.
    pub agent_session_id: Option<String>,
}

/// `publish_child_run`'s arguments.
#[derive(Debug, Clone, Default)]
pub struct ChildRun {
    /// The parent.
    pub parent_run_id: String,
    /// The parent's unit that spawns the child.
    pub parent_unit_id: String,
    /// Idempotency key within the parent.
    pub invocation_key: String,
    /// The child's workflow.
    pub workflow_ref: String,
    /// The child's steps.
    pub steps: Vec<StepSpec>,
    /// Params.
    pub params: Option<Json>,
    /// Plan.
    pub plan: Option<Json>,
    /// Candidate id (ignored when the child exists already).
    pub run_id: Option<String>,
}

/// The row of `RUN_STATUS_SQL`.
#[derive(Debug, Clone)]
pub(crate) struct RunState {
    pub status: String,
    pub current_step_id: Option<String>,
    pub scope_key: Option<String>,
    pub workflow_ref: String,
}

pub(crate) fn run_state(tx: &dyn Tx, run_id: &str) -> Result<RunState> {
    tx.row(&sql::RUN_STATUS_SQL, params![run_id], |r| {
        Ok(RunState {
            status: r.get(0)?,
            current_step_id: r.get(1)?,
            scope_key: r.get(2)?,
            workflow_ref: r.get(3)?,
        })
    })?
    .ok_or_else(|| LedgerError::RunNotFound {
        run_id: run_id.to_owned(),
    })
}

fn run_from_row(r: &dyn crate::store::Row) -> crate::store::DbResult<Run> {
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
    })
}

pub(crate) fn read_run(tx: &dyn Tx, run_id: &str) -> Result<Option<Run>> {
    tx.row(&sql::GET_RUN_SQL, params![run_id], run_from_row)
}

pub(crate) fn must_read_run(tx: &dyn Tx, run_id: &str) -> Result<Run> {
    read_run(tx, run_id)?.ok_or_else(|| LedgerError::RunNotFound {
        run_id: run_id.to_owned(),
    })
}

fn check_steps(steps: &[StepSpec]) -> Result<()> {
    if steps.is_empty() {
        return Err(LedgerError::invalid("steps", "must list at least one step"));
    }
    let mut seen = std::collections::HashSet::new();
    for s in steps {
        check_name("steps", &s.id)?;
        if !seen.insert(s.id.as_str()) {
            return Err(LedgerError::invalid(
                "steps",
                format!("step id {:?} appears twice; step ids must be unique", s.id),
            ));
        }
    }
    Ok(())
}

/// Everything `insert_spine` writes for a new run.
struct Spine<'a> {
    run_id: &'a str,
    workflow_ref: &'a str,
    workflow_name: &'a str,
    scope_key: Option<&'a str>,
    guarded: bool,
    params: &'a Json,
    plan: Option<&'a Json>,
    steps: &'a [StepSpec],
    parent: Option<(&'a str, &'a str, &'a str)>,
    agent: (Option<&'a str>, Option<&'a str>),
}

/// Insert run + blobs + steps + `run.started`. Returns the raw insert error when the scope
/// guard index fires, so the caller can name the occupant.
fn insert_spine(tx: &dyn Tx, s: &Spine<'_>, now_ms: i64) -> Result<()> {
    blobs::put_digested(tx, &s.params.digest, s.params.text.as_bytes(), now_ms)?;
    if let Some(plan) = s.plan {
        blobs::put_digested(tx, &plan.digest, plan.text.as_bytes(), now_ms)?;
    }
    let (parent, parent_unit, key) = match s.parent {
        Some((p, u, k)) => (Some(p), Some(u), Some(k)),
        None => (None, None, None),
    };
    let inserted = tx.exec_raw(
        &sql::START_RUN_INSERT_SQL,
        params![
            s.run_id,
            s.workflow_ref,
            s.workflow_name,
            s.scope_key,
            i64::from(s.guarded),
            s.params.digest,
            s.plan.map(|p| &p.digest),
            s.plan.map(|_| crate::PLAN_VERSION),
            s.steps[0].id,
            parent,
            parent_unit,
            key,
            s.agent.0,
            s.agent.1,
            now_ms
        ],
    );
    inserted.map_err(|e| guard_error(tx, &e, s.scope_key, s.workflow_ref))?;
    for (i, step) in s.steps.iter().enumerate() {
        tx.exec_later(
            &sql::START_RUN_STEP_SQL,
            params![
                s.run_id,
                step.id,
                step.title,
                step.instructions,
                step.completion,
                i64::try_from(i).unwrap_or(i64::MAX),
                if i == 0 { "active" } else { "pending" }
            ],
        )?;
    }
    let payload = Value::Object(vec![
        ("run_id".into(), Value::Str(s.run_id.to_owned())),
        ("status".into(), Value::Str("active".into())),
    ]);
    events::append(
        tx,
        s.run_id,
        "run.started",
        &payload,
        &Actor::default(),
        now_ms,
    )?;
    Ok(())
}

/// A failed write that may have hit the scope guard index (`runs_scope_guard`): reported as
/// `ActiveRunExists` naming the occupant, anything else as a store error. One place for both
/// paths that can fire the index: inserting a run and moving one into `active`.
fn guard_error(
    tx: &dyn Tx,
    err: &crate::store::DbError,
    scope_key: Option<&str>,
    workflow_ref: &str,
) -> LedgerError {
    if !err.is_unique("runs_scope_guard", "runs.scope_key, runs.workflow_ref") {
        return tx.fail(err);
    }
    let refs = json_array(&[workflow_ref.to_owned()]);
    match tx.row(&sql::START_RUN_GUARD_SQL, params![scope_key, refs], |r| {
        r.get::<String>(0)
    }) {
        Ok(occupant) => LedgerError::ActiveRunExists {
            scope_key: scope_key.unwrap_or_default().to_owned(),
            occupant_run_id: occupant.unwrap_or_default(),
        },
        Err(e) => e,
    }
}

/// The caller's run id (validated) or a new UUIDv7.
fn choose_run_id(run_id: Option<&String>) -> Result<String> {
    match run_id {
        Some(id) => {
            check_run_id("run_id", id)?;
            Ok(id.clone())
        }
        None => Ok(new_run_id()),
    }
}

/// Refuse a run id that is taken (inside the transaction that would insert it).
fn refuse_existing(tx: &dyn Tx, run_id: &str) -> Result<()> {
    if tx
        .row(&sql::RUN_EXISTS_SQL, params![run_id], |_| Ok(()))?
        .is_some()
    {
        return Err(LedgerError::invalid(
            "run_id",
            format!("run {run_id:?} already exists; choose another id or omit run_id"),
        ));
    }
    Ok(())
}

fn empty_params() -> Json {
    Json::new(b"{}".to_vec())
}

/// Start a top-level run.
pub fn start_run(store: &mut dyn Store, req: &NewRun, now_ms: i64) -> Result<Run> {
    check_name("workflow_ref", &req.workflow_ref)?;
    check_steps(&req.steps)?;
    let run_id = choose_run_id(req.run_id.as_ref())?;
    let guard_refs = req
        .guard_refs
        .clone()
        .unwrap_or_else(|| vec![req.workflow_ref.clone()]);
    for r in &guard_refs {
        check_name("guard_refs", r)?;
    }
    if !req.force && req.scope_key.is_none() {
        return Err(LedgerError::invalid(
            "scope_key",
            "is None while the scope guard is on; pass a scope key, or force=True to start an \
             unguarded run",
        ));
    }
    let params = req.params.clone().unwrap_or_else(empty_params);
    let refs_json = json_array(&guard_refs);
    let name = req
        .title
        .clone()
        .unwrap_or_else(|| req.workflow_ref.clone());
    store.write("starting a run", |tx| {
        refuse_existing(tx, &run_id)?;
        if !req.force {
            if let Some(occupant) = tx.row(
                &sql::START_RUN_GUARD_SQL,
                params![req.scope_key, refs_json],
                |r| r.get::<String>(0),
            )? {
                return Err(LedgerError::ActiveRunExists {
                    scope_key: req.scope_key.clone().unwrap_or_default(),
                    occupant_run_id: occupant,
                });
            }
        }
        insert_spine(
            tx,
            &Spine {
                run_id: &run_id,
                workflow_ref: &req.workflow_ref,
                workflow_name: &name,
                scope_key: req.scope_key.as_deref(),
                guarded: !req.force,
                params: &params,
                plan: req.plan.as_ref(),
                steps: &req.steps,
                parent: None,
                agent: (
                    req.agent_harness.as_deref(),
                    req.agent_session_id.as_deref(),
                ),
            },
            now_ms,
        )?;
        must_read_run(tx, &run_id)
    })
}

/// Publish (or find) the child of a parent for an invocation key.
pub fn publish_child_run(store: &mut dyn Store, req: &ChildRun, now_ms: i64) -> Result<Run> {
    check_name("parent_unit_id", &req.parent_unit_id)?;
    check_name("invocation_key", &req.invocation_key)?;
    check_name("workflow_ref", &req.workflow_ref)?;
    check_steps(&req.steps)?;
    let run_id = choose_run_id(req.run_id.as_ref())?;
    let params = req.params.clone().unwrap_or_else(empty_params);
    store.write("publishing a child run", |tx| {
        // Publishers of one parent serialize on its row lock, so the look-then-insert below
        // sees the first publisher's child (PostgreSQL; SQLite's IMMEDIATE lock does the same).
        tx.lock_run(&req.parent_run_id)?;
        let scope: Option<String> = tx
            .row(&sql::PARENT_SCOPE_SQL, params![&req.parent_run_id], |r| {
                r.get(0)
            })?
            .ok_or_else(|| LedgerError::RunNotFound {
                run_id: req.parent_run_id.clone(),
            })?;
        // Idempotent by (parent, key): an existing child comes back unchanged, whatever the
        // candidate id, plan and steps (PRIOR_ART AK-14, AK-16). The IMMEDIATE lock makes this
        // look-then-insert atomic; runs_invocation_key backs it up.
        if let Some(existing) = tx.row(
            &sql::PUBLISH_CHILD_RUN_FIND_SQL,
            params![req.parent_run_id, req.invocation_key],
            |r| r.get::<String>(0),
        )? {
            return must_read_run(tx, &existing);
        }
        refuse_existing(tx, &run_id)?;
        insert_spine(
            tx,
            &Spine {
                run_id: &run_id,
                workflow_ref: &req.workflow_ref,
                workflow_name: &req.workflow_ref,
                scope_key: scope.as_deref(),
                guarded: false,
                params: &params,
                plan: req.plan.as_ref(),
                steps: &req.steps,
                parent: Some((&req.parent_run_id, &req.parent_unit_id, &req.invocation_key)),
                agent: (None, None),
            },
            now_ms,
        )?;
        must_read_run(tx, &run_id)
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

/// `list_runs` filters.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Ignore `scope_key` and list every scope.
    pub all_scopes: bool,
    /// The scope (`None` = runs without a scope) when not `all_scopes`.
    pub scope_key: Option<String>,
    /// Only these refs.
    pub workflow_refs: Option<Vec<String>>,
    /// Only `active`.
    pub active_only: bool,
    /// Include child runs.
    pub include_children: bool,
}

/// Runs, most recently updated first.
pub fn list_runs(store: &mut dyn Store, f: &RunFilter) -> Result<Vec<Run>> {
    let refs = f.workflow_refs.as_deref().map(json_array);
    store.read("listing runs", |tx| {
        tx.rows(
            &sql::LIST_RUNS_SQL,
            params![
                i64::from(f.all_scopes),
                f.scope_key,
                refs,
                i64::from(f.active_only),
                i64::from(f.include_children)
            ],
            run_from_row,
        )
    })
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

/// Change a run's status, bump its revision and append `run.status`. The one path every
/// status change takes; a move into `active` that would break the scope guard fails here.
pub(crate) fn transition(
    tx: &dyn Tx,
    run_id: &str,
    state: &RunState,
    to: &str,
    current_step: Option<&str>,
    actor: &Actor<'_>,
    now_ms: i64,
) -> Result<()> {
    if let Err(e) = tx.exec_raw(
        &sql::SET_RUN_STATUS_SQL,
        params![run_id, to, current_step, now_ms],
    ) {
        return Err(guard_error(
            tx,
            &e,
            state.scope_key.as_deref(),
            &state.workflow_ref,
        ));
    }
    let payload = Value::Object(vec![
        ("from".into(), Value::Str(state.status.clone())),
        ("run_id".into(), Value::Str(run_id.to_owned())),
        ("to".into(), Value::Str(to.to_owned())),
    ]);
    events::append(tx, run_id, "run.status", &payload, actor, now_ms)?;
    Ok(())
}

fn require_active(run_id: &str, state: &RunState) -> Result<()> {
    if state.status == "active" {
        Ok(())
    } else {
        Err(LedgerError::RunNotActive {
            run_id: run_id.to_owned(),
            status: state.status.clone(),
        })
    }
}

/// `complete_step`'s arguments.
#[derive(Debug, Clone, Default)]
pub struct StepResult {
    /// `completed`, `skipped`, `blocked` or `failed`.
    pub status: String,
    /// Notes.
    pub notes: Option<String>,
    /// Canonical JSON evidence.
    pub evidence: Option<String>,
    /// Summary.
    pub summary: Option<String>,
}

/// Finish the run's current step and advance (or block, or complete the run).
pub fn complete_step(
    store: &mut dyn Store,
    run_id: &str,
    step_id: &str,
    result: &StepResult,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Run> {
    if !matches!(
        result.status.as_str(),
        "completed" | "skipped" | "blocked" | "failed"
    ) {
        return Err(LedgerError::invalid(
            "status",
            format!(
                "{:?} is not a step result; use completed, skipped, blocked or failed",
                result.status
            ),
        ));
    }
    store.write("completing a step", |tx| {
        tx.lock_run(run_id)?;
        let actor = leases::check(tx, run_id, fence, now_ms)?;
        let state = run_state(tx, run_id)?;
        require_active(run_id, &state)?;
        let seq: i64 = tx
            .row(&sql::STEP_STATUS_SQL, params![run_id, step_id], |r| {
                r.get(1)
            })?
            .ok_or_else(|| LedgerError::NotFound {
                kind: "step",
                key: step_id.to_owned(),
            })?;
        if state.current_step_id.as_deref() != Some(step_id) {
            return Err(LedgerError::invalid(
                "step_id",
                format!(
                    "{step_id:?} is not the current step of run {run_id:?}; the current step is \
                     {:?}",
                    state.current_step_id.as_deref().unwrap_or("none")
                ),
            ));
        }
        let completed_at = (result.status != "blocked").then_some(now_ms);
        tx.exec_later(
            &sql::COMPLETE_STEP_SQL,
            params![
                run_id,
                step_id,
                result.status,
                result.notes,
                result.evidence,
                result.summary,
                completed_at
            ],
        )?;
        let payload = Value::Object(vec![
            ("run_id".into(), Value::Str(run_id.to_owned())),
            ("status".into(), Value::Str(result.status.clone())),
            ("step_id".into(), Value::Str(step_id.to_owned())),
        ]);
        events::append(tx, run_id, "step.completed", &payload, &actor, now_ms)?;
        match result.status.as_str() {
            "completed" | "skipped" => {
                let next: Option<String> =
                    tx.row(&sql::NEXT_STEP_SQL, params![run_id, seq], |r| r.get(0))?;
                if let Some(next) = next {
                    tx.exec_later(&sql::ACTIVATE_STEP_SQL, params![run_id, next])?;
                    tx.exec_later(
                        &sql::SET_RUN_STATUS_SQL,
                        params![run_id, "active", next, now_ms],
                    )?;
                } else {
                    transition(tx, run_id, &state, "completed", None, &actor, now_ms)?;
                }
            }
            _ => transition(tx, run_id, &state, "blocked", Some(step_id), &actor, now_ms)?,
        }
        must_read_run(tx, run_id)
    })
}

/// `active` -> `blocked`, marking the current step blocked.
pub fn block_run(
    store: &mut dyn Store,
    run_id: &str,
    notes: Option<&str>,
    now_ms: i64,
) -> Result<Run> {
    store.write("blocking a run", |tx| {
        tx.lock_run(run_id)?;
        let state = run_state(tx, run_id)?;
        require_active(run_id, &state)?;
        if let Some(step) = &state.current_step_id {
            tx.exec_later(&sql::BLOCK_STEP_SQL, params![run_id, step, notes])?;
        }
        let current = state.current_step_id.clone();
        transition(
            tx,
            run_id,
            &state,
            "blocked",
            current.as_deref(),
            &Actor::default(),
            now_ms,
        )?;
        must_read_run(tx, run_id)
    })
}

/// `blocked` -> `active`, reopening the current step; an active run is returned unchanged.
pub fn resume_run(store: &mut dyn Store, run_id: &str, now_ms: i64) -> Result<Run> {
    store.write("resuming a run", |tx| {
        tx.lock_run(run_id)?;
        let state = run_state(tx, run_id)?;
        match state.status.as_str() {
            "active" => return must_read_run(tx, run_id),
            "blocked" => {}
            _ => {
                return Err(LedgerError::RunNotActive {
                    run_id: run_id.to_owned(),
                    status: state.status.clone(),
                })
            }
        }
        if let Some(step) = &state.current_step_id {
            tx.exec_later(&sql::REOPEN_STEP_SQL, params![run_id, step])?;
        }
        let current = state.current_step_id.clone();
        transition(
            tx,
            run_id,
            &state,
            "active",
            current.as_deref(),
            &Actor::default(),
            now_ms,
        )?;
        must_read_run(tx, run_id)
    })
}

/// Cancel a non-terminal run; `false` when it was terminal already.
pub fn abandon_run(store: &mut dyn Store, run_id: &str, now_ms: i64) -> Result<bool> {
    store.write("abandoning a run", |tx| {
        tx.lock_run(run_id)?;
        let state = run_state(tx, run_id)?;
        if TERMINAL.contains(&state.status.as_str()) {
            return Ok(false);
        }
        let current = state.current_step_id.clone();
        transition(
            tx,
            run_id,
            &state,
            "cancelled",
            current.as_deref(),
            &Actor::default(),
            now_ms,
        )?;
        Ok(true)
    })
}

/// Record the run's outputs.
pub fn set_outputs(
    store: &mut dyn Store,
    run_id: &str,
    outputs: &Json,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<()> {
    store.write("setting outputs", |tx| {
        tx.lock_run(run_id)?;
        leases::check(tx, run_id, fence, now_ms)?;
        run_state(tx, run_id)?;
        blobs::put_digested(tx, &outputs.digest, outputs.text.as_bytes(), now_ms)?;
        tx.exec_later(
            &sql::SET_OUTPUTS_SQL,
            params![run_id, outputs.digest, now_ms],
        )?;
        Ok(())
    })
}
