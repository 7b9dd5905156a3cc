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
use crate::retry::RetryPolicy;
use crate::runs;
use crate::status::RunStatus;
use crate::store::rows::Writes;
use crate::store::{sql, DbResult, Row, Store, Tx};
use std::collections::{HashMap, HashSet};

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
    /// When `claim_next` may first hand the run out.
    pub not_before: NotBefore,
    /// Claim order, higher first: [`MIN_PRIORITY`]..=[`MAX_PRIORITY`].
    pub priority: i64,
    /// What the run counts against while it holds a live lease, if a limit is set for it.
    pub concurrency_key: Option<String>,
    /// The retry policy of the run's units.
    pub retry: Option<RetryPolicy>,
}

/// The lowest priority a queued run may have.
pub const MIN_PRIORITY: i64 = -1000;
/// The highest priority a queued run may have.
pub const MAX_PRIORITY: i64 = 1000;

/// When a queued run may first be claimed by `claim_next`: at once, at an instant, or a delay
/// after it is queued, read against the ledger's clock inside the transaction that queues it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NotBefore {
    /// As soon as it is queued.
    #[default]
    Now,
    /// At this instant (ms since the epoch); one already past is due at once and orders by it.
    At(i64),
    /// This many ms after it is queued (not negative).
    After(i64),
}

