//! Creating runs: a top-level run (`start_run`, under the scope guard) and a child run
//! (`publish_child_run`, idempotent by its parent and invocation key).
//!
//! The run spine (run, blobs, steps, first event) is written whole in one transaction or not at
//! all. The scope guard is a partial unique index (`runs_scope_guard`) over the active
//! top-level guarded runs, so racing processes cannot both start: the look-up before the insert
//! gives the friendly error, the index gives the proof.

use crate::params;

use crate::blobs;
use crate::canonical::{Json, Value};
use crate::errors::{LedgerError, Result};
use crate::events::{self, json_array, Actor};
use crate::ids::{check_name, check_run_id, new_run_id};
use crate::model::Run;
use crate::retry::RetryPolicy;
use crate::runs::read::must_read_run;
use crate::status::{RunStatus, StepStatus};
use crate::store::{sql, DbError, Store, Tx};

/// One step of a new run's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSpec {
    /// Unique within the run.
    pub id: String,
    /// Title (default empty).
    pub title: String,
    /// Instructions (default empty).
    pub instructions: String,
    /// Canonical JSON completion rule, if any.
    pub completion: Option<String>,
    /// The retry policy of the step's units, over the run's.
    pub retry: Option<RetryPolicy>,
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
    /// Display name, `start_run`'s `title` keyword (default: the ref). Stored as the run's
    /// `workflow_name`, the name the `Run` record and `reserve_run` give the same thing: the
    /// field keeps the keyword's name so the binding maps keywords to fields one to one, and
    /// from here on (the spine, the column, [`Run`]) it is `workflow_name`.
    pub title: Option<String>,
    /// Refs the guard covers (default: the run's own ref).
    pub guard_refs: Option<Vec<String>>,
    /// Skip the scope guard.
    pub force: bool,
    /// Agent harness.
    pub agent_harness: Option<String>,
    /// Agent session.
    pub agent_session_id: Option<String>,
    /// The retry policy of the run's units (a step's own overrides it).
    pub retry: Option<RetryPolicy>,
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
    /// The retry policy of the child's units (a step's own overrides it).
    pub retry: Option<RetryPolicy>,
}

/// The steps (and their retry policies) and the run's retry policy.
fn check_steps(steps: &[StepSpec], retry: Option<&RetryPolicy>) -> Result<()> {
    if let Some(p) = retry {
        p.check("retry", "")?;
    }
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
    for (i, s) in steps.iter().enumerate() {
        if let Some(p) = &s.retry {
            p.check("steps", &format!("item {i}: "))?;
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
    retry: Option<&'a RetryPolicy>,
}

/// Insert run + blobs + steps + `run.started`. When the scope guard index fires (a racing start
/// got in between the caller's look-up and this insert) the error is `ActiveRunExists` naming
/// the run that won.
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
            now_ms,
            s.retry.map(RetryPolicy::to_text)
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
                if i == 0 {
                    StepStatus::Active
                } else {
                    StepStatus::Pending
                },
                step.retry.as_ref().map(RetryPolicy::to_text)
            ],
        )?;
    }
    let payload = Value::Object(vec![
        ("run_id".into(), Value::Str(s.run_id.to_owned())),
        (
            "status".into(),
            Value::Str(RunStatus::Active.as_str().into()),
        ),
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
pub(super) fn guard_error(
    tx: &dyn Tx,
    err: &DbError,
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
    check_steps(&req.steps, req.retry.as_ref())?;
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
    let workflow_name = req
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
                workflow_name: &workflow_name,
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
                retry: req.retry.as_ref(),
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
    check_steps(&req.steps, req.retry.as_ref())?;
    let run_id = choose_run_id(req.run_id.as_ref())?;
    let params = req.params.clone().unwrap_or_else(empty_params);
    store.write("publishing a child run", |tx| {
        // Publishers of one parent serialize on its row lock, so the look-then-insert below
        // sees the first publisher's child (PostgreSQL; SQLite's IMMEDIATE lock does the same).
        tx.lock_run(&req.parent_run_id)?;
        let (scope, parent_status): (Option<String>, RunStatus) = tx
            .row(&sql::PARENT_SCOPE_SQL, params![&req.parent_run_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .ok_or_else(|| LedgerError::RunNotFound {
                run_id: req.parent_run_id.clone(),
            })?;
        // Idempotent by (parent, key): an existing child comes back unchanged, whatever the
        // candidate id, plan and steps, so a publisher that crashed and retries with a new
        // candidate id still finds the child it made (even once the parent has ended). The
        // lock above makes this look-then-insert atomic; runs_invocation_key backs it up. The
        // same key for another workflow is not a retry but a mistake, and is refused.
        if let Some((existing, existing_ref)) = tx.row(
            &sql::PUBLISH_CHILD_RUN_FIND_SQL,
            params![req.parent_run_id, req.invocation_key],
            |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?)),
        )? {
            if existing_ref != req.workflow_ref {
                return Err(LedgerError::invalid(
                    "workflow_ref",
                    format!(
                        "invocation key {:?} of run {:?} already published child {existing:?} \
                         of workflow {existing_ref:?}, not {:?}; a different workflow needs its \
                         own invocation_key",
                        req.invocation_key, req.parent_run_id, req.workflow_ref
                    ),
                ));
            }
            return must_read_run(tx, &existing);
        }
        // A new child under an ended parent would be work nobody waits for, and a cancel that
        // had just gone through the parent's tree would miss it.
        if parent_status.is_terminal() {
            return Err(LedgerError::RunNotActive {
                run_id: req.parent_run_id.clone(),
                status: parent_status.as_str().to_owned(),
            });
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
                retry: req.retry.as_ref(),
            },
            now_ms,
        )?;
        must_read_run(tx, &run_id)
    })
}
