//! Plain Rust records returned by the core operations, with the fields (and field names) of
//! the Python records they become. JSON fields carry canonical JSON bytes (decoded by the
//! binding), times are epoch milliseconds, statuses are the enums of [`crate::status`].

use crate::status::{AttemptStatus, RunStatus, StepStatus, UnitStatus};

/// One run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Run id.
    pub run_id: String,
    /// Workflow reference.
    pub workflow_ref: String,
    /// Display name: `reserve_run`'s `workflow_name`, or `start_run`'s `title` (default: the
    /// ref). One concept under the Python API's two spellings; in Rust it is `workflow_name`
    /// from the request on (only `NewRun::title` keeps the keyword's name).
    pub workflow_name: String,
    /// Scope key, if any.
    pub scope_key: Option<String>,
    /// Lifecycle status.
    pub status: RunStatus,
    /// The step in progress.
    pub current_step_id: Option<String>,
    /// Parent run of a child run.
    pub parent_run_id: Option<String>,
    /// The parent's unit that spawned this child.
    pub parent_unit_id: Option<String>,
    /// Idempotency key of a child publication.
    pub invocation_key: Option<String>,
    /// Session that queued the run.
    pub origin_session_id: Option<String>,
    /// Canonical JSON of the params.
    pub params: Option<Vec<u8>>,
    /// Canonical JSON of the outputs.
    pub outputs: Option<Vec<u8>>,
    /// Bumped by every transition and event.
    pub revision: i64,
    /// Creation time.
    pub created_at: i64,
    /// Last change.
    pub updated_at: i64,
    /// Set once terminal.
    pub completed_at: Option<i64>,
    /// When a queued run may first be claimed by `claim_next` (`None`: as soon as queued).
    pub not_before: Option<i64>,
    /// Claim order: higher first (-1000..=1000; 0 unless `reserve_run` said otherwise).
    pub priority: i64,
    /// What the run counts against while it holds a live lease (see `concurrency_limits`).
    pub concurrency_key: Option<String>,
}

/// One step of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Run id.
    pub run_id: String,
    /// Step id.
    pub step_id: String,
    /// Title.
    pub title: String,
    /// Instructions.
    pub instructions: String,
    /// Position in the plan.
    pub sequence_index: i64,
    /// Status.
    pub status: StepStatus,
    /// Notes.
    pub notes: Option<String>,
    /// Canonical JSON evidence.
    pub evidence: Option<Vec<u8>>,
    /// Summary.
    pub summary: Option<String>,
    /// Completion time.
    pub completed_at: Option<i64>,
}

/// A unit's projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Run id.
    pub run_id: String,
    /// Unit id.
    pub unit_id: String,
    /// Step.
    pub step_id: Option<String>,
    /// `unit` or `gate`.
    pub phase: String,
    /// Status of the latest attempt.
    pub status: UnitStatus,
    /// Number of the latest attempt.
    pub attempts: i64,
    /// Canonical JSON result.
    pub result: Option<Vec<u8>>,
    /// Tokens.
    pub tokens: Option<i64>,
    /// Failure reason.
    pub failure_reason: Option<String>,
    /// Holder of the latest reservation.
    pub claim_holder: Option<String>,
    /// When a failed unit may be reserved again, under its retry policy (epoch ms); `None`
    /// unless it waits for a retry.
    pub retry_at: Option<i64>,
}

/// One attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Run id.
    pub run_id: String,
    /// Unit id.
    pub unit_id: String,
    /// Attempt number, from 1.
    pub attempt: i64,
    /// Dedupe key.
    pub dispatch_id: String,
    /// Status.
    pub status: AttemptStatus,
    /// `unit` or `gate`.
    pub phase: String,
    /// Holder.
    pub holder: Option<String>,
    /// Lease generation it was reserved under.
    pub lease_generation: Option<i64>,
    /// Reclaims so far.
    pub reclaims: i64,
    /// Canonical JSON result.
    pub result: Option<Vec<u8>>,
    /// Tokens.
    pub tokens: Option<i64>,
    /// Failure reason.
    pub failure_reason: Option<String>,
    /// Reservation time.
    pub started_at: i64,
    /// Finish time.
    pub finished_at: Option<i64>,
    /// The W3C `traceparent` the attempt was reserved (or last reclaimed) under.
    pub trace_context: Option<String>,
}

