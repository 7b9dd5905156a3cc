//! PostgreSQL's first try of a judgment reads without its runs' locks and takes them with its
//! writes (`Tx::lock_run_at_write`). These cases commit a change from another session between
//! the read and the write: a change the judgment depended on must fail the try, and the call,
//! judged again under the locks, must answer as if it came after the change; a change it did
//! not depend on must not cost a second try.

use std::cell::{Cell, RefCell};

use super::{finish, started, unit, LEASE_MS, T0};
use crate::attempts::{self, finish_in, reserve_in, UnitSpec};
use crate::errors::{LedgerError, Result};
use crate::leases::{self, heartbeat_in, ClaimSpec, Fence};
use crate::model::ReservationKind;
use crate::store::testing::{postgres_fresh, postgres_url, Dropper};
use crate::store::{
    open, rows, DbError, DbResult, FailureScope, OpenOptions, Row, Savepoint, Sql, Store, ToSql, Tx,
};

/// A transaction that runs `change` just before the judgment's rows are written.
struct Meddle<'a> {
    inner: &'a dyn Tx,
    change: RefCell<Option<Box<dyn FnOnce() + 'a>>>,
}

impl Tx for Meddle<'_> {
    fn execute(&self, sql: &Sql, params: &[&dyn ToSql], interpret: bool) -> DbResult<usize> {
        self.inner.execute(sql, params, interpret)
    }
    fn query(
        &self,
        sql: &Sql,
        params: &[&dyn ToSql],
        each: &mut dyn FnMut(&dyn Row) -> DbResult<bool>,
    ) -> DbResult<()> {
        self.inner.query(sql, params, each)
    }
    fn defer(&self, sql: &Sql, params: &[&dyn ToSql]) -> DbResult<()> {
        self.inner.defer(sql, params)
    }
    fn execute_script(&self, text: &str) -> DbResult<()> {
        self.inner.execute_script(text)
    }
    fn fail(&self, err: &DbError) -> LedgerError {
        self.inner.fail(err)
    }
    fn lock_run(&self, run_id: &str) -> Result<()> {
        self.inner.lock_run(run_id)
    }
    fn lock_run_at_write(&self, run_id: &str) -> Result<bool> {
        self.inner.lock_run_at_write(run_id)
    }
    fn mark_run_locked(&self, run_id: &str) -> Result<()> {
        self.inner.mark_run_locked(run_id)
    }
    fn read_snapshot(
        &self,
        keys: &rows::SnapshotKeys<'_>,
        each: &mut dyn FnMut(rows::Part, &dyn Row) -> DbResult<()>,
    ) -> DbResult<()> {
        self.inner.read_snapshot(keys, each)
    }
    fn write_rows(&self, writes: &rows::Writes<'_>) -> DbResult<()> {
        if let Some(change) = self.change.borrow_mut().take() {
            change();
        }
        self.inner.write_rows(writes)
    }
    fn savepoint(&self, step: Savepoint) -> Result<()> {
        self.inner.savepoint(step)
    }
    fn set_operation(&self, op: &'static str) {
        self.inner.set_operation(op);
    }
    fn failure_scope(&self) -> FailureScope {
        self.inner.failure_scope()
    }
    fn query_many(
        &self,
        queries: &[(&Sql, &[&dyn ToSql])],
        each: &mut dyn FnMut(usize, &dyn Row) -> DbResult<()>,
    ) -> DbResult<()> {
        self.inner.query_many(queries, each)
    }
}

/// A fresh ledger with run `r`, and a second session on it.
fn two_sessions() -> (Box<dyn Store>, Box<dyn Store>, Dropper) {
    let (mut store, dropper) = postgres_fresh();
    started(store.as_mut(), "r");
    let other = open(
        None,
        Some(&postgres_url()),
        Some(dropper.schema()),
        &OpenOptions::default(),
        0,
    )
    .expect("a second session");
    (store, other, dropper)
}