impl NotBefore {
    /// Refuse a negative delay: it names no time the caller could have meant.
    pub fn check(self) -> Result<()> {
        match self {
            Self::After(ms) if ms < 0 => Err(LedgerError::invalid(
                "not_before",
                format!(
                    "is a negative timedelta ({ms} ms); pass a delay of zero or more, or an \
                     aware datetime"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The instant, for a run queued at `now_ms` (`None`: due as soon as it is queued).
    pub fn at(self, now_ms: i64) -> Option<i64> {
        match self {
            Self::Now => None,
            Self::At(ms) => Some(ms),
            Self::After(ms) => Some(now_ms.saturating_add(ms)),
        }
    }
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
        self.not_before.check()?;
        if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            return Err(LedgerError::invalid(
                "priority",
                format!(
                    "is {}; priorities run from {MIN_PRIORITY} to {MAX_PRIORITY}, higher first",
                    self.priority
                ),
            ));
        }
        if let Some(key) = &self.concurrency_key {
            check_key(key)?;
        }
        if let Some(p) = &self.retry {
            p.check("retry", "")?;
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
pub(crate) fn reserve_in(tx: &dyn Tx, req: &NewQueuedRun, now_ms: i64) -> Result<()> {
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
    let not_before = req.not_before.at(now_ms);
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
            now_ms,
            not_before,
            req.priority,
            req.concurrency_key,
            not_before.unwrap_or(now_ms),
            req.retry.as_ref().map(RetryPolicy::to_text)
        ],
    )?;
    tx.exec_later(&sql::CREATE_LEASE_SQL, params![&req.run_id])?;
    let mut payload = vec![
        (
            "definition_digest".into(),
            Value::Str(req.definition.digest.clone()),
        ),
        (
            "status".into(),
            Value::Str(RunStatus::Queued.as_str().into()),
        ),
    ];
    // The scheduling a run was queued with, where it differs from the default.
    if let Some(at) = not_before {
        payload.push(("not_before".into(), Value::Int(at)));
    }
    if req.priority != 0 {
        payload.push(("priority".into(), Value::Int(req.priority)));
    }
    if let Some(key) = &req.concurrency_key {
        payload.push(("concurrency_key".into(), Value::Str(key.clone())));
    }
    let payload = Value::Object(payload);
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
        Ok((stored, r.get::<RunStatus>(8)?, r.get::<Option<String>>(9)?))
    })?;
    let Some((stored, status, retry)) = row else {
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
    let mut fields: Vec<String> = wanted
        .iter()
        .zip(&stored)
        .filter(|((_, want), have)| *want != have.as_deref())
        .map(|((name, _), _)| (*name).to_owned())
        .collect();
    if retry != req.retry.as_ref().map(RetryPolicy::to_text) {
        fields.push("retry".to_owned());
    }
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
    /// Also take over runs whose owner's lease expired.
    pub rescue: bool,
}

/// Claim the next due queued runs (priority, highest first, then due time: `not_before`, else
/// the time it was queued; then `run_id`), at most `limit`, each as [`leases::claim`] does
/// (generation + 1, `starting`, a `lease.claimed` event), in one transaction. Runs not yet due
/// and runs of paused workflows are passed over without being read (see `0008_schedule.sql`).
/// On PostgreSQL the due runs are read with `FOR UPDATE SKIP LOCKED` from their lane's index
/// alone, so two claimers never wait on each other's runs (each takes the next ones nobody
/// holds) and the read costs the same however many runs have ended or wait; SQLite has one
/// writer, so the same read simply finds what the last claimer left. Empty when nothing is due.
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
        // Runs that have come due join their lane first, so this claim already sees them; sent
        // with the read (no answer is needed).
        tx.exec_later(&sql::PROMOTE_DUE_SQL, params![now_ms])?;
        // Both lanes and the runs to rescue in one round trip.
        let mut found = Vec::new();
        let lanes: [(&crate::store::Sql, &[&dyn crate::store::ToSql]); 3] = [
            (&sql::NEXT_QUEUED_SQL, params![names, req.limit]),
            if req.limit == 1 && names.is_none() {
                (&sql::NEXT_KEYED_ONE_SQL, params![])
            } else {
                (&sql::NEXT_KEYED_SQL, params![names, req.limit])
            },
            (&sql::RESCUABLE_SQL, params![names, now_ms]),
        ];
        tx.query_many(&lanes[..if req.rescue { 3 } else { 2 }], &mut |_, r| {
            found.push(candidate(r)?);
            Ok(())
        })
        .map_err(|e| tx.fail(&e))?;
        // One order over both lanes: priority (higher first), due time, run id (bytewise).
        found.sort_by(|a, b| {
            (b.priority, a.due_at, a.run_id.as_bytes()).cmp(&(
                a.priority,
                b.due_at,
                b.run_id.as_bytes(),
            ))
        });
        let mut room = key_room(tx, &found, req.limit, now_ms)?;
        let mut decided = Vec::new();
        for found in found {
            if i64::try_from(decided.len()).is_ok_and(|n| n == req.limit) {
                break;
            }
            // A key without room passes its run over; this call's own claims count against
            // it. A key whose limit was removed meanwhile has none to count against. A key
            // that was not counted (out of reach when the room was counted: only when a run
            // before it could not be claimed) is passed over too.
            if let Some(key) = &found.key {
                match room.get_mut(key) {
                    Some(left) if *left > 0 => *left -= 1,
                    _ => continue,
                }
            }
            let drawn;
            let spec = if decided.is_empty() {
                &first
            } else {
                drawn = ClaimSpec::new(req.runner_id.clone(), req.lease_ms, None, "token")?;
                &drawn
            };
            // The read locked the run (PostgreSQL's `FOR UPDATE`; SQLite has one writer) and
            // read its lease, current (see `NEXT_QUEUED_SQL`), so the claim is decided here
            // and written with the others at the end. A queued run without a lease row gets
            // one, never claimed.
            tx.mark_run_locked(&found.run_id)?;
            let lease = leases::or_created(tx, &found.run_id, found.lease)?;
            // A rescued run keeps its status; a queued one moves to `starting`.
            let queued = found.status == RunStatus::Queued;
            decided
                .extend(leases::decide(&lease, found.status, spec, now_ms)?.map(|d| (d, queued)));
        }
        let writes = Writes {
            claims: decided
                .iter()
                .map(|(d, queued)| d.row(*queued, now_ms))
                .collect(),
            ..Writes::default()
        };
        tx.write_rows(&writes).map_err(|e| tx.fail(&e))?;
        let claims: Vec<Claim> = decided.into_iter().map(|(d, _)| d.claim).collect();
        Ok(claims)
    })
}

/// A run `claim_next` may take: a row of [`sql::NEXT_QUEUED_SQL`] or
/// [`sql::NEXT_KEYED_SQL`].
struct Candidate {
    run_id: String,
    lease: Option<Lease>,
    priority: i64,
    due_at: i64,
    /// Set for a run of the keyed lane or a rescued run with a key: the key whose room it
    /// takes (a key without a limit has no room to count).
    key: Option<String>,
    /// `queued`, or the status of a run to rescue.
    status: RunStatus,
}

fn candidate(r: &dyn Row) -> DbResult<Candidate> {
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
    Ok(Candidate {
        run_id,
        lease,
        priority: r.get(4)?,
        due_at: r.get(5)?,
        key: r.get(6)?,
        status: r.get(7)?,
    })
}

