//! Periods: the ISO week, day or month an instant falls in, counted in a
//! campaign's time zone. A period is part of every dedup key, so "once per
//! week" means once per ISO week as the campaign's audience lives it.
//! Also when a wall-clock hour comes in a zone (for local-hour delivery).

use chrono::{DateTime, Datelike, Days, NaiveDate, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde::Deserialize;

/// How a campaign's periods are counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeriodKind {
    /// ISO 8601 week, `2026-W48` (weeks start on Monday; the year is the ISO year).
    #[default]
    Week,
    /// Calendar day, `2026-11-29`.
    Day,
    /// Calendar month, `2026-11`.
    Month,
}

impl PeriodKind {
    pub fn name(self) -> &'static str {
        match self {
            PeriodKind::Week => "week",
            PeriodKind::Day => "day",
            PeriodKind::Month => "month",
        }
    }

    /// The longest such period, counting a DST shift (for retention checks).
    pub(crate) fn max_length_seconds(self) -> u64 {
        let day = 86_400 + 3_600;
        match self {
            PeriodKind::Week => 7 * day,
            PeriodKind::Day => day,
            PeriodKind::Month => 31 * day,
        }
    }

    /// The period `at` falls in, as seen in `tz`.
    pub(crate) fn period_at(self, at: DateTime<Utc>, tz: Tz) -> String {
        let local = tz.from_utc_datetime(&at.naive_utc());
        match self {
            PeriodKind::Week => {
                let week = local.iso_week();
                format!("{}-W{:02}", week.year(), week.week())
            }
            PeriodKind::Day => local.format("%Y-%m-%d").to_string(),
            PeriodKind::Month => local.format("%Y-%m").to_string(),
        }
    }

    /// The local date a period `s` starts on; `None` unless `s` is a real period
    /// of this kind (so `2026-W53` is one and `2025-W53` is not).
    fn first_day(self, s: &str) -> Option<NaiveDate> {
        if !self.is_well_formed(s) {
            return None;
        }
        match self {
            PeriodKind::Week => {
                let (y, w) = s.split_once("-W")?;
                NaiveDate::from_isoywd_opt(y.parse().ok()?, w.parse().ok()?, chrono::Weekday::Mon)
            }
            PeriodKind::Day => NaiveDate::parse_from_str(s, "%Y-%m-%d").ok(),
            PeriodKind::Month => NaiveDate::parse_from_str(&format!("{s}-01"), "%Y-%m-%d").ok(),
        }
    }

    /// When period `s` starts, as seen in `tz` (its first local midnight).
    pub fn start(self, s: &str, tz: Tz) -> Option<DateTime<Utc>> {
        let day = self.first_day(s)?;
        midnight(day, tz)
    }

    /// The period after `s`.
    pub fn next(self, s: &str, tz: Tz) -> Option<String> {
        let day = self.first_day(s)?;
        let after = match self {
            PeriodKind::Week => day + chrono::Days::new(7),
            PeriodKind::Day => day + chrono::Days::new(1),
            PeriodKind::Month => day + chrono::Months::new(1),
        };
        Some(self.period_at(midnight(after, tz)?, tz))
    }

    /// The period before `s`.
    pub fn previous(self, s: &str, tz: Tz) -> Option<String> {
        let start = self.start(s, tz)?;
        Some(self.period_at(start - chrono::Duration::seconds(1), tz))
    }

    /// Whether `s` is a real period of this kind (`--period` from an operator).
    #[cfg(test)]
    fn is_valid(self, s: &str) -> bool {
        self.first_day(s).is_some()
    }

    fn is_well_formed(self, s: &str) -> bool {
        let digits = |part: &str, n: usize| part.len() == n && part.bytes().all(|b| b.is_ascii_digit());
        let parts: Vec<&str> = s.split('-').collect();
        match (self, parts.as_slice()) {
            (PeriodKind::Week, [y, w]) => {
                digits(y, 4)
                    && w.strip_prefix('W')
                        .is_some_and(|n| digits(n, 2) && (1..=53).contains(&n.parse::<u32>().unwrap_or(0)))
            }
            (PeriodKind::Day, [y, m, d]) => {
                digits(y, 4) && digits(m, 2) && digits(d, 2) && chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok()
            }
            (PeriodKind::Month, [y, m]) => {
                digits(y, 4) && digits(m, 2) && (1..=12).contains(&m.parse::<u32>().unwrap_or(0))
            }
            _ => false,
        }
    }
}

/// The first instant of local day `day` in `tz` (a DST gap at midnight moves it later).
fn midnight(day: NaiveDate, tz: Tz) -> Option<DateTime<Utc>> {
    let local = day.and_hms_opt(0, 0, 0)?;
    (0..4)
        .find_map(|h| tz.from_local_datetime(&(local + chrono::Duration::hours(h))).earliest())
        .map(|t| t.with_timezone(&Utc))
}

