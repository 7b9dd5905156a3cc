//! Content-addressed JSON: canonical bytes stored under `"sha256:" + hex(sha256(bytes))`, the
//! digest computed by the ledger before the transaction (never taken from the caller). Storing
//! is idempotent (the same bytes have the same key); reading an unknown digest is `NotFound`.

use crate::canonical::Json;
use crate::errors::{LedgerError, Result};
use crate::params;
use crate::store::{sql, Store, Tx};

/// Store canonical bytes whose digest was computed before the transaction began.
pub fn put_digested(tx: &dyn Tx, digest: &str, canonical: &[u8], now_ms: i64) -> Result<()> {
    tx.exec_later(&sql::PUT_BLOB_SQL, params![digest, canonical, now_ms])?;
    Ok(())
}

/// Check the textual form of a digest argument.
pub fn check_digest(argument: &str, digest: &str) -> Result<()> {
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            argument,
            format!("{digest:?} is not a digest; expected \"sha256:\" and 64 lowercase hex digits"),
        ))
    }
}

/// The canonical bytes stored under `digest`.
pub fn get(tx: &dyn Tx, digest: &str) -> Result<Vec<u8>> {
    tx.row(&sql::GET_BLOB_SQL, params![digest], |r| r.get(0))?
        .ok_or_else(|| LedgerError::NotFound {
            kind: "blob",
            key: digest.to_owned(),
        })
}

/// `put_json`: store canonical JSON (digested before the transaction) in its own transaction;
/// its digest.
pub fn put_json(store: &mut dyn Store, json: &Json, now_ms: i64) -> Result<String> {
    store.write("storing a blob", |tx| {
        put_digested(tx, &json.digest, json.text.as_bytes(), now_ms)
    })?;
    Ok(json.digest.clone())
}

/// `get_json`: the canonical bytes under `digest`.
pub fn get_json(store: &mut dyn Store, digest: &str) -> Result<Vec<u8>> {
    check_digest("digest", digest)?;
    store.read("reading a blob", |tx| get(tx, digest))
}
