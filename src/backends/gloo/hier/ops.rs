//! The hierarchical collectives (see the module docs of [`super`]): each a
//! sequence of operations of the host's group ("local") and the leaders'
//! ("leaders"), run on this rank's progress thread in the comm's order, so
//! every rank of a host runs the same local steps.
//!
//! Reductions: the local step applies the caller's operation (PREMUL_SUM
//! scales each contribution there), the leaders combine host results with
//! the same operation (SUM for PREMUL_SUM and AVG), and AVG divides the
//! total by the comm's size once, on the leader, before the result goes
//! back: integer results are those of the flat path bit for bit.

use super::super::memory::{copy, Scratch};
use super::Hierarchy;
use crate::backends::transport::{offer, Call, Transport};
use crate::error::{Error, Result};
use crate::kernels::reduce::{self, Scale};
use crate::op::{
    gather_single_outputs, AllToAll, Gather, GatherKind, Op, P2p, Ptr, Reduction, ReductionKind,
    Refusal, Scatter, ScatterKind,
};
use crate::types::{DType, PremulFactor, RedKind, ReduceOp};
use std::ffi::c_void;

/// The "call" a leader refuses in its members' local step when its step
/// among the hosts failed (see `Hierarchy::tell_members`).
const LEADER_FAILED: &str = "its host leader's step among the hosts failed";

/// How a reduction splits: the local step's operation, the leaders', and
/// whether the total is divided by the comm's size afterwards.
fn split(op: &ReduceOp) -> (ReduceOp, ReduceOp, bool) {
    let sum = ReduceOp {
        kind: RedKind::Sum,
        factor: PremulFactor::Host(1.0),
    };
    match op.kind {
        RedKind::Avg => (sum, sum, true),
        RedKind::PremulSum => (*op, sum, false),
        _ => (*op, *op, false),
    }
}

/// A step on a group's table (which carries every operation).
///
/// # Safety
/// As for the family methods of [`Transport`].
unsafe fn run(group: &dyn Transport, call: &Call) -> Result<()> {
    offer(group, call).unwrap_or_else(|| {
        Err(Error::internal(format!(
            "a hierarchical group's table does not carry {}",
            call.op.name()
        )))
    })
}

fn ptr(p: *mut u8) -> Ptr {
    Ptr(p as *mut c_void)
}

/// The members of even blocks, which move between hosts only through the
/// leaders; the others (per-rank counts, roots' lists, all-to-alls,
/// point-to-point) and float16/bfloat16 sums (whose flat path rounds once)
/// are left to the comm's flat transport.
impl Transport for Hierarchy {
    fn name(&self) -> &'static str {
        "hierarchy"
    }

    fn carries(&self) -> String {
        let between = self.leaders_transport();
        format!(
            "all_reduce, reduce, reduce_scatter, all_gather, broadcast and barrier (not float16/bfloat16 \
             sums): shared memory inside each host, {between} among the hosts' leaders"
        )
    }

    unsafe fn reduction(&self, r: &Reduction, call: &Call) -> Option<Result<()>> {
        let (dtype, op, c) = (r.dtype, &r.op, call);
        if self.place.len() > 1 && op.kind.sums_halves(dtype) {
            return None; // the flat path rounds such sums once
        }
        Some(match &r.kind {
            ReductionKind::AllReduce { buf, count } => {
                self.all_reduce(buf.as_u8(), *count, dtype, op, c)
            }
            ReductionKind::Reduce { buf, count, root } => {
                self.reduce(buf.as_u8(), *count, dtype, *root as usize, op, c)
            }
            ReductionKind::ReduceScatterSingle {
                output,
                input,
                count,
            } => self.reduce_scatter(*output, input.as_u8(), *count, dtype, op, c),
            ReductionKind::ReduceScatter {
                output,
                inputs,
                count,
            } => {
                let mut packed = some_try!(Scratch::packed(inputs, count * dtype.size()));
                self.reduce_scatter(*output, packed.ptr(), *count, dtype, op, c)
            }
            // Per-rank counts: the flat path agrees them first.
            ReductionKind::ReduceScatterV { .. } => return None,
        })
    }

    /// The all-gathers of even blocks.
    unsafe fn gather(&self, g: &Gather, call: &Call) -> Option<Result<()>> {
        let (dtype, input, c) = (g.dtype, g.input, call);
        Some(match &g.kind {
            GatherKind::AllGatherSingle { output, count } => {
                self.all_gather(output.as_u8(), input, *count, dtype, c)
            }
            GatherKind::AllGather { outputs, count } => {
                self.all_gather_list(outputs, input, *count, dtype, c)
            }
            GatherKind::AllGatherV { .. }
            | GatherKind::Gather { .. }
            | GatherKind::GatherSingle { .. } => return None,
        })
    }

    /// Broadcast; scatter takes the flat path.
    unsafe fn scatter(&self, s: &Scatter, call: &Call) -> Option<Result<()>> {
        match &s.kind {
            ScatterKind::Broadcast { buf } => {
                Some(self.broadcast(*buf, s.count, s.dtype, s.root as usize, call))
            }
            ScatterKind::Scatter { .. } => None,
        }
    }

    /// Every rank's block goes to every rank: nothing to gain by hosts.
    unsafe fn all_to_all(&self, _: &AllToAll, _: &Call) -> Option<Result<()>> {
        None
    }

    /// Every rank of each host, then the leaders, then every rank again.
    fn barrier(&self, call: &Call) -> Option<Result<()>> {
        let c = call;
        Some(
            self.local(Op::Barrier, c)
                .and_then(|()| self.leaders_then_local(Op::Barrier, c))
                .and_then(|()| self.local(Op::Barrier, c)),
        )
    }

    unsafe fn point_to_point(&self, _: &[P2p], _: &Call) -> Option<Result<()>> {
        None
    }

    /// Told through the comm's store, among all ranks (the flat path).
    fn refuse(&self, _: &Refusal, _: &Call) -> Option<Result<()>> {
        None
    }

    /// Makes both groups' transports fail their operations now.
    fn abort(&self, why: &Error) {
        self.abort_all(why);
    }
}