/// The first instant at or after `from` when the wall clock in `tz` reads `at`
/// (a time skipped by DST: the first instant after the gap; a repeated one: its
/// first occurrence); if that is not before `until`, `from` (send at once).
pub(crate) fn release_at(at: NaiveTime, tz: Tz, from: DateTime<Utc>, until: DateTime<Utc>) -> DateTime<Utc> {
    let mut day = from.with_timezone(&tz).date_naive();
    for _ in 0..3 {
        let wall = day.and_time(at);
        let instant = tz
            .from_local_datetime(&wall)
            .earliest()
            .or_else(|| tz.from_local_datetime(&(wall + chrono::Duration::hours(1))).earliest())
            .map(|t| t.with_timezone(&Utc));
        if let Some(t) = instant.filter(|t| *t >= from) {
            return if t < until { t } else { from };
        }
        day = day.checked_add_days(Days::new(1)).unwrap_or(day);
    }
    from
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::Asia::Tokyo;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn week_turns_at_monday_midnight_in_tokyo() {
        // Sunday 2026-11-29 23:59 JST is 14:59 UTC; Monday 00:00 JST is 15:00 UTC.
        assert_eq!(PeriodKind::Week.period_at(utc("2026-11-29T14:59:00Z"), Tokyo), "2026-W48");
        assert_eq!(PeriodKind::Week.period_at(utc("2026-11-29T15:00:00Z"), Tokyo), "2026-W49");
        // In UTC both instants are still Sunday: the zone decides.
        assert_eq!(PeriodKind::Week.period_at(utc("2026-11-29T15:00:00Z"), chrono_tz::UTC), "2026-W48");
    }

    #[test]
    fn iso_year_boundary() {
        // Thursday 2026-12-31 is in 2026-W53; Friday 2027-01-01 JST is still 2026-W53;
        // Monday 2027-01-04 JST starts 2027-W01.
        assert_eq!(PeriodKind::Week.period_at(utc("2026-12-31T03:00:00Z"), Tokyo), "2026-W53");
        assert_eq!(PeriodKind::Week.period_at(utc("2027-01-01T03:00:00Z"), Tokyo), "2026-W53");
        assert_eq!(PeriodKind::Week.period_at(utc("2027-01-03T14:59:59Z"), Tokyo), "2026-W53");
        assert_eq!(PeriodKind::Week.period_at(utc("2027-01-03T15:00:00Z"), Tokyo), "2027-W01");
        // 2024-12-30 (Monday) belongs to ISO year 2025.
        assert_eq!(PeriodKind::Week.period_at(utc("2024-12-30T00:00:00Z"), Tokyo), "2025-W01");
    }

    #[test]
    fn day_and_month_follow_the_zone() {
        let at = utc("2026-11-30T15:30:00Z"); // 2026-12-01 00:30 JST
        assert_eq!(PeriodKind::Day.period_at(at, Tokyo), "2026-12-01");
        assert_eq!(PeriodKind::Month.period_at(at, Tokyo), "2026-12");
        assert_eq!(PeriodKind::Month.period_at(at, chrono_tz::UTC), "2026-11");
    }

    #[test]
    fn operator_periods_are_checked() {
        assert!(PeriodKind::Week.is_valid("2026-W48"));
        assert!(!PeriodKind::Week.is_valid("2026-W54"));
        assert!(!PeriodKind::Week.is_valid("2026-48"));
        assert!(PeriodKind::Day.is_valid("2026-02-28"));
        assert!(!PeriodKind::Day.is_valid("2026-02-30"));
        assert!(PeriodKind::Month.is_valid("2026-12"));
        assert!(!PeriodKind::Month.is_valid("2026-13"));
        // 2026 has 53 ISO weeks, 2025 has 52.
        assert!(PeriodKind::Week.is_valid("2026-W53"));
        assert!(!PeriodKind::Week.is_valid("2025-W53"));
    }

    #[test]
    fn periods_start_at_local_midnight_and_step() {
        let week = PeriodKind::Week;
        assert_eq!(week.start("2026-W49", Tokyo).unwrap(), utc("2026-11-29T15:00:00Z"));
        assert_eq!(week.next("2026-W53", Tokyo).as_deref(), Some("2027-W01"));
        assert_eq!(week.previous("2027-W01", Tokyo).as_deref(), Some("2026-W53"));
        assert_eq!(PeriodKind::Month.next("2026-12", Tokyo).as_deref(), Some("2027-01"));
        assert_eq!(PeriodKind::Day.previous("2026-03-01", Tokyo).as_deref(), Some("2026-02-28"));
        // A zone whose DST starts at midnight (America/Santiago, 2026-09-06).
        let santiago = chrono_tz::America::Santiago;
        assert!(PeriodKind::Day.start("2026-09-06", santiago).is_some());
    }
}
