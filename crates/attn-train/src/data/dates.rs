//! The built-in task: a date between 1950-01-01 and 2049-12-31 written in one of fourteen forms
//! ([`DateFormat`]) → its ISO form `YYYY-MM-DD`.
//!
//! Held-out scheme ([`DatesTask`]): from the seed, a uniform random set of whole dates (1,000 by
//! default) is set aside; training draws only from the other dates, so no held-out date is ever
//! trained on, in any form. Training example `i` draws a date uniformly from the training dates
//! and a form uniformly from the fourteen, as a pure function of `(seed, i)`. The held-out dates
//! cycle through the forms in order, so each form is evaluated about equally often.

use crate::data::calendar::{ordinal, Date, MONTHS, WEEKDAYS};
use crate::data::error::DataError;
use crate::data::pairs::Pair;
use crate::data::sample::{below, shuffle_prefix, stream};
use crate::data::vocab::Vocab;

/// The first date of the task, 1950-01-01.
pub const FIRST_DAY: Date = const_date(1950, 1, 1);
/// The last date of the task, 2049-12-31.
pub const LAST_DAY: Date = const_date(2049, 12, 31);
/// How many dates [`DatesTask::new`] holds out.
pub const DEFAULT_HELD_OUT: usize = 1000;

const SALT_HELD_OUT: u64 = 0x4845_4C44_4F55_5431;
const SALT_TRAIN: u64 = 0x5452_4149_4E49_4E47;

/// A way of writing a date; the examples are 2021-03-03.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DateFormat {
    /// `3 March 2021`
    DayMonthYear,
    /// `3 march 2021`
    DayLowerMonthYear,
    /// `March 3, 2021`
    MonthDayCommaYear,
    /// `March 3 2021`
    MonthDayYear,
    /// `March 3rd, 2021`
    MonthOrdinalCommaYear,
    /// `the 3rd of March 2021`
    TheOrdinalOfMonthYear,
    /// `3 Mar 2021`
    DayShortMonthYear,
    /// `Mar 3, 2021`
    ShortMonthDayCommaYear,
    /// `Wednesday, March 3, 2021`
    WeekdayMonthDayCommaYear,
    /// `Wed 3 Mar 2021`
    ShortWeekdayDayShortMonthYear,
    /// `03/03/2021` (US: month first)
    UsSlashes,
    /// `3.3.2021` (day first)
    Dots,
    /// `03.03.2021` (day first)
    PaddedDots,
    /// `2021-03-03`
    Iso,
}

impl DateFormat {
    /// Every form, in the order of the variants.
    pub const ALL: [DateFormat; 14] = [
        DateFormat::DayMonthYear,
        DateFormat::DayLowerMonthYear,
        DateFormat::MonthDayCommaYear,
        DateFormat::MonthDayYear,
        DateFormat::MonthOrdinalCommaYear,
        DateFormat::TheOrdinalOfMonthYear,
        DateFormat::DayShortMonthYear,
        DateFormat::ShortMonthDayCommaYear,
        DateFormat::WeekdayMonthDayCommaYear,
        DateFormat::ShortWeekdayDayShortMonthYear,
        DateFormat::UsSlashes,
        DateFormat::Dots,
        DateFormat::PaddedDots,
        DateFormat::Iso,
    ];

    /// `date` written in this form.
    pub fn render(self, date: Date) -> String {
        let (y, m, d) = (date.year(), date.month(), date.day());
        let month = date.month_name();
        let mon = &month[..3];
        let weekday = date.weekday_name();
        match self {
            DateFormat::DayMonthYear => format!("{d} {month} {y}"),
            DateFormat::DayLowerMonthYear => format!("{d} {} {y}", month.to_lowercase()),
            DateFormat::MonthDayCommaYear => format!("{month} {d}, {y}"),
            DateFormat::MonthDayYear => format!("{month} {d} {y}"),
            DateFormat::MonthOrdinalCommaYear => format!("{month} {}, {y}", ordinal(d)),
            DateFormat::TheOrdinalOfMonthYear => format!("the {} of {month} {y}", ordinal(d)),
            DateFormat::DayShortMonthYear => format!("{d} {mon} {y}"),
            DateFormat::ShortMonthDayCommaYear => format!("{mon} {d}, {y}"),
            DateFormat::WeekdayMonthDayCommaYear => format!("{weekday}, {month} {d}, {y}"),
            DateFormat::ShortWeekdayDayShortMonthYear => format!("{} {d} {mon} {y}", &weekday[..3]),
            DateFormat::UsSlashes => format!("{m:02}/{d:02}/{y}"),
            DateFormat::Dots => format!("{d}.{m}.{y}"),
            DateFormat::PaddedDots => format!("{d:02}.{m:02}.{y}"),
            DateFormat::Iso => date.iso(),
        }
    }
}

/// One word of [`DatesTask::fold_case`].
fn fold_word(word: &str) -> String {
    let lower = word.to_lowercase();
    if ["the", "of", "st", "nd", "rd", "th"].contains(&lower.as_str()) {
        return lower;
    }
    for name in MONTHS.iter().chain(&WEEKDAYS) {
        let is_month = MONTHS.contains(name);
        if lower == name.to_lowercase() {
            return if is_month && word == lower { lower } else { (*name).to_string() };
        }
        if lower == name[..3].to_lowercase() {
            return name[..3].to_string();
        }
    }
    word.to_string()
}

/// A date known valid at compile time.
const fn const_date(year: i32, month: u32, day: u32) -> Date {
    match Date::new(year, month, day) {
        Some(date) => date,
        None => panic!("not a date"),
    }
}

