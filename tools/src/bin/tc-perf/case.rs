//! One measured case: its buffers (host, and device copies on a GPU) and
//! the operation each call submits.

use crate::coll::Coll;
use std::sync::Arc;
use torchcomm::cuda;
use torchcomm::{DType, PremulFactor, RedKind, ReduceOp};
use torchcomm::{Op, P2p, Ptr};

/// 8-byte aligned host buffer.
pub(crate) struct Buf(pub(crate) Vec<u64>);

impl Buf {
    pub(crate) fn new(bytes: usize) -> Buf {
        Buf(vec![0u64; bytes.div_ceil(8).max(1)])
    }
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

/// Buffers and the operation for one (size, placement).
pub(crate) struct Case {
    pub(crate) coll: Coll,
    pub(crate) dt: DType,
    pub(crate) red: RedKind,
    pub(crate) in_place: bool,
    pub(crate) rank: usize,
    pub(crate) n: usize,
    pub(crate) root: usize,
    /// Elements each rank contributes (per block for the total-size ops).
    pub(crate) count: usize,
    pub(crate) input: Buf,
    pub(crate) output: Buf,
    /// On a GPU backend: device copies of `input` and `output`, which the
    /// operations use; the host buffers only stage data and checks.
    pub(crate) dev: Option<(cuda::DeviceBuffer, cuda::DeviceBuffer)>,
}

fn bytes_of(b: &mut Buf) -> &mut [u8] {
    let len = b.0.len() * 8;
    // SAFETY: a Vec<u64> of `len / 8` elements is `len` initialized bytes.
    unsafe { std::slice::from_raw_parts_mut(b.ptr(), len) }
}

/// This rank, the world size and the root of a measured case.
pub(crate) struct Ranks {
    pub(crate) rank: usize,
    pub(crate) n: usize,
    pub(crate) root: usize,
}

impl Case {
    pub(crate) fn new(
        coll: Coll,
        dt: DType,
        red: RedKind,
        in_place: bool,
        ranks: Ranks,
        count: usize,
    ) -> Case {
        let Ranks { rank, n, root } = ranks;
        let es = dt.size();
        let (in_elems, out_elems) = match coll {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => (count, count),
            Coll::AllGather | Coll::Gather => (count, count * n),
            Coll::ReduceScatter | Coll::Scatter => (count * n, count),
            Coll::AllToAll => (count * n, count * n),
            Coll::Barrier => (0, 0),
        };
        let input = Buf::new(in_elems * es);
        // In place: one allocation holds both (the larger one).
        let output = if in_place {
            Buf::new(0)
        } else {
            Buf::new(out_elems * es)
        };
        let input = if in_place {
            Buf::new(in_elems.max(out_elems) * es)
        } else {
            input
        };
        Case {
            coll,
            dt,
            red,
            in_place,
            rank,
            n,
            root,
            count,
            input,
            output,
            dev: None,
        }
    }

    /// Allocates device copies of the buffers (same sizes) on `device`.
    pub(crate) fn on_device(mut self, device: &Arc<cuda::Device>) -> torchcomm::Result<Case> {
        let i = cuda::DeviceBuffer::zeroed(device, self.input.0.len() * 8)?;
        let o = cuda::DeviceBuffer::zeroed(device, self.output.0.len() * 8)?;
        self.dev = Some((i, o));
        Ok(self)
    }

    /// Host data to the device buffers (both: the output holds sentinels).
    pub(crate) fn upload(&mut self) -> torchcomm::Result<()> {
        if let Some((di, dout)) = &self.dev {
            cuda::copy_to_device(di.ptr(), bytes_of(&mut self.input))?;
            cuda::copy_to_device(dout.ptr(), bytes_of(&mut self.output))?;
        }
        Ok(())
    }

    /// The device's result back into the host buffer that holds the output.
    pub(crate) fn download(&mut self) -> torchcomm::Result<()> {
        if let Some((di, dout)) = &self.dev {
            if self.in_place {
                cuda::copy_to_host(bytes_of(&mut self.input), di.ptr())?;
            } else {
                cuda::copy_to_host(bytes_of(&mut self.output), dout.ptr())?;
            }
        }
        Ok(())
    }

