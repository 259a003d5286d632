//! JSON text read into a [`Json`] tree: what serde_json's `from_slice::<Value>` makes of the
//! same bytes (objects with sorted keys, the last of repeated keys kept; integers as `u64` or
//! `i64`, any other number a float), and the same errors, message and position alike, so an
//! answer that quotes one reads the same. It is here rather than serde_json because the worker
//! reads every request, configuration and REST reply with it: serde_json's parser, `Value` and
//! the B-tree map under it were a third of the bundle.
//!
//! Floats are checked (`1e400` is out of range, as for serde_json) but not kept: nothing
//! redcount reads is a fraction, so a float is only ever refused or passed through as text.
//!
//! ```
//! use redcount_core::json::{self, Json};
//!
//! let v = json::from_slice(br#"{"cost": 2, "cost": 3, "tags": ["a"]}"#).unwrap();
//! let Json::Object(map) = &v else { panic!() };
//! assert_eq!(map.get("cost").and_then(Json::as_i64), Some(3));
//! assert_eq!(json::repeated_path(br#"{"a": {"b": 1, "b": 2}}"#), Some(vec!["a".into(), "b".into()]));
//! let e = json::from_slice(b"{\"cost\": 2,}").unwrap_err();
//! assert_eq!(e.to_string(), "trailing comma at line 1 column 12");
//! ```

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// A JSON value.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Json {
    /// `null`.
    #[default]
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number.
    Number(Number),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object.
    Object(Map),
}

impl Json {
    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is one that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Number(n) => n.as_i64(),
            _ => None,
        }
    }
}

/// A JSON number: an integer (as serde_json keeps it, `u64` when not negative, else `i64`),
/// or a float (its value not kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Number(N);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum N {
    Positive(u64),
    Negative(i64),
    Float,
}

impl Number {
    /// The integer, if it fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self.0 {
            N::Positive(n) => i64::try_from(n).ok(),
            N::Negative(n) => Some(n),
            N::Float => None,
        }
    }

    /// The integer, if it is one and not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match self.0 {
            N::Positive(n) => Some(n),
            _ => None,
        }
    }

    /// True for a number with a fraction or an exponent, `-0`, or an integer past `u64`/`i64`.
    pub fn is_f64(&self) -> bool {
        self.0 == N::Float
    }
}

/// A JSON object: its fields sorted by key, each key once.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Map(Vec<(String, Json)>);

