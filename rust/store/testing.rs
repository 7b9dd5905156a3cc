//! Stores for tests written once over `&mut dyn Store`: a private in-memory SQLite database, and
//! a fresh PostgreSQL schema that is dropped when the test lets go of it.
//!
//! The PostgreSQL server is `FENCEPOST_PG_URL` (default
//! `postgresql://postgres@127.0.0.1:5432/test`). An unreachable server fails the test instead of
//! skipping it: a suite built with the `postgres` feature is meant to run against one, and a
//! skip would pass in CI without testing anything.

use crate::store::{open, OpenOptions, Store};

/// A migrated ledger in a private in-memory SQLite database.
///
/// # Panics
///
/// If the ledger cannot be opened.
pub fn sqlite_memory() -> Box<dyn Store> {
    open(None, None, None, &OpenOptions::default(), 0)
        .unwrap_or_else(|e| panic!("opening an in-memory SQLite ledger: {e}"))
}

/// The server the PostgreSQL tests use.
#[cfg(feature = "postgres")]
pub fn postgres_url() -> String {
    std::env::var("FENCEPOST_PG_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// A migrated ledger in a new PostgreSQL schema of its own (a random name), so tests running at
/// the same time never see each other's rows. Keep the [`Dropper`] alive as long as the store:
/// dropping it drops the schema.
///
/// # Panics
///
/// If the server cannot be reached or the ledger cannot be made there.
#[cfg(feature = "postgres")]
pub fn postgres_fresh() -> (Box<dyn Store>, Dropper) {
    let url = postgres_url();
    let schema = format!("fp_rust_{}", uuid::Uuid::new_v4().simple());
    // Armed before opening, so a schema half made by a failed open is dropped too.
    let dropper = Dropper {
        url: url.clone(),
        schema: schema.clone(),
    };
    let store =
        open(None, Some(&url), Some(&schema), &OpenOptions::default(), 0).unwrap_or_else(|e| {
            panic!("opening a PostgreSQL ledger at {url} (set FENCEPOST_PG_URL): {e}")
        });
    (store, dropper)
}

/// Drops its PostgreSQL schema, with everything in it, when dropped.
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub struct Dropper {
    url: String,
    schema: String,
}

#[cfg(feature = "postgres")]
impl Dropper {
    /// The schema this dropper owns.
    pub fn schema(&self) -> &str {
        &self.schema
    }
}

#[cfg(feature = "postgres")]
impl Drop for Dropper {
    fn drop(&mut self) {
        // A failure leaves a stray schema behind, which is no reason to fail the test that
        // already ran (or to panic while a failed test unwinds).
        let _ = crate::store::postgres::drop_schema(&self.url, &self.schema);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_store_is_migrated() {
        let mut store = sqlite_memory();
        assert_eq!(
            store.pragmas().unwrap().schema_version,
            crate::store::migrate::SCHEMA_VERSION
        );
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn a_fresh_schema_is_migrated_then_dropped() {
        let (mut store, dropper) = postgres_fresh();
        assert_eq!(
            store.pragmas().unwrap().schema_version,
            crate::store::migrate::SCHEMA_VERSION
        );
        let schema = dropper.schema().to_owned();
        drop(store);
        drop(dropper);
        // Opening it again without create finds no ledger: the schema is gone.
        let again = open(
            None,
            Some(&postgres_url()),
            Some(&schema),
            &OpenOptions {
                create: false,
                ..OpenOptions::default()
            },
            0,
        );
        let err = again.err().expect("the schema was dropped");
        assert!(err.to_string().contains("no fencepost ledger"), "{err}");
    }
}
