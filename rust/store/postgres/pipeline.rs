//! Pipelining: a transaction's requests queued and sent back to back in one round trip.
//!
//! On a loopback connection a round trip costs more than executing any ledger statement, so a
//! transaction does not wait for the answer of a statement whose result it does not read: the
//! request is queued and goes out together with the next one it does wait for (or with the
//! `COMMIT`). Only the asynchronous driver can have several requests in flight, so requests
//! are futures, polled in order on the store's private runtime.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use bytes::BytesMut;
use tokio::runtime::Runtime;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql as PgToSql, Type};
use tokio_postgres::{Client, Error as PgError, Statement};

use crate::store::{SqlValue, ToSql};

/// The most requests a transaction queues before it sends them (a long one-by-one batch).
pub(super) const MAX_QUEUED: usize = 64;

/// A request queued to go out with the next one the transaction waits for.
pub(super) enum Queued {
    /// A command without parameters (`BEGIN`, `RELEASE SAVEPOINT ...`).
    Simple(Cow<'static, str>),
    /// A prepared statement and its parameters, owned until sent.
    Exec(Statement, Vec<Owned>),
}

impl Queued {
    /// A prepared statement with its parameters copied, to be sent later.
    pub(super) fn exec(statement: Statement, params: &[&dyn ToSql]) -> Self {
        Self::Exec(
            statement,
            params.iter().map(|p| Owned::of(p.to_sql())).collect(),
        )
    }

    fn req(&self) -> Req<'_> {
        match self {
            Self::Simple(text) => Req::Simple(text),
            Self::Exec(statement, values) => {
                Req::Exec(statement, values.iter().map(|v| Bind(v.value())).collect())
            }
        }
    }
}

/// A parameter value owned by a queued statement.
pub(super) enum Owned {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
}

impl Owned {
    fn of(value: SqlValue<'_>) -> Self {
        match value {
            SqlValue::Null => Self::Null,
            SqlValue::Int(v) => Self::Int(v),
            SqlValue::Text(s) => Self::Text(s.to_owned()),
            SqlValue::Blob(b) => Self::Blob(b.to_vec()),
        }
    }

    fn value(&self) -> SqlValue<'_> {
        match self {
            Self::Null => SqlValue::Null,
            Self::Int(v) => SqlValue::Int(*v),
            Self::Text(s) => SqlValue::Text(s),
            Self::Blob(b) => SqlValue::Blob(b),
        }
    }
}

/// One request of a pipeline.
pub(super) enum Req<'r> {
    Simple(&'r str),
    Exec(&'r Statement, Vec<Bind<'r>>),
    Query(&'r Statement, Vec<Bind<'r>>),
}

impl<'r> Req<'r> {
    /// Execute `statement` with `params`, borrowed until the answer arrives.
    pub(super) fn exec(statement: &'r Statement, params: &'r [&dyn ToSql]) -> Self {
        Self::Exec(statement, binds(params))
    }

    /// Run the query `statement` with `params`.
    pub(super) fn query(statement: &'r Statement, params: &'r [&dyn ToSql]) -> Self {
        Self::Query(statement, binds(params))
    }
}

/// Its answer.
pub(super) enum Resp {
    Done,
    Count(u64),
    Rows(Vec<tokio_postgres::Row>),
}

/// Which request of a pipeline failed.
pub(super) enum Failed {
    /// A queued one: what followed it failed because of it, so this is the error to report.
    Queued(PgError),
    /// The one the caller waited for.
    Waited(PgError),
}

type Pending<'f, T> = Pin<Box<dyn Future<Output = T> + 'f>>;

fn request<'f>(client: &'f Client, req: &'f Req<'f>) -> Pending<'f, Result<Resp, PgError>> {
    fn refs<'b>(binds: &'b [Bind<'_>]) -> Vec<&'b (dyn PgToSql + Sync)> {
        binds.iter().map(|b| b as &(dyn PgToSql + Sync)).collect()
    }
    match req {
        Req::Simple(text) => {
            Box::pin(async move { client.batch_execute(text).await.map(|()| Resp::Done) })
        }
        Req::Exec(statement, binds) => Box::pin(async move {
            client
                .execute(*statement, &refs(binds))
                .await
                .map(Resp::Count)
        }),
        Req::Query(statement, binds) => {
            Box::pin(async move { client.query(*statement, &refs(binds)).await.map(Resp::Rows) })
        }
    }
}

/// Poll `futures` in order until all are done: each one's first poll sends its request, so
/// the requests leave in order, back to back, before the first answer is awaited.
async fn in_order<T>(mut futures: Vec<Pending<'_, T>>) -> Vec<T> {
    let mut done: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

/// A transaction's queue of requests on one connection. The server runs pipelined requests in
/// order, each after the previous one finished, so a transaction sent this way means exactly
/// what its statements sent one by one meant; a failure among the queued requests fails the
/// one waited for, and turns a `COMMIT` into a rollback.
pub(super) struct Pipeline<'a> {
    runtime: &'a Runtime,
    client: &'a Client,
    /// Requests not sent yet; the first is the transaction's `BEGIN`.
    queued: RefCell<Vec<Queued>>,
    /// Whether anything (so the `BEGIN`) has gone out: only then is there a transaction to end.
    sent: Cell<bool>,
}