/// How many keys past those a claim needs are offered to the lock in the same round trip, in
/// claim order, for when keys before them are held by other claimers (see [`key_room`]).
const KEYS_AHEAD: usize = 8;

/// The room of each key the claim may reach in `found` (sorted), asked for only as the claim
/// reaches it: walking the candidates as the claim will, a key not asked yet counts as having
/// room, and the keys met that way before the claim is full are locked and counted together,
/// in one round trip (see [`sql::LOCK_KEYS_SQL`]: the count is sent after the lock, so its
/// snapshot follows it). A key found full passes its runs over, and the walk goes on to the
/// keys behind it, one more round trip each time. A claim whose keyed candidates are all out of
/// reach (the unkeyed runs before them fill it) asks for no key at all.
///
/// The lock skips a key another claimer holds (it is counting that key's room, or has claimed
/// from it and not committed yet): that key has no room for this call and its runs are passed
/// over, as a run another claimer holds is. So claimers never wait for one another, and never
/// in a cycle; a claim that locked a key counts every claim of it committed before.
///
/// Claimers that start together read the same candidates in the same order, so each finds the
/// keys at the front held by the others. The lock is therefore offered the keys the claim needs
/// followed by the next [`KEYS_AHEAD`] keys in claim order, and takes the first of them it can
/// lock, as many as the claim needs: a held key is passed over in the same round trip rather
/// than costing one more each (a claim that found its first k keys held went round k more
/// times). It never locks more keys than the claim needs, and a key it locks past a held one is
/// the key the walk would have gone on to next. The count covers every key offered, as the
/// count cannot know which the lock took; counting a few keys costs less than a round trip.
fn key_room(
    tx: &dyn Tx,
    found: &[Candidate],
    limit: i64,
    now_ms: i64,
) -> Result<HashMap<String, i64>> {
    let mut room: HashMap<String, i64> = HashMap::new();
    loop {
        // The keys not counted yet, in the order the walk meets them; the first `need` of them
        // are the ones the claim reaches if every key has room.
        let mut order: Vec<&str> = Vec::new();
        let mut ordered: HashSet<&str> = HashSet::new();
        let mut need = 0;
        let mut left: HashMap<&str, i64> = HashMap::new();
        let mut taken = 0;
        for f in found {
            let Some(key) = &f.key else {
                taken += 1;
                continue;
            };
            if let Some(&known) = room.get(key) {
                let slots = left.entry(key).or_insert(known);
                if *slots > 0 && taken < limit {
                    *slots -= 1;
                    taken += 1;
                }
            } else if ordered.insert(key) {
                if taken < limit {
                    need += 1;
                } else if order.len() >= need + KEYS_AHEAD {
                    break;
                }
                order.push(key);
                taken += 1;
            } else if taken < limit {
                taken += 1;
            }
        }
        if need == 0 {
            return Ok(room);
        }
        let json = events::json_array(&order);
        let need_n = i64::try_from(need).unwrap_or(i64::MAX);
        let mut locked = Vec::new();
        let mut counted = HashMap::new();
        let statements: [(&crate::store::Sql, &[&dyn crate::store::ToSql]); 2] = [
            (&sql::LOCK_KEYS_SQL, params![json, need_n]),
            (&sql::KEY_ROOM_SQL, params![json, now_ms]),
        ];
        tx.query_many(&statements, &mut |i, r| {
            if i == 0 {
                locked.push(r.get::<String>(0)?);
            } else {
                counted.insert(r.get::<String>(0)?, r.get::<i64>(1)?);
            }
            Ok(())
        })
        .map_err(|e| tx.fail(&e))?;
        // The lock tried the keys in order until it held `need` of them, and returns them in
        // that order: every key up to the last one locked was tried, and every key if it
        // locked fewer.
        let tried = if locked.len() < need {
            order.len()
        } else {
            locked
                .last()
                .and_then(|k| order.iter().position(|o| o == k))
                .map_or(0, |p| p + 1)
        };
        for (i, key) in order.iter().enumerate() {
            let slots = match counted.get(*key) {
                // No limit row (a rescued run's key that has none, or a limit removed
                // meanwhile): nothing to count against.
                None => i64::MAX,
                Some(&n) if locked.iter().any(|k| k == key) => n,
                // Held by another claimer: no room for this call.
                Some(_) if i < tried => 0,
                // Not reached by the lock: asked again if the claim gets this far.
                Some(_) => continue,
            };
            room.insert((*key).to_owned(), slots);
        }
    }
}

