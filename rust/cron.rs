//! Cron schedules in a time zone: the instants ("slots") at which a cron pattern fires.
//!
//! # The pattern
//!
//! Five fields separated by whitespace: minute (0-59), hour (0-23), day-of-month (1-31),
//! month (1-12 or `JAN`-`DEC`) and day-of-week (0-7, where 0 and 7 are Sunday, or
//! `SUN`-`SAT`). Names are three letters, in any case, and only in their own field. Each field
//! takes `*`, a value, a range `a-b`, a step `*/n` or `a-b/n`, and comma-separated lists of
//! these. When both day fields are restricted, a day matches if either does, as in standard
//! cron; a field is unrestricted only when it is exactly `*` (or `?`), so `*/2` restricts.
//!
//! The parser (croner) accepts a few extensions on top, and so does this module:
//! - the shorthands `@yearly` and `@annually` (`0 0 1 1 *`), `@monthly` (`0 0 1 * *`),
//!   `@weekly` (`0 0 * * 0`), `@daily` (`0 0 * * *`) and `@hourly` (`0 * * * *`), each alone;
//! - `?` in either day field, meaning `*`;
//! - in the day-of-month field, `L` (the month's last day), `LW` (its last weekday) and `nW`
//!   (the weekday nearest to day `n`, within the month);
//! - in the day-of-week field, `nL` or `n#L` (the month's last weekday `n`: `5L` is its last
//!   Friday) and `n#k` (its `k`-th weekday `n`, `k` from 1 to 5), where `n` may be a name
//!   (`FRI#2`, `FRI#L`);
//! - a `+` before the day-of-week field, which makes a day match only if both day fields do.
//!
//! Seconds, years, a step from a bare value (`5/15`) and a step without a start (`/15`) are
//! refused. A pattern that matches no date at all (`0 0 30 2 *`) is refused too: the Gregorian
//! calendar repeats every 400 years, weekdays included, so a pattern with no match in one such
//! cycle never fires.
//!
//! # The slots
//!
//! A pattern matches wall-clock times in the schedule's zone. Each matching wall time becomes
//! an instant the way Python's `fold=0` does (jiff's `Disambiguation::Compatible`):
//! - a wall time the clock skips (a spring-forward gap) becomes the instant the gap's length
//!   later, so `02:30` on a day New York skips 02:00-03:00 fires at 03:30 EDT;
//! - a wall time the clock shows twice (a fall-back fold) fires once, at its first occurrence.
//!
//! The slots are the distinct instants so obtained: a skipped `02:30` and a real `03:30` that
//! both land on 03:30 EDT are one slot. Because a skipped wall time lands after the gap, wall
//! order and instant order differ there, and [`CronSchedule::next_after`] orders by instant.
//! Modern zones offset by whole minutes, so a slot is a whole minute of UTC; under the local
//! mean time of some zones before about 1900 an offset has seconds, and so do the slots.

use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};
use croner::{Cron, Weekday};
use jiff::civil::{date, DateTime};
use jiff::tz::{AmbiguousOffset, Offset, TimeZone};
use jiff::{SignedDuration, Timestamp};

use crate::errors::{LedgerError, Result};

/// The longest cron text accepted, in bytes: far past any real pattern, short enough that an
/// error message may quote it.
const MAX_CRON_LEN: usize = 200;

/// The longest time zone name accepted, in bytes (the longest IANA name has 32).
const MAX_ZONE_LEN: usize = 200;

/// The shorthands croner expands, for the message that names them.
const SHORTHANDS: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

const FIVE_FIELDS: &str = "5 fields (minute hour day-of-month month day-of-week)";

/// One of the five fields, for checking it and for naming it in a message.
struct Field {
    name: &'static str,
    /// What the field takes, as the second half of an error message.
    takes: &'static str,
    /// The words (runs of letters, upper case) the field takes. croner replaces month and
    /// weekday names anywhere in the pattern, so without this check `MON` in the hour field
    /// would silently mean 1.
    words: &'static [&'static str],
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        takes: "it takes 0-59 with * , - / such as \"*/15\", \"0,30\" or \"10-40/10\"",
        words: &[],
    },
    Field {
        name: "hour",
        takes: "it takes 0-23 with * , - / such as \"*/2\", \"9,17\" or \"9-17\"",
        words: &[],
    },
    Field {
        name: "day-of-month",
        takes: "it takes 1-31 with * , - / ?, L (last day), LW (last weekday) or nW \
                (weekday nearest day n), such as \"1,15\" or \"L\"",
        words: &["L", "W", "LW"],
    },
    Field {
        name: "month",
        takes: "it takes 1-12 or JAN-DEC with * , - / such as \"1-6\" or \"MAR,SEP\"",
        words: &[
            "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
        ],
    },
    Field {
        name: "day-of-week",
        takes: "it takes 0-7 (0 and 7 are Sunday) or SUN-SAT with * , - / ?, nL (last weekday \
                n of the month) or n#k (k-th weekday n), such as \"MON-FRI\" or \"5#2\"",
        words: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "L"],
    },
];

