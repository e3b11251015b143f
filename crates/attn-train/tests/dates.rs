//! The calendar (day numbers, weekdays checked against Zeller's congruence and known dates,
//! ordinals), the fourteen forms on fixed dates, and the dates task's sampling and held-out split.

use std::collections::HashSet;

use attn_train::data::calendar::{ordinal, Date};
use attn_train::data::dates::{DateFormat, DatesTask, DEFAULT_HELD_OUT, FIRST_DAY, LAST_DAY};
use attn_train::data::{vocab, DataError};

fn date(y: i32, m: u32, d: u32) -> Date {
    Date::new(y, m, d).unwrap()
}

/// Zeller's congruence, an independent weekday formula; 0 = Monday … 6 = Sunday.
fn zeller(y: i32, m: u32, d: u32) -> usize {
    let (y, m) = if m < 3 { (y - 1, m + 12) } else { (y, m) };
    let (k, j) = (y.rem_euclid(100), y.div_euclid(100));
    let h = (d as i32 + 13 * (m as i32 + 1) / 5 + k + k / 4 + j / 4 + 5 * j).rem_euclid(7);
    ((h + 5) % 7) as usize
}

/// Every task date by walking years, months and days (not through day numbers).
fn every_task_date() -> Vec<Date> {
    let mut out = Vec::new();
    for y in 1950..=2049 {
        for m in 1..=12 {
            out.extend((1..=31).filter_map(|d| Date::new(y, m, d)));
        }
    }
    out
}

#[test]
fn weekdays_of_known_dates() {
    for (y, m, d, name) in [
        (1950, 1, 1, "Sunday"),
        (1969, 7, 20, "Sunday"),
        (1970, 1, 1, "Thursday"),
        (1999, 12, 31, "Friday"),
        (2000, 2, 29, "Tuesday"),
        (2000, 3, 1, "Wednesday"),
        (2021, 3, 3, "Wednesday"),
        (2049, 12, 31, "Friday"),
    ] {
        assert_eq!(date(y, m, d).weekday_name(), name, "{y}-{m}-{d}");
    }
}

#[test]
fn day_numbers_and_weekdays_over_the_whole_task_range() {
    let dates = every_task_date();
    assert_eq!(dates.len(), 36_525); // 100 years, 25 of them leap years
    assert_eq!((dates[0], dates[dates.len() - 1]), (FIRST_DAY, LAST_DAY));
    assert_eq!(date(1970, 1, 1).to_days(), 0);
    for pair in dates.windows(2) {
        assert_eq!(pair[1].to_days(), pair[0].to_days() + 1, "{:?}", pair[1]);
    }
    for d in dates {
        assert_eq!(Date::from_days(d.to_days()), Some(d));
        assert_eq!(d.weekday(), zeller(d.year(), d.month(), d.day()), "{}", d.iso());
    }
}

#[test]
fn invalid_dates_are_refused() {
    for (y, m, d) in [(2001, 2, 29), (1900, 2, 29), (2021, 4, 31), (2021, 13, 1), (2021, 0, 1), (2021, 1, 0)] {
        assert_eq!(Date::new(y, m, d), None, "{y}-{m}-{d}");
    }
    assert!(Date::new(2000, 2, 29).is_some());
}

#[test]
fn ordinal_suffixes() {
    let got: Vec<String> =
        [1, 2, 3, 4, 10, 11, 12, 13, 14, 21, 22, 23, 24, 30, 31, 101, 111, 112].map(ordinal).to_vec();
    let want = [
        "1st", "2nd", "3rd", "4th", "10th", "11th", "12th", "13th", "14th", "21st", "22nd", "23rd", "24th", "30th",
        "31st", "101st", "111th", "112th",
    ];
    assert_eq!(got, want);
}

