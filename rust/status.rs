//! Statuses: the run lifecycle, and the statuses of steps, units and attempts.
//!
//! Each status is an enum stored as the same lowercase string in SQL (the schema's CHECK
//! constraints list the same words) and shown to Python as that string. [`RunStatus`] owns the
//! run lifecycle: which statuses are terminal and which move may follow which. Every write of a
//! run's status checks its move here first ([`RunStatus::check_move`]), whatever path makes it:
//!
//! ```text
//! queued -> starting -> active <-> blocked
//!                       active -> parked -> completed
//!                       active -> completed
//! every non-terminal status -> cancelled | failed
//! ```
//!
//! Terminal: `completed`, `failed`, `cancelled`; nothing leaves them. The operations move a run
//! only along a subset of these moves, each refusing the others with its own error before it
//! gets here (`block_run` wants `active`, `resume_run` wants `blocked`, a continuation wants
//! `parked`, `abandon_run` skips terminal runs, a claim starts only a `queued` run); only
//! `set_status` offers every move, and refuses the rest with the error of [`check_move`].
//!
//! [`check_move`]: RunStatus::check_move

use crate::errors::{LedgerError, Result};
use crate::params;
use crate::store::{sql, DbError, DbErrorKind, DbResult, FromSql, Row, SqlValue, ToSql, Tx};

/// A status enum with its stored text: `as_str`, `parse`, `ALL`, `Display`, and the
/// conversions to and from SQL (a stored text outside the enum is a type error, which the
/// schema's CHECK constraints make unreachable).
macro_rules! status_enum {
    (
        $(#[$meta:meta])*
        $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every status, in the order messages list them.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The stored (and shown) text.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }

            /// The status stored as `text`, if there is one.
            #[must_use]
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some(Self::$variant),)+
                    _ => None,
                }
            }

            /// The status a caller named in `argument`, or `InvalidArgument` listing them all.
            pub fn parse_argument(argument: &str, text: &str) -> Result<Self> {
                Self::parse(text).ok_or_else(|| {
                    let all: Vec<&str> = Self::ALL.iter().map(|s| s.as_str()).collect();
                    LedgerError::invalid(
                        argument,
                        format!("must be one of {}, not {text:?}", all.join(", ")),
                    )
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ToSql for $name {
            fn to_sql(&self) -> SqlValue<'_> {
                SqlValue::Text(self.as_str())
            }
        }

        impl FromSql for $name {
            fn from_sql(value: SqlValue<'_>) -> DbResult<Self> {
                let text = String::from_sql(value)?;
                Self::parse(&text).ok_or_else(|| {
                    DbError::new(
                        DbErrorKind::Type,
                        format!("{text:?} is not a {}", stringify!($name)),
                    )
                })
            }
        }
    };
}

status_enum! {
    /// Where a run is in its lifecycle.
    RunStatus {
        /// Reserved for a controller, not yet claimed.
        Queued = "queued",
        /// Claimed, not yet running.
        Starting = "starting",
        /// Running its current step.
        Active = "active",
        /// Waiting for someone (a blocked or failed step, or `block_run`).
        Blocked = "blocked",
        /// Done with its own work, waiting for a continuation to take over.
        Parked = "parked",
        /// Finished.
        Completed = "completed",
        /// Given up on as failed.
        Failed = "failed",
        /// Abandoned.
        Cancelled = "cancelled",
    }
}

impl RunStatus {
    /// Whether no move leaves this status.
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// Whether a run may move from `self` to `to`: see the module's diagram. Staying put is not
    /// a move.
    #[must_use]
    pub const fn can_move_to(self, to: Self) -> bool {
        if self.is_terminal() {
            return false;
        }
        if matches!(to, Self::Cancelled | Self::Failed) {
            return true;
        }
        matches!(
            (self, to),
            (Self::Queued, Self::Starting)
                | (Self::Starting | Self::Blocked, Self::Active)
                | (Self::Active, Self::Blocked | Self::Parked | Self::Completed)
                | (Self::Parked, Self::Completed)
        )
    }

