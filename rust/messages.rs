//! A run's mailbox: anyone may `send` a run a message on a topic; the run's owner `receive`s
//! the oldest ones, fenced by its claim, and each message is taken exactly once.
//!
//! A message is numbered in its run (`seq`, from 1) under the run's lock, as an event's
//! revision is, so numbers never repeat within a run and a pruned run takes its numbers with it.
//! A send with a key is idempotent within its run and topic: the same key answers the first
//! message and writes nothing. A new message writes a `message.sent` event on the run in the
//! same transaction, which is what wakes `wait_events`. A receive writes no event: the message
//! row records when, and under which lease generation, it was taken.

use crate::canonical::{Json, Value};
use crate::errors::{LedgerError, Result};
use crate::events::{self, check_page, Actor};
use crate::leases::Fence;
use crate::model::Message;
use crate::params;
use crate::store::{sql, DbResult, Row, Store};

/// `send`'s arguments, the payload canonicalized before the transaction.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The run it is for.
    pub run_id: String,
    /// Its topic (an identifier: `receive` takes a topic's messages).
    pub topic: String,
    /// The sender's idempotency key.
    pub key: Option<String>,
    /// The payload.
    pub payload: Json,
}

impl NewMessage {
    /// Check the ids before anything is read.
    pub fn check(&self) -> Result<()> {
        crate::ids::check_run_id("run_id", &self.run_id)?;
        crate::ids::check_name("topic", &self.topic)?;
        if let Some(key) = &self.key {
            crate::ids::check_name("key", key)?;
        }
        Ok(())
    }
}

fn message_row(r: &dyn Row) -> DbResult<Message> {
    Ok(Message {
        run_id: r.get(0)?,
        seq: r.get(1)?,
        topic: r.get(2)?,
        key: r.get(3)?,
        payload: r.get::<String>(4)?.into_bytes(),
        sent_at: r.get(5)?,
        consumed_at: r.get(6)?,
        consumed_generation: r.get(7)?,
    })
}

/// Send `msg`: a new message at the run's next number, with its `message.sent` event; or, when
/// its key sent one already on the topic, that first message (whatever this payload is), with
/// nothing written. An unknown run is `RunNotFound`; a run that has ended takes no new
/// message (`RunNotActive`), since nobody could receive it.
pub fn send(store: &mut dyn Store, msg: &NewMessage, now_ms: i64) -> Result<Message> {
    msg.check()?;
    store.write("sending a message", |tx| {
        let (_, state) = crate::runs::fenced_state(tx, &msg.run_id, None, now_ms)?;
        if let Some(key) = &msg.key {
            let first = tx.row(
                &sql::MESSAGE_BY_KEY_SQL,
                params![msg.run_id, msg.topic, key],
                message_row,
            )?;
            if let Some(first) = first {
                return Ok(first);
            }
        }
        if state.status.is_terminal() {
            return Err(LedgerError::RunNotActive {
                run_id: msg.run_id.clone(),
                status: state.status.as_str().to_owned(),
            });
        }
        let seq = tx
            .row(&sql::NEXT_MESSAGE_SEQ_SQL, params![msg.run_id], |r| {
                r.get::<i64>(0)
            })?
            .unwrap_or(1);
        tx.exec_later(
            &sql::INSERT_MESSAGE_SQL,
            params![
                msg.run_id,
                seq,
                msg.topic,
                msg.key,
                msg.payload.text,
                now_ms
            ],
        )?;
        let mut payload = vec![
            ("run_id".into(), Value::Str(msg.run_id.clone())),
            ("seq".into(), Value::Int(seq)),
            ("topic".into(), Value::Str(msg.topic.clone())),
        ];
        if let Some(key) = &msg.key {
            payload.insert(0, ("key".into(), Value::Str(key.clone())));
        }
        let payload = Value::Object(payload);
        events::append(
            tx,
            &msg.run_id,
            "message.sent",
            &payload,
            &Actor::default(),
            now_ms,
        )?;
        Ok(Message {
            run_id: msg.run_id.clone(),
            seq,
            topic: msg.topic.clone(),
            key: msg.key.clone(),
            payload: msg.payload.text.clone().into_bytes(),
            sent_at: now_ms,
            consumed_at: None,
            consumed_generation: None,
        })
    })
}

/// Take the oldest `limit` (1 to 10 000) messages of `topic` that no receive has taken, for the
/// owner of `fence`: the fence is checked as for every write, under the run's lock, so two
/// receivers (or one receiver retrying) never take one message twice, and a stale claim takes
/// none. A run that has ended is `RunNotActive`.
pub fn receive(
    store: &mut dyn Store,
    run_id: &str,
    topic: &str,
    fence: &Fence,
    limit: i64,
    now_ms: i64,
) -> Result<Vec<Message>> {
    crate::ids::check_name("topic", topic)?;
    check_page(limit, "; receive again for more")?;
    store.write("receiving messages", |tx| {
        let (actor, state) = crate::runs::fenced_state(tx, run_id, Some(fence), now_ms)?;
        if state.status.is_terminal() {
            return Err(LedgerError::RunNotActive {
                run_id: run_id.to_owned(),
                status: state.status.as_str().to_owned(),
            });
        }
        let mut taken = tx.rows(
            &sql::WAITING_MESSAGES_SQL,
            params![run_id, topic, limit],
            message_row,
        )?;
        for m in &mut taken {
            tx.exec_later(
                &sql::CONSUME_MESSAGE_SQL,
                params![run_id, m.seq, now_ms, actor.generation],
            )?;
            m.consumed_at = Some(now_ms);
            m.consumed_generation = actor.generation;
        }
        Ok(taken)
    })
}

/// A run's messages after number `after_seq`, taken ones too, oldest first, of one topic or
/// all, at most `limit` (1 to 10 000). An unknown run has none.
pub fn messages(
    store: &mut dyn Store,
    run_id: &str,
    topic: Option<&str>,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<Message>> {
    check_page(limit, "; page on with after_seq=")?;
    if let Some(topic) = topic {
        crate::ids::check_name("topic", topic)?;
    }
    store.read("listing messages", |tx| match topic {
        Some(topic) => tx.rows(
            &sql::TOPIC_MESSAGES_SQL,
            params![run_id, topic, after_seq, limit],
            message_row,
        ),
        None => tx.rows(
            &sql::RUN_MESSAGES_SQL,
            params![run_id, after_seq, limit],
            message_row,
        ),
    })
}
