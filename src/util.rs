//! Small helpers every module uses: a poison-ignoring lock, the overlap test
//! of two byte ranges, deadlines, and allocations whose size a caller chose.

use crate::error::{Error, Result};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Locks `m`, ignoring poison: a panic on another thread (caught at the C
/// boundary) must not make the state it guarded unusable, and every holder
/// leaves it consistent between statements.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An empty vector with room for `len` elements, for memory whose size a
/// caller chose (a gradient's count, a sparse tensor's entries, ...): a
/// failed allocation is `TC_ERR_OUT_OF_MEMORY` naming `what` (the argument)
/// and the bytes, where `Vec`'s own allocation would abort the process.
/// Every such allocation goes through here or [`try_filled`].
pub fn try_vec<T>(len: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::out_of_memory(what, len as u128 * std::mem::size_of::<T>() as u128))?;
    Ok(v)
}

/// `len` copies of `value`, allocated as [`try_vec`] does.
pub fn try_filled<T: Clone>(value: T, len: usize, what: &str) -> Result<Vec<T>> {
    let mut v = try_vec(len, what)?;
    v.resize(len, value);
    Ok(v)
}

/// Plain numbers whose all-zero bytes are the value 0, for [`try_zeroed`].
pub trait ZeroBits: Copy {}
impl ZeroBits for u64 {}
impl ZeroBits for f32 {}

/// `len` zeros, allocated as [`try_vec`] does but zeroed by the allocator,
/// as `vec![0; len]` is (large blocks come zeroed from the system: no pass
/// over the memory).
pub fn try_zeroed<T: ZeroBits>(len: usize, what: &str) -> Result<Vec<T>> {
    let size = std::mem::size_of::<T>();
    let oom = || Error::out_of_memory(what, len as u128 * size as u128);
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| oom())?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: a non-zero layout; the block, from the global allocator with
    // T's layout for `len` elements all zero (a valid T each), becomes the
    // vector's own.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            return Err(oom());
        }
        Ok(Vec::from_raw_parts(p, len, len))
    }
}

/// Resizes `v` to `len` elements (new ones `value`), growing as [`try_vec`]
/// allocates.
pub fn try_resize<T: Clone>(v: &mut Vec<T>, len: usize, value: T, what: &str) -> Result<()> {
    if len > v.len() {
        v.try_reserve_exact(len - v.len()).map_err(|_| {
            Error::out_of_memory(what, len as u128 * std::mem::size_of::<T>() as u128)
        })?;
    }
    v.resize(len, value);
    Ok(())
}

/// Whether the byte ranges [a, a + alen) and [b, b + blen) share a byte;
/// ranges that would pass the end of the address space end there.
#[inline]
pub fn overlaps(a: *const u8, alen: usize, b: *const u8, blen: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    alen > 0 && blen > 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

/// A point in time an operation must finish by, and the timeout it came
/// from.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from now (a timeout past what `Instant` can hold waits for
    /// about a century).
    pub fn after(timeout: Duration) -> Deadline {
        Deadline::since(Instant::now(), timeout)
    }

    /// `timeout` from `start`, a time the caller read already (a clock read
    /// costs about as much as the rest of a small operation's bookkeeping).
    pub fn since(start: Instant, timeout: Duration) -> Deadline {
        let at = start
            .checked_add(timeout)
            .unwrap_or_else(|| start + Duration::from_secs(100 * 365 * 24 * 3600));
        Deadline { at, timeout }
    }

    /// The timeout this deadline was made from.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The time left, at least 1 ms (a wait of zero would not wait at all).
    pub fn remaining(&self) -> Duration {
        self.at
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    /// The time left (at least 1 ms), or a timeout error once it has passed.
    pub fn left(&self) -> Result<Duration> {
        if self.passed() {
            return Err(Error::timeout("the operation's timeout expired"));
        }
        Ok(self.remaining())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(address: usize) -> *const u8 {
        address as *const u8
    }

    #[test]
    fn overlaps_needs_a_shared_byte() {
        assert!(overlaps(at(100), 10, at(109), 1));
        assert!(!overlaps(at(100), 10, at(110), 5));
        assert!(
            !overlaps(at(100), 0, at(100), 5),
            "an empty range overlaps nothing"
        );
        assert!(overlaps(at(100), 10, at(90), 11));
        assert!(!overlaps(at(100), 10, at(90), 10));
    }

    #[test]
    fn overlaps_near_the_end_of_the_address_space_does_not_wrap() {
        // Unguarded, b + blen wraps to 4 and the overlap is missed (or the
        // addition panics with overflow checks on).
        assert!(overlaps(at(usize::MAX - 8), 4, at(usize::MAX - 10), 14));
        assert!(overlaps(at(usize::MAX - 10), 14, at(usize::MAX - 8), 4));
        assert!(!overlaps(at(0), 4, at(usize::MAX - 10), 14));
    }

    #[test]
    fn deadlines_count_down_and_then_time_out() {
        let d = Deadline::after(Duration::from_secs(3600));
        assert!(!d.passed());
        assert!(d.left().unwrap() > Duration::from_secs(3000));
        assert_eq!(d.timeout(), Duration::from_secs(3600));
        let past = Deadline::after(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert!(past.passed());
        assert_eq!(past.remaining(), Duration::from_millis(1));
        let e = past.left().unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Timeout, "{}", e.message);
        assert!(
            !Deadline::after(Duration::MAX).passed(),
            "a huge timeout must not overflow"
        );
    }
}