impl Hierarchy {
    /// A step among this host's ranks (their messages number them from 0
    /// within the host: the context names them as comm ranks).
    fn local(&self, op: Op, c: &Call) -> Result<()> {
        let host = self.place[self.rank].0;
        // SAFETY: the steps' buffers are the caller's (validated by the
        // comm) or scratch memory alive until the step returns.
        unsafe { run(&*self.local, &c.with(&op)) }.map_err(|e| {
            // Told by the leader (see `tell_members`): the comm is out of
            // step on every rank, not only refused.
            let e = match e.message.contains(LEADER_FAILED) {
                true => crate::error::Error::remote(e.message),
                false => e,
            };
            e.context(format_args!(
                "hierarchical step among the ranks {:?} of host {host} (numbered 0.. there)",
                self.hosts[host]
            ))
        })
    }

    /// A step among the hosts' leaders after which this host's members wait
    /// in a local step: when it fails, the leader takes part in that local
    /// step as a refusal, so that the members fail now, told why, rather
    /// than at their timeout.
    fn leaders_then_local(&self, op: Op, c: &Call) -> Result<()> {
        self.leaders(op, c).inspect_err(|e| self.tell_members(e, c))
    }

    fn tell_members(&self, e: &crate::error::Error, c: &Call) {
        let host = self.place[self.rank].0;
        if !self.is_leader() || self.hosts[host].len() < 2 {
            return;
        }
        let refusal = crate::op::Refusal {
            call: LEADER_FAILED,
            rank: self.rank as i32,
            error: e.clone(),
        };
        let short = c
            .deadline
            .remaining()
            .min(std::time::Duration::from_secs(2));
        let short = crate::util::Deadline::after(short);
        let refused = Op::Refused(refusal);
        // SAFETY: a refusal carries no buffer.
        let _ = unsafe { run(&*self.local, &c.with(&refused).until(&short)) };
    }

    /// A step among the hosts' leaders (numbered by host there).
    fn leaders(&self, op: Op, c: &Call) -> Result<()> {
        match &self.leaders {
            // SAFETY: as for `local`.
            Some(l) => unsafe { run(&**l, &c.with(&op)) }.map_err(|e| self.among_leaders(e)),
            None => Ok(()),
        }
    }

    fn among_leaders(&self, e: crate::error::Error) -> crate::error::Error {
        let leaders: Vec<usize> = self.hosts.iter().map(|h| h[0]).collect();
        e.context(format_args!(
            "hierarchical step among the hosts' leaders, ranks {leaders:?} (numbered by host there)"
        ))
    }

    fn is_leader(&self) -> bool {
        self.leaders.is_some()
    }