impl Map {
    /// An empty object.
    pub fn new() -> Map {
        Map(Vec::new())
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// True when the object has `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Sets `key` to `value`, returning the value it had.
    pub fn insert(&mut self, key: String, value: Json) -> Option<Json> {
        match self.find(&key) {
            Ok(i) => Some(core::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    /// Takes `key` out, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<Json> {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }

    /// The number of fields.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the object has no field.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The fields, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Json)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// The keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }
}

impl<'a> IntoIterator for &'a Map {
    type Item = (&'a String, &'a Json);
    type IntoIter = core::iter::Map<core::slice::Iter<'a, (String, Json)>, fn(&'a (String, Json)) -> Self::Item>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl IntoIterator for Map {
    type Item = (String, Json);
    type IntoIter = alloc::vec::IntoIter<(String, Json)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Why a text is not JSON, and where (serde_json's words and position: a 1-based line, and
/// the column in bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: Code,
    line: usize,
    column: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    EofList,
    EofObject,
    EofString,
    EofValue,
    ExpectedColon,
    ExpectedListCommaOrEnd,
    ExpectedObjectCommaOrEnd,
    ExpectedIdent,
    ExpectedValue,
    InvalidEscape,
    InvalidNumber,
    NumberOutOfRange,
    InvalidUnicodeCodePoint,
    ControlCharacter,
    KeyMustBeAString,
    LoneLeadingSurrogate,
    TrailingComma,
    TrailingCharacters,
    UnexpectedEndOfHexEscape,
    RecursionLimitExceeded,
}

impl Code {
    fn message(self) -> &'static str {
        match self {
            Code::EofList => "EOF while parsing a list",
            Code::EofObject => "EOF while parsing an object",
            Code::EofString => "EOF while parsing a string",
            Code::EofValue => "EOF while parsing a value",
            Code::ExpectedColon => "expected `:`",
            Code::ExpectedListCommaOrEnd => "expected `,` or `]`",
            Code::ExpectedObjectCommaOrEnd => "expected `,` or `}`",
            Code::ExpectedIdent => "expected ident",
            Code::ExpectedValue => "expected value",
            Code::InvalidEscape => "invalid escape",
            Code::InvalidNumber => "invalid number",
            Code::NumberOutOfRange => "number out of range",
            Code::InvalidUnicodeCodePoint => "invalid unicode code point",
            Code::ControlCharacter => "control character (\\u0000-\\u001F) found while parsing a string",
            Code::KeyMustBeAString => "key must be a string",
            Code::LoneLeadingSurrogate => "lone leading surrogate in hex escape",
            Code::TrailingComma => "trailing comma",
            Code::TrailingCharacters => "trailing characters",
            Code::UnexpectedEndOfHexEscape => "unexpected end of hex escape",
            Code::RecursionLimitExceeded => "recursion limit exceeded",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code.message())?;
        f.write_str(" at line ")?;
        f.write_str(itoa::Buffer::new().format(self.line))?;
        f.write_str(" column ")?;
        f.write_str(itoa::Buffer::new().format(self.column))
    }
}

impl core::error::Error for Error {}

/// Reads `bytes` as one JSON value (whitespace around it allowed).
pub fn from_slice(bytes: &[u8]) -> Result<Json, Error> {
    read(bytes).map(|(v, _)| v)
}

/// Where the first key repeated in any object within `bytes` is, when `bytes` is JSON: the
/// keys of the objects leading to it (arrays are passed through unnamed), then the key
/// itself. An object keeps the last of repeated keys, so `{"delta":1,"delta":5}` would
/// otherwise pass as one of them.
pub fn repeated_path(bytes: &[u8]) -> Option<Vec<String>> {
    read(bytes).ok().and_then(|(_, path)| path)
}

/// Reads `bytes` as one JSON value, with [`repeated_path`]'s answer.
pub fn read(bytes: &[u8]) -> Result<(Json, Option<Vec<String>>), Error> {
    let mut p = Parser { s: bytes, i: 0, depth: 128 };
    let read = p.value()?;
    match p.whitespace() {
        Some(_) => Err(p.peek_error(Code::TrailingCharacters)),
        None => Ok(read),
    }
}

/// Powers of ten a float's significand (below 2^64) may be multiplied by and still overflow:
/// 10^289 to 10^308 (below, the product is finite; above, it is out of range unless zero).
const POW10_HIGH: [f64; 20] = [
    1e289, 1e290, 1e291, 1e292, 1e293, 1e294, 1e295, 1e296, 1e297, 1e298, 1e299, 1e300, 1e301, 1e302, 1e303, 1e304,
    1e305, 1e306, 1e307, 1e308,
];

type Read = (Json, Option<Vec<String>>);

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    /// Arrays and objects that may still open (serde_json's recursion limit).
    depth: u8,
}

impl Parser<'_> {
    /// An error at byte `at` (serde_json's position: the line, and the bytes from its start).
    #[cold]
    #[inline(never)]
    fn at(&self, at: usize, code: Code) -> Error {
        let before = &self.s[..at];
        let start = before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
        let line = 1 + before[..start].iter().filter(|&&b| b == b'\n').count();
        Error { code, line, column: at - start }
    }

    /// An error at the byte last read.
    fn error(&self, code: Code) -> Error {
        self.at(self.i, code)
    }

    /// An error at the byte about to be read.
    fn peek_error(&self, code: Code) -> Error {
        self.at(self.s.len().min(self.i + 1), code)
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.i += 1;
        Some(b)
    }

    /// The next byte that is not whitespace, not read.
    fn whitespace(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
        self.peek()
    }

    fn value(&mut self) -> Result<Read, Error> {
        let Some(b) = self.whitespace() else { return Err(self.peek_error(Code::EofValue)) };
        let v = match b {
            b'n' => self.word(b"null", Json::Null)?,
            b't' => self.word(b"true", Json::Bool(true))?,
            b'f' => self.word(b"false", Json::Bool(false))?,
            b'-' => {
                self.i += 1;
                Json::Number(self.number(false)?)
            }
            b'0'..=b'9' => Json::Number(self.number(true)?),
            b'"' => {
                self.i += 1;
                Json::String(self.string()?)
            }
            b'[' | b'{' => {
                self.depth -= 1;
                if self.depth == 0 {
                    return Err(self.peek_error(Code::RecursionLimitExceeded));
                }
                self.i += 1;
                let read = if b == b'[' { self.array()? } else { self.object()? };
                self.depth += 1;
                // The closing bracket, which the loops above stopped at.
                self.i += 1;
                return Ok(read);
            }
            _ => return Err(self.peek_error(Code::ExpectedValue)),
        };
        Ok((v, None))
    }

    fn word(&mut self, word: &[u8], v: Json) -> Result<Json, Error> {
        self.i += 1;
        for &want in &word[1..] {
            match self.next() {
                None => return Err(self.error(Code::EofValue)),
                Some(b) if b != want => return Err(self.error(Code::ExpectedIdent)),
                Some(_) => {}
            }
        }
        Ok(v)
    }

    fn array(&mut self) -> Result<Read, Error> {
        let mut items = Vec::new();
        let mut repeated = None;
        loop {
            let Some(b) = self.whitespace() else { return Err(self.peek_error(Code::EofList)) };
            if b == b']' {
                return Ok((Json::Array(items), repeated));
            }
            if !items.is_empty() {
                if b != b',' {
                    return Err(self.peek_error(Code::ExpectedListCommaOrEnd));
                }
                self.i += 1;
                match self.whitespace() {
                    Some(b']') => return Err(self.peek_error(Code::TrailingComma)),
                    Some(_) => {}
                    None => return Err(self.peek_error(Code::EofValue)),
                }
            }
            let (item, inner) = self.value()?;
            repeated = repeated.or(inner);
            items.push(item);
        }
    }

    fn object(&mut self) -> Result<Read, Error> {
        // In the text's order first (the first repeat is the first in the text), sorted at the end.
        let mut fields: Vec<(String, Json)> = Vec::new();
        // The first field whose value repeats a key within it, and that path.
        let mut inner_first: Option<(usize, Vec<String>)> = None;
        loop {
            let Some(b) = self.whitespace() else { return Err(self.peek_error(Code::EofObject)) };
            if b == b'}' {
                break;
            }
            if !fields.is_empty() {
                if b != b',' {
                    return Err(self.peek_error(Code::ExpectedObjectCommaOrEnd));
                }
                self.i += 1;
                match self.whitespace() {
                    Some(b'"') => {}
                    Some(b'}') => return Err(self.peek_error(Code::TrailingComma)),
                    Some(_) => return Err(self.peek_error(Code::KeyMustBeAString)),
                    None => return Err(self.peek_error(Code::EofValue)),
                }
            } else if b != b'"' {
                return Err(self.peek_error(Code::KeyMustBeAString));
            }
            self.i += 1;
            let key = self.string()?;
            match self.whitespace() {
                Some(b':') => self.i += 1,
                Some(_) => return Err(self.peek_error(Code::ExpectedColon)),
                None => return Err(self.peek_error(Code::EofObject)),
            }
            let (v, inner) = self.value()?;
            if let (None, Some(path)) = (&inner_first, inner) {
                inner_first = Some((fields.len(), path));
            }
            fields.push((key, v));
        }
        Ok(sorted(fields, inner_first))
    }

    /// A string's text, after its opening quote.
    fn string(&mut self) -> Result<String, Error> {
        let mut out = Vec::new();
        let mut start = self.i;
        loop {
            while self.peek().is_some_and(|b| b != b'"' && b != b'\\' && b >= 0x20) {
                self.i += 1;
            }
            let Some(b) = self.peek() else { return Err(self.error(Code::EofString)) };
            out.extend_from_slice(&self.s[start..self.i]);
            self.i += 1;
            match b {
                b'"' => {
                    return String::from_utf8(out).map_err(|e| {
                        // At the first byte that is not UTF-8, counted back from the quote.
                        let mut err = self.error(Code::InvalidUnicodeCodePoint);
                        err.column = err.column.saturating_sub(e.as_bytes().len() - e.utf8_error().valid_up_to());
                        err
                    });
                }
                b'\\' => {
                    self.escape(&mut out)?;
                    start = self.i;
                }
                _ => return Err(self.error(Code::ControlCharacter)),
            }
        }
    }

    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        let Some(b) = self.next() else { return Err(self.error(Code::EofString)) };
        let c = match b {
            b'"' | b'\\' | b'/' => b,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => return self.unicode(out),
            _ => return Err(self.error(Code::InvalidEscape)),
        };
        out.push(c);
        Ok(())
    }

    /// `\u` and its four hex digits (a surrogate pair as two), after the `u`.
    fn unicode(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        let high = self.hex4()?;
        let c = match high {
            0xDC00..=0xDFFF => return Err(self.error(Code::LoneLeadingSurrogate)),
            0xD800..=0xDBFF => {
                for want in [b'\\', b'u'] {
                    match self.next() {
                        None => return Err(self.error(Code::EofString)),
                        Some(b) if b != want => return Err(self.error(Code::UnexpectedEndOfHexEscape)),
                        Some(_) => {}
                    }
                }
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(self.error(Code::LoneLeadingSurrogate));
                }
                0x1_0000 + ((u32::from(high) - 0xD800) << 10 | (u32::from(low) - 0xDC00))
            }
            n => u32::from(n),
        };
        let c = char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER);
        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }

    fn hex4(&mut self) -> Result<u16, Error> {
        let Some(digits) = self.s.get(self.i..self.i + 4) else {
            self.i = self.s.len();
            return Err(self.error(Code::EofString));
        };
        self.i += 4;
        let mut n = 0u16;
        for &d in digits {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(self.error(Code::InvalidEscape)),
            };
            n = n << 4 | u16::from(v);
        }
        Ok(n)
    }

    fn digit(&self) -> Option<u8> {
        self.peek().filter(u8::is_ascii_digit).map(|d| d - b'0')
    }

    /// A number, after its sign.
    fn number(&mut self, positive: bool) -> Result<Number, Error> {
        let mut significand = match self.next() {
            None => return Err(self.error(Code::EofValue)),
            Some(b'0') if self.digit().is_some() => return Err(self.peek_error(Code::InvalidNumber)),
            Some(b @ b'0'..=b'9') => u64::from(b - b'0'),
            Some(_) => return Err(self.error(Code::InvalidNumber)),
        };
        if significand != 0 {
            while let Some(d) = self.digit() {
                match significand.checked_mul(10).and_then(|s| s.checked_add(u64::from(d))) {
                    Some(s) => {
                        self.i += 1;
                        significand = s;
                    }
                    // Past u64: a float, the digits beyond counted as powers of ten.
                    None => {
                        let mut exponent = 0i32;
                        while self.digit().is_some() {
                            self.i += 1;
                            exponent += 1;
                        }
                        return self.float(significand, exponent).map(|()| Number(N::Float));
                    }
                }
            }
        }
        if let Some(b'.' | b'e' | b'E') = self.peek() {
            return self.float(significand, 0).map(|()| Number(N::Float));
        }
        Ok(Number(match (positive, (significand as i64).wrapping_neg()) {
            (true, _) => N::Positive(significand),
            // `-0`, and below i64::MIN: floats.
            (false, n) if n >= 0 => N::Float,
            (false, n) => N::Negative(n),
        }))
    }

    /// The rest of a float whose digits so far make `significand` × 10^`exponent`: its
    /// fraction, then its exponent, each if any; checked as serde_json checks one.
    fn float(&mut self, mut significand: u64, mut exponent: i32) -> Result<(), Error> {
        if self.peek() == Some(b'.') {
            self.i += 1;
            let (mut fraction, mut any) = (0i32, false);
            while let Some(d) = self.digit() {
                any = true;
                match significand.checked_mul(10).and_then(|s| s.checked_add(u64::from(d))) {
                    Some(s) => {
                        self.i += 1;
                        significand = s;
                        fraction -= 1;
                    }
                    // Digits past u64's precision are dropped.
                    None => {
                        while self.digit().is_some() {
                            self.i += 1;
                        }
                        break;
                    }
                }
            }
            if !any {
                let code = if self.peek().is_some() { Code::InvalidNumber } else { Code::EofValue };
                return Err(self.peek_error(code));
            }
            exponent += fraction;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            let positive = match self.peek() {
                Some(b'-') => {
                    self.i += 1;
                    false
                }
                Some(b'+') => {
                    self.i += 1;
                    true
                }
                _ => true,
            };
            let mut e = match self.next() {
                None => return Err(self.error(Code::EofValue)),
                Some(b @ b'0'..=b'9') => i32::from(b - b'0'),
                Some(_) => return Err(self.error(Code::InvalidNumber)),
            };
            while let Some(d) = self.digit() {
                self.i += 1;
                match e.checked_mul(10).and_then(|e| e.checked_add(i32::from(d))) {
                    Some(n) => e = n,
                    None if significand != 0 && positive => return Err(self.error(Code::NumberOutOfRange)),
                    // An exponent past i32 that makes zero.
                    None => {
                        while self.digit().is_some() {
                            self.i += 1;
                        }
                        return Ok(());
                    }
                }
            }
            exponent = if positive { exponent.saturating_add(e) } else { exponent.saturating_sub(e) };
        }
        // Negative exponents divide (never infinite); 10^288 times any u64 is finite.
        let finite = match exponent {
            ..=288 => true,
            _ if significand == 0 => true,
            289..=308 => (significand as f64 * POW10_HIGH[(exponent - 289) as usize]).is_finite(),
            _ => false,
        };
        if finite { Ok(()) } else { Err(self.error(Code::NumberOutOfRange)) }
    }
}