impl Field {
    fn invalid(&self, value: &str, why: &str) -> LedgerError {
        LedgerError::invalid(
            "cron",
            format!(
                "{} field {value:?} is invalid ({why}); {}",
                self.name, self.takes
            ),
        )
    }

    /// Refuses a word this field does not take.
    fn check_words(&self, value: &str) -> Result<()> {
        for word in value
            .split(|c: char| !c.is_ascii_alphabetic())
            .filter(|w| !w.is_empty())
        {
            let upper = word.to_ascii_uppercase();
            if !self.words.contains(&upper.as_str()) {
                return Err(self.invalid(value, &format!("{word:?} is not a name it takes")));
            }
        }
        Ok(())
    }
}

/// A parsed cron schedule in a time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    cron: Cron,
    zone: TimeZone,
}

impl CronSchedule {
    /// Parse a 5-field cron (minute hour day-of-month month day-of-week) and an IANA zone
    /// name. The module documentation lists what the pattern may contain.
    ///
    /// Errors: [`LedgerError::InvalidArgument`] on `"cron"` for a malformed pattern or one that
    /// never fires, on `"timezone"` for a name the bundled IANA database does not have.
    pub fn parse(cron: &str, timezone: &str) -> Result<Self> {
        Ok(Self {
            cron: parse_cron(cron)?,
            zone: parse_zone(timezone)?,
        })
    }

    /// The first slot strictly after `after_ms` (epoch milliseconds), as epoch milliseconds:
    /// the smallest instant past `after_ms` that some matching wall time resolves to.
    ///
    /// `None` only past the search horizon: when no slot comes before about the year 5000
    /// (where croner stops searching), or when `after_ms` lies outside the years -9999 to 9999
    /// that jiff represents. A schedule that [`CronSchedule::parse`] accepts fires at least
    /// once every 400 years, so for any `after_ms` before the year 4600 a slot is found.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let after = Timestamp::from_millisecond(after_ms).ok()?;
        let (from, inclusive) = self.walk_start(after);
        let mut wall = self.cron.find_next_occurrence(&from, inclusive).ok()?;
        // The best slot so far, and the wall time it shows in the zone.
        let mut best: Option<(Timestamp, DateTime)> = None;
        loop {
            let ambiguous = self.zone.to_ambiguous_timestamp(wall);
            let skipped = matches!(ambiguous.offset(), AmbiguousOffset::Gap { .. });
            let slot = ambiguous.compatible().ok()?;
            if slot > after && best.is_none_or(|(b, _)| slot < b) {
                best = Some((slot, self.zone.to_datetime(slot)));
            }
            // Outside a gap, a later wall time resolves to a later instant, so once the walk
            // reaches the wall time of the best slot nothing further can come before it. A
            // best slot from a skipped wall time shows a later wall time, and the real wall
            // times up to it may still resolve earlier.
            if best.is_some_and(|(_, shown)| wall >= shown) {
                break;
            }
            let mut step_from = wall;
            if slot <= after {
                // One of the real wall times past a gap that `walk_start` stepped back over:
                // the rest of them up to `after`'s own wall time resolve at or before `after`.
                step_from = step_from.max(self.zone.to_datetime(after));
            }
            if skipped {
                // The rest of this gap resolves later than this wall time did: only the real
                // wall times from the gap's end on can still come earlier.
                if let Some(end) = self.gap_end(slot) {
                    step_from = step_from.max(end);
                }
            }
            match self.cron.find_next_occurrence(&step_from, false) {
                Ok(next) => wall = next,
                Err(_) => break,
            }
        }
        best.map(|(slot, _)| slot.as_millisecond())
    }

    /// Just before the first real wall time after the gap that `slot`, the instant a skipped
    /// wall time resolved to, follows: the walk steps on exclusively from here.
    fn gap_end(&self, slot: Timestamp) -> Option<DateTime> {
        let just_after = slot.checked_add(SignedDuration::from_nanos(1)).ok()?;
        let transition = self.zone.preceding(just_after).next()?;
        self.zone
            .to_datetime(transition.timestamp())
            .checked_sub(SignedDuration::from_nanos(1))
            .ok()
    }

    /// Where the walk over matching wall times starts, and whether that wall time itself
    /// counts: every wall time that resolves to an instant past `after` lies at or past it.
    ///
    /// Usually that is `after`'s own wall time, exclusive. Right after a transition it is not:
    /// - a gap just behind `after` holds skipped wall times that land past `after` though
    ///   they read earlier than its wall time, so the walk starts a gap's length earlier (the
    ///   wall times between that are real resolve at or before `after` and are passed over);
    /// - in the second pass of a fold, the repeated wall times resolve to their first pass,
    ///   before `after`, so the walk starts where the fold ends.
    ///
    /// This relies on a zone's transitions lying further apart than the shifts they make,
    /// which every zone in the bundled IANA database does.
    fn walk_start(&self, after: Timestamp) -> (DateTime, bool) {
        let wall = self.zone.to_datetime(after);
        let Some(transition) = after
            .checked_add(SignedDuration::from_nanos(1))
            .ok()
            .and_then(|just_after| self.zone.preceding(just_after).next())
        else {
            return (wall, false);
        };
        let at = transition.timestamp();
        let Ok(before_at) = at.checked_sub(SignedDuration::from_nanos(1)) else {
            return (wall, false);
        };
        let before: Offset = self.zone.to_offset(before_at);
        let shift = i64::from(transition.offset().seconds()) - i64::from(before.seconds());
        let since = after.duration_since(at);
        if since >= SignedDuration::from_secs(shift.abs()) {
            (wall, false)
        } else if shift > 0 {
            (before.to_datetime(after), false)
        } else {
            (before.to_datetime(at), true)
        }
    }
}

