//! The collectives over the shared segment: each copies in, syncs, works
//! on its share of every chunk (reductions with the kernels of
//! [`super::super::super::reduce`]) and copies out.

use super::{copy, reduce, share, IntraHost, Reduction, Scale, Scratch, SyncAll, HALF, PAYLOAD};
use crate::error::{Error, Result};
use std::ffi::c_void;

/// Reductions up to this many bytes take one sync (see
/// [`IntraHost::reduce`]): each rank reads every rank's input, which for so
/// few bytes costs less than a second sync.
const ONE_SYNC_BYTES: usize = 16 << 10;

/// Where the ranks put their parts of one chunk: the payload of their sync
/// lines when a part fits there (data and sync then move as one line),
/// else their data half `h`. Made just before the chunk's sync (at phase
/// `p`), the one sync after which the part is read.
struct Chunk {
    h: usize,
    p: u64,
    small: bool,
}

impl IntraHost {
    /// The next chunk, in which each rank writes at most `bytes`.
    fn next_chunk(&self, bytes: usize) -> Chunk {
        Chunk {
            h: self.next_half(),
            p: self.next_phase(),
            small: bytes <= PAYLOAD,
        }
    }

    /// Rank `r`'s part of chunk `c`.
    fn area(&self, r: usize, c: &Chunk) -> *mut u8 {
        if c.small {
            self.payload(r, c.p)
        } else {
            self.half(r, c.h)
        }
    }

    /// Reduces `len` elements at `src(r)` of every rank `r`, in rank
    /// order, into `out`.
    unsafe fn combine(
        &self,
        red: &Reduction,
        src: impl Fn(usize) -> *const u8,
        len: usize,
        out: *mut u8,
        blocks: &mut Scratch,
    ) -> Result<()> {
        if self.combine_undivided(red, src, len, out, blocks)? {
            reduce::scale(red.dtype, out, out, len, Scale::Div(self.size as u64))?;
        }
        Ok(())
    }

    /// [`IntraHost::combine`] less AVG's division for the plain kernels:
    /// true when the caller still has to divide `out` by the rank count
    /// (the half-precision kernel divides as it sums).
    unsafe fn combine_undivided(
        &self,
        red: &Reduction,
        src: impl Fn(usize) -> *const u8,
        len: usize,
        out: *mut u8,
        blocks: &mut Scratch,
    ) -> Result<bool> {
        let es = red.dtype.size();
        if red.halves {
            for r in 0..self.size {
                copy(blocks.ptr().add(r * len * es), src(r), len * es);
            }
            reduce::sum_half_blocks(
                red.dtype,
                out,
                blocks.ptr(),
                self.size,
                len,
                red.avg.then_some(self.size as u64),
            )?;
            return Ok(false);
        }
        copy(out, src(0), len * es);
        for r in 1..self.size {
            (red.f)(
                out as *mut c_void,
                out as *const c_void,
                src(r) as *const c_void,
                len,
            );
        }
        Ok(red.avg)
    }

    /// Copies `len` elements of an input into a segment; PREMUL_SUM's
    /// factor is applied by the copy itself (one pass over the data).
    unsafe fn copy_in(
        &self,
        red: &Reduction,
        seg: *mut u8,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        match red.premul {
            Some(k) => reduce::scale(red.dtype, seg, src, len, Scale::Mul(k)),
            None => {
                copy(seg, src, len * red.dtype.size());
                Ok(())
            }
        }
    }

    /// Scratch for [`IntraHost::combine`] of up to `len` elements.
    fn blocks_for(&self, red: &Reduction, len: usize) -> Result<Scratch> {
        Scratch::new(if red.halves {
            self.size * len * red.dtype.size()
        } else {
            0
        })
    }

