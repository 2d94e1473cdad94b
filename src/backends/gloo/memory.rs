//! Memory helpers every host transport uses: scratch memory sized by an
//! operation's counts, private copies of inputs, and the transfers of a
//! rank to itself.

use crate::error::Result;
use crate::op::P2p;

/// 8-byte aligned scratch memory.
pub(super) struct Scratch(Vec<u64>);

impl Scratch {
    /// `bytes` of zeroed scratch; its size comes from the caller's counts,
    /// so a failed allocation is `TC_ERR_OUT_OF_MEMORY`, not an abort.
    #[inline]
    pub(super) fn new(bytes: usize) -> Result<Scratch> {
        // Most small collectives need none: no allocator call for them.
        if bytes == 0 {
            return Ok(Scratch(Vec::new()));
        }
        let what = "scratch memory sized by the operation's counts";
        crate::util::try_zeroed(bytes.div_ceil(8), what).map(Scratch)
    }
    pub(super) fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }

    /// The per-rank buffers of a list-form op, `bytes` each, packed in rank
    /// order into one contiguous scratch buffer (as the single forms take it).
    ///
    /// # Safety
    /// Every pointer in `buffers` must be valid for reads of `bytes`.
    pub(super) unsafe fn packed(buffers: &[crate::op::Ptr], bytes: usize) -> Result<Scratch> {
        let mut s = Scratch::new(bytes * buffers.len())?;
        for (r, p) in buffers.iter().enumerate() {
            copy(s.ptr().add(r * bytes), p.as_u8(), bytes);
        }
        Ok(s)
    }
}

/// `bytes` at `input`, or a private copy of them when `needed` (the copy
/// must be kept alive while the returned pointer is used).
pub(super) unsafe fn private_input(
    input: *const u8,
    bytes: usize,
    needed: bool,
) -> Result<(Option<Scratch>, *const u8)> {
    if !needed {
        return Ok((None, input));
    }
    let mut c = Scratch::new(bytes)?;
    copy(c.ptr(), input, bytes);
    let p = c.ptr() as *const u8;
    Ok((Some(c), p))
}

/// memmove of `n` bytes (no-op when equal or empty).
pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    if n > 0 && !std::ptr::eq(dst, src) {
        std::ptr::copy(src, dst, n);
    }
}

/// Transfers to self pair up in order within each tag, like messages
/// between ranks; their data is copied at once.
pub(super) unsafe fn local_transfers(me: i32, ops: &[P2p], errors: &mut Vec<String>) {
    let mut tags: Vec<u32> = ops.iter().filter(|o| o.peer == me).map(|o| o.tag).collect();
    tags.sort_unstable();
    tags.dedup();
    for tag in tags {
        let mine = |send: bool| -> Vec<&P2p> {
            ops.iter()
                .filter(|o| o.peer == me && o.tag == tag && o.is_send == send)
                .collect()
        };
        let (sends, recvs) = (mine(true), mine(false));
        let tagged = if tag == 0 {
            String::new()
        } else {
            format!(" with tag {tag}")
        };
        if sends.len() != recvs.len() {
            errors.push(format!(
                "{} sends to self but {} receives from self{tagged} in one batch",
                sends.len(),
                recvs.len()
            ));
            continue;
        }
        for (s, r) in sends.iter().zip(&recvs) {
            if s.count != r.count || s.dtype != r.dtype {
                errors.push(format!(
                    "send of {} {} to self{tagged} does not match the receive of {} {}",
                    s.count,
                    s.dtype.name(),
                    r.count,
                    r.dtype.name()
                ));
            } else {
                copy(r.buf.as_u8(), s.buf.as_u8(), s.count * s.dtype.size());
            }
        }
    }
}