fn cron_parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .dom_and_dow(false)
        .build()
}

/// croner's own words for what is wrong, without its prefix.
fn croner_reason(err: &CronError) -> String {
    let text = match err {
        CronError::InvalidPattern(msg)
        | CronError::IllegalCharacters(msg)
        | CronError::ComponentError(msg) => msg.clone(),
        other => other.to_string(),
    };
    text.trim_end_matches('.').to_owned()
}

fn parse_cron(cron: &str) -> Result<Cron> {
    let invalid = |message: String| LedgerError::invalid("cron", message);
    if cron.len() > MAX_CRON_LEN {
        return Err(invalid(format!(
            "is {} bytes long, over the limit of {MAX_CRON_LEN}; pass {FIVE_FIELDS}, such as \
             \"0 * * * *\"",
            cron.len()
        )));
    }
    if cron.contains('\0') {
        return Err(invalid(format!(
            "contains a NUL character: {cron:?}; pass {FIVE_FIELDS} as plain text, such as \
             \"0 * * * *\""
        )));
    }
    let text = cron.trim();
    if text.is_empty() {
        return Err(invalid(format!(
            "is empty; pass {FIVE_FIELDS}, such as \"0 * * * *\""
        )));
    }
    let fields: Vec<&str> = text.split_whitespace().collect();
    if text.starts_with('@') {
        if !SHORTHANDS.iter().any(|s| s.eq_ignore_ascii_case(text)) {
            return Err(invalid(format!(
                "{text:?} is not a shorthand this parser knows; use one of {} or {FIVE_FIELDS}",
                SHORTHANDS.join(", ")
            )));
        }
    } else {
        if fields.len() != 5 {
            let hint = if fields.len() > 5 {
                "; seconds and years are not supported"
            } else {
                ""
            };
            return Err(invalid(format!(
                "must have {FIVE_FIELDS}, got {}: {text:?}{hint}",
                fields.len()
            )));
        }
        for (field, value) in FIELDS.iter().zip(&fields) {
            field.check_words(value.strip_prefix('+').unwrap_or(value))?;
        }
    }
    let parsed = cron_parser()
        .parse(text)
        .map_err(|err| explain(text, &fields, &err))?;
    check_fires(&parsed, text)?;
    Ok(parsed)
}

/// Names the field croner refused: each field is parsed alone, the others set to `*`.
fn explain(text: &str, fields: &[&str], err: &CronError) -> LedgerError {
    if fields.len() == FIELDS.len() {
        for (i, field) in FIELDS.iter().enumerate() {
            let mut probe = ["*"; 5];
            probe[i] = fields[i];
            if let Err(field_err) = cron_parser().parse(&probe.join(" ")) {
                return field.invalid(fields[i], &croner_reason(&field_err));
            }
        }
    }
    LedgerError::invalid(
        "cron",
        format!(
            "{text:?} is invalid ({}); pass {FIVE_FIELDS}, such as \"0 * * * *\"",
            croner_reason(err)
        ),
    )
}