/// The task's dates as day numbers in order, 1950-01-01 first (36,525 of them).
fn all_days() -> Vec<i64> {
    (FIRST_DAY.to_days()..=LAST_DAY.to_days()).collect()
}

/// The date of a task day number (one of [`all_days`]).
fn task_date(day: i64) -> Date {
    Date::from_days(day).expect("task days lie in 1950..=2049")
}

/// The dates task under one seed: training examples by index and the held-out examples.
///
/// ```
/// use attn_train::data::DatesTask;
/// let task = DatesTask::new(7);
/// let (source, target) = task.train_pair(0);
/// assert_eq!(target.len(), 10); // YYYY-MM-DD
/// assert!(!source.is_empty());
/// assert!(task.held_out_examples().iter().all(|&(date, _)| task.is_held_out(date)));
/// assert!((0..1000).all(|i| !task.is_held_out(task.train_example(i).0)));
/// ```
#[derive(Debug, Clone)]
pub struct DatesTask {
    seed: u64,
    /// The training dates as day numbers, ascending.
    train_days: Vec<i64>,
    /// The held-out examples, in the seed's order.
    held_out: Vec<(Date, DateFormat)>,
}

impl DatesTask {
    /// The task with [`DEFAULT_HELD_OUT`] held-out dates.
    pub fn new(seed: u64) -> Self {
        let days = all_days();
        Self::split(seed, days, DEFAULT_HELD_OUT)
    }

    /// The task with `held_out` held-out dates; refused unless at least one date is left to
    /// train on (36,524 at most).
    pub fn with_held_out(seed: u64, held_out: usize) -> Result<Self, DataError> {
        let days = all_days();
        if held_out >= days.len() {
            return Err(DataError::Argument {
                what: "DatesTask::with_held_out: held_out",
                expected: format!("fewer than the task's {} dates", days.len()),
                found: held_out.to_string(),
            });
        }
        Ok(Self::split(seed, days, held_out))
    }

    fn split(seed: u64, mut days: Vec<i64>, count: usize) -> Self {
        shuffle_prefix(&mut stream(seed, SALT_HELD_OUT, 0), &mut days, count);
        let held_out = days[..count]
            .iter()
            .zip(DateFormat::ALL.iter().cycle())
            .map(|(&day, &format)| (task_date(day), format))
            .collect();
        let mut train_days = days.split_off(count);
        train_days.sort_unstable();
        Self { seed, train_days, held_out }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many dates training draws from.
    pub fn num_train_dates(&self) -> usize {
        self.train_days.len()
    }

    /// Training example `index`: a date drawn uniformly from the training dates and a form drawn
    /// uniformly; a pure function of `(seed, index)`.
    pub fn train_example(&self, index: u64) -> (Date, DateFormat) {
        let mut rng = stream(self.seed, SALT_TRAIN, index);
        let day = self.train_days[below(&mut rng, self.train_days.len())];
        let format = DateFormat::ALL[below(&mut rng, DateFormat::ALL.len())];
        (task_date(day), format)
    }

    /// Training example `index` as `(source, target)` text.
    pub fn train_pair(&self, index: u64) -> Pair {
        let (date, format) = self.train_example(index);
        (format.render(date), date.iso())
    }

    /// Training examples `start .. start + count` as text: batch `k` of size `B` is
    /// `train_pairs(k * B, B)`.
    pub fn train_pairs(&self, start: u64, count: usize) -> Vec<Pair> {
        (start..start + count as u64).map(|i| self.train_pair(i)).collect()
    }

    /// The held-out examples (date, form), in the seed's order.
    pub fn held_out_examples(&self) -> &[(Date, DateFormat)] {
        &self.held_out
    }

    /// The held-out examples as `(source, target)` text.
    pub fn held_out(&self) -> Vec<Pair> {
        self.held_out.iter().map(|&(date, format)| (format.render(date), date.iso())).collect()
    }

    /// Whether `date` is held out (never drawn for training); dates outside the task are not.
    pub fn is_held_out(&self, date: Date) -> bool {
        (FIRST_DAY..=LAST_DAY).contains(&date) && self.train_days.binary_search(&date.to_days()).is_err()
    }

    /// `text` with the words the task writes in a fixed case folded to it: month and weekday names
    /// and their three-letter forms to `March`, `Wed` (a full month name all in lower case stays
    /// so, one of the task's forms), `the`, `of` and the ordinal suffixes `st`, `nd`, `rd`, `th`
    /// to lower case. Other words and characters are kept, so no date changes.
    ///
    /// ```
    /// use attn_train::data::DatesTask;
    /// assert_eq!(DatesTask::fold_case("THE 3RD OF MARCH 2021"), "the 3rd of March 2021");
    /// assert_eq!(DatesTask::fold_case("wed 3 mar 2021"), "Wed 3 Mar 2021");
    /// assert_eq!(DatesTask::fold_case("3 march 2021"), "3 march 2021");
    /// assert_eq!(DatesTask::fold_case("3 MARCHE 2021"), "3 MARCHE 2021");
    /// ```
    pub fn fold_case(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find(char::is_alphabetic) {
            out.push_str(&rest[..start]);
            let word = &rest[start..];
            let end = word.find(|c: char| !c.is_alphabetic()).unwrap_or(word.len());
            out.push_str(&fold_word(&word[..end]));
            rest = &word[end..];
        }
        out.push_str(rest);
        out
    }

    /// The vocabulary of the task: every character any form of any date can use, and the digits.
    pub fn vocab() -> Vocab {
        let lower = MONTHS.map(str::to_lowercase);
        let words = MONTHS.iter().chain(&WEEKDAYS).copied().chain(lower.iter().map(String::as_str));
        Vocab::from_texts(words.chain(["0123456789", " ,./-", "the of st nd rd th"]))
    }
}
