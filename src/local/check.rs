//! Argument checks of the device-group operations: sizes that overflow,
//! buffers on the wrong device (`cuPointerGetAttribute`), overlapping
//! destinations. Every check runs before anything is enqueued, so a refused
//! call writes nothing.

use crate::cuda;
use crate::error::{Error, Result};
use crate::types::DType;
use cudarc::driver::sys::{CUmemorytype, CUpointer_attribute};
use std::ffi::c_void;
use std::fmt;

/// Where a buffer or a group member lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Cpu,
    Cuda(i32),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Cpu => write!(f, "host (CPU)"),
            Place::Cuda(i) => write!(f, "CUDA device {i}"),
        }
    }
}

/// `count` elements of `dtype` in bytes; an overflow is an error naming `arg`.
pub fn bytes_of(count: usize, dtype: DType, arg: &str) -> Result<usize> {
    count
        .checked_mul(dtype.size())
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "argument '{arg}': {count} elements of {} overflow the address space",
                dtype.name()
            ))
        })
}

/// The sum of `counts`, an overflow being an error naming `arg`.
pub fn sum_counts(counts: &[usize], arg: &str) -> Result<usize> {
    counts.iter().try_fold(0usize, |acc, c| {
        acc.checked_add(*c).ok_or_else(|| {
            Error::invalid_argument(format!("argument '{arg}': the counts overflow when summed"))
        })
    })
}

/// One pointer attribute of `ptr` as a 32-bit value; None for memory the
/// driver never saw (plain host memory).
fn attribute(ptr: *const c_void, attr: CUpointer_attribute) -> Result<Option<u32>> {
    let mut v: u32 = 0;
    // SAFETY: both attributes asked for here are 32-bit values; `ptr` is
    // only inspected.
    let r = unsafe {
        cuda::drv::cuPointerGetAttribute(
            &mut v as *mut u32 as *mut c_void,
            attr as u32,
            ptr as cudarc::driver::sys::CUdeviceptr,
        )
    };
    if r == cuda::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    cuda::check(r, "cuPointerGetAttribute")?;
    Ok(Some(v))
}

/// Where the byte at `ptr` lives: device (or managed) memory is on its
/// device; pinned, registered and plain host memory is the CPU. Without a
/// CUDA driver everything is host memory.
pub fn place_of(ptr: *const c_void) -> Result<Place> {
    if !cuda::is_available() {
        return Ok(Place::Cpu);
    }
    let kind = attribute(ptr, CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)?;
    match kind {
        None => Ok(Place::Cpu),
        Some(k) if k == CUmemorytype::CU_MEMORYTYPE_HOST as u32 => Ok(Place::Cpu),
        Some(_) => {
            let ord = attribute(
                ptr,
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            )?;
            Ok(Place::Cuda(ord.unwrap_or(0) as i32))
        }
    }
}

/// Checks that the `bytes` bytes at `ptr` (argument `arg`) lie on `want`:
/// the first and the last byte. NULL is accepted only for 0 bytes.
pub fn on_place(ptr: *const c_void, bytes: usize, want: Place, arg: &str) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    if ptr.is_null() {
        return Err(Error::null_argument(arg));
    }
    let last = (ptr as usize).checked_add(bytes - 1).ok_or_else(|| {
        Error::invalid_argument(format!(
            "argument '{arg}': {bytes} bytes at {ptr:p} wrap around the address space"
        ))
    })?;
    for (p, which) in [(ptr, "starts"), (last as *const c_void, "ends")] {
        let got = place_of(p)?;
        if got != want {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': the buffer at {ptr:p} ({bytes} bytes) {which} in {got} memory; it must be on {want}"
            )));
        }
    }
    Ok(())
}

/// A byte range an operation reads or writes, named for messages.
pub struct Span {
    pub start: usize,
    pub len: usize,
    pub name: String,
    pub writes: bool,
}

impl Span {
    pub fn new(ptr: *const c_void, len: usize, name: String, writes: bool) -> Span {
        Span {
            start: ptr as usize,
            len,
            name,
            writes,
        }
    }
}

/// Fails when two spans overlap and at least one of them is written
/// (sources may share memory; a destination may not touch anything else).
pub fn disjoint(mut spans: Vec<Span>) -> Result<()> {
    spans.retain(|s| s.len > 0);
    spans.sort_by_key(|s| s.start);
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if b.start >= a.start + a.len {
                break;
            }
            if a.writes || b.writes {
                return Err(Error::invalid_argument(format!(
                    "arguments '{}' and '{}' overlap ({} bytes at 0x{:x} and {} bytes at 0x{:x}); a destination may not \
                     overlap another buffer of the call",
                    a.name, b.name, a.len, a.start, b.len, b.start
                )));
            }
        }
    }
    Ok(())
}

/// torch.chunk's split of `count` elements into at most `n` chunks: chunks
/// of ceil(count / n) elements, the last one shorter; when fewer chunks are
/// needed than `n` the remaining entries are 0 (torch returns fewer chunks).
pub fn torch_chunks(count: usize, n: usize) -> Vec<usize> {
    let chunk = count.div_ceil(n.max(1));
    (0..n)
        .map(|i| count.saturating_sub(i.saturating_mul(chunk)).min(chunk))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases checked against torch.chunk (torch 2.x): element counts
    /// of each chunk, missing chunks as 0.
    #[test]
    fn chunks_follow_torch_chunk() {
        let cases: &[(usize, usize, &[usize])] = &[
            (0, 3, &[0, 0, 0]),
            (1, 4, &[1, 0, 0, 0]),
            (4, 3, &[2, 2, 0]),
            (5, 4, &[2, 2, 1, 0]),
            (6, 4, &[2, 2, 2, 0]),
            (7, 3, &[3, 3, 1]),
            (10, 4, &[3, 3, 3, 1]),
            (13, 2, &[7, 6]),
            (9, 4, &[3, 3, 3, 0]),
        ];
        for (count, n, want) in cases {
            assert_eq!(torch_chunks(*count, *n), *want, "count {count}, n {n}");
        }
    }

    #[test]
    fn overlapping_writes_are_refused_reads_are_not() {
        let s = |a: usize, l: usize, n: &str, w: bool| Span {
            start: a,
            len: l,
            name: n.into(),
            writes: w,
        };
        assert!(disjoint(vec![s(0, 8, "a", false), s(4, 8, "b", false)]).is_ok());
        let e = disjoint(vec![s(0, 8, "a", false), s(4, 8, "dsts[1]", true)]).unwrap_err();
        assert!(e.message.contains("dsts[1]"), "{}", e.message);
        assert!(disjoint(vec![s(0, 8, "a", true), s(8, 8, "b", true)]).is_ok());
        assert!(bytes_of(usize::MAX / 2, DType::F32, "count").is_err());
    }
}