/// Refuses a pattern that never fires.
fn check_fires(cron: &Cron, text: &str) -> Result<()> {
    let never = |why: &str| {
        LedgerError::invalid(
            "cron",
            format!("{text:?} never fires: {why}; change the fields so that some time matches"),
        )
    };
    let pattern = &cron.pattern;
    // An empty time field (",") passes the day scan below, and would then send each search
    // through every hour up to croner's horizon.
    for (component, name) in [
        (&pattern.minutes, "minute"),
        (&pattern.hours, "hour"),
        (&pattern.months, "month"),
    ] {
        if component.values().is_empty() {
            return Err(never(&format!("its {name} field selects no value")));
        }
    }
    // The calendar repeats every 400 years (146,097 days, a whole number of weeks), so a
    // pattern whose date fields match no day of 2000-2399 matches none at all. This scans the
    // days itself rather than asking croner for the next occurrence: croner would search on to
    // its horizon in the year 5000, tens of milliseconds for a pattern that never fires.
    let mut weekday = Weekday::Saturday; // 2000-01-01
    for year in 2000..2400_i16 {
        for month in 1..=12_i8 {
            let length = date(year, month, 1).days_in_month().unsigned_abs();
            let month = u32::from(month.unsigned_abs());
            if pattern.month_match(month).unwrap_or(false) {
                let mut day_weekday = weekday;
                for day in 1..=u32::from(length) {
                    if pattern
                        .day_match(i32::from(year), month, day, day_weekday)
                        .unwrap_or(false)
                    {
                        return Ok(());
                    }
                    day_weekday = day_weekday.shift(1);
                }
            }
            weekday = weekday.shift(i32::from(length));
        }
    }
    Err(never(
        "no date matches its day-of-month, month and day-of-week fields together (February \
         has no day 30, April no day 31, a bare L is no weekday)",
    ))
}

