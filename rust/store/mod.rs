//! Storage: opening a database, its settings, forward-only migrations, transactions with
//! bounded busy retry, and the mapping of every database error onto [`LedgerError`].
//!
//! SQLite (rusqlite, `bundled`) is the backend today; the PostgreSQL issue turns this module into
//! the `Store`/`Tx` seam with one implementation per backend.

pub mod migrate;
pub mod sqlite;

/// How hard each commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=NORMAL` in WAL mode: crash-safe and consistent; a power loss may drop the
    /// last commits.
    Normal,
    /// `synchronous=FULL`: every commit is fsynced before it returns.
    Full,
}

impl Durability {
    /// The `synchronous` pragma value.
    #[must_use]
    pub fn pragma(self) -> &'static str {
        match self {
            Self::Normal => "NORMAL",
            Self::Full => "FULL",
        }
    }
}

/// Options for [`sqlite::SqliteStore::open`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Commit durability.
    pub durability: Durability,
    /// How long a write waits for the database lock, in total, before `StoreBusy`.
    pub busy_timeout_ms: u64,
    /// Create the file if it does not exist (read-only tools pass `false`).
    pub create: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Normal,
            busy_timeout_ms: 5000,
            create: true,
        }
    }
}
