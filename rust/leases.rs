//! Leases: at most one live owner per run, proved by generations. Every claim, heartbeat and
//! release, and the fence check of every fenced write, lives here.
//!
//! One primitive serves every path, so no path can skip it: a claim bumps the lease's
//! generation by compare-and-set and stores only the SHA-256 of a fresh token; every fenced
//! write (heartbeat, release, a status change, a step or attempt written under a claim) runs
//! [`check`] inside its own transaction, so a holder whose lease moved on (taken over, released,
//! re-claimed, or simply expired by the ledger's clock) writes nothing. Checking at every write,
//! not only at claim time, is what stops a paused or partitioned old owner after a takeover.

use crate::params;
use sha2::{Digest as _, Sha256};

use crate::canonical::{into_text, to_vec, Value};
use crate::errors::{LedgerError, LostReason, Result};
use crate::events::{self, Actor};
use crate::ids::check_name;
use crate::model::{Claim, Lease};
use crate::status::{run_state, RunStatus};
use crate::store::rows::{ClaimRow, Stamp, Writes};
use crate::store::{sql, DbResult, Row, Store, Tx};

/// The longest lease a claim or heartbeat may ask for: one day. A longer lease is almost
/// always a unit mistake (seconds for milliseconds), and a dead owner would block the run
/// for that long.
pub const MAX_LEASE_MS: i64 = 86_400_000;

/// The latest time an injected clock may return, in epoch milliseconds: every timestamp the
/// ledger writes (an expiry is the clock plus at most [`MAX_LEASE_MS`]) must still read back as
/// a Python `datetime`, whose last instant is 9999-12-31T23:59:59.999Z.
pub const MAX_CLOCK_MS: i64 = 253_402_300_799_999 - MAX_LEASE_MS;

/// Check a time read from an injected clock before anything is written with it: a value that
/// could not be read back would make the run unreadable from then on.
pub fn check_clock_ms(now_ms: i64) -> Result<()> {
    if (0..=MAX_CLOCK_MS).contains(&now_ms) {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "clock",
            format!(
                "returned {now_ms}, outside the epoch milliseconds fencepost can store (0 to \
                 {MAX_CLOCK_MS}, 1970 to 9999); return int(time.time() * 1000) or a test time \
                 in that range"
            ),
        ))
    }
}

/// What a claimed write presents: the run, the generation it claimed, and the token's hash
/// (the token itself never reaches the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The claimed run.
    pub run_id: String,
    /// The generation the claim took.
    pub generation: i64,
    /// `hex(sha256(token))`.
    pub token_hash: String,
}

/// `hex(sha256(token))`, the only form of a token the database sees.
pub fn hash_token(token: &str) -> String {
    let hash = Sha256::digest(token.as_bytes());
    let mut hex = String::with_capacity(64);
    for b in hash {
        hex.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
    }
    hex
}

impl Fence {
    /// A fence from a claim's plaintext token (hashed here, before any transaction).
    pub fn from_token(run_id: &str, generation: i64, token: &str) -> Self {
        Self {
            run_id: run_id.to_owned(),
            generation,
            token_hash: hash_token(token),
        }
    }
}

/// A new claim token: 256 bits from the operating system's generator, as 64 hex digits behind
/// a `fpt_` prefix (recognisable in a log, so it can be scrubbed).
pub fn new_token() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| LedgerError::StoreError {
        operation: "minting a claim token".into(),
        message: format!("the operating system's random generator failed: {e}"),
    })?;
    let mut token = String::with_capacity(68);
    token.push_str("fpt_");
    for b in bytes {
        token.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        token.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
    }
    Ok(token)
}

/// Validate a lease length in milliseconds.
pub fn check_lease_ms(argument: &str, lease_ms: i64) -> Result<()> {
    if (1..=MAX_LEASE_MS).contains(&lease_ms) {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            argument,
            format!("must be from 1 to {MAX_LEASE_MS} milliseconds, not {lease_ms}"),
        ))
    }
}

/// Validate a caller-chosen token: long enough to be a secret, printable, bounded.
pub fn check_token(argument: &str, token: &str) -> Result<()> {
    let ok = (32..=256).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            argument,
            "must be 32 to 256 printable ASCII characters (or None: fencepost mints one)",
        ))
    }
}

