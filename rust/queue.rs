//! The run queue: reserving runs for a controller, handing out the next queued ones
//! ([`claim_next`]), preparing or adopting them atomically, and continuing a parked run with a
//! new one. Claims, heartbeats and releases are in
//! [`crate::leases`]; status changes in [`crate::runs`].
//!
//! Every operation is one transaction. Digests are always recomputed from the values the caller
//! passes, never taken on trust: a caller's digest that disagreed with its definition would
//! register one definition under another's name. A refused operation rolls back, so a
//! `ContinuationRefused` or `PreparationConflict` leaves nothing behind.

use crate::params;

use crate::blobs;
use crate::canonical::{Json, Value};
use crate::errors::{LedgerError, Result};
use crate::events::{self, Actor};
use crate::ids::{check_name, check_run_id};
use crate::leases::{self, ClaimSpec};
use crate::model::{Claim, Lease, Run};
use crate::runs;
use crate::status::RunStatus;
use crate::store::rows::Writes;
use crate::store::{sql, Store, Tx};

/// `reserve_run`'s arguments, canonicalized before the transaction.
#[derive(Debug, Clone)]
pub struct NewQueuedRun {
    /// The run id (the rules of [`check_run_id`]).
    pub run_id: String,
    /// Display name.
    pub workflow_name: String,
    /// Workflow reference.
    pub workflow_ref: String,
    /// The workflow source identity.
    pub source: Json,
    /// What the caller says the definition's digest is (checked, not trusted).
    pub definition_digest: String,
    /// The definition snapshot.
    pub definition: Json,
    /// The run's input (`null` if none).
    pub input: Json,
    /// Launch options (`{}` if none).
    pub launch_options: Json,
    /// The runner the run is meant for (affinity).
    pub runner_id: String,
    /// The session that queued it.
    pub origin_session_id: String,
    /// The run this one continues.
    pub parent_run_id: Option<String>,
}

impl NewQueuedRun {
    /// Validate ids and the definition digest (recomputed from the definition).
    pub fn check(&self) -> Result<()> {
        check_run_id("run_id", &self.run_id)?;
        check_name("workflow_name", &self.workflow_name)?;
        check_name("workflow_ref", &self.workflow_ref)?;
        check_name("runner_id", &self.runner_id)?;
        check_name("origin_session_id", &self.origin_session_id)?;
        if let Some(parent) = &self.parent_run_id {
            check_run_id("parent_run_id", parent)?;
            if parent == &self.run_id {
                return Err(LedgerError::invalid(
                    "parent_run_id",
                    "a run cannot continue itself",
                ));
            }
        }
        if self.definition_digest != self.definition.digest {
            return Err(LedgerError::invalid(
                "definition_digest",
                format!(
                    "is {:?} but the definition's digest is {:?}; pass fencepost.digest(definition)",
                    self.definition_digest, self.definition.digest
                ),
            ));
        }
        Ok(())
    }
}

/// Refuse or accept the continuation of `parent`; a parked parent with no live owner becomes
/// `completed` with `run.continued`.
fn continue_parent(tx: &dyn Tx, req: &NewQueuedRun, parent: &str, now_ms: i64) -> Result<()> {
    let refused = |reason: String| LedgerError::ContinuationRefused {
        parent_run_id: parent.to_owned(),
        reason,
    };
    tx.lock_run(parent)?;
    let Some((status, origin)) = tx.row(&sql::CONTINUATION_PARENT_SQL, params![parent], |r| {
        Ok((r.get::<RunStatus>(0)?, r.get::<Option<String>>(1)?))
    })?
    else {
        return Err(refused(format!("run {parent:?} does not exist")));
    };
    if origin.as_deref() != Some(req.origin_session_id.as_str()) {
        return Err(refused(format!(
            "run {parent:?} belongs to another session; continue it from {:?}",
            origin.unwrap_or_default()
        )));
    }
    if let Some(existing) = tx.row(&sql::CONTINUATION_OF_SQL, params![parent], |r| {
        r.get::<String>(0)
    })? {
        return Err(refused(format!(
            "run {parent:?} already has a continuation, {existing:?}"
        )));
    }
    if status != RunStatus::Parked {
        return Err(refused(format!(
            "run {parent:?} is {status}; only a parked run can be continued"
        )));
    }
    // An expired owner does not block: every write it could still try fails the fence check,
    // and waiting for it to release would strand the continuation behind a crashed process.
    let lease = leases::read(tx, parent)?;
    let live = lease.owner_id.is_some() && lease.expires_at.is_some_and(|e| e > now_ms);
    if live {
        return Err(refused(format!(
            "run {parent:?} still has a live owner ({}); release its claim first",
            lease.owner_id.unwrap_or_default()
        )));
    }
    // The move is the continuation's own, recorded as `run.continued` naming the new run
    // rather than as a plain `run.status`.
    let to = RunStatus::Completed;
    status.check_move(to)?;
    tx.exec_later(
        &sql::SET_RUN_STATUS_SQL,
        params![parent, to, Option::<&str>::None, now_ms],
    )?;
    let payload = Value::Object(vec![
        ("continuation_run_id".into(), Value::Str(req.run_id.clone())),
        ("from".into(), Value::Str(status.as_str().into())),
        ("to".into(), Value::Str(to.as_str().into())),
    ]);
    events::append(
        tx,
        parent,
        "run.continued",
        &payload,
        &Actor::default(),
        now_ms,
    )?;
    Ok(())
}

