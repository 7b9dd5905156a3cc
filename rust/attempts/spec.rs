//! The arguments of reserving and finishing, checked before any transaction.

use crate::errors::{LedgerError, Result};
use crate::ids::check_name;
use crate::status::AttemptStatus;

/// One unit to reserve.
#[derive(Debug, Clone, Default)]
pub struct UnitSpec {
    /// Unit id.
    pub unit_id: String,
    /// Step the unit belongs to.
    pub step_id: String,
    /// Plan node.
    pub node_id: Option<String>,
    /// `unit` (dispatch) or `gate`.
    pub phase: String,
    /// Runner.
    pub runner: Option<String>,
    /// Engine.
    pub engine: Option<String>,
    /// Model.
    pub model: Option<String>,
    /// Opaque hash of the unit's input.
    pub input_hash: Option<String>,
    /// Worktree.
    pub worktree_path: Option<String>,
    /// Fan-out template parent.
    pub parent_unit_id: Option<String>,
    /// Who holds the reservation.
    pub holder: Option<String>,
    /// The W3C `traceparent` of the span that reserved the attempt (a reclaim records the
    /// reclaimer's), so the work done for it can link back to that span.
    pub trace_context: Option<String>,
    /// Reserve a failed unit before its retry time (never an exhausted one).
    pub force: bool,
}

impl UnitSpec {
    pub(crate) fn check(&self) -> Result<()> {
        check_name("unit_id", &self.unit_id)?;
        check_name("step_id", &self.step_id)?;
        if !matches!(self.phase.as_str(), "unit" | "gate") {
            return Err(LedgerError::invalid(
                "phase",
                format!("{:?} is not a phase; use \"unit\" or \"gate\"", self.phase),
            ));
        }
        if let Some(tp) = &self.trace_context {
            check_traceparent(tp)?;
        }
        Ok(())
    }
}

/// A W3C trace context `traceparent` value: `version-trace_id-parent_id-flags` in lowercase
/// hex (2-32-16-2 digits; a later version may append fields after a `-`), trace and parent ids
/// not all zero. Anything else is refused rather than stored, since a consumer parses it to
/// link spans.
fn check_traceparent(tp: &str) -> Result<()> {
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let parts: Vec<&str> = tp.splitn(5, '-').collect();
    let ok = tp.len() <= 256
        && parts.len() >= 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
        && (parts.len() == 4 || parts[0] != "00");
    if ok {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "trace_context",
            format!(
                "{tp:?} is not a W3C traceparent; pass \"00-<32 hex trace id>-<16 hex span \
                 id>-<2 hex flags>\" (what a propagator's inject() writes under \"traceparent\"), \
                 or None"
            ),
        ))
    }
}

/// One finish.
#[derive(Debug, Clone, Default)]
pub struct FinishSpec {
    /// Run id.
    pub run_id: String,
    /// Unit id.
    pub unit_id: String,
    /// Attempt number.
    pub attempt: i64,
    /// The attempt's dispatch id.
    pub dispatch_id: String,
    /// `completed`, `failed`, `cancelled` or `timed_out`.
    pub status: String,
    /// Canonical JSON result.
    pub result: Option<String>,
    /// Tokens spent.
    pub tokens: Option<i64>,
    /// Why it failed.
    pub failure_reason: Option<String>,
    /// Agent session.
    pub session_id: Option<String>,
}

impl FinishSpec {
    /// Whether this finish fails its attempt (`failed` or `timed_out`): the finishes a retry
    /// policy applies to.
    pub(crate) fn fails(&self) -> bool {
        matches!(self.status.as_str(), "failed" | "timed_out")
    }

    pub(crate) fn check(&self) -> Result<()> {
        AttemptStatus::parse_finish(&self.status)?;
        if self.tokens.is_some_and(|t| t < 0) {
            return Err(LedgerError::invalid(
                "tokens",
                "must be a non-negative int or None",
            ));
        }
        Ok(())
    }
}
