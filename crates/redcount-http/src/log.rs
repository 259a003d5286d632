//! Logs through `tracing` to stderr, as text or JSON lines, for both servers. Callers never
//! pass tokens, passwords or command arguments in (tests scan the output for them).

use std::str::FromStr;

/// How much to log (`--log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Only failures and warnings.
    Error,
    /// Start-up, reloads and failures.
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

/// The shape of a log line (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `2026-11-23T21:00:00Z  INFO redcount_rest: listening on …`
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields.message`, and the fields).
    Json,
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err(format!("unknown log format `{s}` (text, json)")),
        }
    }
}

/// Installs the process's subscriber; a second call changes nothing.
pub fn init(level: Level, format: Format) {
    let max = match level {
        Level::Error => tracing::Level::WARN,
        Level::Info => tracing::Level::INFO,
        Level::Debug => tracing::Level::DEBUG,
    };
    let builder = tracing_subscriber::fmt().with_max_level(max).with_writer(std::io::stderr).with_ansi(false);
    let _ = match format {
        Format::Text => builder.try_init(),
        Format::Json => builder.json().try_init(),
    };
}
