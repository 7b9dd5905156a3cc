//! Retry policies: when a failed unit may be tried again, and when it has failed for good.
//!
//! A policy is set on a run (`retry=`) or on a step (`steps=[{"id": ..., "retry": {...}}]`,
//! which overrides the run's for the step's units) and kept as canonical JSON with every field
//! spelled out, so a later change of a default never changes a stored policy. A failed or
//! timed-out finish of attempt `n` then either makes the unit `exhausted` (`n >= max_attempts`)
//! or sets its `retry_at` to the finish time plus the attempt's delay:
//!
//! - the base delay is `initial_ms`, multiplied by `factor` once for each attempt after the
//!   first, and capped at `max_ms` (the product is formed by repeated multiplication and stops
//!   growing at the cap, so a large attempt number never overflows);
//! - jitter then scales it by `1 + jitter * (2u - 1)` for a `u` in `[0, 1)` drawn from the run,
//!   the unit and the attempt: the first eight bytes of SHA-256 over
//!   `run_id NUL unit_id NUL attempt` (the attempt as decimal text), big-endian, over `2^64`.
//!   A replay of the same failure computes the same time, and a test can compute it too;
//! - the result is floored to whole milliseconds.

use sha2::{Digest, Sha256};

use crate::canonical::{into_text, to_vec, Value};
use crate::errors::{LedgerError, Result};

/// The base delay's cap when the policy names none: an hour.
pub const DEFAULT_MAX_MS: i64 = 3_600_000;
/// The factor when the policy names none.
pub const DEFAULT_FACTOR: f64 = 2.0;
/// The largest delay a policy may name (about 10 years), so a retry time stays far inside the
/// range of a millisecond timestamp.
pub const MAX_DELAY_MS: i64 = 315_360_000_000;
/// The largest factor: past it a second attempt already waits longer than any cap allows.
pub const MAX_FACTOR: f64 = 1_000_000.0;

/// A unit's retry policy, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: i64,
    /// The delay after the first failed attempt, in milliseconds.
    pub initial_ms: i64,
    /// How much longer each further delay is (at least 1).
    pub factor: f64,
    /// The longest base delay, in milliseconds.
    pub max_ms: i64,
    /// How far a delay may be spread, as a fraction of it (0 to 1).
    pub jitter: f64,
}

/// What a failed attempt leaves its unit to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// It may be reserved again from this time on.
    RetryAt(i64),
    /// It has used every attempt the policy allows.
    Exhausted,
}

impl RetryPolicy {
    /// A policy of `max_attempts` and `initial_ms` with the other fields at their defaults.
    #[must_use]
    pub const fn new(max_attempts: i64, initial_ms: i64) -> Self {
        Self {
            max_attempts,
            initial_ms,
            factor: DEFAULT_FACTOR,
            max_ms: DEFAULT_MAX_MS,
            jitter: 0.0,
        }
    }

    /// Refuse a field out of its range with `InvalidArgument` on `argument` (`retry`, or
    /// `steps` for a step's policy, `at` saying which item), naming the field.
    pub fn check(&self, argument: &str, at: &str) -> Result<()> {
        let bad = |field: &str, rule: &str, got: String| {
            Err(LedgerError::invalid(
                argument,
                format!("{at}retry.{field} must be {rule}, not {got}"),
            ))
        };
        if self.max_attempts < 1 {
            return bad(
                "max_attempts",
                "an int >= 1 (1 = no retries)",
                self.max_attempts.to_string(),
            );
        }
        if !(0..=MAX_DELAY_MS).contains(&self.initial_ms) {
            return bad(
                "initial_ms",
                &format!("an int from 0 to {MAX_DELAY_MS}"),
                self.initial_ms.to_string(),
            );
        }
        if !(1.0..=MAX_FACTOR).contains(&self.factor) {
            return bad(
                "factor",
                &format!("a number from 1 to {MAX_FACTOR}"),
                self.factor.to_string(),
            );
        }
        if !(0..=MAX_DELAY_MS).contains(&self.max_ms) {
            return bad(
                "max_ms",
                &format!("an int from 0 to {MAX_DELAY_MS}"),
                self.max_ms.to_string(),
            );
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return bad("jitter", "a number from 0 to 1", self.jitter.to_string());
        }
        Ok(())
    }