    /// Local reduce to the leader, all_reduce among leaders, local broadcast.
    unsafe fn all_reduce(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        op: &ReduceOp,
        c: &Call,
    ) -> Result<()> {
        let (local_op, top_op, avg) = split(op);
        let buf = ptr(buf);
        let reduce = |root: i32, op: ReduceOp| Op::reduce(buf, count, dtype, root, op);
        self.local(reduce(0, local_op), c)?;
        if self.is_leader() {
            let all = Op::all_reduce(buf, count, dtype, top_op);
            self.leaders_then_local(all, c)?;
            if avg {
                let n = self.place.len() as u64;
                reduce::scale(dtype, buf.as_u8(), buf.as_u8(), count, Scale::Div(n))?;
            }
        }
        let root = 0;
        self.local(Op::broadcast(buf, count, dtype, root), c)
    }

    /// Local reduce to each leader, reduce among leaders to the root's, then
    /// (when the root is not its host's leader) one local send to the root.
    unsafe fn reduce(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        root: usize,
        op: &ReduceOp,
        c: &Call,
    ) -> Result<()> {
        let (local_op, top_op, avg) = split(op);
        let (root_host, root_index) = self.place[root];
        let (my_host, _) = self.place[self.rank];
        let bytes = count * dtype.size();
        // A leader that is not the root keeps its buffer as it was.
        let mut scratch = None;
        let target = match self.is_leader() && self.rank != root {
            true => {
                let s: &mut Scratch = scratch.insert(Scratch::new(bytes)?);
                copy(s.ptr(), buf, bytes);
                s.ptr()
            }
            false => buf,
        };
        let on = |root: usize, op: ReduceOp| Op::reduce(ptr(target), count, dtype, root as i32, op);
        self.local(on(0, local_op), c)?;
        self.leaders_reduce(target, count, dtype, root_host, &top_op, c)?;
        if my_host != root_host {
            return Ok(());
        }
        if avg && self.is_leader() {
            let n = self.place.len() as u64;
            reduce::scale(dtype, target, target, count, Scale::Div(n))?;
        }
        let (send, recv) = (self.is_leader() && root_index != 0, self.rank == root);
        let p2p = |is_send: bool, peer: usize| match is_send {
            true => Op::send(ptr(target), count, dtype, peer as i32, 0),
            false => Op::recv(ptr(buf), count, dtype, peer as i32, 0),
        };
        match (send, recv && root_index != 0) {
            (true, _) => self.local(p2p(true, root_index), c),
            (_, true) => self.local(p2p(false, 0), c),
            _ => Ok(()),
        }
    }

    /// The leaders' step of reduce: every other leader sends its host's
    /// result to the root host's leader, which combines them in host order.
    /// Each host's result crosses once (Gloo's reduce moves half as much
    /// again between two leaders).
    unsafe fn leaders_reduce(
        &self,
        target: *mut u8,
        count: usize,
        dtype: DType,
        root_host: usize,
        op: &ReduceOp,
        c: &Call,
    ) -> Result<()> {
        let Some(leaders) = &self.leaders else {
            return Ok(());
        };
        let (me, hosts) = (self.place[self.rank].0, self.hosts.len());
        let p2p = |is_send, buf, peer: usize| P2p {
            is_send,
            buf: ptr(buf),
            count,
            dtype,
            peer: peer as i32,
            tag: 0,
            source: None,
        };
        if me != root_host {
            let ops = vec![p2p(true, target, root_host)];
            return run(&**leaders, &c.with(&Op::batch(ops))).map_err(|e| self.among_leaders(e));
        }
        let bytes = count * dtype.size();
        let mut parts = Scratch::new(bytes * hosts)?;
        let others = (0..hosts).filter(|h| *h != me);
        let ops = others
            .map(|h| p2p(false, parts.ptr().add(h * bytes), h))
            .collect();
        run(&**leaders, &c.with(&Op::batch(ops))).map_err(|e| self.among_leaders(e))?;
        let f = reduce::kernel(dtype, op.kind)?;
        for h in (0..hosts).filter(|h| *h != me) {
            let part = parts.ptr().add(h * bytes);
            f(
                target as *mut c_void,
                target as *const c_void,
                part as *const c_void,
                count,
            );
        }
        Ok(())
    }

