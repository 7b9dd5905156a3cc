//! The append-only event log. Each event takes its run's next revision (a run's revision is the
//! revision of its newest event), so `UNIQUE(resource_id, revision)` proves one event per
//! revision; `seq` is the global cursor for paging.

use crate::canonical::{into_text, to_vec, Value};
use crate::errors::{LedgerError, Result};
use crate::model::Event;
use crate::params;
use crate::store::{sql, Tx};

/// Who wrote an event, for fenced writes (the event's `actor_type`, `actor_id` and
/// `generation`).
#[derive(Debug, Clone, Default)]
pub struct Actor<'a> {
    /// `host` or `session`.
    pub actor_type: Option<&'a str>,
    /// The actor's id (a fenced write's lease owner, read from the lease row).
    pub id: Option<String>,
    /// The lease generation of a fenced write.
    pub generation: Option<i64>,
}

/// Append an event at the run's next revision. The caller has already read the run inside
/// this transaction. Deferred ([`Tx::defer`]): on PostgreSQL it goes out with the operation's
/// next statement or its `COMMIT`; `UNIQUE(resource_id, revision)` still refuses a second event
/// at one revision, failing the transaction.
pub fn append(
    tx: &dyn Tx,
    run_id: &str,
    event_type: &str,
    payload: &Value,
    actor: &Actor<'_>,
    now_ms: i64,
) -> Result<()> {
    // Every write takes its run's lock first; this is the backstop that keeps max + 1 exact
    // on PostgreSQL even for a path that did not (free when the lock is held).
    tx.lock_run(run_id)?;
    tx.exec_later(
        &sql::INSERT_EVENT_SQL,
        params![
            run_id,
            event_type,
            actor.actor_type,
            actor.id.as_deref(),
            actor.generation,
            into_text(to_vec(payload)),
            Option::<&str>::None,
            now_ms
        ],
    )
}

/// The largest page a read returns (events, runs, units).
pub const MAX_PAGE: i64 = 10_000;

/// Refuse a page size outside 1..=[`MAX_PAGE`], naming `limit`; `read_on` ends the message
/// with how to ask for more.
pub(crate) fn check_page(limit: i64, read_on: &str) -> Result<()> {
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "limit",
            format!("must be from 1 to {MAX_PAGE}, not {limit}{read_on}"),
        ))
    }
}

/// Refuse a list of more than [`MAX_PAGE`] ids (`what`: "units", "runs"), naming `argument`:
/// a read of a page of keys takes at most a page of them.
pub(crate) fn check_keys(argument: &str, count: usize, what: &str) -> Result<()> {
    if count <= usize::try_from(MAX_PAGE).unwrap_or(usize::MAX) {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            argument,
            format!("names {count} {what}; ask for at most {MAX_PAGE} at a time"),
        ))
    }
}

/// Events after `after_seq`, optionally of one resource and of some types, oldest first.
fn list(
    tx: &dyn Tx,
    resource: Option<&str>,
    after_seq: i64,
    limit: i64,
    types: Option<&[String]>,
    horizon: Option<i64>,
) -> Result<Vec<Event>> {
    check_page(limit, "")?;
    if after_seq < 0 {
        return Err(LedgerError::invalid(
            "after_seq",
            "must be 0 or a seq you were given",
        ));
    }
    let types_json = types.map(json_array);
    let event = |r: &dyn crate::store::Row| {
        Ok(Event {
            seq: r.get(0)?,
            resource_id: r.get(1)?,
            revision: r.get(2)?,
            event_type: r.get(3)?,
            actor_type: r.get(4)?,
            actor_id: r.get(5)?,
            generation: r.get(6)?,
            payload: r.get::<String>(7)?.into_bytes(),
            ts: r.get(8)?,
        })
    };
    if let Some(run) = resource {
        return tx.rows(
            &sql::LIST_RUN_EVENTS_SQL,
            params![after_seq, run, types_json, limit],
            event,
        );
    }
    let rare = types.is_some_and(|t| {
        !t.is_empty()
            && t.iter()
                .all(|t| !sql::DENSE_EVENT_TYPES.contains(&t.as_str()))
    });
    let statement = if rare {
        &sql::LIST_RARE_EVENTS_SQL
    } else {
        &sql::LIST_EVENTS_SQL
    };
    tx.rows(
        statement,
        params![after_seq, types_json, limit, horizon],
        event,
    )
}