/// `host` for runner ids that start with `host-`, else `session`.
pub fn owner_type(runner_id: &str) -> &'static str {
    if runner_id.starts_with("host-") {
        "host"
    } else {
        "session"
    }
}

/// Re-check `fence` against the run's lease inside the caller's transaction: the generation,
/// the token hash and the expiry (judged with the ledger's clock) must all hold, else
/// `LeaseLost` and the caller writes nothing. Without a fence the write is unfenced. Returns the
/// actor to stamp on the write's events: the lease's owner at that generation.
pub fn check(
    tx: &dyn Tx,
    run_id: &str,
    fence: Option<&Fence>,
    now_ms: i64,
) -> Result<Actor<'static>> {
    check_against(run_id, fence, now_ms, || {
        tx.row(&sql::FENCE_SQL, params![run_id], fence_row)
    })
}

/// A row of [`sql::FENCE_SQL`].
pub(crate) fn fence_row(r: &dyn Row) -> DbResult<FenceRow> {
    Ok(FenceRow {
        generation: r.get(0)?,
        token_hash: r.get(1)?,
        expires_at: r.get(2)?,
        owner_type: r.get(3)?,
        owner_id: r.get(4)?,
    })
}

/// [`check`] against the lease row `lease` gives (read from the store, or from what a group
/// read for all its calls); it is read only when there is a fence naming `run_id`.
pub(crate) fn check_against(
    run_id: &str,
    fence: Option<&Fence>,
    now_ms: i64,
    lease: impl FnOnce() -> Result<Option<FenceRow>>,
) -> Result<Actor<'static>> {
    let Some(fence) = fence else {
        return Ok(Actor::default());
    };
    claim_names(fence, run_id)?;
    judge_fence(lease()?.as_ref(), fence, now_ms)
}

/// A claim presented for `run_id` must name it.
fn claim_names(fence: &Fence, run_id: &str) -> Result<()> {
    if fence.run_id == run_id {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "claim",
            format!("the claim is for run {:?}, not {run_id:?}", fence.run_id),
        ))
    }
}

/// What a fence is checked against: the lease row's fence columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FenceRow {
    pub generation: i64,
    pub token_hash: Option<String>,
    pub expires_at: Option<i64>,
    pub owner_type: Option<String>,
    pub owner_id: Option<String>,
}

/// The fence check itself, on a lease row already read (`None`: the run has no lease row):
/// the generation, the token hash and the expiry must all hold, else `LeaseLost`.
fn judge_fence(row: Option<&FenceRow>, fence: &Fence, now_ms: i64) -> Result<Actor<'static>> {
    let lost = |actual: i64, reason: LostReason| LedgerError::LeaseLost {
        run_id: fence.run_id.clone(),
        expected_generation: fence.generation,
        actual_generation: actual,
        reason,
    };
    let Some(row) = row else {
        return Err(lost(0, LostReason::Superseded));
    };
    // In the order that says most: a newer generation explains any other mismatch, a cleared
    // owner explains the missing expiry, and only a claim that is still the lease's can have
    // merely run out of time.
    if row.generation != fence.generation {
        return Err(lost(row.generation, LostReason::Superseded));
    }
    match row.token_hash.as_deref() {
        None => return Err(lost(row.generation, LostReason::Released)),
        Some(hash) if hash != fence.token_hash => {
            return Err(lost(row.generation, LostReason::Token));
        }
        Some(_) => {}
    }
    if row.expires_at.is_none_or(|e| e <= now_ms) {
        return Err(lost(row.generation, LostReason::Expired));
    }
    let actor_type = match row.owner_type.as_deref() {
        Some("host") => Some("host"),
        _ => Some("session"),
    };
    Ok(Actor {
        actor_type,
        id: row.owner_id.clone(),
        generation: Some(row.generation),
    })
}

/// The lease of an existing run (generation 0, no owner, if never claimed).
pub fn read(tx: &dyn Tx, run_id: &str) -> Result<Lease> {
    let lease = tx.row(&sql::LEASE_SQL, params![run_id], |r| {
        lease_from_row(run_id, r)
    })?;
    Ok(lease.unwrap_or_else(|| unclaimed(run_id)))
}