/// The body of `reserve_run`, inside the caller's transaction.
fn reserve_in(tx: &dyn Tx, req: &NewQueuedRun, now_ms: i64) -> Result<()> {
    if tx
        .row(&sql::RUN_EXISTS_SQL, params![&req.run_id], |_| Ok(()))?
        .is_some()
    {
        return Err(LedgerError::invalid(
            "run_id",
            format!(
                "run {:?} is already reserved; use prepare_or_adopt to adopt it",
                req.run_id
            ),
        ));
    }
    if let Some(parent) = &req.parent_run_id {
        continue_parent(tx, req, parent, now_ms)?;
    }
    for json in [
        &req.definition,
        &req.source,
        &req.input,
        &req.launch_options,
    ] {
        blobs::put_digested(tx, &json.digest, json.text.as_bytes(), now_ms)?;
    }
    tx.exec_later(
        &sql::DEFINITION_INSERT_SQL,
        params![req.definition.digest, req.workflow_name, now_ms],
    )?;
    tx.exec_later(
        &sql::RESERVE_RUN_INSERT_SQL,
        params![
            req.run_id,
            req.workflow_ref,
            req.workflow_name,
            req.definition.digest,
            req.input.digest,
            req.launch_options.digest,
            req.source.digest,
            req.parent_run_id,
            req.origin_session_id,
            req.runner_id,
            now_ms
        ],
    )?;
    tx.exec_later(&sql::CREATE_LEASE_SQL, params![&req.run_id])?;
    let payload = Value::Object(vec![
        (
            "definition_digest".into(),
            Value::Str(req.definition.digest.clone()),
        ),
        (
            "status".into(),
            Value::Str(RunStatus::Queued.as_str().into()),
        ),
    ]);
    let actor = Actor {
        actor_type: Some("session"),
        id: Some(req.origin_session_id.clone()),
        generation: None,
    };
    events::append(tx, &req.run_id, "run.queued", &payload, &actor, now_ms)?;
    Ok(())
}

/// Queue a run for a controller: status `queued`, lease at generation 0 with no owner.
pub fn reserve_run(store: &mut dyn Store, req: &NewQueuedRun, now_ms: i64) -> Result<Run> {
    req.check()?;
    store.write("reserving a run", |tx| {
        reserve_in(tx, req, now_ms)?;
        runs::must_read_run(tx, &req.run_id)
    })
}

/// What `prepare_or_adopt` answers (Python's `Preparation`).
#[derive(Debug, Clone)]
pub struct Preparation {
    /// `claimed` or `adopted`.
    pub state: &'static str,
    /// The run as it stands after the call.
    pub run: Run,
    /// The claim, when `claimed`.
    pub claim: Option<Claim>,
}

/// The fields that differ between a stored run and a request, in a fixed order.
fn differences(tx: &dyn Tx, req: &NewQueuedRun) -> Result<Option<(Vec<String>, RunStatus)>> {
    let row = tx.row(&sql::PREPARATION_SQL, params![&req.run_id], |r| {
        let mut stored: [Option<String>; 8] = Default::default();
        for (i, field) in stored.iter_mut().enumerate() {
            *field = r.get(i)?;
        }
        Ok((stored, r.get::<RunStatus>(8)?))
    })?;
    let Some((stored, status)) = row else {
        return Ok(None);
    };
    let wanted: [(&str, Option<&str>); 8] = [
        ("workflow_name", Some(&req.workflow_name)),
        ("workflow_ref", Some(&req.workflow_ref)),
        ("definition_digest", Some(&req.definition.digest)),
        ("origin_session_id", Some(&req.origin_session_id)),
        ("parent_run_id", req.parent_run_id.as_deref()),
        ("source", Some(&req.source.digest)),
        ("input", Some(&req.input.digest)),
        ("launch_options", Some(&req.launch_options.digest)),
    ];
    let fields = wanted
        .iter()
        .zip(&stored)
        .filter(|((_, want), have)| *want != have.as_deref())
        .map(|((name, _), _)| (*name).to_owned())
        .collect();
    Ok(Some((fields, status)))
}