/// A list of strings as one JSON array parameter (read back with `json_each`).
pub fn json_array<S: AsRef<str>>(items: &[S]) -> String {
    into_text(to_vec(&Value::Array(
        items
            .iter()
            .map(|s| Value::Str(s.as_ref().to_owned()))
            .collect(),
    )))
}

/// The newest event's `seq` that a reader of every run's events can see with nothing below it
/// still to come (on PostgreSQL, below the horizon of the writers in flight; see [`read`]); 0
/// for an empty log. One probe of the primary key's last entries: a reader that starts at it
/// with `after_seq` misses nothing.
pub fn newest_seq(store: &mut dyn crate::store::Store) -> Result<i64> {
    let horizon = store.event_horizon()?;
    store.read("reading the newest event", |tx| {
        tx.row(&sql::NEWEST_EVENT_SEQ_SQL, params![horizon], |r| r.get(0))
            .map(Option::unwrap_or_default)
    })
}

/// `events(...)` in a read transaction.
pub fn read(
    store: &mut dyn crate::store::Store,
    resource: Option<&str>,
    after_seq: i64,
    limit: i64,
    types: Option<&[String]>,
) -> Result<Vec<Event>> {
    // Every run's events: only below the horizon of the writers still in flight (PostgreSQL;
    // read before the snapshot, see the horizon statement in `store::postgres::sql`). One run's events need none:
    // its writers hold the run's lock, so its `seq` order is its commit order.
    let horizon = match resource {
        None => store.event_horizon()?,
        Some(_) => None,
    };
    // Each statement is a range of one index in its own order whatever the values, so it is
    // planned once (left to choose, PostgreSQL plans a run's page for its values on every call
    // once the log is large: 0.085 ms at 200 000 attempts).
    store.read("reading events", |tx| {
        tx.plan_generic()?;
        list(tx, resource, after_seq, limit, types, horizon)
    })
}

/// The most events `event_counts` reads to count exactly (by default); past it, it counts by
/// position.
pub const EXACT_MAX: i64 = 5_000;
/// The largest `exact_max` a caller may ask for: a read of that many events is still short.
pub const EXACT_MAX_LIMIT: i64 = 100_000;
/// How close a minute's boundary is placed when counting by position: this fraction of the
/// range's average minute (a batch of writes shares one time, so placing a boundary inside
/// one would cost probes and tell nothing).
const PRECISION: f64 = 0.002;
/// A minute, in ms.
const MINUTE: i64 = 60_000;
/// The longest range `event_counts` takes, in minutes (a day).
pub const MAX_MINUTES: i64 = 1_440;