fn parse_zone(timezone: &str) -> Result<TimeZone> {
    let unknown = || {
        let shown = if timezone.len() > MAX_ZONE_LEN {
            format!("a {}-byte name", timezone.len())
        } else {
            format!("{timezone:?}")
        };
        LedgerError::invalid(
            "timezone",
            format!(
                "{shown} is not an IANA time zone name; pass one such as \"Europe/Berlin\" or \
                 \"UTC\""
            ),
        )
    };
    if timezone.len() > MAX_ZONE_LEN || timezone.contains('\0') {
        return Err(unknown());
    }
    // jiff answers "Etc/Unknown" with its placeholder zone rather than an error; it is no
    // IANA zone, so it is refused like any other unknown name.
    match TimeZone::get(timezone) {
        Ok(zone) if !zone.is_unknown() => Ok(zone),
        _ => Err(unknown()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60_000;
    const HOUR: i64 = 60 * MINUTE;
    const DAY: i64 = 24 * HOUR;

    fn ms(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn instant(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).unwrap()
    }

    fn schedule(cron: &str, zone: &str) -> CronSchedule {
        CronSchedule::parse(cron, zone).unwrap()
    }

    /// The first `count` slots after `from`, as UTC text.
    fn slots(cron: &str, zone: &str, from: &str, count: usize) -> Vec<String> {
        let schedule = schedule(cron, zone);
        let mut at = ms(from);
        let mut out = Vec::new();
        for _ in 0..count {
            at = schedule.next_after(at).unwrap();
            out.push(instant(at).to_string());
        }
        out
    }

    /// A matcher written apart from croner for the plain syntax (values, names, `*`, lists,
    /// ranges, steps), so the comparison below also checks how croner was configured.
    struct Reference {
        minutes: Vec<bool>,
        hours: Vec<bool>,
        days: Vec<bool>,
        months: Vec<bool>,
        weekdays: Vec<bool>,
        days_star: bool,
        weekdays_star: bool,
    }

    const MONTH_NAMES: [&str; 13] = [
        "", "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    const WEEKDAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

    impl Reference {
        fn new(cron: &str) -> Self {
            let fields: Vec<&str> = cron.split_whitespace().collect();
            assert_eq!(fields.len(), 5, "{cron}");
            let mut weekdays = Self::field(fields[4], 0, 7, &WEEKDAY_NAMES);
            weekdays[0] |= weekdays[7];
            Self {
                minutes: Self::field(fields[0], 0, 59, &[]),
                hours: Self::field(fields[1], 0, 23, &[]),
                days: Self::field(fields[2], 1, 31, &[]),
                months: Self::field(fields[3], 1, 12, &MONTH_NAMES),
                weekdays,
                days_star: fields[2] == "*",
                weekdays_star: fields[4] == "*",
            }
        }

        fn field(text: &str, low: usize, high: usize, names: &[&str]) -> Vec<bool> {
            let value = |part: &str| {
                names
                    .iter()
                    .position(|name| name.eq_ignore_ascii_case(part))
                    .unwrap_or_else(|| part.parse().unwrap())
            };
            let mut set = vec![false; high + 1];
            for part in text.split(',') {
                let (range, step) = match part.split_once('/') {
                    Some((range, step)) => (range, step.parse().unwrap()),
                    None => (part, 1),
                };
                let (first, last) = if range == "*" {
                    (low, high)
                } else if let Some((first, last)) = range.split_once('-') {
                    (value(first), value(last))
                } else {
                    (value(range), value(range))
                };
                for v in (first..=last).step_by(step) {
                    set[v] = true;
                }
            }
            set
        }

        fn matches(&self, wall: DateTime) -> bool {
            let index = |v: i8| usize::try_from(v).unwrap();
            let day = self.days[index(wall.day())];
            let weekday =
                self.weekdays[usize::from(wall.weekday().to_sunday_zero_offset().unsigned_abs())];
            let day_ok = if self.days_star || self.weekdays_star {
                day && weekday
            } else {
                day || weekday
            };
            self.minutes[index(wall.minute())]
                && self.hours[index(wall.hour())]
                && self.months[index(wall.month())]
                && day_ok
        }
    }

    /// Every slot in `[from, until]`, found by trying every minute: an instant is a slot when
    /// some matching wall time resolves to it, either its own wall time (when the instant is
    /// that wall time's first occurrence) or a skipped wall time shifted forward onto it. Such
    /// a wall time reads the instant plus one of the zone's offsets, so trying each offset the
    /// zone uses nearby covers both.
    fn reference_slots(reference: &Reference, zone: &TimeZone, from: i64, until: i64) -> Vec<i64> {
        let mut offsets: Vec<Offset> = Vec::new();
        let mut probe = from - 2 * DAY;
        while probe <= until + 2 * DAY {
            let offset = zone.to_offset(instant(probe));
            if !offsets.contains(&offset) {
                offsets.push(offset);
            }
            probe += 15 * MINUTE;
        }
        let mut out = Vec::new();
        let mut at = from.div_euclid(MINUTE) * MINUTE;
        while at <= until {
            let ts = instant(at);
            let is_slot = offsets.iter().any(|offset| {
                let wall = offset.to_datetime(ts);
                reference.matches(wall)
                    && zone.to_ambiguous_timestamp(wall).compatible().unwrap() == ts
            });
            if is_slot && at >= from {
                out.push(at);
            }
            at += MINUTE;
        }
        out
    }

    /// Compares `next_after` with the reference for `after` at every minute of `window` (and
    /// just before it, and half a minute into it), looking up to `horizon` past the window.
    fn check_window(cron: &str, zone_name: &str, window: (i64, i64), horizon: i64) {
        let schedule = schedule(cron, zone_name);
        let zone = TimeZone::get(zone_name).unwrap();
        let until = window.1 + horizon;
        let expected = reference_slots(&Reference::new(cron), &zone, window.0 - MINUTE, until);
        let mut minute = window.0;
        while minute <= window.1 {
            for after in [minute - 1, minute, minute + 29_999] {
                let got = schedule.next_after(after);
                match expected.iter().find(|&&slot| slot > after) {
                    Some(&want) => assert_eq!(
                        got.map(instant),
                        Some(instant(want)),
                        "{cron:?} in {zone_name} after {}",
                        instant(after)
                    ),
                    None => assert!(
                        got.is_none_or(|g| g > until),
                        "{cron:?} in {zone_name} after {}: {:?} but the reference has none \
                         up to {}",
                        instant(after),
                        got.map(instant),
                        instant(until)
                    ),
                }
            }
            minute += MINUTE;
        }
    }

    /// Windows of four hours either side of each transition in 2026 and 2027.
    fn transition_windows(zone_name: &str) -> Vec<(i64, i64)> {
        let zone = TimeZone::get(zone_name).unwrap();
        let end = ms("2028-01-01T00:00:00Z");
        let windows: Vec<(i64, i64)> = zone
            .following(instant(ms("2026-01-01T00:00:00Z")))
            .map(|t| t.timestamp().as_millisecond())
            .take_while(|&at| at < end)
            .map(|at| (at - 4 * HOUR, at + 4 * HOUR))
            .collect();
        assert_eq!(windows.len(), 4, "{zone_name}");
        windows
    }

    const DST_ZONES: [&str; 3] = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"];

    fn all_windows() -> Vec<(&'static str, (i64, i64))> {
        let mut out: Vec<(&str, (i64, i64))> = DST_ZONES
            .iter()
            .flat_map(|&zone| transition_windows(zone).into_iter().map(move |w| (zone, w)))
            .collect();
        for around in ["2026-03-29T01:00:00Z", "2026-12-31T23:00:00Z"] {
            out.push(("UTC", (ms(around) - 4 * HOUR, ms(around) + 4 * HOUR)));
        }
        out
    }

    #[test]
    fn cron_matches_the_reference_around_transitions() {
        let crons = [
            "*/30 * * * *",
            "10,50 2,4 * * *",
            "30 2 * * *",
            "0 * * * *",
            "15 1 * * *",
            "0 0 * * MON",
            "0 9 1 * *",
            "0 12 13 * FRI",
            "* * * * *",
            "45 1,2 * * *",
            "0,30 2-3 * * *",
            "15,30 2 * * *",
        ];
        for (zone, window) in all_windows() {
            for cron in crons {
                check_window(cron, zone, window, 40 * DAY);
            }
        }
    }

    /// A deterministic linear congruential generator: varied patterns without a dependency.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            usize::try_from(self.0 >> 33).unwrap() % n
        }

        fn pick<'a>(&mut self, options: &[&'a str]) -> &'a str {
            options[self.below(options.len())]
        }
    }

    fn random_cron(rng: &mut Lcg) -> String {
        let minute = match rng.below(6) {
            0 => "*".to_owned(),
            1 => format!("*/{}", rng.pick(&["5", "10", "15", "20", "30"])),
            2 => rng.below(60).to_string(),
            3 => format!("{},{}", rng.below(30), 30 + rng.below(30)),
            4 => {
                let first = rng.below(50);
                format!("{first}-{}", first + rng.below(10))
            }
            _ => format!(
                "{}-{}/{}",
                rng.below(20),
                40 + rng.below(20),
                1 + rng.below(15)
            ),
        };
        // Transitions happen in the small hours, so the hours favour them.
        let hour = match rng.below(5) {
            0 => "*".to_owned(),
            1 => rng.below(5).to_string(),
            2 => format!("{},{}", rng.below(4), 1 + rng.below(23)),
            3 => {
                let first = rng.below(4);
                format!("{first}-{}", first + rng.below(4))
            }
            _ => format!("*/{}", 1 + rng.below(4)),
        };
        let day = match rng.below(6) {
            0 => (1 + rng.below(28)).to_string(),
            1 => format!("{}-{}", 1 + rng.below(10), 11 + rng.below(20)),
            _ => "*".to_owned(),
        };
        let month = match rng.below(8) {
            0 => "3-4,10-11".to_owned(),
            1 => "MAR,APR,OCT,NOV".to_owned(),
            _ => "*".to_owned(),
        };
        let weekday = match rng.below(6) {
            0 => rng.below(8).to_string(),
            1 => "MON-FRI".to_owned(),
            2 => "SAT,SUN".to_owned(),
            _ => "*".to_owned(),
        };
        format!("{minute} {hour} {day} {month} {weekday}")
    }

    #[test]
    fn cron_random_patterns_match_the_reference_around_transitions() {
        let mut rng = Lcg(0x5eed_f00d);
        let windows = all_windows();
        for _ in 0..60 {
            let cron = random_cron(&mut rng);
            for &(zone, window) in &windows {
                check_window(&cron, zone, window, 12 * DAY);
            }
        }
    }

    #[test]
    fn cron_new_york_spring_forward_fires_once_after_the_gap() {
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT, so 02:30 is 03:30 EDT.
        assert_eq!(
            slots("30 2 * * *", "America/New_York", "2026-03-07T00:00:00Z", 3),
            [
                "2026-03-07T07:30:00Z",
                "2026-03-08T07:30:00Z",
                "2026-03-09T06:30:00Z"
            ]
        );
    }

    #[test]
    fn cron_new_york_fall_back_fires_once_at_the_first_pass() {
        // 2026-11-01: 02:00 EDT falls back to 01:00 EST, so 01:30 happens twice.
        assert_eq!(
            slots("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2),
            ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
        );
        let s = schedule("30 1 * * *", "America/New_York");
        // From inside the second pass the next slot is the next day's, not 01:30 EST.
        assert_eq!(
            s.next_after(ms("2026-11-01T06:00:00Z")),
            Some(ms("2026-11-02T06:30:00Z"))
        );
    }

    #[test]
    fn cron_berlin_hourly_across_fall_back() {
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET at 01:00Z. The repeated 02:00 fires
        // at its first pass only (00:00Z), so 01:00Z (02:00 CET) is no slot.
        assert_eq!(
            slots("0 * * * *", "Europe/Berlin", "2026-10-24T21:30:00Z", 6),
            [
                "2026-10-24T22:00:00Z",
                "2026-10-24T23:00:00Z",
                "2026-10-25T00:00:00Z",
                "2026-10-25T02:00:00Z",
                "2026-10-25T03:00:00Z",
                "2026-10-25T04:00:00Z"
            ]
        );
    }

    #[test]
    fn cron_berlin_spring_forward_shifts_the_skipped_time() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 becomes 03:30 CEST.
        assert_eq!(
            slots("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 2),
            ["2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"]
        );
    }

    #[test]
    fn cron_skipped_time_orders_by_instant_not_wall_time() {
        // After 03:20 EDT the skipped 02:50 (03:50 EDT) comes before 04:10 EDT.
        assert_eq!(
            slots(
                "10,50 2,4 * * *",
                "America/New_York",
                "2026-03-08T07:20:00Z",
                2
            ),
            ["2026-03-08T07:50:00Z", "2026-03-08T08:10:00Z"]
        );
    }

    #[test]
    fn cron_skipped_and_real_times_on_one_instant_are_one_slot() {
        // 02:30 (skipped) and 03:30 both resolve to 03:30 EDT.
        assert_eq!(
            slots(
                "30 2,3 * * *",
                "America/New_York",
                "2026-03-08T06:00:00Z",
                3
            ),
            [
                "2026-03-08T07:30:00Z",
                "2026-03-09T06:30:00Z",
                "2026-03-09T07:30:00Z"
            ]
        );
    }

    #[test]
    fn cron_lord_howe_half_hour_shifts() {
        // 2026-10-04: 02:00 +10:30 jumps to 02:30 +11; 02:15 becomes 02:45 +11.
        assert_eq!(
            slots(
                "15 2 * * *",
                "Australia/Lord_Howe",
                "2026-10-03T12:00:00Z",
                2
            ),
            ["2026-10-03T15:45:00Z", "2026-10-04T15:15:00Z"]
        );
        // A skipped 02:15 lands at 02:45, after the real 02:30.
        assert_eq!(
            slots(
                "15,30 2 * * *",
                "Australia/Lord_Howe",
                "2026-10-03T12:00:00Z",
                3
            ),
            [
                "2026-10-03T15:30:00Z",
                "2026-10-03T15:45:00Z",
                "2026-10-04T15:15:00Z"
            ]
        );
        // 2026-04-05: 02:00 +11 falls back to 01:30 +10:30; 01:45 fires at +11 only.
        assert_eq!(
            slots(
                "45 1 * * *",
                "Australia/Lord_Howe",
                "2026-04-04T12:00:00Z",
                2
            ),
            ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]
        );
    }

    #[test]
    fn cron_next_is_strictly_after() {
        let s = schedule("*/15 * * * *", "UTC");
        let at = |t: &str| s.next_after(ms(t)).map(instant).map(|t| t.to_string());
        assert_eq!(at("2026-01-01T00:00:00Z").unwrap(), "2026-01-01T00:15:00Z");
        assert_eq!(
            at("2026-01-01T00:14:59.999Z").unwrap(),
            "2026-01-01T00:15:00Z"
        );
        assert_eq!(at("2026-01-01T00:15:00Z").unwrap(), "2026-01-01T00:30:00Z");
        assert_eq!(at("2026-12-31T23:59:00Z").unwrap(), "2027-01-01T00:00:00Z");
        // Before 1970 too.
        assert_eq!(at("1969-12-31T23:50:00Z").unwrap(), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn cron_day_fields_are_ored_when_both_are_restricted() {
        assert_eq!(
            slots("0 12 13 * FRI", "UTC", "2026-04-01T00:00:00Z", 4),
            [
                "2026-04-03T12:00:00Z",
                "2026-04-10T12:00:00Z",
                "2026-04-13T12:00:00Z",
                "2026-04-17T12:00:00Z"
            ]
        );
    }

    #[test]
    fn cron_extensions_croner_accepts() {
        let first = |cron: &str| slots(cron, "UTC", "2026-03-01T00:00:00Z", 1).remove(0);
        assert_eq!(first("@daily"), "2026-03-02T00:00:00Z");
        assert_eq!(first("@Weekly"), "2026-03-08T00:00:00Z");
        assert_eq!(first("0 0 L * *"), "2026-03-31T00:00:00Z");
        assert_eq!(first("0 0 LW 5 *"), "2026-05-29T00:00:00Z");
        assert_eq!(first("0 0 14W * *"), "2026-03-13T00:00:00Z");
        assert_eq!(first("0 0 * * 5#2"), "2026-03-13T00:00:00Z");
        assert_eq!(first("0 0 * * FRI#L"), "2026-03-27T00:00:00Z");
        assert_eq!(first("0 0 ? * mon"), "2026-03-02T00:00:00Z");
        assert_eq!(first("0 0 13 * +FRI"), "2026-03-13T00:00:00Z");
        assert_eq!(first("0 0 * * 7"), "2026-03-08T00:00:00Z");
        assert_eq!(first("0 0 1 jan-feb *"), "2027-01-01T00:00:00Z");
    }

    #[test]
    fn cron_out_of_range_instants_give_none() {
        let s = schedule("* * * * *", "Europe/Berlin");
        assert_eq!(s.next_after(i64::MAX), None);
        assert_eq!(s.next_after(i64::MIN), None);
        assert_eq!(s.next_after(ms("9999-12-30T00:00:00Z")), None);
        let yearly = schedule("0 0 1 1 *", "UTC");
        assert_eq!(yearly.next_after(ms("6000-06-01T00:00:00Z")), None);
    }

    fn refused(cron: &str, zone: &str) -> (String, String) {
        match CronSchedule::parse(cron, zone).unwrap_err() {
            LedgerError::InvalidArgument { argument, message } => (argument, message),
            other => panic!("{other:?}"),
        }
    }

    #[track_caller]
    fn assert_refused(cron: &str, zone: &str, argument: &str, words: &[&str]) {
        let (got, message) = refused(cron, zone);
        assert_eq!(got, argument, "{cron:?} {zone:?}: {message}");
        for word in words {
            assert!(
                message.contains(word),
                "{cron:?}: {message:?} lacks {word:?}"
            );
        }
    }

    #[test]
    fn cron_refuses_malformed_patterns() {
        assert_refused(
            "0 0 * * * *",
            "UTC",
            "cron",
            &["must have 5 fields (minute hour day-of-month month day-of-week), got 6"],
        );
        assert_refused("0 0 * *", "UTC", "cron", &["got 4"]);
        assert_refused("", "UTC", "cron", &["empty"]);
        assert_refused("   ", "UTC", "cron", &["empty"]);
        assert_refused(
            "60 * * * *",
            "UTC",
            "cron",
            &["minute field \"60\"", "0-59"],
        );
        assert_refused("* 24 * * *", "UTC", "cron", &["hour field \"24\"", "0-23"]);
        assert_refused("* * 0 * *", "UTC", "cron", &["day-of-month field \"0\""]);
        assert_refused("* * * 13 *", "UTC", "cron", &["month field \"13\""]);
        assert_refused("* * * * 8", "UTC", "cron", &["day-of-week field \"8\""]);
        assert_refused("* * * * 5-1", "UTC", "cron", &["day-of-week field \"5-1\""]);
        assert_refused("*/0 * * * *", "UTC", "cron", &["minute field \"*/0\""]);
        assert_refused("5/15 * * * *", "UTC", "cron", &["minute field \"5/15\""]);
        assert_refused("* * * FOO *", "UTC", "cron", &["month field \"FOO\""]);
        assert_refused(
            "* * * * MONDAY",
            "UTC",
            "cron",
            &["day-of-week field \"MONDAY\""],
        );
        // croner would read a name in any field; here a name belongs to its own field.
        assert_refused("MON * * * *", "UTC", "cron", &["minute field \"MON\""]);
        assert_refused("0 0 * * JAN", "UTC", "cron", &["day-of-week field \"JAN\""]);
        assert_refused("0 0 * MON *", "UTC", "cron", &["month field \"MON\""]);
        assert_refused("@reboot", "UTC", "cron", &["@daily"]);
        assert_refused("0 0 * * *\0", "UTC", "cron", &["NUL"]);
        assert_refused(&"0 ".repeat(101), "UTC", "cron", &["202 bytes", "200"]);
    }

    #[test]
    fn cron_refuses_patterns_that_never_fire() {
        for cron in ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 * * L", ", * * * *"] {
            assert_refused(cron, "UTC", "cron", &["never fires"]);
        }
        // Rare is not never: 29 February on a Monday.
        assert_eq!(
            slots("0 0 29 2 +MON", "UTC", "2026-01-01T00:00:00Z", 1),
            ["2044-02-29T00:00:00Z"]
        );
    }

    #[test]
    fn cron_refuses_unknown_zones() {
        let (argument, message) = refused("* * * * *", "Mars/Base");
        assert_eq!(argument, "timezone");
        assert_eq!(
            message,
            "\"Mars/Base\" is not an IANA time zone name; pass one such as \"Europe/Berlin\" \
             or \"UTC\""
        );
        for zone in ["", "Etc/Unknown", "Europe/Berlin\0", "../../etc/passwd"] {
            assert_refused(
                "* * * * *",
                zone,
                "timezone",
                &["not an IANA time zone name"],
            );
        }
        // The cron is checked first.
        assert_refused("bad", "Mars/Base", "cron", &[]);
        assert!(CronSchedule::parse("* * * * *", "europe/berlin").is_ok());
    }
}