/// What a reservation returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Run id.
    pub run_id: String,
    /// Unit id.
    pub unit_id: String,
    /// A new attempt, or the running one handed back in place.
    pub kind: ReservationKind,
    /// Attempt number.
    pub attempt: i64,
    /// Dedupe key.
    pub dispatch_id: String,
    /// Reclaims so far.
    pub reclaims: i64,
    /// Lease generation.
    pub lease_generation: Option<i64>,
}

/// What a reservation did (Python's `Reservation.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationKind {
    /// A new attempt, with a fresh dispatch id and a `unit.started` event.
    Reserved,
    /// The latest attempt, still running, handed back in place: same number and dispatch id,
    /// no event.
    Reclaimed,
}

impl ReservationKind {
    /// `reserved` or `reclaimed`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Reclaimed => "reclaimed",
        }
    }
}

/// Attempt and token totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Accounting {
    /// All attempts.
    pub total_attempts: i64,
    /// All tokens.
    pub total_tokens: i64,
    /// Attempts of phase `unit`.
    pub dispatch_attempts: i64,
    /// Tokens of phase `unit`.
    pub dispatch_tokens: i64,
    /// Attempts of phase `gate`.
    pub gate_attempts: i64,
    /// Tokens of phase `gate`.
    pub gate_tokens: i64,
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Global cursor.
    pub seq: i64,
    /// The run (resource) it belongs to.
    pub resource_id: String,
    /// The resource's revision it recorded.
    pub revision: i64,
    /// Event type (`run.started`, `unit.finished`, ...): the `type` column, Python's
    /// `Event.type`.
    pub event_type: String,
    /// Actor type.
    pub actor_type: Option<String>,
    /// Actor id.
    pub actor_id: Option<String>,
    /// Lease generation of a fenced write.
    pub generation: Option<i64>,
    /// Canonical JSON payload.
    pub payload: Vec<u8>,
    /// Time.
    pub ts: i64,
}

/// A message sent to a run (`send`), taken at most once by its owner (`receive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The run it was sent to.
    pub run_id: String,
    /// Its number in the run's mailbox, from 1, in the order sent.
    pub seq: i64,
    /// The topic it was sent on.
    pub topic: String,
    /// The sender's idempotency key, if it gave one.
    pub key: Option<String>,
    /// Canonical JSON payload.
    pub payload: Vec<u8>,
    /// When it was sent.
    pub sent_at: i64,
    /// When a `receive` took it, if one has.
    pub consumed_at: Option<i64>,
    /// The lease generation of the claim that took it.
    pub consumed_generation: Option<i64>,
}

/// A live claim: the plaintext token is handed to the claimer once and never stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claimed run.
    pub run_id: String,
    /// The generation this claim took.
    pub generation: i64,
    /// The secret the claimer presents on every fenced write.
    pub token: String,
    /// Who holds it.
    pub owner_id: String,
    /// When it lapses unless renewed (epoch ms, the ledger's clock).
    pub expires_at: i64,
    /// The owner whose expired claim this one took over (a takeover); `None` when the lease
    /// had no owner, was this runner's own, or this is a heartbeat's renewed claim.
    pub taken_from: Option<String>,
}

/// The lease row of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run_id: String,
    /// Claims taken so far (0 = never claimed).
    pub generation: i64,
    /// The current owner, if any.
    pub owner_id: Option<String>,
    /// `host` or `session`.
    pub owner_type: Option<String>,
    /// Expiry of the current claim.
    pub expires_at: Option<i64>,
    /// Last claim or heartbeat.
    pub heartbeat_at: Option<i64>,
    /// Claims that took the lease from another owner whose claim had expired.
    pub takeovers: i64,
    /// Fenced writes refused because their claim no longer held the lease.
    pub refused_writes: i64,
}