/// An object of `fields` in the text's order: sorted by key, the last of each key kept; and
/// the first repeat in the text, if any: a key given again, or a repeat within the value of
/// `inner_first`'s field (whichever comes first; a field that is both names itself).
fn sorted(fields: Vec<(String, Json)>, inner_first: Option<(usize, Vec<String>)>) -> Read {
    // A stable merge sort of the fields' positions by key (a body may hold thousands: no
    // quadratic insertion), written here for one type rather than a generic sort's code.
    let mut order: Vec<usize> = (0..fields.len()).collect();
    let mut scratch = Vec::with_capacity(fields.len());
    merge_sort(&fields, &mut order, &mut scratch);
    // The first field (in the text) that repeats a key before it: a stable sort puts each
    // key's first field first.
    let mut repeat: Option<usize> = None;
    for w in order.windows(2) {
        if fields[w[0]].0 == fields[w[1]].0 {
            repeat = Some(repeat.map_or(w[1], |r| r.min(w[1])));
        }
    }
    let path = match (repeat, inner_first) {
        (Some(r), Some((i, _))) if r <= i => Some(alloc::vec![fields[r].0.clone()]),
        (Some(r), None) => Some(alloc::vec![fields[r].0.clone()]),
        (_, Some((i, mut path))) => {
            path.insert(0, fields[i].0.clone());
            Some(path)
        }
        (None, None) => None,
    };
    if order.iter().enumerate().all(|(n, &i)| n == i) && repeat.is_none() {
        return (Json::Object(Map(fields)), path);
    }
    // The last of a run of one key is the one kept.
    let keep: Vec<bool> =
        (0..order.len()).map(|n| order.get(n + 1).is_none_or(|&j| fields[j].0 != fields[order[n]].0)).collect();
    let mut slots: Vec<Option<(String, Json)>> = fields.into_iter().map(Some).collect();
    let mut map = Vec::with_capacity(slots.len());
    for (&i, keep) in order.iter().zip(keep) {
        if keep {
            map.extend(slots[i].take());
        }
    }
    (Json::Object(Map(map)), path)
}