#[test]
fn the_fourteen_forms_of_2021_03_03() {
    let got: Vec<String> = DateFormat::ALL.iter().map(|f| f.render(date(2021, 3, 3))).collect();
    let want = [
        "3 March 2021",
        "3 march 2021",
        "March 3, 2021",
        "March 3 2021",
        "March 3rd, 2021",
        "the 3rd of March 2021",
        "3 Mar 2021",
        "Mar 3, 2021",
        "Wednesday, March 3, 2021",
        "Wed 3 Mar 2021",
        "03/03/2021",
        "3.3.2021",
        "03.03.2021",
        "2021-03-03",
    ];
    assert_eq!(got, want);
}

#[test]
fn forms_with_two_digit_days_and_months_and_other_weekdays() {
    let d = date(1999, 12, 22);
    let got: Vec<String> = DateFormat::ALL.iter().map(|f| f.render(d)).collect();
    let want = [
        "22 December 1999",
        "22 december 1999",
        "December 22, 1999",
        "December 22 1999",
        "December 22nd, 1999",
        "the 22nd of December 1999",
        "22 Dec 1999",
        "Dec 22, 1999",
        "Wednesday, December 22, 1999",
        "Wed 22 Dec 1999",
        "12/22/1999",
        "22.12.1999",
        "22.12.1999",
        "1999-12-22",
    ];
    assert_eq!(got, want);
    assert_eq!(DateFormat::TheOrdinalOfMonthYear.render(date(2000, 2, 29)), "the 29th of February 2000");
    assert_eq!(DateFormat::WeekdayMonthDayCommaYear.render(FIRST_DAY), "Sunday, January 1, 1950");
    assert_eq!(DateFormat::ShortWeekdayDayShortMonthYear.render(date(2011, 9, 11)), "Sun 11 Sep 2011");
    assert_eq!(DateFormat::MonthOrdinalCommaYear.render(date(2049, 5, 31)), "May 31st, 2049");
    assert_eq!(DateFormat::UsSlashes.render(date(1950, 11, 5)), "11/05/1950");
    assert_eq!(DateFormat::Dots.render(date(1950, 11, 5)), "5.11.1950");
}

#[test]
fn training_pairs_are_deterministic_and_render_their_example() {
    let (a, b) = (DatesTask::new(3), DatesTask::new(3));
    for i in 0..500 {
        let (d, f) = a.train_example(i);
        assert_eq!(a.train_pair(i), (f.render(d), d.iso()));
        assert_eq!(a.train_pair(i), b.train_pair(i));
    }
    assert_eq!(a.train_pairs(40, 3), vec![a.train_pair(40), a.train_pair(41), a.train_pair(42)]);
    let other = DatesTask::new(4);
    assert!((0..100).filter(|&i| other.train_pair(i) == a.train_pair(i)).count() < 5);
    assert_ne!(other.held_out(), a.held_out());
}

#[test]
fn training_covers_every_form_and_the_whole_range() {
    let task = DatesTask::new(11);
    let examples: Vec<_> = (0..20_000).map(|i| task.train_example(i)).collect();
    let mut counts = [0usize; 14];
    for (_, f) in &examples {
        counts[DateFormat::ALL.iter().position(|g| g == f).unwrap()] += 1;
    }
    // Uniform forms: 20,000 / 14 ≈ 1,429 each (σ ≈ 36).
    assert!(counts.iter().all(|&c| (1250..1610).contains(&c)), "{counts:?}");
    let years: HashSet<i32> = examples.iter().map(|(d, _)| d.year()).collect();
    assert_eq!(years.len(), 100);
    let weekdays: HashSet<usize> = examples.iter().map(|(d, _)| d.weekday()).collect();
    assert_eq!(weekdays.len(), 7);
    assert!(examples.iter().all(|(d, _)| (FIRST_DAY..=LAST_DAY).contains(d)));
}