/// Run `call` in a write of `store`, with `change` made on `other` between the first try's
/// read and its write; the call's answer and how many tries it took.
fn meddled<T>(
    store: &mut dyn Store,
    other: &mut dyn Store,
    change: impl FnOnce(&mut dyn Store),
    call: impl Fn(&dyn Tx) -> Result<T>,
) -> (Result<T>, u32) {
    let tries = Cell::new(0_u32);
    let mut change = Some(change);
    let out = store.write("meddled", |tx| {
        tries.set(tries.get() + 1);
        match change.take() {
            Some(c) => {
                let other = &mut *other;
                let meddle = Meddle {
                    inner: tx,
                    change: RefCell::new(Some(Box::new(move || c(other)))),
                };
                call(&meddle)
            }
            None => call(tx),
        }
    });
    (out, tries.get())
}

fn reserve(store: &mut dyn Store, units: &[UnitSpec], fence: Option<&Fence>) -> (i64, String) {
    let r = attempts::reserve_attempts(store, "r", units, fence, T0).expect("reserve");
    (r[0].attempt, r[0].dispatch_id.clone())
}

fn held(unit_id: &str, holder: &str) -> UnitSpec {
    UnitSpec {
        holder: Some(holder.into()),
        ..unit(unit_id)
    }
}

fn claimed(store: &mut dyn Store) -> (Fence, String) {
    let spec = ClaimSpec::new("host-a".into(), LEASE_MS, None, "token").expect("spec");
    let c = leases::claim(store, "r", &spec, T0)
        .expect("claim")
        .expect("claimed");
    (Fence::from_token("r", c.generation, &c.token), c.token)
}

#[test]
fn a_finish_that_lost_meanwhile_is_judged_lost() {
    let (mut store, mut other, _schema) = two_sessions();
    let (attempt, dispatch) = reserve(store.as_mut(), &[unit("u1")], None);
    let f = [finish("r", "u1", attempt, &dispatch)];
    let mut theirs = f[0].clone();
    theirs.tokens = Some(99);
    let (out, tries) = meddled(
        store.as_mut(),
        other.as_mut(),
        |o| {
            let won = attempts::finish_attempts(o, &[theirs], None, T0).expect("their finish");
            assert_eq!(won, vec![true]);
        },
        |tx| finish_in(tx, &f, None, T0),
    );
    assert_eq!(out.expect("finish"), vec![false]);
    assert_eq!(tries, 2);
    let rows = attempts::attempts(store.as_mut(), "r", "u1").expect("attempts");
    assert_eq!(
        rows[0].tokens,
        Some(99),
        "the other session's finish stands"
    );
    let finished = super::event_types(store.as_mut(), "r")
        .iter()
        .filter(|t| *t == "unit.finished")
        .count();
    assert_eq!(finished, 1);
}

#[test]
fn a_reserve_under_a_lease_released_meanwhile_is_refused() {
    let (mut store, mut other, _schema) = two_sessions();
    let (fence, _) = claimed(store.as_mut());
    let released = fence.clone();
    let units = [unit("u1")];
    let (out, tries) = meddled(
        store.as_mut(),
        other.as_mut(),
        |o| leases::release(o, &released, T0).expect("release"),
        |tx| reserve_in(tx, "r", &units, &["d-1".to_owned()], Some(&fence), T0),
    );
    assert!(matches!(out, Err(LedgerError::LeaseLost { .. })), "{out:?}");
    assert_eq!(tries, 2);
    assert!(attempts::attempts(store.as_mut(), "r", "u1")
        .expect("attempts")
        .is_empty());
}

#[test]
fn a_heartbeat_after_a_new_claim_meanwhile_is_refused() {
    let (mut store, mut other, _schema) = two_sessions();
    let (fence, token) = claimed(store.as_mut());
    let released = fence.clone();
    let (out, tries) = meddled(
        store.as_mut(),
        other.as_mut(),
        |o| {
            leases::release(o, &released, T0).expect("release");
            let spec = ClaimSpec::new("host-b".into(), LEASE_MS, None, "token").expect("spec");
            leases::claim(o, "r", &spec, T0 + 1)
                .expect("claim")
                .expect("claimed");
        },
        |tx| heartbeat_in(tx, &fence, &token, LEASE_MS, T0 + 2),
    );
    assert!(matches!(out, Err(LedgerError::LeaseLost { .. })), "{out:?}");
    assert_eq!(tries, 2);
    let lease = leases::lease(store.as_mut(), "r").expect("lease");
    assert_eq!(lease.owner_id.as_deref(), Some("host-b"));
}

