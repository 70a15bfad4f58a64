//! The command line of a worker process: `--name value` pairs, repeatable,
//! and bare `--switch`es.

use std::str::FromStr;
use std::time::Duration;

use crate::TestkitError;

/// A worker's flags, read one by one; [`finish`](Self::finish) then rejects
/// whatever no reader asked for, so a misspelt flag is an error rather than
/// a default silently used.
///
/// ```
/// use lock_testkit::Flags;
/// use std::time::Duration;
///
/// let words = ["--lock", "redis://a", "--lock", "redis://b", "--ttl-ms", "500", "--fencing"];
/// let mut flags = Flags::parse(words.map(String::from), &["--fencing"])?;
/// assert_eq!(flags.all("--lock"), ["redis://a", "redis://b"]);
/// assert_eq!(flags.millis("--ttl-ms", 100)?, Duration::from_millis(500));
/// assert_eq!(flags.number("--seed", 1_u64)?, 1);
/// assert!(flags.switch("--fencing"));
/// flags.finish()?;
/// # Ok::<(), lock_testkit::TestkitError>(())
/// ```
#[derive(Debug)]
pub struct Flags {
    /// Each flag as given, its value (`None` for a switch), and whether a
    /// reader has asked for it.
    given: Vec<(String, Option<String>, bool)>,
}

impl Flags {
    /// Splits `words` (the arguments after the program's name) into flags;
    /// the names in `switches` take no value, every other name takes the
    /// word after it.
    ///
    /// # Errors
    ///
    /// A word that is not a flag, or a flag without its value.
    pub fn parse(
        words: impl IntoIterator<Item = String>,
        switches: &[&str],
    ) -> Result<Flags, TestkitError> {
        let mut words = words.into_iter();
        let mut given = Vec::new();
        while let Some(name) = words.next() {
            if !name.starts_with("--") {
                return Err(TestkitError::new(format!("{name}: expected a --flag")));
            }
            let value = if switches.contains(&name.as_str()) {
                None
            } else {
                Some(
                    words
                        .next()
                        .ok_or_else(|| TestkitError::new(format!("{name} needs a value")))?,
                )
            };
            given.push((name, value, false));
        }
        Ok(Flags { given })
    }

    /// Every value of `name`, in the order given.
    pub fn all(&mut self, name: &str) -> Vec<String> {
        self.given
            .iter_mut()
            .filter(|(given, _, _)| given == name)
            .filter_map(|(_, value, read)| {
                *read = true;
                value.clone()
            })
            .collect()
    }

    /// Every value of `name`, which must be given at least once.
    ///
    /// # Errors
    ///
    /// When it is not.
    pub fn one_or_more(&mut self, name: &str) -> Result<Vec<String>, TestkitError> {
        let values = self.all(name);
        if values.is_empty() {
            return Err(TestkitError::new(format!("{name} is required")));
        }
        Ok(values)
    }

    /// The value of `name` (the last one when given twice).
    pub fn value(&mut self, name: &str) -> Option<String> {
        self.all(name).pop()
    }

    /// The value of `name`, which must be given.
    ///
    /// # Errors
    ///
    /// When it is not.
    pub fn required(&mut self, name: &str) -> Result<String, TestkitError> {
        self.value(name)
            .ok_or_else(|| TestkitError::new(format!("{name} is required")))
    }

    /// The value of `name` as a number, or `default`.
    ///
    /// # Errors
    ///
    /// A value that does not parse.
    pub fn number<T>(&mut self, name: &str, default: T) -> Result<T, TestkitError>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        match self.value(name) {
            None => Ok(default),
            Some(value) => value
                .parse()
                .map_err(|e| TestkitError::new(format!("{name} {value}: {e}"))),
        }
    }

    /// The value of `name`, a number of milliseconds, or `default_ms`.
    ///
    /// # Errors
    ///
    /// A value that is not a whole number.
    pub fn millis(&mut self, name: &str, default_ms: u64) -> Result<Duration, TestkitError> {
        self.number(name, default_ms).map(Duration::from_millis)
    }

    /// Whether the switch `name` was given.
    pub fn switch(&mut self, name: &str) -> bool {
        let mut found = false;
        for (given, _, read) in &mut self.given {
            if given == name {
                *read = true;
                found = true;
            }
        }
        found
    }

    /// Ends the reading.
    ///
    /// # Errors
    ///
    /// Names every flag given that no reader asked for.
    pub fn finish(self) -> Result<(), TestkitError> {
        let unknown: Vec<&str> = self
            .given
            .iter()
            .filter(|(_, _, read)| !read)
            .map(|(name, _, _)| name.as_str())
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(TestkitError::new(format!(
                "unknown argument {}",
                unknown.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn flags(words: &[&str]) -> Result<Flags, TestkitError> {
        Flags::parse(words.iter().map(|w| (*w).to_owned()), &["--fencing"])
    }

    #[test]
    fn a_flag_nobody_reads_is_an_error_that_names_it() {
        let mut given = flags(&["--id", "3", "--ttl", "500"]).unwrap();
        assert_eq!(given.number("--id", 0_u32).unwrap(), 3);
        let err = given.finish().unwrap_err().to_string();
        assert!(err.contains("--ttl"), "{err}");
    }

    #[test]
    fn a_missing_value_or_a_bare_word_is_an_error() {
        let err = flags(&["--id"]).unwrap_err().to_string();
        assert!(err.contains("--id needs a value"), "{err}");
        assert!(flags(&["3"]).is_err());
    }

    #[test]
    fn defaults_apply_and_bad_numbers_are_named() {
        let mut given = flags(&["--seed", "x"]).unwrap();
        assert_eq!(
            given.millis("--ttl-ms", 250).unwrap(),
            Duration::from_millis(250)
        );
        assert!(!given.switch("--fencing"));
        let err = given.number("--seed", 1_u64).unwrap_err().to_string();
        assert!(err.contains("--seed x"), "{err}");
        assert!(given.required("--register").is_err());
        assert!(given.one_or_more("--lock").is_err());
    }
}
