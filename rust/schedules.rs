//! Cron schedules that queue runs: `put_schedule` keeps what each fire queues, and
//! `tick_schedules` fires every slot that has come, once, however many tickers run at once.
//!
//! A schedule's `next_slot` is the first slot it has not fired (the first slot after the time
//! it was put). A tick reads the due schedules, and for each, in a transaction of its own: works
//! out the slots from `next_slot` up to now, moves `next_slot` past them with a compare-and-set
//! on its old value (a tick that lost the race to another changes nothing and fires nothing),
//! then queues the newest slot plus at most `catch_up` missed slots before it, oldest first,
//! each with `reserve_run` under a run id made of the schedule's name and the slot, due at the
//! slot (`not_before`). With `overlap = "skip"`, a slot whose turn comes while the schedule's
//! last fired run has not ended is used up without a run.
//!
//! Slots are local wall times in the schedule's zone, resolved as [`crate::cron`] says (a wall
//! time in a spring-forward gap fires once, shifted by the gap; a repeated one fires once, at
//! its first occurrence).

use std::collections::VecDeque;

use crate::canonical::Json;
use crate::cron::CronSchedule;
use crate::errors::{LedgerError, Result};
use crate::ids::MAX_RUN_ID;
use crate::model::Run;
use crate::params;
use crate::queue::{NewQueuedRun, NotBefore};
use crate::retry::RetryPolicy;
use crate::status::RunStatus;
use crate::store::{sql, DbResult, Row, Store};

/// What a fire does while the schedule's last fired run has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// The slot is used up without a run.
    Skip,
    /// The slot queues a run all the same.
    Allow,
}

impl Overlap {
    /// Read `overlap`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "skip" => Ok(Self::Skip),
            "allow" => Ok(Self::Allow),
            other => Err(LedgerError::invalid(
                "overlap",
                format!("must be \"skip\" or \"allow\", not {other:?}"),
            )),
        }
    }

    /// The stored word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Allow => "allow",
        }
    }
}

/// The most missed slots a tick may fire besides the newest.
pub const MAX_CATCH_UP: i64 = 1000;
/// The longest schedule name: its runs' ids are the name, a colon and the slot
/// (`2026-03-08T07:30Z`, 17 characters).
pub const MAX_NAME: usize = MAX_RUN_ID - 18;
/// The most schedules one tick reads; the rest are fired by the next tick.
const TICK_BATCH: i64 = 1000;

/// `put_schedule`'s arguments, checked and canonicalized before the transaction.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    /// Its name, the prefix of its runs' ids.
    pub name: String,
    /// The cron text, as given.
    pub cron: String,
    /// The IANA zone its wall times are read in.
    pub timezone: String,
    /// What a fire does while the last one's run is live.
    pub overlap: Overlap,
    /// How many missed slots a tick fires besides the newest.
    pub catch_up: i64,
    /// What each fire queues (its run id and `not_before` are the fire's own).
    pub run: NewQueuedRun,
}

impl NewSchedule {
    /// Check everything a fire would check, so that a fire never fails on its arguments; and
    /// parse the cron and the zone. A `parent_run_id` is refused: every fire would continue the
    /// same parked run, which only the first can.
    pub fn check(&self) -> Result<CronSchedule> {
        check_name(&self.name)?;
        if !(0..=MAX_CATCH_UP).contains(&self.catch_up) {
            return Err(LedgerError::invalid(
                "catch_up",
                format!("must be from 0 to {MAX_CATCH_UP}, not {}", self.catch_up),
            ));
        }
        if self.run.parent_run_id.is_some() {
            return Err(LedgerError::invalid(
                "template",
                "parent_run_id is not a schedule's: every fire would continue the same run; \
                 leave it out",
            ));
        }
        let mut run = self.run.clone();
        run.run_id = fire_id(&self.name, 0);
        run.check()?;
        CronSchedule::parse(&self.cron, &self.timezone)
    }
}

