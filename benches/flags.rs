//! The bench examples' command lines: `--help` (or `-h`) prints the usage and exits 0; an
//! unknown flag, a missing or unparsable value prints what was wrong and the usage and exits 2,
//! never a panic with a backtrace.

use std::fmt::Display;
use std::str::FromStr;

/// What an example was given, after its name.
#[derive(Debug)]
pub struct Flags {
    given: std::vec::IntoIter<String>,
    usage: &'static str,
}

impl Flags {
    /// The process's arguments for a program whose usage is `usage`: `--help` or `-h`
    /// anywhere prints it and exits.
    pub fn from_env(usage: &'static str) -> Flags {
        Flags::from(std::env::args().skip(1).collect(), usage)
    }

    fn from(given: Vec<String>, usage: &'static str) -> Flags {
        if given.iter().any(|arg| arg == "--help" || arg == "-h") {
            println!("{usage}");
            std::process::exit(0);
        }
        Flags { given: given.into_iter(), usage }
    }

    /// The next argument (a flag, or a positional one).
    pub fn next_arg(&mut self) -> Option<String> {
        self.given.next()
    }

    /// The value after `flag`, parsed.
    pub fn value<T: FromStr>(&mut self, flag: &str) -> T
    where
        T::Err: Display,
    {
        let Some(text) = self.given.next() else { self.fail(&format!("{flag} needs a value")) };
        text.parse().unwrap_or_else(|error| self.fail(&format!("{flag} {text}: {error}")))
    }

    /// The comma-separated list after `flag`, each item parsed (`--ids staged:shm,ucx:shm`).
    pub fn list<T: FromStr>(&mut self, flag: &str) -> Vec<T>
    where
        T::Err: Display,
    {
        let text: String = self.value(flag);
        text.split(',')
            .map(|item| item.parse().unwrap_or_else(|e| self.fail(&format!("{flag} {item}: {e}"))))
            .collect()
    }

    /// The arguments not taken yet.
    pub fn rest(self) -> Vec<String> {
        self.given.collect()
    }

    /// Says what was wrong, then the usage, and exits 2.
    pub fn fail(&self, problem: &str) -> ! {
        eprintln!("{problem}\n{}", self.usage);
        std::process::exit(2)
    }
}