#[test]
fn held_out_dates_are_never_trained_on() {
    let task = DatesTask::new(5);
    let held = task.held_out_examples();
    assert_eq!(held.len(), DEFAULT_HELD_OUT);
    let held_dates: HashSet<Date> = held.iter().map(|&(d, _)| d).collect();
    assert_eq!(held_dates.len(), DEFAULT_HELD_OUT, "held-out dates repeat");
    assert_eq!(task.num_train_dates(), 36_525 - DEFAULT_HELD_OUT);
    let held_isos: HashSet<String> = task.held_out().into_iter().map(|(_, t)| t).collect();
    for i in 0..50_000 {
        let (d, _) = task.train_example(i);
        assert!(!held_dates.contains(&d) && !task.is_held_out(d), "training example {i} is held out: {}", d.iso());
        assert!(!held_isos.contains(&task.train_pair(i).1));
    }
    assert!(held.iter().all(|&(d, _)| task.is_held_out(d)));
    assert!(!task.is_held_out(date(1949, 12, 31)) && !task.is_held_out(date(2050, 1, 1)));
    // The held-out forms cycle through all fourteen.
    let forms: Vec<DateFormat> = held.iter().take(28).map(|&(_, f)| f).collect();
    assert_eq!(forms[..14], DateFormat::ALL);
    assert_eq!(forms[14..], DateFormat::ALL);
}

#[test]
fn held_out_sizes() {
    let all_but_one = DatesTask::with_held_out(1, 36_524).unwrap();
    assert_eq!(all_but_one.num_train_dates(), 1);
    let only = all_but_one.train_example(0).0;
    assert!((0..200).all(|i| all_but_one.train_example(i).0 == only));
    assert!(!all_but_one.is_held_out(only));
    assert_eq!(DatesTask::with_held_out(1, 0).unwrap().held_out(), vec![]);
    match DatesTask::with_held_out(1, 36_525) {
        Err(DataError::Argument { found, .. }) => assert_eq!(found, "36525"),
        other => panic!("expected an argument error, got {other:?}"),
    }
}

#[test]
fn the_task_vocabulary_covers_every_pair() {
    let task = DatesTask::new(9);
    let v = DatesTask::vocab();
    let pairs = task.held_out().into_iter().chain((0..20_000).map(|i| task.train_pair(i)));
    for (s, t) in pairs {
        for text in [&s, &t] {
            let ids = v.encode(text, true, true);
            assert!(!ids.contains(&vocab::UNK), "{text:?} has a character outside the vocabulary");
            assert_eq!(v.decode(&ids), *text);
        }
    }
    // Every character of the vocabulary is used by some form of some date.
    let used: HashSet<char> = every_task_date()
        .iter()
        .flat_map(|&d| DateFormat::ALL.map(|f| f.render(d)))
        .flat_map(|s| s.chars().collect::<Vec<_>>())
        .collect();
    assert_eq!(v.chars().iter().copied().collect::<HashSet<_>>(), used);
}

#[test]
fn iso_text_parses_back_to_its_date_and_other_text_does_not() {
    for d in every_task_date() {
        assert_eq!(Date::parse_iso(&d.iso()), Some(d));
    }
    for bad in
        ["2021-02-29", "2100-02-29", "2021-04-31", "2021-13-01", "2021-01-00", "21-01-01", "2021/01/01", "２021-01-01"]
    {
        assert_eq!(Date::parse_iso(bad), None, "{bad}");
    }
    assert_eq!(Date::parse_iso("2000-02-29"), Some(date(2000, 2, 29)));
}

/// Every form, written in upper case, folds back to how the task writes it (the all-lower-case
/// month of `3 march 2021` comes back capitalised, the form `3 March 2021`); the task's own
/// forms are left as they are.
#[test]
fn case_folding_restores_every_form_of_every_month_and_weekday() {
    let days: Vec<Date> = every_task_date().into_iter().step_by(37).collect();
    for d in days {
        for f in DateFormat::ALL {
            let text = f.render(d);
            assert_eq!(DatesTask::fold_case(&text), text, "{f:?}");
            let expected = if f == DateFormat::DayLowerMonthYear { DateFormat::DayMonthYear.render(d) } else { text };
            assert_eq!(DatesTask::fold_case(&expected.to_uppercase()), expected, "{f:?}");
        }
    }
}