    /// The policy as stored: canonical JSON, every field spelled out.
    #[must_use]
    pub fn to_text(&self) -> String {
        let number = |f: f64| {
            // A whole factor is written as an integer, as canonical JSON writes 2.0.
            crate::canonical::check_float(f).unwrap_or(Value::Null)
        };
        into_text(to_vec(&Value::Object(vec![
            ("factor".into(), number(self.factor)),
            ("initial_ms".into(), Value::Int(self.initial_ms)),
            ("jitter".into(), number(self.jitter)),
            ("max_attempts".into(), Value::Int(self.max_attempts)),
            ("max_ms".into(), Value::Int(self.max_ms)),
        ])))
    }

    /// A stored policy; `None` for text this library did not write.
    ///
    /// Stored text is always [`Self::to_text`]'s: a policy is written only by it, and a restore
    /// refuses any text that does not come back from this function and `to_text` unchanged.
    /// So it is read in that one form, field by field in canonical (sorted) order, without
    /// building a JSON tree: every failing finish under a policy reads it, and the tree (a map,
    /// its keys and values) costs that finish about half as much as the policy's index entries.
    #[must_use]
    pub fn from_text(text: &str) -> Option<Self> {
        let mut fields = text.strip_prefix('{')?.strip_suffix('}')?.split(',');
        let mut field = |name: &str| -> Option<&str> {
            fields
                .next()?
                .strip_prefix('"')?
                .strip_prefix(name)?
                .strip_prefix("\":")
        };
        // Fields are read in the order written, which is the stored order.
        let p = Self {
            factor: field("factor")?.parse().ok()?,
            initial_ms: field("initial_ms")?.parse().ok()?,
            jitter: field("jitter")?.parse().ok()?,
            max_attempts: field("max_attempts")?.parse().ok()?,
            max_ms: field("max_ms")?.parse().ok()?,
        };
        (fields.next().is_none() && p.check("retry", "").is_ok()).then_some(p)
    }

    /// The delay after failed attempt `attempt` of `unit_id` in `run_id`, in milliseconds.
    #[must_use]
    pub fn delay_ms(&self, run_id: &str, unit_id: &str, attempt: i64) -> i64 {
        #[allow(clippy::cast_precision_loss)]
        let cap = self.max_ms as f64;
        #[allow(clippy::cast_precision_loss)]
        let mut base = self.initial_ms as f64;
        let mut n = 1;
        while n < attempt && base < cap {
            base *= self.factor;
            n += 1;
        }
        let base = base.min(cap);
        let spread = if self.jitter > 0.0 {
            1.0 + self.jitter * (2.0 * draw(run_id, unit_id, attempt) - 1.0)
        } else {
            1.0
        };
        // Within 0..=MAX_DELAY_MS * 2 by the checks above, so the cast is exact.
        #[allow(clippy::cast_possible_truncation)]
        let ms = (base * spread).floor() as i64;
        ms.max(0)
    }

    /// What failed attempt `attempt`, finished at `finished_at`, leaves its unit to.
    #[must_use]
    pub fn after_failure(
        &self,
        run_id: &str,
        unit_id: &str,
        attempt: i64,
        finished_at: i64,
    ) -> AfterFailure {
        if attempt >= self.max_attempts {
            AfterFailure::Exhausted
        } else {
            // No later than the last instant the ledger writes: a retry time is read back
            // as a date.
            let last = crate::leases::MAX_CLOCK_MS + crate::leases::MAX_LEASE_MS;
            AfterFailure::RetryAt(
                finished_at
                    .saturating_add(self.delay_ms(run_id, unit_id, attempt))
                    .min(last),
            )
        }
    }
}

