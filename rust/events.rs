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
pub fn json_array(items: &[String]) -> String {
    into_text(to_vec(&Value::Array(
        items.iter().map(|s| Value::Str(s.clone())).collect(),
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
    store.read("reading events", |tx| {
        list(tx, resource, after_seq, limit, types, horizon)
    })
}