/// Events per minute for `minutes` minutes from `first_ms` (a minute's start), and whether the
/// counts are exact. The log is not read through: `seq` is dense and `ts` grows with it, so a
/// minute's events are about the `seq` range between the first event at or after its start
/// and the first at or after its end. Each boundary is found by probes of one event (a
/// primary-key seek), interpolating on `ts` and halving when that stops paying, to within
/// [`PRECISION`] of the range's average minute: a range of millions of events costs a few
/// hundred probes, all in one read transaction. When the range holds at most `exact_max`
/// (0 to [`EXACT_MAX_LIMIT`]) events they are read and counted exactly instead.
pub fn counts_per_minute(
    store: &mut dyn crate::store::Store,
    first_ms: i64,
    minutes: i64,
    exact_max: i64,
) -> Result<(Vec<i64>, bool)> {
    if !(1..=MAX_MINUTES).contains(&minutes) {
        return Err(crate::errors::LedgerError::invalid(
            "minutes",
            format!("must be from 1 to {MAX_MINUTES}, not {minutes}"),
        ));
    }
    if !(0..=EXACT_MAX_LIMIT).contains(&exact_max) {
        return Err(crate::errors::LedgerError::invalid(
            "exact_max",
            format!("must be from 0 to {EXACT_MAX_LIMIT}, not {exact_max}"),
        ));
    }
    let first_ms = first_ms.div_euclid(MINUTE) * MINUTE;
    let horizon = store.event_horizon()?;
    store.read("counting events", |tx| {
        let head: i64 = tx
            .row(&sql::NEWEST_EVENT_SEQ_SQL, params![horizon], |r| r.get(0))?
            .unwrap_or_default();
        let n = usize::try_from(minutes).unwrap_or(0);
        let mut counts = vec![0_i64; n];
        if head == 0 {
            return Ok((counts, true));
        }
        let mut finder = Bounds {
            tx,
            head,
            known: Vec::new(),
        };
        let first = finder.lower_bound(first_ms, 1)?;
        if head + 1 - first <= exact_max {
            let times = tx.rows(&sql::EVENT_TIMES_SQL, params![first, head], |r| {
                r.get::<i64>(0)
            })?;
            for ts in times {
                let at = (ts - first_ms).div_euclid(MINUTE);
                if let Some(c) = usize::try_from(at).ok().and_then(|i| counts.get_mut(i)) {
                    *c += 1;
                }
            }
            return Ok((counts, true));
        }
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        let within = (((head + 1 - first) as f64 / minutes as f64) * PRECISION).max(1.0) as i64;
        let mut bounds = Vec::with_capacity(n + 1);
        bounds.push(first);
        for i in 1..minutes {
            bounds.push(finder.lower_bound(first_ms + i * MINUTE, within)?);
        }
        bounds.push(head + 1);
        for (i, c) in counts.iter_mut().enumerate() {
            *c = (bounds[i + 1] - bounds[i]).max(0);
        }
        Ok((counts, false))
    })
}

/// The boundaries' search: what the probes so far found, (position, time of the first event
/// at or after it), in position order.
struct Bounds<'a> {
    tx: &'a dyn crate::store::Tx,
    head: i64,
    known: Vec<(i64, i64)>,
}

impl Bounds<'_> {
    fn probe(&mut self, position: i64) -> Result<(i64, i64)> {
        let found = self.tx.row(&sql::EVENT_AT_SQL, params![position], |r| {
            Ok((r.get::<i64>(0)?, r.get::<i64>(1)?))
        })?;
        // None from here to the head (pruned meanwhile): past the end.
        let (seq, ts) = found.unwrap_or((self.head + 1, i64::MAX));
        for point in [(position, ts), (seq, ts)] {
            if let Err(at) = self.known.binary_search(&point) {
                self.known.insert(at, point);
            }
        }
        Ok((seq, ts))
    }

    /// The first position whose event's time is at or after `t` (head + 1: none), or one at
    /// most `within` after it.
    fn lower_bound(&mut self, t: i64, within: i64) -> Result<i64> {
        let (mut low, mut low_ts, mut high, mut high_ts) = (0, None, self.head + 1, None);
        // The tightest bracket the probes so far give.
        for &(position, ts) in &self.known {
            if ts < t {
                (low, low_ts) = (position, Some(ts));
            } else if position < high {
                (high, high_ts) = (position, Some(ts));
                break;
            }
        }
        let mut interpolate = true;
        while high - low > within {
            let width = high - low;
            let position = match (interpolate, low_ts, high_ts) {
                (true, Some(lt), Some(ht)) if ht > lt && ht != i64::MAX => {
                    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
                    let guess = low + ((t - lt) as f64 * width as f64 / (ht - lt) as f64) as i64;
                    guess.clamp(low + 1, high - 1)
                }
                _ => low + width / 2,
            };
            let (seq, ts) = self.probe(position)?;
            if ts >= t {
                (high, high_ts) = (position, Some(ts));
            } else {
                (low, low_ts) = (seq, Some(ts));
            }
            // Interpolation while it more than halves the bracket, halving otherwise.
            interpolate = (high - low) * 2 <= width;
        }
        Ok(high)
    }
}