/// The jitter's `u` in `[0, 1)` for an attempt (see the module's documentation).
fn draw(run_id: &str, unit_id: &str, attempt: i64) -> f64 {
    let mut h = Sha256::new();
    h.update(run_id.as_bytes());
    h.update([0]);
    h.update(unit_id.as_bytes());
    h.update([0]);
    h.update(attempt.to_string().as_bytes());
    let digest = h.finalize();
    let mut first = [0_u8; 8];
    first.copy_from_slice(&digest[..8]);
    // 2^64 as a double is exact; the u64 rounds to the nearest double, which may be 2^64
    // itself for the largest values, so the draw is clamped below 1.
    #[allow(clippy::cast_precision_loss)]
    let u = u64::from_be_bytes(first) as f64 / 18_446_744_073_709_551_616.0;
    u.min(1.0 - f64::EPSILON)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_by_the_factor_up_to_the_cap() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_ms: 100,
            factor: 3.0,
            max_ms: 2_000,
            jitter: 0.0,
        };
        let got: Vec<i64> = (1..=6).map(|n| p.delay_ms("r", "u", n)).collect();
        assert_eq!(got, [100, 300, 900, 2_000, 2_000, 2_000]);
        assert_eq!(p.delay_ms("r", "u", i64::MAX), 2_000);
    }

    #[test]
    fn exhausted_at_max_attempts() {
        let p = RetryPolicy::new(3, 1_000);
        assert_eq!(
            p.after_failure("r", "u", 1, 10),
            AfterFailure::RetryAt(1_010)
        );
        assert_eq!(
            p.after_failure("r", "u", 2, 10),
            AfterFailure::RetryAt(2_010)
        );
        assert_eq!(p.after_failure("r", "u", 3, 10), AfterFailure::Exhausted);
        assert_eq!(p.after_failure("r", "u", 4, 10), AfterFailure::Exhausted);
    }

    #[test]
    fn jitter_stays_within_its_fraction_and_replays_alike() {
        let p = RetryPolicy {
            jitter: 0.5,
            ..RetryPolicy::new(100, 1_000)
        };
        let mut seen = std::collections::HashSet::new();
        for unit in 0..200 {
            let u = unit.to_string();
            let d = p.delay_ms("run", &u, 1);
            assert!((500..=1_500).contains(&d), "{d}");
            assert_eq!(d, p.delay_ms("run", &u, 1));
            seen.insert(d);
        }
        assert!(
            seen.len() > 150,
            "the draw spreads: {} distinct",
            seen.len()
        );
    }

    #[test]
    fn stored_text_round_trips_and_is_canonical() {
        let p = RetryPolicy {
            jitter: 0.25,
            factor: 1.5,
            ..RetryPolicy::new(5, 250)
        };
        let text = p.to_text();
        assert_eq!(
            text,
            r#"{"factor":1.5,"initial_ms":250,"jitter":0.25,"max_attempts":5,"max_ms":3600000}"#
        );
        assert_eq!(RetryPolicy::from_text(&text), Some(p));
        assert_eq!(
            RetryPolicy::new(2, 0).to_text(),
            r#"{"factor":2,"initial_ms":0,"jitter":0,"max_attempts":2,"max_ms":3600000}"#
        );
        assert_eq!(RetryPolicy::from_text("{}"), None);
        // ECMAScript's exponent form, as canonical JSON writes small and large numbers.
        let tiny = RetryPolicy {
            jitter: 1e-7,
            factor: 123_456.5,
            ..RetryPolicy::new(3, 7)
        };
        assert!(
            tiny.to_text().contains(r#""jitter":1e-7"#),
            "{}",
            tiny.to_text()
        );
        assert_eq!(RetryPolicy::from_text(&tiny.to_text()), Some(tiny));
        // Only the stored form is read: other orders, spacing, fields, forms or ranges are not.
        for other in [
            r#"{"initial_ms":250,"factor":1.5,"jitter":0.25,"max_attempts":5,"max_ms":3600000}"#,
            r#"{"factor": 1.5,"initial_ms":250,"jitter":0.25,"max_attempts":5,"max_ms":3600000}"#,
            r#"{"factor":1.5,"initial_ms":250,"jitter":0.25,"max_attempts":5,"max_ms":3600000,"x":1}"#,
            r#"{"factor":1.5,"initial_ms":250,"jitter":0.25,"max_attempts":5}"#,
            r#"{"factor":1.5,"initial_ms":250.0,"jitter":0.25,"max_attempts":5,"max_ms":3600000}"#,
            r#"{"factor":NaN,"initial_ms":250,"jitter":0.25,"max_attempts":5,"max_ms":3600000}"#,
            r#"{"factor":1.5,"initial_ms":250,"jitter":0.25,"max_attempts":0,"max_ms":3600000}"#,
            r#"{"factor":1.5,"initial_ms":250,"jitter":0.25,"max_attempts":5,"max_ms":3600000"#,
        ] {
            assert_eq!(RetryPolicy::from_text(other), None, "{other}");
        }
    }

    #[test]
    fn checks_name_the_field() {
        let err = |p: RetryPolicy| p.check("retry", "").unwrap_err().to_string();
        assert!(err(RetryPolicy::new(0, 1)).contains("retry.max_attempts"));
        assert!(err(RetryPolicy::new(1, -1)).contains("retry.initial_ms"));
        let p = RetryPolicy {
            factor: 0.5,
            ..RetryPolicy::new(1, 1)
        };
        assert!(err(p).contains("retry.factor"));
        let p = RetryPolicy {
            jitter: 1.5,
            ..RetryPolicy::new(1, 1)
        };
        assert!(err(p).contains("retry.jitter"));
        let p = RetryPolicy {
            max_ms: -1,
            ..RetryPolicy::new(1, 1)
        };
        assert!(err(p).contains("retry.max_ms"));
    }
}