    /// Refuse a move the lifecycle forbids, as `set_status` reports it: `InvalidArgument` on
    /// `status`, naming both statuses.
    pub fn check_move(self, to: Self) -> Result<()> {
        if self.can_move_to(to) {
            Ok(())
        } else {
            let allowed: Vec<&str> = Self::ALL
                .iter()
                .filter(|next| self.can_move_to(**next))
                .map(|next| next.as_str())
                .collect();
            let allowed = if allowed.is_empty() {
                "nowhere: it is terminal".to_owned()
            } else {
                allowed.join(", ")
            };
            Err(LedgerError::invalid(
                "status",
                format!("a run cannot go from {self} to {to}; from {self} it can go to {allowed}"),
            ))
        }
    }
}

status_enum! {
    /// Where a step of a run's plan stands.
    StepStatus {
        /// Not reached yet.
        Pending = "pending",
        /// The run's current step.
        Active = "active",
        /// Done.
        Completed = "completed",
        /// Waiting for someone; the run is blocked on it.
        Blocked = "blocked",
        /// Failed; the run is blocked on it until resumed.
        Failed = "failed",
        /// Passed over.
        Skipped = "skipped",
    }
}

impl StepStatus {
    /// The result `complete_step` records for `text`: `completed`, `skipped`, `blocked` or
    /// `failed`; anything else is `InvalidArgument` on `status`.
    pub fn parse_result(text: &str) -> Result<Self> {
        match Self::parse(text) {
            Some(s @ (Self::Completed | Self::Skipped | Self::Blocked | Self::Failed)) => Ok(s),
            _ => Err(LedgerError::invalid(
                "status",
                format!("{text:?} is not a step result; use completed, skipped, blocked or failed"),
            )),
        }
    }

    /// Whether a step finished with this result lets the run go on to its next step (the
    /// others block the run on it).
    #[must_use]
    pub const fn advances(self) -> bool {
        matches!(self, Self::Completed | Self::Skipped)
    }
}

status_enum! {
    /// The status of one attempt: `running` until its one finish.
    AttemptStatus {
        /// Reserved (or reclaimed) and not finished.
        Running = "running",
        /// Finished well.
        Completed = "completed",
        /// Finished badly.
        Failed = "failed",
        /// Called off.
        Cancelled = "cancelled",
        /// Ran out of time.
        TimedOut = "timed_out",
    }
}

impl AttemptStatus {
    /// The status a finish records for `text`: a terminal one; anything else is
    /// `InvalidArgument` on `status`.
    pub fn parse_finish(text: &str) -> Result<Self> {
        match Self::parse(text) {
            Some(s) if s != Self::Running => Ok(s),
            _ => Err(LedgerError::invalid(
                "status",
                format!(
                    "{text:?} is not a terminal attempt status; use completed, failed, cancelled \
                     or timed_out"
                ),
            )),
        }
    }
}

status_enum! {
    /// A unit's status: that of its latest attempt. The schema also admits `pending` (a unit
    /// known before its first attempt); fencepost writes a unit only with an attempt.
    UnitStatus {
        /// Known, never attempted.
        Pending = "pending",
        /// The latest attempt is running.
        Running = "running",
        /// The latest attempt completed.
        Completed = "completed",
        /// The latest attempt failed.
        Failed = "failed",
        /// The latest attempt was cancelled.
        Cancelled = "cancelled",
        /// The latest attempt timed out.
        TimedOut = "timed_out",
        /// The latest attempt failed or timed out, and it was the last its retry policy
        /// allows.
        Exhausted = "exhausted",
    }
}

