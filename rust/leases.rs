//! Leases and the fence every claimed write re-checks (DESIGN §1.3).
//!
//! This module holds the fence check that every fenced write runs inside its own transaction;
//! claiming, heartbeats and release arrive with the queue and fencing issue.

use rusqlite::params;
use sha2::{Digest as _, Sha256};

use crate::errors::{LedgerError, Result};
use crate::events::Actor;
use crate::store::sqlite::{sql, Tx};

/// What a claimed write presents: the run, the generation it claimed, and the token's hash
/// (the token itself never reaches the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The claimed run.
    pub run_id: String,
    /// The generation the claim took.
    pub generation: i64,
    /// `hex(sha256(token))`.
    pub token_hash: String,
}

impl Fence {
    /// A fence from a claim's plaintext token (hashed here, before any transaction).
    pub fn from_token(run_id: &str, generation: i64, token: &str) -> Self {
        let hash = Sha256::digest(token.as_bytes());
        let mut hex = String::with_capacity(64);
        for b in hash {
            hex.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            hex.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
        }
        Self {
            run_id: run_id.to_owned(),
            generation,
            token_hash: hex,
        }
    }
}

/// Re-check `fence` against the run's lease inside the caller's transaction: the generation,
/// the token hash and the expiry (judged with the ledger's clock) must all hold, else
/// `LeaseLost` and the caller writes nothing. Without a fence the write is unfenced. Returns the
/// actor to stamp on the write's events.
pub fn check<'a>(
    tx: &Tx<'_>,
    run_id: &str,
    fence: Option<&'a Fence>,
    now_ms: i64,
) -> Result<Actor<'a>> {
    let Some(fence) = fence else {
        return Ok(Actor::default());
    };
    if fence.run_id != run_id {
        return Err(LedgerError::invalid(
            "claim",
            format!("the claim is for run {:?}, not {run_id:?}", fence.run_id),
        ));
    }
    let row = tx.row(sql::FENCE_SQL, params![run_id], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, Option<String>>(1)?,
            r.get::<_, Option<i64>>(2)?,
            r.get::<_, Option<String>>(3)?,
        ))
    })?;
    let lost = |actual: i64| LedgerError::LeaseLost {
        run_id: run_id.to_owned(),
        expected_generation: fence.generation,
        actual_generation: actual,
    };
    let Some((generation, token_hash, expires_at, owner_type)) = row else {
        return Err(lost(0));
    };
    let live = expires_at.is_some_and(|e| e > now_ms);
    if generation != fence.generation || token_hash.as_deref() != Some(&fence.token_hash) || !live {
        return Err(lost(generation));
    }
    // Owner type is "host"/"session"; the actor id is left to the claim issue's richer Claim.
    let kind = match owner_type.as_deref() {
        Some("host") => Some("host"),
        _ => Some("session"),
    };
    Ok(Actor {
        kind,
        id: None,
        generation: Some(generation),
    })
}