    /// On the root's host: local broadcast from the root; then broadcast
    /// among leaders; then, on the other hosts, local broadcast from the
    /// leader.
    unsafe fn broadcast(
        &self,
        buf: Ptr,
        count: usize,
        dtype: DType,
        root: usize,
        c: &Call,
    ) -> Result<()> {
        let (root_host, root_index) = self.place[root];
        let on = |root: usize| Op::broadcast(buf, count, dtype, root as i32);
        let home = self.place[self.rank].0 == root_host;
        if home {
            self.local(on(root_index), c)?;
        }
        match home {
            true => self.leaders(on(root_host), c)?,
            false => self.leaders_then_local(on(root_host), c)?,
        }
        if !home {
            self.local(on(0), c)?;
        }
        Ok(())
    }

    /// Local gather to the leader, all_gather_v of the hosts' blocks among
    /// leaders, reordered into rank order, local broadcast of the whole.
    unsafe fn all_gather(
        &self,
        output: *mut u8,
        input: Ptr,
        count: usize,
        dtype: DType,
        c: &Call,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let (my_host, _) = self.place[self.rank];
        let mine = self.hosts[my_host].len();
        let mut block = Scratch::new(if self.is_leader() { mine * bytes } else { 0 })?;
        let block_ptr = match self.is_leader() {
            true => block.ptr(),
            false => std::ptr::null_mut(),
        };
        // The leader's blocks as the list a gather takes.
        let at = (self.local_rank, 0, self.local_size);
        let outputs = gather_single_outputs(ptr(block_ptr), count, dtype, at);
        self.local(Op::gather(outputs, input, count, dtype, 0), c)?;
        if self.is_leader() {
            let n = self.place.len();
            let mut all = Scratch::new(n * bytes)?;
            let counts = self.hosts.iter().map(|h| h.len() * count).collect();
            let op = Op::all_gather_v(ptr(all.ptr()), ptr(block.ptr()), counts, dtype);
            self.leaders_then_local(op, c)?;
            for (k, r) in self.hosts.iter().flatten().enumerate() {
                copy(output.add(r * bytes), all.ptr().add(k * bytes), bytes);
            }
        }
        let whole = Op::broadcast(ptr(output), count * self.place.len(), dtype, 0);
        self.local(whole, c)
    }

    unsafe fn all_gather_list(
        &self,
        outputs: &[Ptr],
        input: Ptr,
        count: usize,
        dtype: DType,
        c: &Call,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let mut all = Scratch::new(bytes * outputs.len())?;
        self.all_gather(all.ptr(), input, count, dtype, c)?;
        for (r, out) in outputs.iter().enumerate() {
            copy(out.as_u8(), all.ptr().add(r * bytes), bytes);
        }
        Ok(())
    }

    /// Local reduce of the whole input to the leader, reduce_scatter_v
    /// among leaders (each host gets its ranks' blocks), local scatter.
    unsafe fn reduce_scatter(
        &self,
        output: Ptr,
        input: *mut u8,
        count: usize,
        dtype: DType,
        op: &ReduceOp,
        c: &Call,
    ) -> Result<()> {
        let (local_op, top_op, avg) = split(op);
        let n = self.place.len();
        let bytes = count * dtype.size();
        let mut sum = Scratch::new(n * bytes)?;
        copy(sum.ptr(), input, n * bytes);
        let reduce = Op::reduce(ptr(sum.ptr()), count * n, dtype, 0, local_op);
        self.local(reduce, c)?;
        let my_ranks = &self.hosts[self.place[self.rank].0];
        let leader = self.is_leader();
        let mut mine = Scratch::new(if leader { my_ranks.len() * bytes } else { 0 })?;
        let mut inputs = Vec::new();
        if leader {
            // Host-major order: each host's ranks' blocks together.
            let mut by_host = Scratch::new(n * bytes)?;
            for (k, r) in self.hosts.iter().flatten().enumerate() {
                copy(
                    by_host.ptr().add(k * bytes),
                    sum.ptr().add(r * bytes),
                    bytes,
                );
            }
            let op = Op::reduce_scatter_v(
                ptr(mine.ptr()),
                ptr(by_host.ptr()),
                self.hosts.iter().map(|h| h.len() * count).collect(),
                dtype,
                top_op,
            );
            self.leaders_then_local(op, c)?;
            if avg {
                let total = my_ranks.len() * count;
                reduce::scale(dtype, mine.ptr(), mine.ptr(), total, Scale::Div(n as u64))?;
            }
            inputs = (0..my_ranks.len())
                .map(|j| ptr(mine.ptr().add(j * bytes)))
                .collect();
        }
        let scatter = Op::scatter(output, inputs, count, dtype, 0);
        self.local(scatter, c)
    }
}