/// Set the limit of live leases for runs with `concurrency_key` (`None` removes it), and move
/// the key's queued runs into the lane that says so. A limit counts live leases of runs that
/// have left the queue and not ended; lowering it below what the key holds takes no lease
/// away, it only stops new claims until the key is under it again. Applies to the claims that
/// start after it commits.
pub fn set_concurrency_limit(
    store: &mut dyn Store,
    concurrency_key: &str,
    limit: Option<i64>,
    now_ms: i64,
) -> Result<()> {
    check_key(concurrency_key)?;
    if let Some(n) = limit {
        if n < 0 {
            return Err(LedgerError::invalid(
                "limit",
                format!(
                    "is {n}; a limit is 0 or more live leases (0 holds the key's runs), or \
                     None to remove it"
                ),
            ));
        }
    }
    store.write("setting a concurrency limit", |tx| {
        if let Some(n) = limit {
            tx.exec(&sql::LIMIT_SET_SQL, params![concurrency_key, n, now_ms])?;
            tx.exec(&sql::KEY_LANE_SQL, params![concurrency_key, "due", "keyed"])?;
        } else {
            tx.exec(&sql::LIMIT_REMOVE_SQL, params![concurrency_key])?;
            tx.exec(&sql::KEY_LANE_SQL, params![concurrency_key, "keyed", "due"])?;
        }
        Ok(())
    })
}

/// Every key's limit.
pub fn concurrency_limits(store: &mut dyn Store) -> Result<Vec<(String, i64)>> {
    store.read("reading the concurrency limits", |tx| {
        tx.rows(&sql::LIMITS_SQL, params![], |r| Ok((r.get(0)?, r.get(1)?)))
    })
}

/// Stop `claim_next` handing out runs of `workflow_name` (queued ones and those queued later;
/// claims already taken stand). Pausing a paused workflow, or one with no runs, is allowed.
pub fn pause_workflow(store: &mut dyn Store, workflow_name: &str, now_ms: i64) -> Result<()> {
    check_name("workflow_name", workflow_name)?;
    store.write("pausing a workflow", |tx| {
        tx.exec(&sql::PAUSE_SQL, params![workflow_name, now_ms])?;
        tx.exec(&sql::PAUSE_LANE_SQL, params![workflow_name])?;
        Ok(())
    })
}

/// Let `claim_next` hand out runs of `workflow_name` again; a workflow not paused is left as
/// it is.
pub fn resume_workflow(store: &mut dyn Store, workflow_name: &str) -> Result<()> {
    check_name("workflow_name", workflow_name)?;
    store.write("resuming a workflow", |tx| {
        tx.exec(&sql::RESUME_SQL, params![workflow_name])?;
        tx.exec(&sql::RESUME_LANE_SQL, params![workflow_name])?;
        Ok(())
    })
}

/// The paused workflows, by name.
pub fn paused_workflows(store: &mut dyn Store) -> Result<Vec<String>> {
    store.read("reading the paused workflows", |tx| {
        tx.rows(&sql::PAUSED_SQL, params![], |r| r.get(0))
    })
}

/// A part of the queue [`queued_runs`] pages through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Due runs whose key has no limit and whose workflow is not paused, in claim order
    /// (priority, highest first, then due time, then run id): what `claim_next` takes next.
    Due,
    /// Runs not yet due when a claim last looked, soonest due first (a run whose time has
    /// come since moves to its lane at the next `claim_next`).
    Later,
}

impl Lane {
    /// The lane named `name` (the `lane` argument).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "due" => Ok(Self::Due),
            "later" => Ok(Self::Later),
            _ => Err(LedgerError::invalid(
                "lane",
                format!(
                    "is {name:?}; pass \"due\" (what claim_next takes next) or \"later\" \
                     (not due yet)"
                ),
            )),
        }
    }
}

/// Where a page of [`queued_runs`] starts: after the run at this place in the lane's order,
/// as the page before saw it (priority, due time, run id).
pub type QueueCursor = (i64, i64, String);

