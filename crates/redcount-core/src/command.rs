//! A Redis command as a list of arguments, and its encodings.

use alloc::string::String;
use alloc::vec::Vec;

/// One Redis command: its name then its arguments, each a string.
///
/// Every argument redcount sends is UTF-8 (ids are allow-listed, numbers are decimal,
/// bodies come from JSON strings), which is what the Upstash REST protocol can carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    args: Vec<String>,
}

impl Command {
    /// A command with no arguments yet, e.g. `Command::new("GET")`.
    pub fn new(name: &str) -> Self {
        Command { args: alloc::vec![String::from(name)] }
    }

    /// A command of these words, the name first (never empty).
    pub(crate) fn from_parts(args: Vec<String>) -> Self {
        debug_assert!(!args.is_empty());
        Command { args }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends one argument in place.
    pub fn push(&mut self, arg: impl Into<String>) {
        self.args.push(arg.into());
    }

    /// The command name (upper case as built by redcount).
    pub fn name(&self) -> &str {
        &self.args[0]
    }

    /// The name followed by every argument.
    pub fn parts(&self) -> &[String] {
        &self.args
    }

    pub(crate) fn parts_mut(&mut self) -> &mut [String] {
        &mut self.args
    }

    /// The Upstash REST body for this command: a JSON array of strings.
    pub fn to_rest_body(&self) -> String {
        let mut out = String::with_capacity(self.args.iter().map(|a| a.len() + 3).sum::<usize>() + 2);
        crate::rest::write_json_array(&mut out, &self.args);
        out
    }

    /// The RESP2 encoding of this command (an array of bulk strings), as sent on a socket.
    pub fn to_resp(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.args.iter().map(|a| a.len() + 16).sum::<usize>());
        push_line(&mut out, b'*', self.args.len());
        for a in &self.args {
            push_line(&mut out, b'$', a.len());
            out.extend_from_slice(a.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out
    }
}

fn push_line(out: &mut Vec<u8>, tag: u8, n: usize) {
    out.push(tag);
    out.extend_from_slice(itoa(n as u64).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Decimal text of an unsigned integer.
pub(crate) fn itoa(n: u64) -> String {
    // The itoa crate (serde_json's own): no formatting machinery per number, which the
    // worker's wasm pays for on every key count and argument.
    String::from(itoa::Buffer::new().format(n))
}

/// Decimal text of a signed integer (no_std has no `to_string` for free).
pub fn itoa_i(n: i64) -> String {
    String::from(itoa::Buffer::new().format(n))
}