fn merge_sort(fields: &[(String, Json)], order: &mut [usize], scratch: &mut Vec<usize>) {
    if order.len() < 2 {
        return;
    }
    let (a, b) = order.split_at_mut(order.len() / 2);
    merge_sort(fields, a, scratch);
    merge_sort(fields, b, scratch);
    if fields[a[a.len() - 1]].0 <= fields[b[0]].0 {
        return;
    }
    scratch.clear();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if fields[b[j]].0 < fields[a[i]].0 {
            scratch.push(b[j]);
            j += 1;
        } else {
            scratch.push(a[i]);
            i += 1;
        }
    }
    scratch.extend_from_slice(&a[i..]);
    scratch.extend_from_slice(&b[j..]);
    order.copy_from_slice(scratch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;
    use proptest::prelude::*;
    use serde_json::Value;

    /// serde_json's tree, as this module's.
    fn model(v: &Value) -> Json {
        match v {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => Json::Number(Number(match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => N::Positive(u),
                (None, Some(i)) => N::Negative(i),
                _ => N::Float,
            })),
            Value::String(s) => Json::String(s.clone()),
            Value::Array(items) => Json::Array(items.iter().map(model).collect()),
            Value::Object(map) => Json::Object(Map(map.iter().map(|(k, v)| (k.clone(), model(v))).collect())),
        }
    }

    /// The first repeated key's path as a serde visitor finds it, key by key in the text.
    fn model_repeated(bytes: &[u8]) -> Option<Vec<String>> {
        struct Keys(Option<Vec<String>>);
        impl<'de> serde::Deserialize<'de> for Keys {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = Keys;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("JSON")
                    }
                    fn visit_bool<E>(self, _: bool) -> Result<Keys, E> {
                        Ok(Keys(None))
                    }
                    fn visit_i64<E>(self, _: i64) -> Result<Keys, E> {
                        Ok(Keys(None))
                    }
                    fn visit_u64<E>(self, _: u64) -> Result<Keys, E> {
                        Ok(Keys(None))
                    }
                    fn visit_f64<E>(self, _: f64) -> Result<Keys, E> {
                        Ok(Keys(None))
                    }
                    fn visit_str<E>(self, _: &str) -> Result<Keys, E> {
                        Ok(Keys(None))
                    }
                    fn visit_unit<E>(self) -> Result<Keys, E> {
                        Ok(Keys(None))
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<Keys, A::Error> {
                        let mut repeated = None;
                        while let Some(Keys(inner)) = s.next_element::<Keys>()? {
                            repeated = repeated.or(inner);
                        }
                        Ok(Keys(repeated))
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Keys, A::Error> {
                        let mut seen = Vec::new();
                        let mut repeated = None;
                        while let Some(k) = m.next_key::<String>()? {
                            let Keys(inner) = m.next_value::<Keys>()?;
                            if repeated.is_none() {
                                if seen.contains(&k) {
                                    repeated = Some(vec![k.clone()]);
                                } else if let Some(mut p) = inner {
                                    p.insert(0, k.clone());
                                    repeated = Some(p);
                                }
                            }
                            seen.push(k);
                        }
                        Ok(Keys(repeated))
                    }
                }
                d.deserialize_any(V)
            }
        }
        serde_json::from_slice::<Keys>(bytes).ok().and_then(|k| k.0)
    }

    fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
        let ours = read(bytes);
        match serde_json::from_slice::<Value>(bytes) {
            Ok(v) => {
                let (tree, path) = ours.map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
                prop_assert_eq!(tree, model(&v));
                prop_assert_eq!(path, model_repeated(bytes));
            }
            Err(e) => prop_assert_eq!(ours.map(|_| ()).map_err(|e| e.to_string()), Err(e.to_string())),
        }
        Ok(())
    }

    /// Text that is JSON, or nearly: numbers of every shape (past u64, past f64, exponents past
    /// i32), escapes (surrogates, lone halves, bad hex), repeated and nested keys, whitespace
    /// and newlines anywhere.
    fn texty() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", "", " ", "\n", "\t", "\r\n ", "\n\n"]);
        let number = prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{0,22})?([eE][+-]?[0-9]{0,12})?",
            "-?[0-9]{1,3}(\\.[0-9]{1,3})?[eE]\\+?(28[0-9]|29[0-9]|30[0-9]|31[0-9])",
            "(1797693134862315[0-9]|17976931348623157[0-9]{0,3})[eE]29[0-9]",
            prop::sample::select(vec![
                "-0",
                "1.",
                "-",
                "01",
                "1e",
                "1e+",
                ".5",
                "1.e5",
                "2147483648e1",
                "1e2147483648"
            ])
            .prop_map(String::from),
        ];
        let string = prop_oneof![
            "[a-c]{0,3}",
            "(\\\\[\"\\\\/bfnrtu]|\\\\u[0-9a-fA-F]{4}|\\\\u[dD][89abAB][0-9a-f]{2}(\\\\u[dD][c-fC-F][0-9a-f]{2})?|\\\\u[dD][c-f][0-9]{2}|\\\\x|[\\x00-\\x1f]|é|[a-b]){0,4}",
        ]
        .prop_map(|s| format!("\"{s}\""));
        let leaf = prop_oneof![
            number,
            string.clone(),
            prop::sample::select(vec!["null", "true", "false", "nul", "tru", "nulx"]).prop_map(String::from),
        ];
        let key = prop_oneof!["[a-c]{0,2}", "a|b"].prop_map(|s| format!("\"{s}\""));
        (leaf.prop_recursive(4, 32, 4, move |inner| {
            let ws = ws.clone();
            prop_oneof![
                (prop::collection::vec((inner.clone(), ws.clone()), 0..4), ws.clone()).prop_map(|(items, w)| {
                    let items: Vec<String> = items.into_iter().map(|(v, w)| format!("{w}{v}{w}")).collect();
                    format!("[{w}{}]", items.join(","))
                }),
                (prop::collection::vec((key.clone(), inner, ws.clone()), 0..4), ws).prop_map(|(fields, w)| {
                    let fields: Vec<String> = fields.into_iter().map(|(k, v, w)| format!("{w}{k}{w}:{v}")).collect();
                    format!("{{{w}{}}}", fields.join(","))
                }),
            ]
        }),)
            .prop_map(|(v,)| v)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        // Any text near JSON, mutated (cut short, a byte put in or taken out): the same tree
        // and repeated key, or the same error at the same place, as serde_json.
        #[test]
        fn reads_as_serde_json_reads(text in texty(), at in any::<prop::sample::Index>(), byte in prop::sample::select(b"{}[]\":,\\ \n0-.eEu\x01\xff\xc3a".to_vec()), how in 0..4u8) {
            let mut bytes = text.into_bytes();
            let i = at.index(bytes.len() + 1);
            match how {
                0 => {}
                1 => bytes.truncate(i),
                2 => bytes.insert(i, byte),
                _ => if i < bytes.len() { bytes.remove(i); },
            }
            check(&bytes)?;
        }
    }

    proptest! {
        // Numbers near f64's end (a fraction, an exponent, digits past u64): out of range or
        // not exactly as serde_json says.
        #[test]
        fn numbers_at_the_edge_of_range_read_as_serde_json_reads(int in "[1-9][0-9]{0,21}", fraction in "(\\.[0-9]{1,22})?", e in 270..330i32, sign in "-?") {
            check(format!("{sign}{int}{fraction}e{e}").as_bytes())?;
        }
    }

    #[test]
    fn edges_read_as_serde_json_reads() {
        let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
        for text in [
            deep(127),
            deep(128),
            "{\"a\":1,\"a\":{\"b\":[{\"c\":1,\"c\":2}]}}".into(),
            "{\"x\":{\"b\":1,\"b\":2},\"x\":1}".into(),
            "{\"x\":{\"b\":1,\"b\":2},\"y\":1,\"y\":2}".into(),
            "[{\"b\":1},{\"a\":1,\"a\":1}]".into(),
            "\"\u{e9}\\u00e9\\ud83d\\ude00\"".into(),
            "1.7976931348623157e308".into(),
            "1.7e308".into(),
            "1.8e308".into(),
            "1.7976931348623159e308".into(),
            "18446744073709551616".into(),
            "184467440737095516150.5e289".into(),
            "-9223372036854775808".into(),
            "-9223372036854775809".into(),
            "0.000000000000000000000000000001e400".into(),
            "1e-2147483649".into(),
            "0e2147483648".into(),
            "  \n [1,\n 2,\n ]".into(),
            "".into(),
        ] {
            check(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        check(b"\"a\xff\xfeb\"").unwrap();
        check(b"\"\\u00e9\xc3\"").unwrap();
        check(b"{\"k\":\"\x1f\"}").unwrap();
    }

    #[test]
    fn many_keys_in_any_order_sort_in_time() {
        let n = 3000;
        let fields: Vec<String> = (0..n).rev().map(|i| format!("\"k{i:05}\":{i}")).collect();
        let text = format!("{{{}}}", fields.join(","));
        let Json::Object(map) = from_slice(text.as_bytes()).unwrap() else { panic!() };
        assert_eq!(map.len(), n);
        assert!(map.keys().zip(map.keys().skip(1)).all(|(a, b)| a < b));
        assert_eq!(map.get("k00007").and_then(Json::as_i64), Some(7));
    }
}
