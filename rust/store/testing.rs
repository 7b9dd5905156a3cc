//! Stores for Rust tests: a private in-memory SQLite database, and a PostgreSQL schema of its
//! own that is dropped when the test is done. A PostgreSQL store that cannot be opened fails
//! the test: a test that skipped silently would pass on a machine that tested nothing.

use super::{open, OpenOptions, Store};

/// The time the test stores are opened at (the migrations record it).
const OPENED_AT_MS: i64 = 1_700_000_000_000;

/// A fresh, migrated `:memory:` store.
///
/// # Panics
/// If SQLite cannot open or migrate it.
pub fn sqlite_memory() -> Box<dyn Store> {
    open(None, None, None, &OpenOptions::default(), OPENED_AT_MS)
        .unwrap_or_else(|e| panic!("opening a :memory: store: {e}"))
}

/// The server the PostgreSQL tests use: `FENCEPOST_PG_URL`, else the local test database.
#[cfg(feature = "postgres")]
fn pg_url() -> String {
    std::env::var("FENCEPOST_PG_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// Drops its schema (and everything in it) when dropped. Keep it alive as long as the store:
/// bind it to a name (`_schema`), since `let (store, _) = ...` would drop it at once.
#[cfg(feature = "postgres")]
pub struct Dropper {
    url: String,
    schema: String,
}

#[cfg(feature = "postgres")]
impl Drop for Dropper {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        let dropped = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
            .and_then(|runtime| {
                runtime.block_on(async {
                    let (client, connection) =
                        tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
                            .await
                            .map_err(|e| e.to_string())?;
                    let task = tokio::spawn(connection);
                    let result = client.batch_execute(&sql).await.map_err(|e| e.to_string());
                    drop(client);
                    let _ = task.await;
                    result
                })
            });
        // A schema left behind is litter, not a wrong result: say so, without failing a test
        // that may already be unwinding.
        if let Err(e) = dropped {
            eprintln!("could not drop test schema {}: {e}", self.schema);
        }
    }
}

/// A fresh, migrated store in a new schema of a random name on `FENCEPOST_PG_URL`, and the
/// [`Dropper`] that drops the schema.
///
/// # Panics
/// If PostgreSQL is unreachable or refuses the schema.
#[cfg(feature = "postgres")]
pub fn postgres_fresh() -> (Box<dyn Store>, Dropper) {
    let url = pg_url();
    let schema = format!("fp_test_{}", uuid::Uuid::new_v4().simple());
    let dropper = Dropper {
        url: url.clone(),
        schema: schema.clone(),
    };
    let store = open(
        None,
        Some(&url),
        Some(&schema),
        &OpenOptions::default(),
        OPENED_AT_MS,
    )
    .unwrap_or_else(|e| panic!("opening a PostgreSQL store on {url} (FENCEPOST_PG_URL): {e}"));
    (store, dropper)
}