    /// all_reduce of `count` elements in place; with `root`, a reduce (the
    /// result lands on the root only). Up to [`ONE_SYNC_BYTES`]: one sync,
    /// after which every rank (the root only, for a reduce) combines the
    /// whole input itself, in rank order (the same bits everywhere). Its
    /// half is next written two chunks later, after a sync that every rank
    /// reaches only once done reading it.
    pub unsafe fn reduce(
        &self,
        buf: *mut u8,
        count: usize,
        red: &Reduction,
        root: Option<usize>,
        sync: &SyncAll,
    ) -> Result<()> {
        let es = red.dtype.size();
        if count * es > ONE_SYNC_BYTES {
            return self.reduce_in_shares(buf, count, red, root, sync);
        }
        let c = self.next_chunk(count * es);
        // Allocated before the first sync: a rank without the memory fails
        // there, which the other ranks hear about at that sync.
        let combines = root.map_or(true, |r| r == self.rank) && count > 0;
        let mut blocks = self.blocks_for(red, if combines { count } else { 0 })?;
        self.copy_in(red, self.area(self.rank, &c), buf, count)?;
        sync(if root.is_some() {
            "reduce"
        } else {
            "all_reduce"
        })?;
        if combines {
            self.combine(red, |r| self.area(r, &c), count, buf, &mut blocks)?;
        }
        Ok(())
    }

    /// [`IntraHost::reduce`] chunk by chunk, each rank reducing its share.
    unsafe fn reduce_in_shares(
        &self,
        buf: *mut u8,
        count: usize,
        red: &Reduction,
        root: Option<usize>,
        sync: &SyncAll,
    ) -> Result<()> {
        let (n, me, es) = (self.size, self.rank, red.dtype.size());
        let per_chunk = HALF / es;
        let share_max = count.min(per_chunk).div_ceil(n);
        // A rank that gets the result reduces its share straight into `buf`
        // (its input there is already in its segment); only a reduce's
        // other ranks, whose `buf` must stay as it was, need scratch.
        let lands_here = root.map_or(true, |r| r == me);
        if red.avg {
            // A dtype AVG cannot divide fails here, before `buf` is touched.
            reduce::scale(red.dtype, buf, buf, 0, Scale::Div(n as u64))?;
        }
        let mut acc = Scratch::new(if lands_here { 0 } else { share_max * es })?;
        let mut blocks = self.blocks_for(red, share_max)?;
        let what = if root.is_some() {
            "reduce"
        } else {
            "all_reduce"
        };
        for c0 in (0..count).step_by(per_chunk) {
            let (m, h) = ((count - c0).min(per_chunk), self.next_half());
            let mine = self.half(me, h);
            self.copy_in(red, mine, buf.add(c0 * es), m)?;
            sync(what)?;
            let (s0, len) = share(m, n, me);
            let mut own_share_final = false;
            if len > 0 {
                let out = if lands_here {
                    buf.add((c0 + s0) * es)
                } else {
                    acc.ptr()
                };
                // AVG's division, when still due, is the copy into the
                // segment itself: one pass instead of two.
                let src = |r| self.half(r, h).add(s0 * es) as *const u8;
                if self.combine_undivided(red, src, len, out, &mut blocks)? {
                    reduce::scale(red.dtype, mine.add(s0 * es), out, len, Scale::Div(n as u64))?;
                } else {
                    copy(mine.add(s0 * es), out, len * es);
                    own_share_final = lands_here;
                }
            }
            sync(what)?;
            if lands_here {
                // This rank's share is in `buf` already unless AVG left the
                // undivided sum there.
                for r in (0..n).filter(|&r| r != me || !own_share_final) {
                    let (s, l) = share(m, n, r);
                    copy(buf.add((c0 + s) * es), self.half(r, h).add(s * es), l * es);
                }
            }
        }
        Ok(())
    }

    /// `bytes` from `root` to every rank.
    pub unsafe fn broadcast(
        &self,
        buf: *mut u8,
        bytes: usize,
        root: usize,
        sync: &SyncAll,
    ) -> Result<()> {
        for c0 in (0..bytes).step_by(HALF) {
            let m = (bytes - c0).min(HALF);
            let c = self.next_chunk(m);
            if self.rank == root {
                copy(self.area(root, &c), buf.add(c0), m);
            }
            sync("broadcast")?;
            if self.rank != root {
                copy(buf.add(c0), self.area(root, &c), m);
            }
        }
        Ok(())
    }

    /// Every rank's `bytes` from `input` into `out`, in rank order.
    pub unsafe fn all_gather(
        &self,
        out: *mut u8,
        input: *const u8,
        bytes: usize,
        sync: &SyncAll,
    ) -> Result<()> {
        for c0 in (0..bytes).step_by(HALF) {
            let m = (bytes - c0).min(HALF);
            let c = self.next_chunk(m);
            copy(self.area(self.rank, &c), input.add(c0), m);
            sync("all_gather_single")?;
            for r in 0..self.size {
                copy(out.add(r * bytes + c0), self.area(r, &c), m);
            }
        }
        Ok(())
    }

