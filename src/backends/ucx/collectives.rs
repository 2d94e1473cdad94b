//! The collectives over UCX, each a sequence of steps (sends and receives
//! posted together, then waited for). Every rank gets bit-identical
//! results: a reduced value is combined from the same operands on every
//! rank (recursive doubling: the kernels are commutative), or computed on
//! one rank and copied (ring).
//!
//! - barrier: dissemination (log2 n rounds of empty messages);
//! - broadcast: binomial tree;
//! - all_reduce: recursive doubling below [`RING_MIN_BYTES`] (ranks past
//!   the largest power of two first fold into a partner and get the result
//!   back at the end), else ring reduce-scatter + ring all-gather, the
//!   blocks sent in segments that travel on as they arrive
//!   (`segmented_ring.rs`);
//! - reduce: binomial tree into the root;
//! - all_gather (list and single buffer): ring;
//! - reduce_scatter (list and single buffer): ring over a copy of the input;
//! - gather, scatter, all_to_all (list and single buffer): direct, every
//!   transfer posted at once;
//! - float16/bfloat16 sums (and AVG, PREMUL_SUM) of all_reduce, reduce and
//!   the reduce-scatters: accumulated in f32 and rounded once
//!   (`half_sums.rs`), as on the Gloo path.
//!
//! - the v-variants (all_gather_v, reduce_scatter_v, all_to_all_v_single):
//!   the same over blocks of the given counts (`v_variants.rs`).
//!
//! The first step of each also carries the neighbour check (`check.rs`):
//! its message to the right-hand neighbour, when it has a small one,
//! travels inside the check message.

use super::fingerprint::{Fingerprint, FINGERPRINT_BYTES};
use super::worker::{Request, Worker};
use super::{tag, CLASS_COLLECTIVE, CLASS_WIRE_UP};
use crate::error::{Error, Result};
use crate::kernels::reduce::{self, host_premul_factor, ReduceFn, Scale};
use crate::op::{
    AllToAll, AllToAllKind, Gather, GatherKind, Ptr, Reduction, ReductionKind, Scatter, ScatterKind,
};
use crate::types::{DType, RedKind, ReduceOp};
use crate::util::Deadline;
use check::Check;
pub(super) use check::Inbox;
use std::ffi::c_void;

#[path = "check.rs"]
mod check;
#[path = "half_sums.rs"]
mod half_sums;
#[path = "segmented_ring.rs"]
mod segmented_ring;
#[path = "v_variants.rs"]
mod v_variants;

/// The largest check message (`check.rs`: a first-step message of up to
/// `FOLD_MAX` bytes folded in after its header): worth sending in one
/// eager message (see `Worker::open`).
pub(super) const LARGEST_CHECK_MESSAGE: usize = check::FOLD_MAX + check::FOLD_HEADER;

/// All-reduces from this size on go through the ring (with eager
/// segments, `segmented_ring.rs`, the ring beat recursive doubling from
/// 128 KiB on 2 and 4 ranks over TCP loopback, 142 against 191-209 us and
/// 422 against 670 us, and lost at 64 KiB).
const RING_MIN_BYTES: usize = 128 << 10;
/// Step numbers of the non-power-of-two fold of recursive doubling.
const STEP_FOLD: u64 = 0xf_fff0;
const STEP_UNFOLD: u64 = 0xf_fff1;

/// One collective in progress.
pub(super) struct Ctx<'a> {
    pub w: &'a mut Worker,
    /// The collective's number (the same on every rank).
    pub seq: u32,
    pub d: &'a Deadline,
    pub alive: &'a dyn Fn() -> Result<()>,
    pub what: &'static str,
    /// This rank's side of the neighbour check (`check.rs`).
    check: Check<'a>,
    /// Scratch memory kept by the transport (see [`Spare`]).
    spare: &'a mut Spare,
}

/// 8-byte aligned scratch memory.
struct Scratch(Vec<u64>);