/// Adopt the run if it exists with exactly these inputs (no writes at all), refuse it if it
/// differs, else reserve and claim it, all in one transaction.
pub fn prepare_or_adopt(
    store: &mut dyn Store,
    req: &NewQueuedRun,
    spec: &ClaimSpec,
    now_ms: i64,
) -> Result<Preparation> {
    req.check()?;
    store.write("preparing a run", |tx| {
        tx.lock_run(&req.run_id)?;
        if let Some((fields, status)) = differences(tx, req)? {
            if !fields.is_empty() {
                return Err(LedgerError::PreparationConflict {
                    run_id: req.run_id.clone(),
                    fields,
                });
            }
            if status.is_terminal() {
                return Err(LedgerError::RunNotActive {
                    run_id: req.run_id.clone(),
                    status: status.as_str().to_owned(),
                });
            }
            return Ok(Preparation {
                state: "adopted",
                run: runs::must_read_run(tx, &req.run_id)?,
                claim: None,
            });
        }
        reserve_in(tx, req, now_ms)?;
        let claim = leases::claim_in(tx, &req.run_id, RunStatus::Queued, spec, now_ms)?
            .ok_or_else(|| LedgerError::StoreError {
                operation: "preparing a run".into(),
                message: format!("run {:?} was reserved but could not be claimed", req.run_id),
            })?;
        Ok(Preparation {
            state: "claimed",
            run: runs::must_read_run(tx, &req.run_id)?,
            claim: Some(claim),
        })
    })
}

/// The most runs one `claim_next` claims.
pub const MAX_NEXT: i64 = 1000;

/// What `claim_next` is asked for.
#[derive(Debug, Clone)]
pub struct NextClaims {
    /// Who claims.
    pub runner_id: String,
    /// Lease length of each claim.
    pub lease_ms: i64,
    /// Only runs of these workflow names (`None`: any).
    pub workflow_names: Option<Vec<String>>,
    /// At most this many runs, from 1 to [`MAX_NEXT`].
    pub limit: i64,
    /// The caller's token, for a single claim (`limit` 1).
    pub token: Option<String>,
}

/// Claim the oldest queued runs (`created_at`, then `run_id`), at most `limit`, each as
/// [`leases::claim`] does (generation + 1, `starting`, a `lease.claimed` event), in one
/// transaction. On PostgreSQL the queued runs are read with `FOR UPDATE SKIP LOCKED` from the
/// index of queued runs alone, so two claimers never wait on each other's runs (each takes the
/// next ones nobody holds) and the read costs the same however many runs have ended; SQLite has
/// one writer, so the same read simply finds what the last claimer left. Empty when nothing is
/// queued.
pub fn claim_next(store: &mut dyn Store, req: &NextClaims, now_ms: i64) -> Result<Vec<Claim>> {
    if !(1..=MAX_NEXT).contains(&req.limit) {
        return Err(LedgerError::invalid(
            "limit",
            format!("must be from 1 to {MAX_NEXT}, not {}", req.limit),
        ));
    }
    if req.token.is_some() && req.limit > 1 {
        return Err(LedgerError::invalid(
            "token",
            "a token belongs to one claim: pass it with limit=1, or leave it out and each claim \
             gets its own",
        ));
    }
    if let Some(names) = &req.workflow_names {
        for name in names {
            check_name("workflow_names", name)?;
        }
    }
    // The arguments (and a caller's token) are checked before the transaction; the tokens of
    // the other claims are drawn for the runs found, not `limit` of them on every call (an
    // idle controller polling with a large limit finds none). A transaction run again after
    // contention draws new ones: nothing of the rolled-back run was handed out.
    let first = ClaimSpec::new(
        req.runner_id.clone(),
        req.lease_ms,
        req.token.clone(),
        "token",
    )?;
    let names = req.workflow_names.as_deref().map(events::json_array);
    store.write("claiming the next queued runs", |tx| {
        let found: Vec<(String, Option<Lease>)> =
            tx.rows(&sql::NEXT_QUEUED_SQL, params![names, req.limit], |r| {
                let run_id: String = r.get(0)?;
                let lease = match r.get::<Option<i64>>(1)? {
                    Some(generation) => Some(Lease {
                        run_id: run_id.clone(),
                        generation,
                        owner_id: r.get(2)?,
                        owner_type: None,
                        expires_at: r.get(3)?,
                        heartbeat_at: None,
                        takeovers: 0,
                        refused_writes: 0,
                    }),
                    None => None,
                };
                Ok((run_id, lease))
            })?;
        let mut decided = Vec::with_capacity(found.len());
        for (i, (run_id, lease)) in found.into_iter().enumerate() {
            let drawn;
            let spec = if i == 0 {
                &first
            } else {
                drawn = ClaimSpec::new(req.runner_id.clone(), req.lease_ms, None, "token")?;
                &drawn
            };
            // The read locked the run (PostgreSQL's `FOR UPDATE`; SQLite has one writer) and
            // read its lease, current (see `NEXT_QUEUED_SQL`), so the claim is decided here
            // and written with the others at the end. A queued run without a lease row gets
            // one, never claimed.
            tx.mark_run_locked(&run_id)?;
            let lease = leases::or_created(tx, &run_id, lease)?;
            decided.extend(leases::decide(&lease, RunStatus::Queued, spec, now_ms)?);
        }
        let writes = Writes {
            claims: decided.iter().map(|d| d.row(true, now_ms)).collect(),
            ..Writes::default()
        };
        tx.write_rows(&writes).map_err(|e| tx.fail(&e))?;
        let claims: Vec<Claim> = decided.into_iter().map(|d| d.claim).collect();
        Ok(claims)
    })
}