impl<'a> Pipeline<'a> {
    /// A transaction that begins with `begin`, queued: a body that sends nothing costs no
    /// round trip at all. With `replan`, the same message discards the session's cached plans
    /// (`DISCARD PLANS`: prepared statements stay, each is planned again at its next use).
    pub(super) fn new(
        runtime: &'a Runtime,
        client: &'a Client,
        begin: &'static str,
        replan: bool,
    ) -> Self {
        let begin = if replan {
            Cow::Owned(format!("{begin}; DISCARD PLANS"))
        } else {
            Cow::Borrowed(begin)
        };
        Self {
            runtime,
            client,
            queued: RefCell::new(vec![Queued::Simple(begin)]),
            sent: Cell::new(false),
        }
    }

    /// Prepare a statement (one round trip of its own: its answer is needed to bind).
    pub(super) fn prepare(&self, text: &str) -> Result<Statement, PgError> {
        #[cfg(test)]
        ROUND_TRIPS.with(|c| c.set(c.get() + 1));
        self.runtime.block_on(self.client.prepare(text))
    }

    /// Queue a request; whether the queue is full (time to send it).
    pub(super) fn push(&self, request: Queued) -> bool {
        let mut queued = self.queued.borrow_mut();
        queued.push(request);
        queued.len() >= MAX_QUEUED
    }

    /// Whether the transaction did anything beyond its `BEGIN` (sent or queued).
    pub(super) fn begun(&self) -> bool {
        self.sent.get() || self.queued.borrow().len() > 1
    }

    /// Whether anything has gone out to the server.
    pub(super) fn sent(&self) -> bool {
        self.sent.get()
    }

    /// Drop whatever is queued, unsent.
    pub(super) fn clear(&self) {
        self.queued.borrow_mut().clear();
    }

    /// Send the queued requests and `last` in one round trip; `last`'s answer.
    pub(super) fn send(&self, last: Option<Req<'_>>) -> Result<Option<Resp>, Failed> {
        Ok(self.send_many(last.into_iter().collect())?.pop())
    }

    /// Send the queued requests and every one of `waited` in one round trip; the answers of
    /// `waited`, in order. The first failure is the one reported: the server skips whatever
    /// follows a failed request up to the next Sync, so the later ones fail because of it.
    pub(super) fn send_many(&self, waited: Vec<Req<'_>>) -> Result<Vec<Resp>, Failed> {
        self.send_each(waited)?
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(Failed::Waited)
    }

    /// [`Pipeline::send_many`], with each of `waited` answered on its own (a request after a
    /// `COMMIT` is a transaction of its own, whose failure says nothing of the commit's).
    pub(super) fn send_each(
        &self,
        waited: Vec<Req<'_>>,
    ) -> Result<Vec<Result<Resp, PgError>>, Failed> {
        let queued = std::mem::take(&mut *self.queued.borrow_mut());
        let mut reqs: Vec<Req<'_>> = queued.iter().map(Queued::req).collect();
        let n = waited.len();
        reqs.extend(waited);
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        self.sent.set(true);
        #[cfg(test)]
        ROUND_TRIPS.with(|c| c.set(c.get() + 1));
        let futures = reqs.iter().map(|r| request(self.client, r)).collect();
        let mut answers = self.runtime.block_on(in_order(futures));
        let answers_waited = answers.split_off(answers.len() - n);
        if let Some(e) = answers.into_iter().find_map(Result::err) {
            return Err(Failed::Queued(e));
        }
        Ok(answers_waited)
    }
}

#[cfg(test)]
thread_local! {
    /// Round trips this thread has waited for (prepares included), for tests that bound them.
    pub(super) static ROUND_TRIPS: Cell<u64> = const { Cell::new(0) };
}

fn binds<'p>(params: &'p [&dyn ToSql]) -> Vec<Bind<'p>> {
    params.iter().map(|p| Bind(p.to_sql())).collect()
}

/// A parameter bound to whatever type PostgreSQL inferred for its placeholder: integers fit
/// `BIGINT`, `INTEGER` (a literal such as `?1 = 1` infers one), `SMALLINT` or `BOOLEAN`.
#[derive(Debug)]
pub(super) struct Bind<'a>(SqlValue<'a>);

impl PgToSql for Bind<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match self.0 {
            SqlValue::Null => Ok(IsNull::Yes),
            SqlValue::Int(v) => match *ty {
                Type::INT8 => PgToSql::to_sql(&v, ty, out),
                Type::INT4 => PgToSql::to_sql(&i32::try_from(v)?, ty, out),
                Type::INT2 => PgToSql::to_sql(&i16::try_from(v)?, ty, out),
                Type::BOOL => PgToSql::to_sql(&(v != 0), ty, out),
                _ => Err(format!("cannot bind an integer to a {ty} parameter").into()),
            },
            SqlValue::Text(s) => PgToSql::to_sql(&s, ty, out),
            SqlValue::Blob(b) => PgToSql::to_sql(&b, ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}