/// The lease `found` for `run_id` (the caller holds the run's lock), or, for a run without a
/// lease row, the row made now: generation 0, no owner, what a read of it would return.
pub(crate) fn or_created(tx: &dyn Tx, run_id: &str, found: Option<Lease>) -> Result<Lease> {
    if let Some(lease) = found {
        return Ok(lease);
    }
    tx.exec_later(&sql::CREATE_LEASE_SQL, params![run_id])?;
    Ok(unclaimed(run_id))
}

/// The lease of a run never claimed: generation 0, no owner.
fn unclaimed(run_id: &str) -> Lease {
    Lease {
        run_id: run_id.to_owned(),
        generation: 0,
        owner_id: None,
        owner_type: None,
        expires_at: None,
        heartbeat_at: None,
        takeovers: 0,
        refused_writes: 0,
    }
}

fn lease_from_row(run_id: &str, r: &dyn Row) -> DbResult<Lease> {
    Ok(Lease {
        run_id: run_id.to_owned(),
        generation: r.get(0)?,
        owner_id: r.get(1)?,
        owner_type: r.get(2)?,
        expires_at: r.get(3)?,
        heartbeat_at: r.get(4)?,
        takeovers: r.get(5)?,
        refused_writes: r.get(6)?,
    })
}

/// A claim request, validated before the transaction.
#[derive(Debug, Clone)]
pub struct ClaimSpec {
    /// Who claims.
    pub runner_id: String,
    /// Lease length.
    pub lease_ms: i64,
    /// The token (minted if the caller gave none).
    pub token: String,
}

impl ClaimSpec {
    /// Validate the arguments and mint the token if none was given.
    pub fn new(
        runner_id: String,
        lease_ms: i64,
        token: Option<String>,
        token_argument: &str,
    ) -> Result<Self> {
        check_name("runner_id", &runner_id)?;
        check_lease_ms("lease_ms", lease_ms)?;
        let token = match token {
            Some(t) => {
                check_token(token_argument, &t)?;
                t
            }
            None => new_token()?,
        };
        Ok(Self {
            runner_id,
            lease_ms,
            token,
        })
    }
}

/// A claim decided on a lease as read: what the compare-and-set writes, the `lease.claimed`
/// event's payload and actor, and the claim the caller gets back.
pub(crate) struct Decided {
    /// The generation the lease was read at (the compare-and-set's condition).
    pub previous: i64,
    /// `host` or `session`, from the runner id.
    pub owner_type: &'static str,
    /// The new token's hash.
    pub token_hash: String,
    /// The `lease.claimed` payload.
    pub payload: Value,
    /// The claim, at generation `previous + 1`.
    pub claim: Claim,
}

impl Decided {
    /// The rows the claim writes (`queued`: its run moves to `starting`), its event stamped
    /// with the new owner at the new generation.
    pub fn row(&self, queued: bool, now_ms: i64) -> ClaimRow<'_> {
        ClaimRow {
            run_id: &self.claim.run_id,
            previous: self.previous,
            generation: self.claim.generation,
            owner_type: self.owner_type,
            owner_id: &self.claim.owner_id,
            token_hash: &self.token_hash,
            expires_at: self.claim.expires_at,
            queued,
            payload: into_text(to_vec(&self.payload)),
            stamp: Stamp {
                actor_type: Some(self.owner_type),
                actor_id: Some(self.claim.owner_id.clone()),
                generation: Some(self.claim.generation),
                ts: now_ms,
            },
        }
    }
}