#[test]
fn a_reclaim_counts_the_reclaim_made_meanwhile() {
    let (mut store, mut other, _schema) = two_sessions();
    reserve(store.as_mut(), &[held("u1", "h1")], None);
    let theirs = [held("u1", "h2")];
    let mine = [held("u1", "h3")];
    let (out, tries) = meddled(
        store.as_mut(),
        other.as_mut(),
        |o| {
            let r = attempts::reserve_attempts(o, "r", &theirs, None, T0).expect("their reclaim");
            assert_eq!((r[0].kind, r[0].reclaims), (ReservationKind::Reclaimed, 1));
        },
        |tx| reserve_in(tx, "r", &mine, &["d-unused".to_owned()], None, T0),
    );
    let out = out.expect("reclaim");
    assert_eq!(
        (out[0].kind, out[0].reclaims),
        (ReservationKind::Reclaimed, 2)
    );
    assert_eq!(tries, 2);
    let rows = attempts::attempts(store.as_mut(), "r", "u1").expect("attempts");
    assert_eq!((rows.len(), rows[0].reclaims), (1, 2));
    assert_eq!(rows[0].holder.as_deref(), Some("h3"));
}

/// The other session's write needs the run's lock: it commits while the first try is open,
/// so that try did not hold the lock across its read, and it still writes on its first try.
#[test]
fn a_write_on_another_unit_meanwhile_costs_no_second_try() {
    let (mut store, mut other, _schema) = two_sessions();
    let (fence, token) = claimed(store.as_mut());
    let theirs = [unit("u9")];
    let (theirs_fence, mine_fence) = (fence.clone(), fence.clone());
    let units = [unit("u1")];
    let (out, tries) = meddled(
        store.as_mut(),
        other.as_mut(),
        |o| {
            attempts::reserve_attempts(o, "r", &theirs, Some(&theirs_fence), T0)
                .expect("their reserve");
            leases::heartbeat(o, &theirs_fence, &token, LEASE_MS, T0 + 1).expect("heartbeat");
        },
        |tx| {
            reserve_in(
                tx,
                "r",
                &units,
                &["d-1".to_owned()],
                Some(&mine_fence),
                T0 + 2,
            )
        },
    );
    assert_eq!(out.expect("reserve")[0].attempt, 1);
    assert_eq!(tries, 1);
    let types = super::event_types(store.as_mut(), "r");
    let started = types.iter().filter(|t| *t == "unit.started").count();
    assert_eq!(started, 2);
    // Revisions stay one per event, in order, across both sessions' writes.
    assert_eq!(
        super::revision(store.as_mut(), "r"),
        i64::try_from(types.len()).unwrap()
    );
}

/// A judgment over two runs (as a batch or a group makes) checks both runs in one statement.
#[test]
fn a_judgment_over_two_runs_is_judged_again_when_one_changed() {
    let (mut store, mut other, _schema) = two_sessions();
    started(store.as_mut(), "r2");
    let spec = ClaimSpec::new("host-a".into(), LEASE_MS, None, "token").expect("spec");
    let c = leases::claim(store.as_mut(), "r2", &spec, T0)
        .expect("claim")
        .expect("claimed");
    let fence = Fence::from_token("r2", c.generation, &c.token);
    let released = fence.clone();
    let (mine, theirs) = ([unit("u1")], [unit("u2")]);
    let (ids, other_ids) = (["d-1".to_owned()], ["d-2".to_owned()]);
    let (out, tries) = meddled(
        store.as_mut(),
        other.as_mut(),
        |o| leases::release(o, &released, T0).expect("release"),
        |tx| {
            let mut keys = crate::plan::Keys::default();
            keys.reserve("r", &mine);
            keys.reserve("r2", &theirs);
            let mut judgment = crate::plan::Judgment::read(tx, keys)?;
            let unfenced = judgment.reserve("r", &mine, &ids, None, T0);
            let fenced = judgment.reserve("r2", &theirs, &other_ids, Some(&fence), T0);
            judgment.write(tx)?;
            Ok((unfenced.is_ok(), fenced.err()))
        },
    );
    let (unfenced, fenced) = out.expect("judged");
    assert!(unfenced);
    assert!(
        matches!(fenced, Some(LedgerError::LeaseLost { .. })),
        "{fenced:?}"
    );
    assert_eq!(tries, 2);
    assert_eq!(
        attempts::attempts(store.as_mut(), "r", "u1")
            .expect("r")
            .len(),
        1
    );
    assert!(attempts::attempts(store.as_mut(), "r2", "u2")
        .expect("r2")
        .is_empty());
}

