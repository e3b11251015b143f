//! Proleptic Gregorian dates as day numbers, after Howard Hinnant's `days_from_civil` and
//! `civil_from_days`, and their weekdays (1970-01-01 was a Thursday), month and weekday names,
//! and English ordinals.

/// English month names, January first.
pub const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// English weekday names, Monday first (the order of [`Date::weekday`]).
pub const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// A calendar date (proleptic Gregorian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date {
    year: i32,
    month: u32,
    day: u32,
}

/// Whether `year` has a 29 February.
pub const fn is_leap_year(year: i32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// The number of days in `month` (1–12) of `year`; 0 for a month out of range.
pub const fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(year) => 29,
        2 => 28,
        _ => 0,
    }
}

impl Date {
    /// The date `year-month-day`, or `None` if no such day exists (month outside 1–12, day outside
    /// the month).
    pub const fn new(year: i32, month: u32, day: u32) -> Option<Self> {
        if day >= 1 && day <= days_in_month(year, month) {
            Some(Self { year, month, day })
        } else {
            None
        }
    }

    /// The year.
    pub fn year(self) -> i32 {
        self.year
    }

    /// The month, 1–12.
    pub fn month(self) -> u32 {
        self.month
    }

    /// The day of the month, 1–31.
    pub fn day(self) -> u32 {
        self.day
    }

    /// Days since 1970-01-01 (negative before it).
    pub fn to_days(self) -> i64 {
        let y = i64::from(self.year) - i64::from(self.month <= 2);
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let m = i64::from(self.month);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(self.day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// The date `days` after 1970-01-01 (before it when negative); `None` if the year would not
    /// fit an `i32`.
    pub fn from_days(days: i64) -> Option<Self> {
        let z = days.checked_add(719_468)?;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Some(Self { year: i32::try_from(year).ok()?, month, day })
    }

    /// The weekday: 0 = Monday … 6 = Sunday.
    pub fn weekday(self) -> usize {
        (self.to_days() + 3).rem_euclid(7) as usize
    }

    /// The weekday's English name.
    pub fn weekday_name(self) -> &'static str {
        WEEKDAYS[self.weekday()]
    }

    /// The month's English name.
    pub fn month_name(self) -> &'static str {
        MONTHS[self.month as usize - 1]
    }

    /// The date written `YYYY-MM-DD` (exactly: four-digit year, two-digit month and day), or
    /// `None` for any other text or a day the calendar lacks (`2021-02-30`).
    ///
    /// ```
    /// use attn_train::data::Date;
    /// assert_eq!(Date::parse_iso("2000-02-29"), Date::new(2000, 2, 29));
    /// for bad in ["2021-02-29", "2021-13-01", "2021-00-10", "2021-3-03", "2021-03-03 ", "0000-00-00", ""] {
    ///     assert_eq!(Date::parse_iso(bad), None, "{bad}");
    /// }
    /// ```
    pub fn parse_iso(text: &str) -> Option<Self> {
        let b = text.as_bytes();
        let digits = |r: std::ops::Range<usize>| -> Option<u32> {
            b[r].iter().try_fold(0u32, |n, &c| c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0')))
        };
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        Self::new(digits(0..4)? as i32, digits(5..7)?, digits(8..10)?)
    }

    /// `YYYY-MM-DD` (ISO 8601, the task's target).
    pub fn iso(self) -> String {
        format!("{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// `n` with its English ordinal suffix: `1st`, `2nd`, `3rd`, `4th`, `11th`, `12th`, `13th`,
/// `21st`, `22nd`, `23rd`, `111th`.
pub fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}
