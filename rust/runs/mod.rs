//! Runs and steps, the orchestrator's operations, split by responsibility:
//!
//! - `create`: starting a top-level run under the scope guard, publishing a child run;
//! - `read`: reading runs and steps, and the row helpers the other run operations share;
//! - `progress`: completing steps, every change of a run's status (through the lifecycle of
//!   [`crate::status::RunStatus`]), and a run's outputs.
//!
//! Each write is one transaction that takes the run's lock first. The operations are used
//! through this module; the submodules are private, so each has one path.

mod create;
mod progress;
mod read;

pub use create::{publish_child_run, start_run, ChildRun, NewRun, StepSpec};
pub use progress::{
    abandon_run, block_run, complete_step, resume_run, set_outputs, set_status, StepResult,
};
pub(crate) use progress::{complete_step_in, fenced_state, set_status_in};
pub use read::{
    child_runs, child_summary, find_active_run, find_scope_occupant, get_run, list_runs,
    resolve_run_id, run_counts, steps, RunCursor, RunFilter,
};
pub(crate) use read::{must_read_run, run_from_row};