/// Where a run stands: the row every operation on a run reads first, under the run's lock.
#[derive(Debug, Clone)]
pub(crate) struct RunState {
    pub status: RunStatus,
    pub current_step_id: Option<String>,
    pub scope_key: Option<String>,
    pub workflow_ref: String,
}

impl RunState {
    /// Refuse with `RunNotActive` unless the run is `active`.
    pub(crate) fn require_active(&self, run_id: &str) -> Result<()> {
        if self.status == RunStatus::Active {
            Ok(())
        } else {
            Err(LedgerError::RunNotActive {
                run_id: run_id.to_owned(),
                status: self.status.as_str().to_owned(),
            })
        }
    }
}

/// The run's [`RunState`], or `RunNotFound`.
/// A row of [`sql::RUN_STATUS_SQL`].
pub(crate) fn run_state_row(r: &dyn Row) -> DbResult<RunState> {
    Ok(RunState {
        status: r.get(0)?,
        current_step_id: r.get(1)?,
        scope_key: r.get(2)?,
        workflow_ref: r.get(3)?,
    })
}

pub(crate) fn run_state(tx: &dyn Tx, run_id: &str) -> Result<RunState> {
    tx.row(&sql::RUN_STATUS_SQL, params![run_id], run_state_row)?
        .ok_or_else(|| LedgerError::RunNotFound {
            run_id: run_id.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_round_trip() {
        for s in RunStatus::ALL {
            assert_eq!(RunStatus::parse(s.as_str()), Some(*s));
        }
        for s in StepStatus::ALL {
            assert_eq!(StepStatus::parse(s.as_str()), Some(*s));
        }
        for s in AttemptStatus::ALL {
            assert_eq!(AttemptStatus::parse(s.as_str()), Some(*s));
        }
        for s in UnitStatus::ALL {
            assert_eq!(UnitStatus::parse(s.as_str()), Some(*s));
        }
        assert_eq!(RunStatus::parse("Active"), None);
        assert_eq!(AttemptStatus::TimedOut.to_string(), "timed_out");
    }

    #[test]
    fn the_terminal_set() {
        let terminal: Vec<_> = RunStatus::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        assert_eq!(terminal, ["completed", "failed", "cancelled"]);
    }

    #[test]
    fn the_lifecycle_table() {
        use RunStatus::{Active, Blocked, Cancelled, Completed, Failed, Parked, Queued, Starting};
        let allowed = [
            (Queued, Starting),
            (Starting, Active),
            (Active, Blocked),
            (Active, Parked),
            (Active, Completed),
            (Blocked, Active),
            (Parked, Completed),
        ];
        for &from in RunStatus::ALL {
            for &to in RunStatus::ALL {
                let want = allowed.contains(&(from, to))
                    || (!from.is_terminal() && matches!(to, Cancelled | Failed));
                assert_eq!(from.can_move_to(to), want, "{from} -> {to}");
                assert_eq!(from.check_move(to).is_ok(), want, "{from} -> {to}");
            }
        }
        let err = Parked.check_move(Active).unwrap_err();
        assert!(
            matches!(&err, LedgerError::InvalidArgument { argument, message }
                if argument == "status" && message.contains("from parked to active")),
            "{err:?}"
        );
    }

    #[test]
    fn arguments_are_refused_by_name() {
        let err = RunStatus::parse_argument("status", "running").unwrap_err();
        assert!(
            matches!(&err, LedgerError::InvalidArgument { argument, message }
                if argument == "status" && message == "must be one of queued, starting, \
                   active, blocked, parked, completed, failed, cancelled, not \"running\""),
            "{err:?}"
        );
        assert!(StepStatus::parse_result("active").is_err());
        assert_eq!(
            StepStatus::parse_result("failed").ok(),
            Some(StepStatus::Failed)
        );
        assert!(AttemptStatus::parse_finish("running").is_err());
        assert_eq!(
            AttemptStatus::parse_finish("timed_out").ok(),
            Some(AttemptStatus::TimedOut)
        );
    }
}