/// A schedule name is a run id's prefix: the same characters, shorter.
fn check_name(name: &str) -> Result<()> {
    crate::ids::check_run_id("name", name)?;
    if name.len() > MAX_NAME {
        return Err(LedgerError::invalid(
            "name",
            format!(
                "is {} characters; a schedule's name is at most {MAX_NAME} (its runs' ids add \
                 the slot)",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// The run id of the fire of `name` at `slot_ms`: the name, a colon, the slot in UTC to the
/// minute (`nightly:2026-03-08T07:30Z`). Readable, sorted by slot, and the same for every
/// ticker, so a slot's run can be found (and is queued once) whoever fired it.
pub fn fire_id(name: &str, slot_ms: i64) -> String {
    // Slots come from `CronSchedule::next_after`, within jiff's range; the clamp keeps a
    // hand-made out-of-range time from panicking.
    let at = jiff::Timestamp::from_millisecond(slot_ms).unwrap_or(if slot_ms < 0 {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    });
    format!("{name}:{}", at.strftime("%Y-%m-%dT%H:%MZ"))
}

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Its name.
    pub name: String,
    /// Its cron text.
    pub cron: String,
    /// Its zone.
    pub timezone: String,
    /// `skip` or `allow`.
    pub overlap: String,
    /// Missed slots a tick fires besides the newest.
    pub catch_up: i64,
    /// Whether ticks pass it over.
    pub paused: bool,
    /// The first slot not fired yet (epoch ms).
    pub next_slot: i64,
    /// The newest slot fired.
    pub last_slot: Option<i64>,
    /// The run of the newest fire that queued one.
    pub last_run_id: Option<String>,
    /// The queued runs' workflow name.
    pub workflow_name: String,
    /// The template's workflow reference.
    pub workflow_ref: String,
    /// The template's JSON arguments, canonical text: source, definition, input, launch
    /// options.
    pub source: String,
    /// The definition's digest.
    pub definition_digest: String,
    /// The definition.
    pub definition: String,
    /// The input.
    pub input: String,
    /// The launch options.
    pub launch_options: String,
    /// The runner the runs are meant for.
    pub runner_id: String,
    /// The session named as the runs' origin.
    pub origin_session_id: String,
    /// The runs' priority.
    pub priority: i64,
    /// The runs' concurrency key.
    pub concurrency_key: Option<String>,
    /// The runs' retry policy, canonical text.
    pub retry_policy: Option<String>,
    /// When it was first put.
    pub created_at: i64,
    /// When it was last put, paused, resumed or fired.
    pub updated_at: i64,
    /// The status of `last_run_id`'s run, as read with the schedule (`None` once it is pruned).
    pub last_run_status: Option<RunStatus>,
}

fn schedule_row(r: &dyn Row) -> DbResult<Schedule> {
    Ok(Schedule {
        name: r.get(0)?,
        cron: r.get(1)?,
        timezone: r.get(2)?,
        overlap: r.get(3)?,
        catch_up: r.get(4)?,
        paused: r.get::<i64>(5)? != 0,
        next_slot: r.get(6)?,
        last_slot: r.get(7)?,
        last_run_id: r.get(8)?,
        workflow_name: r.get(9)?,
        workflow_ref: r.get(10)?,
        source: r.get(11)?,
        definition_digest: r.get(12)?,
        definition: r.get(13)?,
        input: r.get(14)?,
        launch_options: r.get(15)?,
        runner_id: r.get(16)?,
        origin_session_id: r.get(17)?,
        priority: r.get(18)?,
        concurrency_key: r.get(19)?,
        retry_policy: r.get(20)?,
        created_at: r.get(21)?,
        updated_at: r.get(22)?,
        last_run_status: r.get(23)?,
    })
}

impl Schedule {
    /// The run its fire at `slot_ms` queues.
    fn fire(&self, slot_ms: i64) -> NewQueuedRun {
        let json = |text: &str| Json::new(text.as_bytes().to_vec());
        NewQueuedRun {
            run_id: fire_id(&self.name, slot_ms),
            workflow_name: self.workflow_name.clone(),
            workflow_ref: self.workflow_ref.clone(),
            source: json(&self.source),
            definition_digest: self.definition_digest.clone(),
            definition: json(&self.definition),
            input: json(&self.input),
            launch_options: json(&self.launch_options),
            runner_id: self.runner_id.clone(),
            origin_session_id: self.origin_session_id.clone(),
            parent_run_id: None,
            not_before: NotBefore::At(slot_ms),
            priority: self.priority,
            concurrency_key: self.concurrency_key.clone(),
            retry: self
                .retry_policy
                .as_deref()
                .and_then(RetryPolicy::from_text),
        }
    }
}

/// Put (create or replace) a schedule; its next slot is the first after `now_ms`. Replacing
/// keeps whether it is paused and its last fire.
pub fn put_schedule(store: &mut dyn Store, new: &NewSchedule, now_ms: i64) -> Result<Schedule> {
    let cron = new.check()?;
    let next = cron.next_after(now_ms).ok_or_else(never)?;
    let r = &new.run;
    let retry = r.retry.as_ref().map(RetryPolicy::to_text);
    store.write("putting a schedule", |tx| {
        tx.exec(
            &sql::PUT_SCHEDULE_SQL,
            params![
                new.name,
                new.cron,
                new.timezone,
                new.overlap.as_str(),
                new.catch_up,
                next,
                r.workflow_name,
                r.workflow_ref,
                r.source.text,
                r.definition_digest,
                r.definition.text,
                r.input.text,
                r.launch_options.text,
                r.runner_id,
                r.origin_session_id,
                r.priority,
                r.concurrency_key,
                retry,
                now_ms
            ],
        )?;
        must_read(tx, &new.name)
    })
}

fn never() -> LedgerError {
    LedgerError::invalid(
        "cron",
        "has no slot left to fire (it matches no date within the years ahead)",
    )
}

fn must_read(tx: &dyn crate::store::Tx, name: &str) -> Result<Schedule> {
    tx.row(&sql::SCHEDULE_SQL, params![name], schedule_row)?
        .ok_or_else(|| not_found(name))
}

fn not_found(name: &str) -> LedgerError {
    LedgerError::NotFound {
        kind: "schedule",
        key: name.to_owned(),
    }
}

/// Every schedule, by name.
pub fn schedules(store: &mut dyn Store) -> Result<Vec<Schedule>> {
    store.read("listing schedules", |tx| {
        tx.rows(&sql::SCHEDULES_SQL, params![], schedule_row)
    })
}

/// Pause (ticks pass it over) or resume a schedule. Resuming fires what is due at the next
/// tick: the newest slot and at most `catch_up` missed ones. An unknown name is `NotFound`.
pub fn pause_schedule(store: &mut dyn Store, name: &str, paused: bool, now_ms: i64) -> Result<()> {
    store.write("pausing a schedule", |tx| {
        let n = tx.exec(
            &sql::PAUSE_SCHEDULE_SQL,
            params![name, i64::from(paused), now_ms],
        )?;
        if n == 0 {
            return Err(not_found(name));
        }
        Ok(())
    })
}

/// Delete a schedule (its runs stay). An unknown name is `NotFound`.
pub fn delete_schedule(store: &mut dyn Store, name: &str) -> Result<()> {
    store.write("deleting a schedule", |tx| {
        if tx.exec(&sql::DELETE_SCHEDULE_SQL, params![name])? == 0 {
            return Err(not_found(name));
        }
        Ok(())
    })
}

/// The slots of `cron` from `first` (a slot) up to `now_ms`: the newest and at most `catch_up`
/// before it, oldest first; and the first slot after `now_ms` (`i64::MAX` when none is left).
fn due_slots(cron: &CronSchedule, first: i64, now_ms: i64, catch_up: i64) -> (Vec<i64>, i64) {
    let keep = usize::try_from(catch_up).unwrap_or(0) + 1;
    let mut slots = VecDeque::with_capacity(keep.min(64));
    let mut slot = Some(first);
    while let Some(s) = slot.filter(|s| *s <= now_ms) {
        if slots.len() == keep {
            slots.pop_front();
        }
        slots.push_back(s);
        slot = cron.next_after(s);
    }
    (slots.into(), slot.unwrap_or(i64::MAX))
}

/// Fire every due slot of every schedule that is not paused, once: the runs this call queued
/// (another ticker's fires are its own). Each schedule is fired in a transaction of its own.
pub fn tick_schedules(store: &mut dyn Store, now_ms: i64) -> Result<Vec<Run>> {
    let due = store.read("ticking schedules", |tx| {
        tx.rows(&sql::DUE_SCHEDULES_SQL, params![now_ms, TICK_BATCH], |r| {
            r.get::<String>(0)
        })
    })?;
    let mut fired = Vec::new();
    for name in due {
        fired.extend(tick_one(store, &name, now_ms)?);
    }
    Ok(fired)
}

fn tick_one(store: &mut dyn Store, name: &str, now_ms: i64) -> Result<Vec<Run>> {
    store.write("firing a schedule", |tx| {
        let Some(s) = tx.row(&sql::SCHEDULE_SQL, params![name], schedule_row)? else {
            return Ok(Vec::new());
        };
        if s.paused || s.next_slot > now_ms {
            return Ok(Vec::new());
        }
        // A stored cron and zone parsed when they were put; one this library can no longer
        // read (a zone removed from the database) is reported, not skipped silently.
        let cron = CronSchedule::parse(&s.cron, &s.timezone)?;
        let (slots, next) = due_slots(&cron, s.next_slot, now_ms, s.catch_up);
        if tx.exec(
            &sql::ADVANCE_SCHEDULE_SQL,
            params![name, s.next_slot, next, now_ms],
        )? == 0
        {
            return Ok(Vec::new());
        }
        // Whether the last fire's run is live: as read with the schedule (a pruned run has
        // ended), and then a run this tick queues is (it is queued).
        let mut last_live = s.last_run_status.is_some_and(|st| !st.is_terminal());
        let skip = s.overlap == Overlap::Skip.as_str();
        let mut queued = Vec::new();
        for &slot in &slots {
            if skip && last_live {
                continue;
            }
            let run = s.fire(slot);
            if tx
                .row(&sql::RUN_EXISTS_SQL, params![run.run_id], |_| Ok(()))?
                .is_some()
            {
                // Queued by this schedule before it was deleted and put again: the slot's run
                // exists, and is not queued twice.
                continue;
            }
            crate::queue::reserve_in(tx, &run, now_ms)?;
            last_live = true;
            queued.push(run.run_id);
        }
        let newest = slots.last().copied();
        if let Some(newest) = newest {
            let fired_run = queued.last().map(String::as_str);
            tx.exec(&sql::FIRED_SCHEDULE_SQL, params![name, newest, fired_run])?;
        }
        queued
            .iter()
            .map(|id| crate::runs::must_read_run(tx, id))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fire_ids_name_the_slot_in_utc() {
        assert_eq!(fire_id("n", 0), "n:1970-01-01T00:00Z");
        // 2026-03-08T07:30:00Z
        assert_eq!(
            fire_id("nightly", 1_772_955_000_000),
            "nightly:2026-03-08T07:30Z"
        );
        assert_eq!(fire_id("leap", 951_782_400_000), "leap:2000-02-29T00:00Z");
        assert_eq!(fire_id("x", -60_000), "x:1969-12-31T23:59Z");
        assert!(fire_id(&"a".repeat(MAX_NAME), 253_402_300_740_000).len() <= MAX_RUN_ID);
    }
}