    /// Block `me` (`count` elements) of the reduction of every rank's
    /// `input` of `size` blocks.
    pub unsafe fn reduce_scatter(
        &self,
        out: *mut u8,
        input: *const u8,
        count: usize,
        red: &Reduction,
        sync: &SyncAll,
    ) -> Result<()> {
        let (n, me, es) = (self.size, self.rank, red.dtype.size());
        let per_block = HALF / es / n;
        let mut blocks = self.blocks_for(red, count.min(per_block))?;
        for c0 in (0..count).step_by(per_block) {
            let m = (count - c0).min(per_block);
            let c = self.next_chunk(n * m * es);
            let mine = self.area(me, &c);
            for r in 0..n {
                self.copy_in(
                    red,
                    mine.add(r * m * es),
                    input.add((r * count + c0) * es),
                    m,
                )?;
            }
            sync("reduce_scatter_single")?;
            let src = |r| self.area(r, &c).add(me * m * es) as *const u8;
            self.combine(red, src, m, out.add(c0 * es), &mut blocks)?;
        }
        Ok(())
    }

    /// Every rank's `bytes` from `input` into `outputs[r]` on `root`
    /// (`outputs` is empty elsewhere).
    pub unsafe fn gather(
        &self,
        outputs: &[*mut u8],
        input: *const u8,
        bytes: usize,
        root: usize,
        sync: &SyncAll,
    ) -> Result<()> {
        for c0 in (0..bytes).step_by(HALF) {
            let m = (bytes - c0).min(HALF);
            let c = self.next_chunk(m);
            copy(self.area(self.rank, &c), input.add(c0), m);
            sync("gather")?;
            if self.rank == root {
                for (r, out) in outputs.iter().enumerate() {
                    copy(out.add(c0), self.area(r, &c), m);
                }
            }
        }
        Ok(())
    }

    /// `inputs[r]` on `root` (empty elsewhere) into rank `r`'s `out`, `bytes`
    /// each.
    pub unsafe fn scatter(
        &self,
        out: *mut u8,
        inputs: &[*const u8],
        bytes: usize,
        root: usize,
        sync: &SyncAll,
    ) -> Result<()> {
        let per_block = HALF / self.size;
        for c0 in (0..bytes).step_by(per_block) {
            let m = (bytes - c0).min(per_block);
            let c = self.next_chunk(self.size * m);
            for (r, input) in inputs.iter().enumerate() {
                copy(self.area(root, &c).add(r * m), input.add(c0), m);
            }
            sync("scatter")?;
            copy(out.add(c0), self.area(root, &c).add(self.rank * m), m);
        }
        Ok(())
    }

    /// Rank `r`'s `counts[r]` elements into `out` at the sum of the counts
    /// before it. Every rank passes the same `counts` (checked by the
    /// fingerprint, which carries their digest).
    pub unsafe fn all_gather_v(
        &self,
        out: *mut u8,
        input: *const u8,
        counts: &[usize],
        es: usize,
        sync: &SyncAll,
    ) -> Result<()> {
        let step = HALF / es;
        let (chunks, starts) = v_layout(counts, step);
        for k in 0..chunks {
            let (c0, h) = (k * step, self.next_half());
            let part = |r: usize| counts[r].saturating_sub(c0).min(step);
            copy(
                self.half(self.rank, h),
                input.add(c0 * es),
                part(self.rank) * es,
            );
            sync("all_gather_v")?;
            for (r, start) in starts.iter().enumerate() {
                copy(out.add((start + c0) * es), self.half(r, h), part(r) * es);
            }
        }
        Ok(())
    }