/// Decide a claim of `current` (the lease as read, its run in `status`): `None` while another
/// owner's lease is unexpired. The same runner re-claiming its own live lease gets a new
/// generation too: processes can share a runner id, and the re-claim must cut off whichever of
/// them held the old token, or both would keep writing. A `queued` run moves to `starting`, and
/// the payload says so.
pub(crate) fn decide(
    current: &Lease,
    status: RunStatus,
    spec: &ClaimSpec,
    now_ms: i64,
) -> Result<Option<Decided>> {
    let held_by_other = current
        .owner_id
        .as_deref()
        .is_some_and(|o| o != spec.runner_id)
        && current.expires_at.is_some_and(|e| e > now_ms);
    if held_by_other {
        return Ok(None);
    }
    let expires_at = now_ms.saturating_add(spec.lease_ms);
    let generation = current.generation + 1;
    // Another owner still named on the lease: its claim expired and this claim takes over
    // (`CLAIM_SQL` counts it by the same rule).
    let taken_from = current
        .owner_id
        .clone()
        .filter(|owner| *owner != spec.runner_id);
    let mut payload = vec![
        ("expires_at".into(), Value::Int(expires_at)),
        ("generation".into(), Value::Int(generation)),
        ("owner_id".into(), Value::Str(spec.runner_id.clone())),
    ];
    if status == RunStatus::Queued {
        status.check_move(RunStatus::Starting)?;
        payload.push((
            "status".into(),
            Value::Str(RunStatus::Starting.as_str().into()),
        ));
    }
    // Members in key order, as canonical JSON writes them.
    if let Some(owner) = &taken_from {
        payload.push(("taken_from".into(), Value::Str(owner.clone())));
    }
    Ok(Some(Decided {
        previous: current.generation,
        owner_type: owner_type(&spec.runner_id),
        token_hash: hash_token(&spec.token),
        payload: Value::Object(payload),
        claim: Claim {
            run_id: current.run_id.clone(),
            generation,
            token: spec.token.clone(),
            owner_id: spec.runner_id.clone(),
            expires_at,
            taken_from,
        },
    }))
}

/// Claim the lease of a run known to exist and not be terminal, inside the caller's
/// transaction (see [`decide`]). `None` while another owner's lease is unexpired. `status` is
/// the run's status, moved from `queued` to `starting` by the claim.
pub(crate) fn claim_in(
    tx: &dyn Tx,
    run_id: &str,
    status: RunStatus,
    spec: &ClaimSpec,
    now_ms: i64,
) -> Result<Option<Claim>> {
    let found = tx.row(&sql::LEASE_SQL, params![run_id], |r| {
        lease_from_row(run_id, r)
    })?;
    let current = or_created(tx, run_id, found)?;
    let Some(decided) = decide(&current, status, spec, now_ms)? else {
        return Ok(None);
    };
    let writes = Writes {
        claims: vec![decided.row(status == RunStatus::Queued, now_ms)],
        ..Writes::default()
    };
    tx.write_rows(&writes).map_err(|e| tx.fail(&e))?;
    Ok(Some(decided.claim))
}

/// The fenced statement itself (its WHERE repeats the fence) must have changed the one lease
/// row; [`check`] just passed in this transaction, so anything else is the fence failing.
fn fenced_write(fence: &Fence, changed: usize) -> Result<()> {
    if changed == 1 {
        Ok(())
    } else {
        // Unreachable while `check` holds the run's lock; reported as the fence moving on.
        Err(LedgerError::LeaseLost {
            run_id: fence.run_id.clone(),
            expected_generation: fence.generation,
            actual_generation: fence.generation,
            reason: LostReason::Superseded,
        })
    }
}

/// Claim a run. `None` for a terminal run or while another owner's lease is unexpired.
pub fn claim(
    store: &mut dyn Store,
    run_id: &str,
    spec: &ClaimSpec,
    now_ms: i64,
) -> Result<Option<Claim>> {
    store.write("claiming a run", |tx| {
        claim_run_in(tx, run_id, spec, now_ms)
    })
}

/// The body of [`claim`] inside the caller's transaction: it locks `run_id` and no other run.
pub(crate) fn claim_run_in(
    tx: &dyn Tx,
    run_id: &str,
    spec: &ClaimSpec,
    now_ms: i64,
) -> Result<Option<Claim>> {
    tx.lock_run(run_id)?;
    let state = run_state(tx, run_id)?;
    if state.status.is_terminal() {
        return Ok(None);
    }
    claim_in(tx, run_id, state.status, spec, now_ms)
}

/// Extend a live claim by `lease_ms` from now; the claim comes back with `token`. No event: a
/// heartbeat changes no state anyone reads back but the lease itself (and an event per
/// heartbeat would flood the log of a long run).
pub fn heartbeat(
    store: &mut dyn Store,
    fence: &Fence,
    token: &str,
    lease_ms: i64,
    now_ms: i64,
) -> Result<Claim> {
    check_lease_ms("lease_ms", lease_ms)?;
    store.write("renewing a claim", |tx| {
        heartbeat_in(tx, fence, token, lease_ms, now_ms)
    })
}