impl Scratch {
    fn new(bytes: usize) -> Scratch {
        Scratch(vec![0u64; bytes.div_ceil(8)])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

/// Scratch memory kept from call to call (the ring's receive buffer, up
/// to the largest block a comm's reductions had): a fresh buffer of many
/// MiB costs a page fault and a page clear per 4 KiB on every call (a
/// 2-rank 64 MiB all_reduce over TCP loopback took 83 ms with one, 52 ms
/// without).
/// With it, a step's list of requests, so that a small collective
/// allocates nothing.
pub(crate) struct Spare {
    scratch: Scratch,
    requests: Vec<Request>,
}

impl Spare {
    pub fn new() -> Spare {
        Spare {
            scratch: Scratch::new(0),
            requests: Vec::new(),
        }
    }
    /// At least `bytes` of it (8-byte aligned, contents undefined).
    fn at_least(&mut self, bytes: usize) -> *mut u8 {
        if self.scratch.0.len() * 8 < bytes {
            self.scratch = Scratch::new(bytes);
        }
        self.scratch.ptr()
    }
    /// An empty request list, with the capacity an earlier step left.
    fn requests(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.requests)
    }
    /// Takes back a list of [`Spare::requests`] whose requests are done.
    fn keep_requests(&mut self, mut reqs: Vec<Request>) {
        reqs.clear();
        self.requests = reqs;
    }
}

/// memmove of `n` bytes (nothing when equal or empty).
unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    if n > 0 && !std::ptr::eq(dst, src) {
        std::ptr::copy(src, dst, n);
    }
}

/// `count` split into `n` blocks, the first `count % n` one larger, and
/// their element offsets.
fn blocks(count: usize, n: usize) -> (Vec<usize>, Vec<usize>) {
    let counts: Vec<usize> = (0..n)
        .map(|r| count / n + usize::from(r < count % n))
        .collect();
    let offsets = counts
        .iter()
        .scan(0, |at, c| {
            let o = *at;
            *at += c;
            Some(o)
        })
        .collect();
    (counts, offsets)
}

/// `acc = acc (op) other` over `count` elements.
unsafe fn combine(f: ReduceFn, acc: *mut u8, other: *const u8, count: usize) {
    if count > 0 {
        f(
            acc as *mut c_void,
            acc as *const c_void,
            other as *const c_void,
            count,
        );
    }
}

/// Sets up every connection: one 8-byte message each way between every
/// pair, each checked (collective).
pub(super) fn wire_up(w: &mut Worker, d: &Deadline, alive: &dyn Fn() -> Result<()>) -> Result<()> {
    let (me, n) = (w.rank, w.size);
    let mine = [me as u64];
    let mut got = vec![u64::MAX; n];
    let mut reqs = Vec::new();
    for p in (0..n).filter(|p| *p != me) {
        // SAFETY: both buffers outlive the wait below.
        unsafe {
            reqs.push(w.send(p, mine.as_ptr() as *const u8, 8, tag(CLASS_WIRE_UP, me, 0)));
            let t = (tag(CLASS_WIRE_UP, p, 0), !0);
            reqs.push(w.recv(p, got[p..].as_mut_ptr() as *mut u8, 8, t));
        }
    }
    w.wait(&mut reqs, d, alive, "connect")?;
    match (0..n).find(|p| *p != me && got[*p] != *p as u64) {
        Some(p) => Err(Error::internal(format!(
            "ucx connect: rank {p} answered as {}",
            got[p]
        ))),
        None => Ok(()),
    }
}