    /// Block `me` (`counts[me]` elements, at the sum of the counts before
    /// it) of the reduction of every rank's `input`. Every rank passes the
    /// same `counts` (checked).
    pub unsafe fn reduce_scatter_v(
        &self,
        out: *mut u8,
        input: *const u8,
        counts: &[usize],
        red: &Reduction,
        sync: &SyncAll,
    ) -> Result<()> {
        let (n, me, es) = (self.size, self.rank, red.dtype.size());
        let step = HALF / es / n;
        let (chunks, starts) = v_layout(counts, step);
        let mut blocks = self.blocks_for(red, counts[me].min(step))?;
        for k in 0..chunks {
            let (c0, h) = (k * step, self.next_half());
            let part = |r: usize| counts[r].saturating_sub(c0).min(step);
            let mine = self.half(me, h);
            for (r, start) in starts.iter().enumerate() {
                let block = mine.add(r * step * es);
                self.copy_in(red, block, input.add((start + c0) * es), part(r))?;
            }
            sync("reduce_scatter_v")?;
            let src = |r| self.half(r, h).add(me * step * es) as *const u8;
            self.combine(red, src, part(me), out.add(c0 * es), &mut blocks)?;
        }
        Ok(())
    }

    /// `in_counts[r]` elements of this rank's `input` to rank `r`, and
    /// `out_counts[q]` from rank `q` into `out`, blocks in rank order. A
    /// first sync shares every rank's splits through the segments, so every
    /// rank finds any mismatch alike (and nothing lands).
    pub unsafe fn all_to_all_v(
        &self,
        out: *mut u8,
        out_counts: &[usize],
        input: *const u8,
        in_counts: &[usize],
        es: usize,
        sync: &SyncAll,
    ) -> Result<()> {
        let (n, me) = (self.size, self.rank);
        let h = self.next_half();
        let words = self.half(me, h) as *mut u64;
        for (i, c) in in_counts.iter().chain(out_counts).enumerate() {
            words.add(i).write(*c as u64);
        }
        sync("all_to_all_v_single")?;
        let split = |r: usize, i: usize| (self.half(r, h) as *const u64).add(i).read();
        let mut largest = 0;
        for src in 0..n {
            for dst in 0..n {
                let (sent, expected) = (split(src, dst), split(dst, n + src));
                if sent != expected {
                    return Err(Error::invalid_usage(format!(
                        "all_to_all_v_single: rank {src} sends {sent} elements to rank {dst}, which expects {expected} from it \
                         (nothing was transferred)"
                    )));
                }
                largest = largest.max(sent as usize);
            }
        }
        let step = HALF / es / n;
        let starts = |c: &[usize]| {
            c.iter()
                .scan(0, |at, c| Some(std::mem::replace(at, *at + c)))
                .collect::<Vec<usize>>()
        };
        let (in_starts, out_starts) = (starts(in_counts), starts(out_counts));
        for k in 0..largest.div_ceil(step) {
            let (c0, h) = (k * step, self.next_half());
            let part = |c: usize| c.saturating_sub(c0).min(step) * es;
            for (r, start) in in_starts.iter().enumerate() {
                copy(
                    self.half(me, h).add(r * step * es),
                    input.add((start + c0) * es),
                    part(in_counts[r]),
                );
            }
            sync("all_to_all_v_single")?;
            for (q, start) in out_starts.iter().enumerate() {
                copy(
                    out.add((start + c0) * es),
                    self.half(q, h).add(me * step * es),
                    part(out_counts[q]),
                );
            }
        }
        Ok(())
    }

    /// Block `r` of this rank's `input` to rank `r`; block `r` of `out` from
    /// rank `r`; blocks of `block` bytes.
    pub unsafe fn all_to_all(
        &self,
        out: *mut u8,
        input: *const u8,
        block: usize,
        sync: &SyncAll,
    ) -> Result<()> {
        let (n, me) = (self.size, self.rank);
        let per_block = HALF / n;
        for c0 in (0..block).step_by(per_block) {
            let m = (block - c0).min(per_block);
            let c = self.next_chunk(n * m);
            for r in 0..n {
                copy(self.area(me, &c).add(r * m), input.add(r * block + c0), m);
            }
            sync("all_to_all_single")?;
            for r in 0..n {
                copy(out.add(r * block + c0), self.area(r, &c).add(me * m), m);
            }
        }
        Ok(())
    }
}

/// How a v-variant goes through the halves: the chunks of `step` elements
/// the largest count needs (at least one: every rank syncs even with
/// nothing to move), and where each rank's block starts (the sum of the
/// counts before it).
fn v_layout(counts: &[usize], step: usize) -> (usize, Vec<usize>) {
    let largest = counts.iter().max().copied().unwrap_or(0);
    let starts = counts
        .iter()
        .scan(0, |at, c| Some(std::mem::replace(at, *at + c)))
        .collect();
    (largest.div_ceil(step).max(1), starts)
}