/// A page of `lane`, at most `limit` runs (1 to [`events::MAX_PAGE`]) after `after`. Each run
/// is read as `get_run` reads it; the page is a range of the lane's index, so it costs the same
/// at any depth of any backlog.
pub fn queued_runs(
    store: &mut dyn Store,
    lane: Lane,
    limit: i64,
    after: Option<&QueueCursor>,
) -> Result<Vec<Run>> {
    events::check_page(limit, "; page on with after=")?;
    let (priority, due, run_id) = after.map_or((MAX_PRIORITY + 1, i64::MIN, ""), |c| {
        (c.0, c.1, c.2.as_str())
    });
    store.read("reading the queue", |tx| match lane {
        Lane::Due => tx.rows(
            &sql::QUEUED_DUE_SQL,
            params![priority, due, run_id, limit],
            runs::run_from_row,
        ),
        Lane::Later => tx.rows(
            &sql::QUEUED_LATER_SQL,
            params![due, run_id, limit],
            runs::run_from_row,
        ),
    })
}

/// A key with a limit, as [`queue_overview`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyUsage {
    /// The key.
    pub concurrency_key: String,
    /// Its limit.
    pub limit: i64,
    /// Its runs that hold live leases now.
    pub live: i64,
    /// Its queued runs (due or not), counted up to the overview's `count_max`.
    pub queued: i64,
}

/// A paused workflow, as [`queue_overview`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PausedUsage {
    /// The workflow's name.
    pub workflow_name: String,
    /// When it was paused (ms).
    pub paused_at: i64,
    /// Its queued runs (all held while it is paused), counted up to `count_max`.
    pub queued: i64,
}

/// The queue at a glance, read in one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOverview {
    /// Runs in the due lane, up to `count_max`.
    pub due: i64,
    /// Due runs of keys with a limit, up to `count_max`.
    pub keyed: i64,
    /// Runs not yet due, up to `count_max`.
    pub later: i64,
    /// The keys with a limit, in key order, at most `limit` of them after `after_key`.
    pub keys: Vec<KeyUsage>,
    /// The paused workflows, by name, at most `limit` of them.
    pub paused: Vec<PausedUsage>,
}

/// The most a count of [`queue_overview`] reads: a count is a walk of an index, and a
/// dashboard repeats it.
pub const MAX_COUNT: i64 = 1_000_000;

/// The queue's counts (each stops at `count_max`: a count of `count_max` means "at least"),
/// the keys with limits (their live and queued runs) and the paused workflows (their queued
/// runs), `limit` of each (1 to [`events::MAX_PAGE`]; keys in key order after `after_key`).
/// Every count is a range of an index read at most `count_max` entries far, so the overview
/// costs the same over a backlog of millions; a key's live count is what it holds now.
pub fn queue_overview(
    store: &mut dyn Store,
    count_max: i64,
    limit: i64,
    after_key: &str,
    now_ms: i64,
) -> Result<QueueOverview> {
    events::check_page(limit, "")?;
    if !(1..=MAX_COUNT).contains(&count_max) {
        return Err(LedgerError::invalid(
            "count_max",
            format!("must be from 1 to {MAX_COUNT}, not {count_max}"),
        ));
    }
    store.read("reading the queue", |tx| {
        let (due, keyed, later) = tx
            .row(&sql::QUEUE_COUNTS_SQL, params![count_max], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .unwrap_or((0, 0, 0));
        let keys = tx.rows(
            &sql::KEY_USAGE_SQL,
            params![count_max, now_ms, after_key, limit],
            |r| {
                Ok(KeyUsage {
                    concurrency_key: r.get(0)?,
                    limit: r.get(1)?,
                    live: r.get(2)?,
                    queued: r.get(3)?,
                })
            },
        )?;
        let paused = tx.rows(&sql::PAUSED_USAGE_SQL, params![count_max, "", limit], |r| {
            Ok(PausedUsage {
                workflow_name: r.get(0)?,
                paused_at: r.get(1)?,
                queued: r.get(2)?,
            })
        })?;
        Ok(QueueOverview {
            due,
            keyed,
            later,
            keys,
            paused,
        })
    })
}

/// A concurrency key: not empty (the text checks, NUL and length, are the argument's).
fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(LedgerError::invalid(
            "concurrency_key",
            "is empty; pass a key (a tenant, a model, a repository) or None",
        ));
    }
    Ok(())
}
