//! A byte buffer in memory from `malloc` (or `posix_memalign`), of fixed capacity: results are
//! written straight into the memory handed to C callers (released there with
//! `tc_free`), without a final copy.

use crate::error::{Error, Result};
use crate::util::lock;
use std::ffi::c_void;

pub struct CBuf {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

// The buffer is owned; moving it between threads moves that ownership.
unsafe impl Send for CBuf {}

impl CBuf {
    /// An empty buffer with room for `cap` bytes (the pages are only
    /// committed as they are written, so a generous bound costs nothing).
    /// A large one is asked to be backed by 2 MiB pages: fresh memory is
    /// then faulted in 512 times less often (the faults, not the copies,
    /// dominated a 50 MB result); still released by `free`.
    pub fn with_capacity(cap: usize) -> Result<CBuf> {
        let ptr = if cap >= HUGE_FROM {
            huge_alloc(cap)
        } else {
            // SAFETY: plain allocation; never 0 bytes so the pointer is unique.
            unsafe { libc::malloc(cap.max(1)) as *mut u8 }
        };
        if ptr.is_null() {
            return Err(Error::out_of_memory(
                "argument 'input.nnz': a sparse all-reduce's entries",
                cap as u128,
            ));
        }
        Ok(CBuf { ptr, len: 0, cap })
    }

    pub fn from_slice(bytes: &[u8]) -> Result<CBuf> {
        let mut b = CBuf::with_capacity(bytes.len())?;
        b.append(bytes);
        Ok(b)
    }

    /// Room for `n` more bytes, written by `fill` (which must write them
    /// all). Panics past the capacity: callers size buffers exactly.
    pub fn append_with(&mut self, n: usize, fill: impl FnOnce(*mut u8)) {
        assert!(self.cap - self.len >= n, "CBuf overflow");
        // SAFETY: within the allocation, checked above.
        fill(unsafe { self.ptr.add(self.len) });
        self.len += n;
    }

    pub fn append(&mut self, bytes: &[u8]) {
        self.append_with(bytes.len(), |dst| unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len())
        });
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes were written.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hands the memory to the caller (never NULL), to release with `free`.
    pub fn into_raw(self) -> *mut c_void {
        let p = self.ptr;
        std::mem::forget(self);
        p.cast()
    }
}

/// The size of a huge page, and the buffer size from which one is asked for.
const HUGE_PAGE: usize = 2 << 20;
const HUGE_FROM: usize = 4 << 20;

/// `cap` bytes (NULL on failure) from `posix_memalign`, aligned to a huge
/// page and advised to use them (where the kernel offers transparent huge
/// pages on request; elsewhere the advice is ignored).
fn huge_alloc(cap: usize) -> *mut u8 {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; the alignment is a power of two.
    if unsafe { libc::posix_memalign(&mut p, HUGE_PAGE, cap) } != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `p` starts `cap` bytes of our own mapping; advice only.
    unsafe { libc::madvise(p, cap, libc::MADV_HUGEPAGE) };
    p.cast()
}

impl Drop for CBuf {
    fn drop(&mut self) {
        // SAFETY: from malloc or posix_memalign, owned.
        unsafe { libc::free(self.ptr.cast()) }
    }
}

impl std::ops::Deref for CBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for CBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CBuf({} bytes)", self.len)
    }
}

/// Exchange buffers kept for the next calls: their pages stay mapped, so a
/// repeated all-reduce of similar size does not fault in fresh memory each
/// time (large `malloc` blocks are mapped anew on every allocation).
static POOL: std::sync::Mutex<Vec<CBuf>> = std::sync::Mutex::new(Vec::new());
/// At most this many buffers are kept.
const POOL_SIZE: usize = 4;

impl CBuf {
    /// An empty buffer of at least `cap` bytes, reused when one is pooled.
    pub fn pooled(cap: usize) -> Result<CBuf> {
        let mut pool = lock(&POOL);
        let fit = (0..pool.len())
            .filter(|i| pool[*i].cap >= cap)
            .min_by_key(|i| pool[*i].cap);
        match fit {
            Some(i) => {
                let mut b = pool.swap_remove(i);
                b.len = 0;
                Ok(b)
            }
            None => {
                drop(pool);
                CBuf::with_capacity(cap)
            }
        }
    }

    /// Returns the buffer to the pool (dropping the smallest when full).
    pub fn recycle(self) {
        let mut pool = lock(&POOL);
        pool.push(self);
        if pool.len() > POOL_SIZE {
            if let Some(i) = (0..pool.len()).min_by_key(|i| pool[*i].cap) {
                pool.swap_remove(i);
            }
        }
    }

    /// Marks `len` bytes as written (by a collective into `as_mut_ptr`).
    ///
    /// # Safety
    /// The first `len` bytes must have been written; `len <= capacity`.
    pub unsafe fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "CBuf overflow");
        self.len = len;
    }
}