    fn reduce_op(&self) -> ReduceOp {
        ReduceOp {
            kind: self.red,
            factor: PremulFactor::Host(1.0),
        }
    }

    /// (where this rank's input starts, where its output starts) in the
    /// host buffers.
    pub(crate) fn ptrs(&mut self) -> (*mut u8, *mut u8) {
        let (i, o) = (self.input.ptr(), self.output.ptr());
        self.ptrs_in(i, o)
    }

    /// The same in the buffers the operations use (device ones on a GPU).
    fn op_ptrs(&mut self) -> (*mut u8, *mut u8) {
        match &self.dev {
            Some((i, o)) => {
                let (i, o) = (i.ptr() as *mut u8, o.ptr() as *mut u8);
                self.ptrs_in(i, o)
            }
            None => self.ptrs(),
        }
    }

    fn ptrs_in(&self, input: *mut u8, output: *mut u8) -> (*mut u8, *mut u8) {
        let es = self.dt.size();
        if !self.in_place {
            return (input, output);
        }
        let base = input;
        match self.coll {
            // The rank's block of the gathered output is its input.
            Coll::AllGather => (unsafe { base.add(self.rank * self.count * es) }, base),
            // The output is the rank's block of the input.
            Coll::ReduceScatter => (base, unsafe { base.add(self.rank * self.count * es) }),
            _ => (base, base),
        }
    }

    /// The operation of one call, on the buffers the operations use.
    pub(crate) fn op(&mut self) -> Op {
        let (inp, out) = self.op_ptrs();
        let (inp, out) = (Ptr(inp as *mut _), Ptr(out as *mut _));
        let (count, dtype, root) = (self.count, self.dt, self.root as i32);
        match self.coll {
            Coll::AllReduce => Op::all_reduce(inp, count, dtype, self.reduce_op()),
            Coll::Broadcast => Op::broadcast(inp, count, dtype, root),
            Coll::Reduce => Op::reduce(inp, count, dtype, root, self.reduce_op()),
            Coll::AllGather => Op::all_gather_single(out, inp, count, dtype),
            Coll::ReduceScatter => {
                Op::reduce_scatter_single(out, inp, count, dtype, self.reduce_op())
            }
            Coll::AllToAll => Op::all_to_all_single(out, inp, count, dtype),
            Coll::SendRecv => self.send_recv(inp, out),
            Coll::Gather => Op::gather(self.root_blocks(out), inp, count, dtype, root),
            Coll::Scatter => Op::scatter(out, self.root_blocks(inp), count, dtype, root),
            Coll::Barrier => Op::Barrier,
        }
    }

    /// Send to the next rank, receive from the previous one, as one batch.
    fn send_recv(&self, inp: Ptr, out: Ptr) -> Op {
        let (count, dtype, n) = (self.count, self.dt, self.n);
        let next = ((self.rank + 1) % n) as i32;
        let prev = ((self.rank + n - 1) % n) as i32;
        Op::batch(vec![
            P2p {
                is_send: true,
                buf: inp,
                count,
                dtype,
                peer: next,
                tag: 0,
                source: None,
            },
            P2p {
                is_send: false,
                buf: out,
                count,
                dtype,
                peer: prev,
                tag: 0,
                source: None,
            },
        ])
    }

    /// The root's per-rank blocks of `base`, one per rank (none elsewhere).
    fn root_blocks(&self, base: Ptr) -> Vec<Ptr> {
        if self.rank != self.root {
            return Vec::new();
        }
        let (count, es) = (self.count, self.dt.size());
        (0..self.n)
            .map(|r| Ptr(unsafe { base.as_u8().add(r * count * es) } as *mut _))
            .collect()
    }

    /// Elements of the input and output of this rank (in place: of the
    /// shared buffer).
    pub(crate) fn in_elems(&self) -> usize {
        match self.coll {
            Coll::ReduceScatter | Coll::AllToAll => self.count * self.n,
            Coll::Scatter if self.rank == self.root => self.count * self.n,
            Coll::Scatter => 0,
            Coll::Barrier => 0,
            _ => self.count,
        }
    }

    /// Input element `i` of rank `r` for `seed`.
    pub(crate) fn v(&self, r: usize, i: usize, seed: usize) -> f64 {
        crate::check::value(r, i, seed, self.red)
    }
}