/// The body of [`heartbeat`] inside the caller's transaction: a judgment of one call.
pub(crate) fn heartbeat_in(
    tx: &dyn Tx,
    fence: &Fence,
    token: &str,
    lease_ms: i64,
    now_ms: i64,
) -> Result<Claim> {
    let mut keys = crate::plan::Keys::default();
    keys.heartbeat(fence);
    let mut judgment = crate::plan::Judgment::read(tx, keys)?;
    let claim = judgment.heartbeat(fence, token, lease_ms, now_ms)?;
    judgment.write(tx)?;
    Ok(claim)
}

/// A heartbeat whose fence held (`actor` is the fence check's answer): the claim, renewed to
/// expire `lease_ms` from now. One rule for a heartbeat alone and in a commit group.
pub(crate) fn renewed(
    fence: &Fence,
    token: &str,
    actor: Actor<'_>,
    lease_ms: i64,
    now_ms: i64,
) -> Claim {
    Claim {
        run_id: fence.run_id.clone(),
        generation: fence.generation,
        token: token.to_owned(),
        owner_id: actor.id.unwrap_or_default(),
        expires_at: now_ms.saturating_add(lease_ms),
        taken_from: None,
    }
}

/// Give a live claim up: the owner is cleared, the generation kept, `lease.released` appended.
pub fn release(store: &mut dyn Store, fence: &Fence, now_ms: i64) -> Result<()> {
    store.write("releasing a claim", |tx| {
        tx.lock_run(&fence.run_id)?;
        let actor = check(tx, &fence.run_id, Some(fence), now_ms)?;
        let changed = tx.exec(
            &sql::RELEASE_SQL,
            params![fence.run_id, fence.generation, fence.token_hash, now_ms],
        )?;
        fenced_write(fence, changed)?;
        let payload = Value::Object(vec![("generation".into(), Value::Int(fence.generation))]);
        events::append(
            tx,
            &fence.run_id,
            "lease.released",
            &payload,
            &actor,
            now_ms,
        )
    })
}

/// The lease of a run (generation 0 and no owner if never claimed).
pub fn lease(store: &mut dyn Store, run_id: &str) -> Result<Lease> {
    store.read("reading a lease", |tx| {
        run_state(tx, run_id)?;
        read(tx, run_id)
    })
}

/// A lease read with its run id first.
fn run_lease_from_row(r: &dyn Row) -> DbResult<Lease> {
    Ok(Lease {
        run_id: r.get(0)?,
        generation: r.get(1)?,
        owner_id: r.get(2)?,
        owner_type: r.get(3)?,
        expires_at: r.get(4)?,
        heartbeat_at: r.get(5)?,
        takeovers: r.get(6)?,
        refused_writes: r.get(7)?,
    })
}

/// Owned leases past their expiry on runs that are not terminal (with `active_only`, on
/// `active` runs), soonest-expired first.
pub fn expired_leases(store: &mut dyn Store, now_ms: i64, active_only: bool) -> Result<Vec<Lease>> {
    store.read("listing expired leases", |tx| {
        tx.rows(
            &sql::EXPIRED_LEASES_SQL,
            params![now_ms, i64::from(active_only)],
            run_lease_from_row,
        )
    })
}

/// The leases of `run_ids` (at most 10 000; unknown runs left out), by run id, in one read.
pub fn run_leases(store: &mut dyn Store, run_ids: &[String]) -> Result<Vec<Lease>> {
    crate::events::check_keys("run_ids", run_ids.len(), "runs")?;
    if run_ids.is_empty() {
        return Ok(Vec::new());
    }
    let ids = crate::events::json_array(run_ids);
    store.read("listing leases", |tx| {
        tx.rows(&sql::RUN_LEASES_SQL, params![ids], run_lease_from_row)
    })
}

/// Every run's lease in one read, runs newest first; with `owned_only`, only the leases that
/// have an owner, soonest to expire first.
pub fn leases(store: &mut dyn Store, owned_only: bool) -> Result<Vec<Lease>> {
    store.read("listing leases", |tx| {
        let statement = if owned_only {
            &sql::OWNED_LEASES_SQL
        } else {
            &sql::LEASES_SQL
        };
        tx.rows(statement, params![], run_lease_from_row)
    })
}
