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
use std::sync::{Arc, LazyLock};
use std::task::Poll;

use bytes::BytesMut;
use tokio::runtime::Runtime;
use tokio_postgres::types::{to_sql_checked, Format, IsNull, Kind, ToSql as PgToSql, Type};
use tokio_postgres::{Client, Error as PgError, Statement};

use crate::store::{SqlValue, ToSql};

/// The most requests a transaction queues before it sends them (a long one-by-one batch).
pub(super) const MAX_QUEUED: usize = 64;

/// A statement as a transaction sends it.
#[derive(Clone)]
pub(super) enum Prepared {
    /// Prepared once per session: the server keeps it by name, so each use sends only its
    /// parameters, and caches its plan.
    Named(Statement),
    /// Its text (placeholders rewritten), sent with every use as the unnamed statement, its
    /// parameters' types left to the server and their values in text: behind a pooler in
    /// transaction mode, where the next transaction may run on another server session that
    /// never saw a name (see `Target::pooled`).
    Unnamed(Arc<str>),
}

/// A request queued to go out with the next one the transaction waits for.
pub(super) enum Queued {
    /// A command without parameters (`BEGIN`, `RELEASE SAVEPOINT ...`).
    Simple(Cow<'static, str>),
    /// A statement and its parameters, owned until sent.
    Exec(Prepared, Vec<Owned>),
}

impl Queued {
    /// A statement with its parameters copied, to be sent later.
    pub(super) fn exec(statement: Prepared, params: &[&dyn ToSql]) -> Self {
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
    Exec(&'r Prepared, Vec<Bind<'r>>),
    Query(&'r Prepared, Vec<Bind<'r>>),
}

impl<'r> Req<'r> {
    /// Execute `statement` with `params`, borrowed until the answer arrives.
    pub(super) fn exec(statement: &'r Prepared, params: &'r [&dyn ToSql]) -> Self {
        Self::Exec(statement, binds(params))
    }

    /// Run the query `statement` with `params`.
    pub(super) fn query(statement: &'r Prepared, params: &'r [&dyn ToSql]) -> Self {
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
    // Every parameter of an unnamed statement goes as "unspecified", so the server infers its
    // type from the statement exactly as it does when preparing one, and in text, which
    // parses into whatever type it inferred (see `Bind`).
    fn typed<'b>(binds: &'b [Bind<'_>]) -> Vec<(&'b (dyn PgToSql + Sync), Type)> {
        binds
            .iter()
            .map(|b| (b as &(dyn PgToSql + Sync), UNSPECIFIED.clone()))
            .collect()
    }
    match req {
        Req::Simple(text) => {
            Box::pin(async move { client.batch_execute(text).await.map(|()| Resp::Done) })
        }
        Req::Exec(Prepared::Named(statement), binds) => Box::pin(async move {
            client
                .execute(statement, &refs(binds))
                .await
                .map(Resp::Count)
        }),
        Req::Query(Prepared::Named(statement), binds) => {
            Box::pin(async move { client.query(statement, &refs(binds)).await.map(Resp::Rows) })
        }
        Req::Exec(Prepared::Unnamed(text), binds) => Box::pin(async move {
            client
                .execute_typed(text, &typed(binds))
                .await
                .map(Resp::Count)
        }),
        Req::Query(Prepared::Unnamed(text), binds) => Box::pin(async move {
            client
                .query_typed(text, &typed(binds))
                .await
                .map(Resp::Rows)
        }),
    }
}

/// The type of a parameter left for the server to infer (type OID 0 in the Parse message).
static UNSPECIFIED: LazyLock<Type> =
    LazyLock::new(|| Type::new("unspecified".into(), 0, Kind::Pseudo, "pg_catalog".into()));

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
    /// A transaction that begins with `begin` (a message of simple commands, see
    /// `PgStore::begin`), queued: a body that sends nothing costs no round trip at all.
    pub(super) fn new(runtime: &'a Runtime, client: &'a Client, begin: Cow<'static, str>) -> Self {
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

    /// Queue `command` (a simple command), in the `BEGIN`'s own message while that has not
    /// gone out: the server answers a message's commands together, where a message of its own
    /// is one more answer to flush and for the client to read. Whether the queue is full.
    pub(super) fn push_simple(&self, command: &'static str) -> bool {
        let mut queued = self.queued.borrow_mut();
        if !self.sent.get() {
            if let Some(Queued::Simple(begin)) = queued.first_mut() {
                *begin = Cow::Owned(format!("{begin}; {command}"));
                return false;
            }
        }
        queued.push(Queued::Simple(Cow::Borrowed(command)));
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
/// `BIGINT`, `INTEGER` (a literal such as `?1 = 1` infers one), `SMALLINT` or `BOOLEAN`. For an
/// unnamed statement the type is not known here ([`UNSPECIFIED`]), so the value goes in text,
/// the form every type's input function reads: an integer in decimal (`boolean` reads `1` and
/// `0` too), bytes as `bytea`'s hex form.
#[derive(Debug)]
pub(super) struct Bind<'a>(SqlValue<'a>);

impl PgToSql for Bind<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        if ty.oid() == 0 {
            return Ok(self.to_text(out));
        }
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

    fn encode_format(&self, ty: &Type) -> Format {
        if ty.oid() == 0 {
            Format::Text
        } else {
            Format::Binary
        }
    }

    to_sql_checked!();
}

impl Bind<'_> {
    fn to_text(&self, out: &mut BytesMut) -> IsNull {
        use std::fmt::Write as _;
        match self.0 {
            SqlValue::Null => return IsNull::Yes,
            SqlValue::Int(v) => {
                let _ = write!(Text(out), "{v}");
            }
            SqlValue::Text(s) => out.extend_from_slice(s.as_bytes()),
            SqlValue::Blob(b) => {
                out.extend_from_slice(b"\\x");
                for byte in b {
                    let _ = write!(Text(out), "{byte:02x}");
                }
            }
        }
        IsNull::No
    }
}

/// `fmt::Write` into a parameter's bytes.
struct Text<'b>(&'b mut BytesMut);

impl std::fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: SqlValue<'_>) -> Option<String> {
        let mut out = BytesMut::new();
        match Bind(value).to_sql(&UNSPECIFIED, &mut out).unwrap() {
            IsNull::Yes => None,
            IsNull::No => Some(String::from_utf8(out.to_vec()).unwrap()),
        }
    }

    #[test]
    fn unnamed_statements_bind_text() {
        assert_eq!(text(SqlValue::Int(-42)).as_deref(), Some("-42"));
        assert_eq!(text(SqlValue::Text("é x")).as_deref(), Some("é x"));
        assert_eq!(
            text(SqlValue::Blob(&[0, 0xab, 0x10])).as_deref(),
            Some("\\x00ab10")
        );
        assert_eq!(text(SqlValue::Null), None);
        assert_eq!(Bind(SqlValue::Int(1)).encode_format(&UNSPECIFIED) as i16, 0);
        assert_eq!(Bind(SqlValue::Int(1)).encode_format(&Type::INT8) as i16, 1);
    }
}