impl Ctx<'_> {
    fn tag(&self, sender: usize, step: u64) -> u64 {
        tag(
            CLASS_COLLECTIVE,
            sender,
            ((self.seq as u64 & 0xff_ffff) << 20) | (step & 0xf_ffff),
        )
    }

    /// One step: `sends` (peer, bytes) and `recvs` (peer, buffer, length)
    /// posted together, then waited for; every receive must get exactly its
    /// length. The collective's first step sends the check message too,
    /// with its send to the right-hand neighbour folded in when small
    /// (`check.rs`), and compares the left-hand neighbour's before it posts
    /// any receive.
    unsafe fn step(
        &mut self,
        step: u64,
        sends: &[(usize, *const u8, usize)],
        recvs: &[(usize, *mut u8, usize)],
    ) -> Result<()> {
        let me = self.w.rank;
        let folded = self.send_check(step, sends);
        let mut reqs = self.spare.requests();
        for (i, &(peer, buf, len)) in sends.iter().enumerate() {
            if folded != Some(i) {
                let t = self.tag(me, step);
                reqs.push(self.w.send(peer, buf, len, t));
            }
        }
        let posted_sends = reqs.len();
        // The neighbour's check first: with calls that differ, the step's
        // own messages may never come.
        self.await_check(&mut reqs)?;
        let mut taken = None;
        for (i, &(peer, buf, len)) in recvs.iter().enumerate() {
            match self.take_folded(step, (peer, buf, len)) {
                Some(Ok(())) => taken = Some(i),
                Some(Err(e)) => {
                    self.w.withdraw(&mut reqs, &e);
                    return Err(e);
                }
                None => {
                    let t = (self.tag(peer, step), !0);
                    reqs.push(self.w.recv(peer, buf, len, t));
                }
            }
        }
        if !reqs.is_empty() {
            self.w.wait(&mut reqs, self.d, self.alive, self.what)?;
        }
        let posted_recvs = recvs.iter().enumerate().filter(|(i, _)| taken != Some(*i));
        for (r, (_, &(peer, _, len))) in reqs[posted_sends..].iter().zip(posted_recvs) {
            if r.info.length != len {
                let e = self.size_mismatch(peer, r.info.length, len);
                self.w.withdraw(&mut [], &e);
                return Err(e);
            }
        }
        self.spare.keep_requests(reqs);
        Ok(())
    }

    /// The error of a message of `got` bytes from `peer` where `len` were
    /// expected.
    fn size_mismatch(&self, peer: usize, got: usize, len: usize) -> Error {
        Error::invalid_usage(format!(
            "ucx {} on rank {}: rank {peer} sent {got} bytes where {len} were expected \
             (the ranks called different operations or sizes)",
            self.what, self.w.rank
        ))
    }

    /// Runs reduction `r`.
    ///
    /// # Safety
    /// As for the family methods of [`crate::backends::transport::Transport`].
    pub unsafe fn run_reduction(&mut self, r: &Reduction) -> Result<()> {
        let (dtype, op) = (r.dtype, &r.op);
        match &r.kind {
            ReductionKind::AllReduce { buf, count } => {
                self.all_reduce(buf.as_u8(), *count, dtype, op)
            }
            ReductionKind::Reduce { buf, count, root } => {
                self.reduce(buf.as_u8(), *count, dtype, op, *root as usize)
            }
            ReductionKind::ReduceScatter {
                output,
                inputs,
                count,
            } => self.reduce_scatter(inputs, None, *output, *count, dtype, op),
            ReductionKind::ReduceScatterSingle {
                output,
                input,
                count,
            } => self.reduce_scatter(&[], Some(*input), *output, *count, dtype, op),
            ReductionKind::ReduceScatterV {
                output,
                input,
                counts,
            } => self.reduce_scatter_v(output.as_u8(), input.as_u8(), counts, dtype, op),
        }
    }

    /// Runs gather `g`.
    ///
    /// # Safety
    /// As for the family methods of [`crate::backends::transport::Transport`].
    pub unsafe fn run_gather(&mut self, g: &Gather) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let layout = || g.layout(me as i32, n as i32);
        let (dtype, input) = (g.dtype, g.input);
        match &g.kind {
            GatherKind::AllGather { outputs, count } => {
                let bytes = count * dtype.size();
                let mut tmp = Scratch::new(bytes * n);
                copy(tmp.ptr().add(me * bytes), input.as_u8(), bytes);
                self.ring_all_gather(tmp.ptr(), bytes, 0).map(|()| {
                    for (r, out) in outputs.iter().enumerate() {
                        copy(out.as_u8(), tmp.ptr().add(r * bytes), bytes);
                    }
                })
            }
            GatherKind::AllGatherSingle { output, count } => {
                let bytes = count * dtype.size();
                let own = output.as_u8().add(me * bytes);
                if layout().inputs_overlap_outputs() && !std::ptr::eq(input.as_u8(), own) {
                    let mut tmp = Scratch::new(bytes);
                    copy(tmp.ptr(), input.as_u8(), bytes);
                    copy(own, tmp.ptr(), bytes);
                } else {
                    copy(own, input.as_u8(), bytes);
                }
                self.ring_all_gather(output.as_u8(), bytes, 0)
            }
            GatherKind::Gather {
                outputs,
                count,
                root,
            } => {
                let bytes = count * dtype.size();
                let outs: Vec<*mut u8> = outputs.iter().map(|p| p.as_u8()).collect();
                self.gather(input.as_u8(), &outs, bytes, *root as usize)
            }
            GatherKind::GatherSingle {
                output,
                count,
                root,
            } => {
                let bytes = count * dtype.size();
                let root = *root as usize;
                let mut own = Scratch::new(0);
                let mut src = input.as_u8() as *const u8;
                if me == root && layout().inputs_overlap_outputs() {
                    own = Scratch::new(bytes);
                    copy(own.ptr(), src, bytes);
                    src = own.ptr();
                }
                let outs: Vec<*mut u8> = match me == root {
                    true => (0..n).map(|r| output.as_u8().add(r * bytes)).collect(),
                    false => Vec::new(),
                };
                let r = self.gather(src, &outs, bytes, root);
                drop(own);
                r
            }
            GatherKind::AllGatherV { output, counts } => {
                self.all_gather_v(output.as_u8(), input.as_u8(), counts, dtype.size())
            }
        }
    }

    /// Runs broadcast or scatter `s`.
    ///
    /// # Safety
    /// As for the family methods of [`crate::backends::transport::Transport`].
    pub unsafe fn run_scatter(&mut self, s: &Scatter) -> Result<()> {
        let (bytes, root) = (s.count * s.dtype.size(), s.root as usize);
        match &s.kind {
            ScatterKind::Broadcast { buf } => self.broadcast(buf.as_u8(), bytes, root),
            ScatterKind::Scatter { output, inputs } => {
                let ins: Vec<*const u8> = inputs.iter().map(|p| p.as_u8() as *const u8).collect();
                self.scatter(&ins, output.as_u8(), bytes, root)
            }
        }
    }

    /// Runs all-to-all `a`.
    ///
    /// # Safety
    /// As for the family methods of [`crate::backends::transport::Transport`].
    pub unsafe fn run_all_to_all(&mut self, a: &AllToAll) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let clash = || a.layout(me as i32, n as i32).inputs_overlap_outputs();
        match &a.kind {
            AllToAllKind::Lists {
                outputs,
                inputs,
                count,
            } => {
                let ins: Vec<*const u8> = inputs.iter().map(|p| p.as_u8() as *const u8).collect();
                let outs: Vec<*mut u8> = outputs.iter().map(|p| p.as_u8()).collect();
                self.all_to_all(&ins, &outs, count * a.dtype.size(), clash())
            }
            AllToAllKind::Single {
                output,
                input,
                count,
            } => {
                let bytes = count * a.dtype.size();
                let ins: Vec<*const u8> = (0..n)
                    .map(|r| input.as_u8().add(r * bytes) as *const u8)
                    .collect();
                let outs: Vec<*mut u8> = (0..n).map(|r| output.as_u8().add(r * bytes)).collect();
                self.all_to_all(&ins, &outs, bytes, clash())
            }
            AllToAllKind::VSingle {
                output,
                output_counts,
                input,
                input_counts,
            } => self.all_to_all_v(
                (output.as_u8(), output_counts),
                (input.as_u8(), input_counts),
                a.dtype.size(),
            ),
        }
    }

    /// Dissemination: in round k each rank signals rank + 2^k and waits
    /// for rank - 2^k.
    pub unsafe fn barrier(&mut self) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let mut byte = [0u8; 1];
        let mut k = 1;
        let mut round = 0;
        while k < n {
            let to = (me + k) % n;
            let from = (me + n - k) % n;
            let p = byte.as_mut_ptr();
            self.step(round, &[(to, p, 0)], &[(from, p, 0)])?;
            k <<= 1;
            round += 1;
        }
        Ok(())
    }

    /// Binomial tree from `root`: a rank receives once (from the rank whose
    /// relative number differs in its lowest set bit) and then sends to the
    /// ranks below that bit.
    unsafe fn broadcast(&mut self, buf: *mut u8, bytes: usize, root: usize) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        if n == 1 || bytes == 0 {
            return Ok(());
        }
        let rel = (me + n - root) % n;
        let real = |r: usize| (r + root) % n;
        let mut mask = 1;
        while mask < n {
            if rel & mask != 0 {
                self.step(mask as u64, &[], &[(real(rel - mask), buf, bytes)])?;
                break;
            }
            mask <<= 1;
        }
        let mut sends = Vec::new();
        mask >>= 1;
        while mask > 0 {
            if rel + mask < n {
                sends.push((real(rel + mask), buf as *const u8, bytes));
            }
            mask >>= 1;
        }
        // Each send has its own step number: the receiver's mask.
        for s in sends {
            let m = (s.0 + n - root) % n - rel;
            self.step(m as u64, &[s], &[])?;
        }
        Ok(())
    }

    unsafe fn all_reduce(
        &mut self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        op: &ReduceOp,
    ) -> Result<()> {
        let n = self.w.size;
        let f = reduce::kernel(dtype, op.kind)?;
        if n > 1 && op.kind.sums_halves(dtype) {
            return self.all_reduce_halves(buf, count, dtype, op);
        }
        if op.kind == RedKind::PremulSum {
            let k = host_premul_factor(op, dtype)?;
            reduce::scale(dtype, buf, buf, count, Scale::Mul(k))?;
        }
        let bytes = count * dtype.size();
        if n > 1 && bytes > 0 {
            if bytes >= RING_MIN_BYTES && count >= n {
                self.ring_all_reduce(buf, count, dtype.size(), f)?;
            } else {
                self.recursive_doubling(buf, count, dtype.size(), f)?;
            }
        }
        if op.kind == RedKind::Avg {
            reduce::scale(dtype, buf, buf, count, Scale::Div(n as u64))?;
        }
        Ok(())
    }

    /// Recursive doubling over the largest power of two p <= n ranks; the
    /// first 2(n - p) ranks pair up first (the even one hands its data to
    /// the odd one and gets the result back at the end).
    unsafe fn recursive_doubling(
        &mut self,
        buf: *mut u8,
        count: usize,
        es: usize,
        f: ReduceFn,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let bytes = count * es;
        let p = 1 << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - p;
        // The transport's kept buffer: a small all_reduce allocates nothing.
        let tmp = self.spare.at_least(bytes);
        let new_rank = if me < 2 * rem {
            if me % 2 == 0 {
                self.step(STEP_FOLD, &[(me + 1, buf, bytes)], &[])?;
                None
            } else {
                self.step(STEP_FOLD, &[], &[(me - 1, tmp, bytes)])?;
                combine(f, buf, tmp, count);
                Some(me / 2)
            }
        } else {
            Some(me - rem)
        };
        if let Some(nr) = new_rank {
            let real = |r: usize| if r < rem { 2 * r + 1 } else { r + rem };
            let mut mask = 1;
            let mut round = 0;
            while mask < p {
                let partner = real(nr ^ mask);
                self.step(round, &[(partner, buf, bytes)], &[(partner, tmp, bytes)])?;
                combine(f, buf, tmp, count);
                mask <<= 1;
                round += 1;
            }
        }
        if me < 2 * rem {
            if me % 2 == 1 {
                self.step(STEP_UNFOLD, &[(me - 1, buf, bytes)], &[])?;
            } else {
                self.step(STEP_UNFOLD, &[], &[(me + 1, buf, bytes)])?;
            }
        }
        Ok(())
    }

    /// Ring reduce-scatter of `buf`'s blocks (rank r ends holding block r
    /// reduced, in place), steps numbered from `first_step`.
    unsafe fn ring_reduce_scatter(
        &mut self,
        buf: *mut u8,
        (counts, offsets): (&[usize], &[usize]),
        es: usize,
        f: ReduceFn,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        let tmp = self
            .spare
            .at_least(counts.iter().max().copied().unwrap_or(0) * es);
        for s in 0..n - 1 {
            let send = (me + 2 * n - s - 1) % n;
            let recv = (me + 2 * n - s - 2) % n;
            let sp = buf.add(offsets[send] * es);
            self.step(
                s as u64,
                &[(right, sp, counts[send] * es)],
                &[(left, tmp, counts[recv] * es)],
            )?;
            combine(f, buf.add(offsets[recv] * es), tmp, counts[recv]);
        }
        Ok(())
    }

    /// Ring all-gather of `buf`'s blocks of `bytes` each (rank r holds
    /// block r), steps numbered from `first_step`.
    unsafe fn ring_all_gather(
        &mut self,
        buf: *mut u8,
        bytes: usize,
        first_step: u64,
    ) -> Result<()> {
        let n = self.w.size;
        let sizes = vec![bytes; n];
        let offsets: Vec<usize> = (0..n).map(|r| r * bytes).collect();
        self.ring_all_gather_blocks(buf, (&sizes, &offsets), first_step)
    }

    /// Ring all-gather of blocks of `counts` elements of `es` bytes at
    /// element `offsets`.
    unsafe fn ring_all_gather_elements(
        &mut self,
        buf: *mut u8,
        (counts, offsets): (&[usize], &[usize]),
        es: usize,
        first_step: u64,
    ) -> Result<()> {
        let sizes: Vec<usize> = counts.iter().map(|c| c * es).collect();
        let byte_offsets: Vec<usize> = offsets.iter().map(|o| o * es).collect();
        self.ring_all_gather_blocks(buf, (&sizes, &byte_offsets), first_step)
    }

    /// Ring all-gather of blocks of the given byte sizes and offsets.
    unsafe fn ring_all_gather_blocks(
        &mut self,
        buf: *mut u8,
        (sizes, offsets): (&[usize], &[usize]),
        first_step: u64,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        if n == 1 || sizes.iter().all(|s| *s == 0) {
            return Ok(());
        }
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        for s in 0..n - 1 {
            let send = (me + n - s) % n;
            let recv = (me + 2 * n - s - 1) % n;
            self.step(
                first_step + s as u64,
                &[(right, buf.add(offsets[send]), sizes[send])],
                &[(left, buf.add(offsets[recv]), sizes[recv])],
            )?;
        }
        Ok(())
    }

    /// Binomial tree into `root`; other ranks' buffers are left as they
    /// were.
    unsafe fn reduce(
        &mut self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        op: &ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let f = reduce::kernel(dtype, op.kind)?;
        if n > 1 && op.kind.sums_halves(dtype) {
            return self.reduce_halves(buf, count, dtype, op, root);
        }
        let es = dtype.size();
        let bytes = count * es;
        let mut own = Scratch::new(if me == root { 0 } else { bytes });
        let acc = if me == root { buf } else { own.ptr() };
        let k = match op.kind {
            RedKind::PremulSum => Some(host_premul_factor(op, dtype)?),
            _ => None,
        };
        match k {
            Some(k) => reduce::scale(dtype, acc, buf, count, Scale::Mul(k))?,
            None => copy(acc, buf, bytes),
        }
        if n > 1 && bytes > 0 {
            let rel = (me + n - root) % n;
            let real = |r: usize| (r + root) % n;
            let mut tmp = Scratch::new(bytes);
            let mut mask = 1;
            while mask < n {
                if rel & mask != 0 {
                    self.step(mask as u64, &[(real(rel - mask), acc, bytes)], &[])?;
                    break;
                }
                if rel + mask < n {
                    self.step(mask as u64, &[], &[(real(rel + mask), tmp.ptr(), bytes)])?;
                    combine(f, acc, tmp.ptr(), count);
                }
                mask <<= 1;
            }
        }
        if me == root && op.kind == RedKind::Avg {
            reduce::scale(dtype, buf, buf, count, Scale::Div(n as u64))?;
        }
        Ok(())
    }

    /// Ring reduce-scatter over a copy of the input (`inputs`, one buffer
    /// per rank, or `single`, the blocks in one buffer).
    unsafe fn reduce_scatter(
        &mut self,
        inputs: &[Ptr],
        single: Option<Ptr>,
        output: Ptr,
        count: usize,
        dtype: DType,
        op: &ReduceOp,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let f = reduce::kernel(dtype, op.kind)?;
        let es = dtype.size();
        let bytes = count * es;
        let mut all = Scratch::new(bytes * n);
        match single {
            Some(p) => copy(all.ptr(), p.as_u8(), bytes * n),
            None => {
                for (r, p) in inputs.iter().enumerate() {
                    copy(all.ptr().add(r * bytes), p.as_u8(), bytes);
                }
            }
        }
        if n > 1 && op.kind.sums_halves(dtype) {
            let counts = vec![count; n];
            let offsets: Vec<usize> = (0..n).map(|r| r * count).collect();
            let blocks = (&counts[..], &offsets[..]);
            return self.reduce_scatter_halves(all.ptr(), blocks, output.as_u8(), dtype, op);
        }
        if op.kind == RedKind::PremulSum {
            let k = host_premul_factor(op, dtype)?;
            reduce::scale(dtype, all.ptr(), all.ptr(), count * n, Scale::Mul(k))?;
        }
        if n > 1 && bytes > 0 {
            let counts = vec![count; n];
            let offsets: Vec<usize> = (0..n).map(|r| r * count).collect();
            self.ring_reduce_scatter(all.ptr(), (&counts, &offsets), es, f)?;
        }
        copy(output.as_u8(), all.ptr().add(me * bytes), bytes);
        if op.kind == RedKind::Avg {
            reduce::scale(
                dtype,
                output.as_u8(),
                output.as_u8(),
                count,
                Scale::Div(n as u64),
            )?;
        }
        Ok(())
    }

    /// Every rank's `bytes` at `input` into the root's `outputs` (one per
    /// rank; empty elsewhere).
    unsafe fn gather(
        &mut self,
        input: *const u8,
        outputs: &[*mut u8],
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        if me != root {
            return match bytes {
                0 => Ok(()),
                _ => self.step(0, &[(root, input, bytes)], &[]),
            };
        }
        if bytes > 0 {
            let recvs: Vec<(usize, *mut u8, usize)> = (0..n)
                .filter(|r| *r != me)
                .map(|r| (r, outputs[r], bytes))
                .collect();
            self.step(0, &[], &recvs)?;
        }
        copy(outputs[me], input, bytes);
        Ok(())
    }

    /// The root's `inputs` (one per rank; empty elsewhere) to every rank's
    /// `output`.
    unsafe fn scatter(
        &mut self,
        inputs: &[*const u8],
        output: *mut u8,
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        if me != root {
            return match bytes {
                0 => Ok(()),
                _ => self.step(0, &[], &[(root, output, bytes)]),
            };
        }
        if bytes > 0 {
            let sends: Vec<(usize, *const u8, usize)> = (0..n)
                .filter(|r| *r != me)
                .map(|r| (r, inputs[r], bytes))
                .collect();
            self.step(0, &sends, &[])?;
        }
        // After the sends: the root's output may overlap the other blocks.
        copy(output, inputs[me], bytes);
        Ok(())
    }

    /// Block r of `inputs` to rank r, rank r's block into `outputs[r]`;
    /// `overlap`: inputs overlap outputs, and are read from a copy.
    unsafe fn all_to_all(
        &mut self,
        inputs: &[*const u8],
        outputs: &[*mut u8],
        bytes: usize,
        overlap: bool,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let mut copies = Scratch::new(if overlap { bytes * n } else { 0 });
        let ins: Vec<*const u8> = match overlap {
            true => (0..n)
                .map(|r| {
                    let p = copies.ptr().add(r * bytes);
                    copy(p, inputs[r], bytes);
                    p as *const u8
                })
                .collect(),
            false => inputs.to_vec(),
        };
        if bytes > 0 && n > 1 {
            let others = (0..n).filter(|r| *r != me);
            let sends: Vec<_> = others.clone().map(|r| (r, ins[r], bytes)).collect();
            let recvs: Vec<_> = others.map(|r| (r, outputs[r], bytes)).collect();
            self.step(0, &sends, &recvs)?;
        }
        copy(outputs[me], ins[me], bytes);
        Ok(())
    }
}
