//! A Redis reply, whichever way it travelled (REST JSON or RESP).

use alloc::string::String;
use alloc::vec::Vec;

use crate::error::ShapeError;

/// A successful Redis reply. Error replies are [`crate::error::ErrorReply`] instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A null bulk string or null array.
    Nil,
    /// An integer reply.
    Int(i64),
    /// A bulk string or status reply, as raw bytes (binary-safe).
    Bytes(Vec<u8>),
    /// An array reply.
    Array(Vec<Value>),
}

impl Value {
    /// The integer, also accepting a decimal bulk string (Redis returns both forms).
    pub fn to_int(&self, op: &'static str) -> Result<i64, ShapeError> {
        match self {
            Value::Int(n) => Ok(*n),
            Value::Bytes(b) => core::str::from_utf8(b)
                .ok()
                .and_then(crate::text::int)
                .ok_or(ShapeError::new(op, "expected an integer")),
            _ => Err(ShapeError::new(op, "expected an integer")),
        }
    }

    /// Removes the mark a script puts at the end of a reply it replayed for an idempotency
    /// key (the bulk string `replayed`); true when it was there.
    ///
    /// ```
    /// use redcount_core::Value;
    /// let mut reply = Value::Array(vec![Value::Int(1), Value::Bytes(b"replayed".to_vec())]);
    /// assert!(reply.take_replay_mark());
    /// assert_eq!(reply, Value::Array(vec![Value::Int(1)]));
    /// assert!(!reply.take_replay_mark());
    /// ```
    pub fn take_replay_mark(&mut self) -> bool {
        match self {
            Value::Array(items) if matches!(items.last(), Some(Value::Bytes(b)) if b == b"replayed") => {
                items.pop();
                true
            }
            _ => false,
        }
    }

    /// The array's elements.
    pub fn into_array(self, op: &'static str) -> Result<Vec<Value>, ShapeError> {
        match self {
            Value::Array(v) => Ok(v),
            _ => Err(ShapeError::new(op, "expected an array")),
        }
    }

    /// An array of exactly `n` integers.
    pub fn into_ints<const N: usize>(self, op: &'static str) -> Result<[i64; N], ShapeError> {
        let mut out = [0i64; N];
        self.fill_ints(op, &mut out)?;
        Ok(out)
    }

    /// [`Value::into_ints`] into `out` (exactly `out.len()` integers): one copy for every `N`.
    #[inline(never)]
    fn fill_ints(self, op: &'static str, out: &mut [i64]) -> Result<(), ShapeError> {
        let items = self.into_array(op)?;
        if items.len() != out.len() {
            return Err(ShapeError::new(op, "unexpected array length"));
        }
        for (slot, v) in out.iter_mut().zip(items.iter()) {
            *slot = v.to_int(op)?;
        }
        Ok(())
    }

    /// A UTF-8 string.
    pub fn into_string(self, op: &'static str) -> Result<String, ShapeError> {
        match self {
            Value::Bytes(b) => String::from_utf8(b).map_err(|_| ShapeError::new(op, "expected UTF-8")),
            _ => Err(ShapeError::new(op, "expected a string")),
        }
    }
}
