//! Minimal leveled logging to stderr. Callers never pass tokens or arguments in.

use std::str::FromStr;

/// How much to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Only failures.
    Error,
    /// Start-up and failures.
    Info,
    /// One line per request.
    Debug,
}

impl FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "error" => Ok(Level::Error),
            "info" => Ok(Level::Info),
            "debug" => Ok(Level::Debug),
            _ => Err(format!("unknown log level `{s}` (error, info, debug)")),
        }
    }
}

pub fn info(level: Level, msg: &str) {
    if level >= Level::Info {
        eprintln!("redcount-rest: {msg}");
    }
}

pub fn debug(level: Level, msg: &str) {
    if level >= Level::Debug {
        eprintln!("redcount-rest: {msg}");
    }
}

pub fn error(msg: &str) {
    eprintln!("redcount-rest: error: {msg}");
}