/// The change commits while the write's lock statement waits for the run's lock: the check,
/// in that same statement, must see it (the rows it locks are re-read once the lock is free).
#[test]
fn a_change_committed_while_the_write_waits_for_the_lock_is_seen() {
    let (mut store, _other, dropper) = two_sessions();
    let (fence, _) = claimed(store.as_mut());
    let schema = dropper.schema().to_owned();
    let units = [unit("u1")];
    let (held, holding) = std::sync::mpsc::channel::<()>();
    let mut holder = None;
    let tries = Cell::new(0_u32);
    let out = store.write("meddled", |tx| {
        tries.set(tries.get() + 1);
        if tries.get() > 1 {
            return reserve_in(tx, "r", &units, &["d-1".to_owned()], Some(&fence), T0);
        }
        let schema = schema.clone();
        let held = held.clone();
        let start = || {
            holder = Some(std::thread::spawn(move || {
                let url = postgres_url();
                let opts = OpenOptions::default();
                let mut other = open(None, Some(&url), Some(&schema), &opts, 0).expect("open");
                other
                    .write("holding the run's lock", |tx| {
                        tx.lock_run("r")?;
                        tx.execute(&RELEASE_ANY, crate::params!["r"], false)
                            .map_err(|e| tx.fail(&e))?;
                        held.send(()).expect("send");
                        std::thread::sleep(std::time::Duration::from_millis(300));
                        Ok(())
                    })
                    .expect("the other write");
            }));
            holding.recv().expect("the other session holds the lock");
        };
        let meddle = Meddle {
            inner: tx,
            change: RefCell::new(Some(Box::new(start))),
        };
        reserve_in(&meddle, "r", &units, &["d-1".to_owned()], Some(&fence), T0)
    });
    if let Some(h) = holder.take() {
        h.join().expect("holder");
    }
    assert!(matches!(out, Err(LedgerError::LeaseLost { .. })), "{out:?}");
    assert_eq!(tries.get(), 2);
    assert!(attempts::attempts(store.as_mut(), "r", "u1")
        .expect("attempts")
        .is_empty());
}

/// A release by hand, so that it can be held open: the owner cleared, the generation kept.
const RELEASE_ANY: Sql = Sql::same(
    "UPDATE leases SET owner_type = NULL, owner_id = NULL, token_hash = NULL,
    acquired_at = NULL, heartbeat_at = NULL, expires_at = NULL WHERE resource_id = ?1",
);

#[test]
fn a_reserve_on_a_run_blocked_meanwhile_is_refused() {
    let (mut store, mut other, _schema) = two_sessions();
    let units = [unit("u1")];
    let (out, tries) = meddled(
        store.as_mut(),
        other.as_mut(),
        |o| {
            crate::runs::block_run(o, "r", None, T0).expect("block");
        },
        |tx| reserve_in(tx, "r", &units, &["d-1".to_owned()], None, T0),
    );
    assert!(
        matches!(out, Err(LedgerError::RunNotActive { .. })),
        "{out:?}"
    );
    assert_eq!(tries, 2);
    assert!(attempts::attempts(store.as_mut(), "r", "u1")
        .expect("attempts")
        .is_empty());
}
