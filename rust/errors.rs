//! The core error enum: one variant per Python exception in `fencepost.errors`, with the same
//! name and the same structured fields, so an error reads the same from Rust and from Python.
//! The Python binding turns each variant into that exception by calling its class with keyword
//! fields, so the user-facing message text lives in Python; the `Display` strings here serve
//! Rust callers and tests.
//!
//! A raw `rusqlite`/`postgres` error never escapes the store: it becomes
//! [`LedgerError::StoreError`] with the operation that failed, or [`LedgerError::StoreBusy`]
//! for lock waits.

use crate::canonical::CanonicalError;

/// Result alias for every core operation.
pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// Every way a ledger operation can fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// A keyed record (`kind`: "blob", "step", ...) does not exist.
    #[error("no {kind} {key:?}")]
    NotFound {
        /// What was looked up.
        kind: &'static str,
        /// The key that matched nothing.
        key: String,
    },
    /// No run has this id.
    #[error("run {run_id:?} not found")]
    RunNotFound {
        /// The id or prefix that matched nothing.
        run_id: String,
    },
    /// A run id prefix matches several runs.
    #[error("run id prefix {prefix:?} matches {matches:?}")]
    AmbiguousRunId {
        /// The prefix given.
        prefix: String,
        /// Every matching run id, sorted.
        matches: Vec<String>,
    },
    /// An argument is malformed; `message` says what is wrong and what is allowed.
    #[error("{argument}: {message}")]
    InvalidArgument {
        /// The keyword or parameter name.
        argument: String,
        /// What is wrong with it.
        message: String,
    },
    /// A JSON argument cannot be canonicalized (RFC 8785 / I-JSON limits).
    #[error("{argument}: {source}")]
    CanonicalJsonError {
        /// The keyword or parameter that carried the value.
        argument: String,
        /// Where in the value, and why.
        source: CanonicalError,
    },
    /// The scope guard found another active top-level run.
    #[error("scope {scope_key:?} is occupied by run {occupant_run_id:?}")]
    ActiveRunExists {
        /// The guarded scope.
        scope_key: String,
        /// The run already active there.
        occupant_run_id: String,
    },
    /// The run is not `active`.
    #[error("run {run_id:?} is {status}, not active")]
    RunNotActive {
        /// The run.
        run_id: String,
        /// Its actual status.
        status: String,
    },
    /// `prepare_or_adopt` found the run with different inputs.
    #[error("run {run_id:?} differs in {fields:?}")]
    PreparationConflict {
        /// The run.
        run_id: String,
        /// The names of the fields that differ.
        fields: Vec<String>,
    },
    /// A continuation was refused.
    #[error("cannot continue {parent_run_id:?}: {reason}")]
    ContinuationRefused {
        /// The parent run.
        parent_run_id: String,
        /// Why.
        reason: String,
    },
    /// A fenced write carried a stale claim.
    #[error("lease on {run_id:?} lost ({reason}): this claim holds generation {expected_generation}, the lease is at {actual_generation}")]
    LeaseLost {
        /// The run whose lease moved on.
        run_id: String,
        /// The generation the caller's claim holds.
        expected_generation: i64,
        /// The lease's generation now.
        actual_generation: i64,
        /// What happened to the claim.
        reason: LostReason,
    },
    /// A reservation came before the failed unit's retry time (`force=True` reserves anyway).
    #[error("unit {unit_id:?} of run {run_id:?} may be retried from {retry_at} (epoch ms)")]
    RetryNotDue {
        /// The run.
        run_id: String,
        /// The unit.
        unit_id: String,
        /// When the unit may be reserved again, epoch milliseconds.
        retry_at: i64,
    },
    /// A reservation named a unit that has used every attempt its policy allows.
    #[error("unit {unit_id:?} of run {run_id:?} is exhausted after {attempts} attempts")]
    UnitExhausted {
        /// The run.
        run_id: String,
        /// The unit.
        unit_id: String,
        /// The attempts it made.
        attempts: i64,
    },
    /// The database stayed locked past the busy timeout and every retry.
    #[error("database busy after {waited_ms} ms and {retries} retries")]
    StoreBusy {
        /// Total time spent waiting.
        waited_ms: u64,
        /// Retries made after the first attempt.
        retries: u32,
    },
    /// The database schema is newer than this library.
    #[error("database schema {database_version} is newer than library schema {library_version}")]
    SchemaError {
        /// The version recorded in the database.
        database_version: i64,
        /// The newest version this library knows.
        library_version: i64,
    },
    /// Any other database failure, with what fencepost was doing at the time.
    #[error("{message}")]
    StoreError {
        /// The operation, e.g. "reserving attempt 3 of run X".
        operation: String,
        /// A complete, user-facing sentence.
        message: String,
    },
}

impl LedgerError {
    /// Shorthand for [`LedgerError::InvalidArgument`].
    pub fn invalid(argument: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            argument: argument.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`LedgerError::CanonicalJsonError`].
    pub fn canonical(argument: impl Into<String>, source: CanonicalError) -> Self {
        Self::CanonicalJsonError {
            argument: argument.into(),
            source,
        }
    }
}

/// Why a claim no longer fences its run, as `LeaseLost` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// Another claim took a newer generation (after this one expired or was released).
    Superseded,
    /// The claim's lease ran out (no heartbeat in time) and nobody has claimed the run since.
    Expired,
    /// The claim was given up with `release`.
    Released,
    /// The token is not this generation's: the claim presented is not the one `claim` returned.
    Token,
}

impl LostReason {
    /// The name Python sees (`LeaseLost.reason`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Superseded => "superseded",
            Self::Expired => "expired",
            Self::Released => "released",
            Self::Token => "token",
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
