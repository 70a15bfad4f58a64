//! Duration strings: `"500ms"`, `"30s"`, `"2m"`, `"1h"`, and sums written
//! from the largest unit down, like `"1m30s"`.
//!
//! Only the syntax is checked here; whether a value makes sense as a ttl or
//! a wait is `valid.rs`'s business.

use std::fmt;
use std::time::Duration;

/// The units, largest first, in milliseconds. A duration names each unit at
/// most once, in this order.
const UNITS: [(&str, u64); 4] = [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];

/// Why a duration string did not parse. The messages finish the sentence
/// "the duration `"..."` ...".
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DurationError {
    Empty,
    Whitespace,
    Fraction,
    Negative,
    MissingNumber,
    MissingUnit(String),
    UnknownUnit(String),
    OutOfOrder(String),
    Unexpected(char),
    Overflow,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Empty => {
                f.write_str("is empty: write a number and a unit, like \"30s\"")
            }
            DurationError::Whitespace => {
                f.write_str("contains spaces: write it without them, like \"1m30s\"")
            }
            DurationError::Fraction => f.write_str(
                "has a fraction: use whole numbers of a smaller unit, like \"1500ms\" for 1.5s",
            ),
            DurationError::Negative => f.write_str("is negative: a duration is at least \"0s\""),
            DurationError::MissingNumber => {
                f.write_str("needs a number before each unit, like \"30s\"")
            }
            DurationError::MissingUnit(number) => write!(
                f,
                "has no unit after `{number}`: write \"{number}ms\", \"{number}s\", \"{number}m\" or \"{number}h\""
            ),
            DurationError::UnknownUnit(unit) => write!(
                f,
                "has an unknown unit `{unit}`: the units are `ms`, `s`, `m` and `h`"
            ),
            DurationError::OutOfOrder(unit) => write!(
                f,
                "repeats or reorders the unit `{unit}`: write each unit once, largest first, like \"1h30m\" or \"1m30s\""
            ),
            DurationError::Unexpected(c) => write!(
                f,
                "has an unexpected `{c}`: write numbers and units only, like \"1m30s\""
            ),
            DurationError::Overflow => f.write_str("is too long to represent"),
        }
    }
}

/// Parses a duration string.
pub(crate) fn parse(text: &str) -> Result<Duration, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    if text.chars().any(char::is_whitespace) {
        return Err(DurationError::Whitespace);
    }
    if text.starts_with('-') {
        return Err(DurationError::Negative);
    }
    if text.contains(['.', ',']) {
        return Err(DurationError::Fraction);
    }
    let mut rest = text;
    let mut total: u64 = 0;
    // Index into UNITS of the smallest unit seen so far.
    let mut last: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(match rest.chars().next() {
                Some(c) if !c.is_alphabetic() => DurationError::Unexpected(c),
                _ => DurationError::MissingNumber,
            });
        }
        let (number, after) = rest.split_at(digits);
        let letters = after.len() - after.trim_start_matches(|c: char| c.is_alphabetic()).len();
        let (unit, after) = after.split_at(letters);
        if unit.is_empty() {
            return Err(match after.chars().next() {
                None => DurationError::MissingUnit(number.to_owned()),
                Some(c) => DurationError::Unexpected(c),
            });
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(DurationError::UnknownUnit(unit.to_owned()));
        };
        if last.is_some_and(|last| index <= last) {
            return Err(DurationError::OutOfOrder(unit.to_owned()));
        }
        last = Some(index);
        let value: u64 = number.parse().map_err(|_| DurationError::Overflow)?;
        total = value
            .checked_mul(UNITS[index].1)
            .and_then(|ms| total.checked_add(ms))
            .ok_or(DurationError::Overflow)?;
        rest = after;
    }
    Ok(Duration::from_millis(total))
}

/// Writes a duration the way a user would, for error messages: `"1h30m"`,
/// `"500ms"`.
pub(crate) fn display(duration: Duration) -> String {
    let mut ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (name, size) in UNITS {
        if ms >= size {
            out.push_str(&(ms / size).to_string());
            out.push_str(name);
            ms %= size;
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ms(text: &str) -> Result<u64, DurationError> {
        parse(text).map(|d| d.as_millis() as u64)
    }

    #[test]
    fn single_units() {
        assert_eq!(ms("500ms"), Ok(500));
        assert_eq!(ms("30s"), Ok(30_000));
        assert_eq!(ms("2m"), Ok(120_000));
        assert_eq!(ms("1h"), Ok(3_600_000));
        assert_eq!(ms("0s"), Ok(0));
    }

    #[test]
    fn sums_from_the_largest_unit_down() {
        assert_eq!(ms("1m30s"), Ok(90_000));
        assert_eq!(ms("1h2m3s4ms"), Ok(3_723_004));
        assert_eq!(ms("1s500ms"), Ok(1_500));
    }

    #[test]
    fn malformed() {
        assert_eq!(ms(""), Err(DurationError::Empty));
        assert_eq!(ms("30"), Err(DurationError::MissingUnit("30".into())));
        assert_eq!(ms("s"), Err(DurationError::MissingNumber));
        assert_eq!(ms("1.5s"), Err(DurationError::Fraction));
        assert_eq!(ms("1 m"), Err(DurationError::Whitespace));
        assert_eq!(ms("-1s"), Err(DurationError::Negative));
        assert_eq!(ms("30sec"), Err(DurationError::UnknownUnit("sec".into())));
        assert_eq!(ms("5d"), Err(DurationError::UnknownUnit("d".into())));
        assert_eq!(ms("30s1m"), Err(DurationError::OutOfOrder("m".into())));
        assert_eq!(ms("1s1s"), Err(DurationError::OutOfOrder("s".into())));
        assert_eq!(ms("1s+"), Err(DurationError::Unexpected('+')));
        assert_eq!(ms("1+1s"), Err(DurationError::Unexpected('+')));
        assert_eq!(ms("99999999999999999999h"), Err(DurationError::Overflow));
        assert_eq!(ms("9999999999999999h"), Err(DurationError::Overflow));
    }

    #[test]
    fn displays_like_the_input() {
        assert_eq!(display(Duration::from_millis(90_000)), "1m30s");
        assert_eq!(display(Duration::from_millis(500)), "500ms");
        assert_eq!(display(Duration::ZERO), "0s");
        assert_eq!(display(Duration::from_secs(25 * 3600)), "25h");
    }
}
