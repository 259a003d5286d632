//! Splitting a red packet into random shares ("double mean" method).
//!
//! Each share is drawn uniformly from `[min, 2 × remaining / shares_left]`, capped so
//! that every later share can still get `min`; the last share takes the rest. Later
//! draws have a wider range than earlier ones, so the shares are shuffled afterwards:
//! every position then has the same distribution, with mean `total / count`.

use alloc::vec::Vec;
use rand_core::RngCore;

use crate::error::{InputError, Problem};

/// Largest total accepted, in cents (10^13: far below 2^53 in every layer).
pub const MAX_TOTAL: i64 = 10_000_000_000_000;
/// Most shares in one packet.
pub const MAX_COUNT: i64 = 10_000;

/// Splits `total` into `count` shares, each at least `min`, summing exactly to `total`.
pub fn split<R: RngCore + ?Sized>(total: i64, count: i64, min: i64, rng: &mut R) -> Result<Vec<i64>, InputError> {
    crate::validate::range("total_cents", total, 1, MAX_TOTAL)?;
    crate::validate::range("count", count, 1, MAX_COUNT)?;
    crate::validate::range("min_cents", min, 1, MAX_TOTAL)?;
    if min.checked_mul(count).is_none_or(|need| need > total) {
        return Err(InputError::new("total_cents", Problem::Inconsistent("must be at least count × min_cents")));
    }
    let (total, count, min) = (total as u64, count as u64, min as u64);
    let mut shares = Vec::with_capacity(count as usize);
    let mut remaining = total;
    for left in (1..=count).rev() {
        if left == 1 {
            shares.push(remaining as i64);
            break;
        }
        // Leave at least `min` for each of the other `left - 1` shares.
        let hi = (2 * remaining / left).min(remaining - min * (left - 1));
        let share = uniform(rng, min, hi.max(min));
        shares.push(share as i64);
        remaining -= share;
    }
    // Fisher–Yates.
    for i in (1..shares.len()).rev() {
        let j = uniform(rng, 0, i as u64) as usize;
        shares.swap(i, j);
    }
    Ok(shares)
}

/// A uniform integer in `lo..=hi`, without modulo bias.
pub fn uniform<R: RngCore + ?Sized>(rng: &mut R, lo: u64, hi: u64) -> u64 {
    debug_assert!(lo <= hi);
    let span = hi - lo;
    if span == u64::MAX {
        return rng.next_u64();
    }
    let range = span + 1;
    // Largest multiple of `range` that fits: draws at or above it would favour small values.
    let zone = (u64::MAX / range) * range;
    loop {
        let x = rng.next_u64();
        if x < zone {
            return lo + x % range;
        }
    }
}
