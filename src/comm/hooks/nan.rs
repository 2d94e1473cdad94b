//! The built-in NaN check (`TORCHCOMM_NAN_CHECK=1`, read at comm creation;
//! it must be set alike on every rank, like `TORCHCOMM_CHECK_COLLECTIVES`).
//!
//! Before every collective on f32, f64, f16 or bf16 data, each rank scans
//! the inputs it contributes (host memory directly; CUDA memory through a
//! synchronous copy to the host after synchronizing the operation's stream:
//! a debugging aid, slow by design) and the ranks exchange their verdicts
//! in a one-element all_gather on the same comm. If any rank found a NaN,
//! the operation is run on no rank and fails everywhere: on a rank with a
//! NaN with `TC_ERR_INVALID_ARGUMENT` naming the operation, the rank and the
//! first bad element; on the others with `TC_ERR_REMOTE` naming the rank and
//! element that stopped it. Sharing the verdict keeps the other ranks from
//! waiting in a collective that one rank refused (they would otherwise time
//! out and abort the comm); the comm stays usable. Point-to-point
//! operations are not checked (their receiver could not be told).

use crate::backends::BufferHome;
use crate::comm::{Comm, Op, OpOptions, Ptr};
use crate::cuda::{self, MemoryType};
use crate::error::{Error, Result};
use crate::op::{for_each_buffer, ScatterKind, Use};
use crate::types::DType;
use crate::util::try_filled;

/// The dtype of `op` if the check applies to it.
fn checked_dtype(op: &Op) -> Option<DType> {
    let (dtype, _, _) = op.signature()?;
    dtype.filter(|d| matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16))
}

/// Index of the first NaN of `dtype` elements in `bytes`.
pub fn first_nan(bytes: &[u8], dtype: DType) -> Option<usize> {
    let half = |mask_exp: u16, mask_man: u16| {
        bytes.chunks_exact(2).position(|c| {
            let x = u16::from_ne_bytes([c[0], c[1]]);
            x & mask_exp == mask_exp && x & mask_man != 0
        })
    };
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .position(|c| f32::from_ne_bytes(c.try_into().unwrap()).is_nan()),
        DType::F64 => bytes
            .chunks_exact(8)
            .position(|c| f64::from_ne_bytes(c.try_into().unwrap()).is_nan()),
        DType::F16 => half(0x7c00, 0x03ff),
        DType::BF16 => half(0x7f80, 0x007f),
        _ => None,
    }
}

/// The buffers `op` reads on this rank (a broadcast reads only on its root).
fn inputs(op: &Op, rank: i32, size: i32) -> Vec<(Ptr, usize)> {
    let mut found = Vec::new();
    if matches!(op, Op::Scatter(s) if matches!(s.kind, ScatterKind::Broadcast { .. }) && s.root != rank)
    {
        return found;
    }
    let mut walked = op.clone();
    let _ = for_each_buffer(&mut walked, rank, size, &mut |p, bytes, usage| {
        if usage != Use::Out {
            found.push((*p, bytes));
        }
        Ok(())
    });
    found
}

/// (input index, element index) of this rank's first NaN.
fn local_nan(
    op: &Op,
    rank: i32,
    size: i32,
    dtype: DType,
    stream: *mut std::ffi::c_void,
) -> Result<Option<(usize, usize)>> {
    let mut synchronized = false;
    for (i, (p, bytes)) in inputs(op, rank, size).into_iter().enumerate() {
        if bytes == 0 {
            continue;
        }
        let on_device = cuda::is_available() && cuda::memory_type(p.0)? != MemoryType::Host;
        let found = if on_device {
            if !synchronized {
                // The input is complete once the caller's stream reaches here.
                cuda::stream_synchronize(stream as _)?;
                synchronized = true;
            }
            let mut host = try_filled(0u8, bytes, "argument 'count': the NaN check's host copy")?;
            cuda::copy_to_host(&mut host, p.0)?;
            first_nan(&host, dtype)
        } else {
            // SAFETY: validated operation; the caller keeps its buffers valid.
            first_nan(
                unsafe { std::slice::from_raw_parts(p.as_u8(), bytes) },
                dtype,
            )
        };
        if let Some(e) = found {
            return Ok(Some((i, e)));
        }
    }
    Ok(None)
}

/// Checks `op`'s inputs on every rank (see the module docs); collective.
pub fn check(comm: &Comm, op: &Op, opts: &OpOptions) -> Result<()> {
    let Some(dtype) = checked_dtype(op) else {
        return Ok(());
    };
    let (rank, size) = (comm.rank(), comm.size());
    let local = local_nan(op, rank, size, dtype, opts.stream)?;
    // Each rank's verdict: -1, or the flat element index of its first NaN
    // (elements counted across its input buffers).
    let flat = local.map_or(-1, |(buffer, element)| {
        let before: usize = inputs(op, rank, size)[..buffer]
            .iter()
            .map(|(_, b)| b / dtype.size())
            .sum();
        (before + element) as i64
    });
    let verdicts = exchange(comm, op, flat, opts)?;
    let context = format!(
        "{} on comm '{}' (rank {rank}/{size})",
        op.name(),
        comm.name()
    );
    if let Some((buffer, element)) = local {
        let which = if inputs(op, rank, size).len() > 1 {
            format!("input buffer {buffer}, element {element}")
        } else {
            format!("input element {element}")
        };
        return Err(Error::invalid_argument(format!(
            "{context}: {which} ({} data) is NaN (TORCHCOMM_NAN_CHECK); the operation ran on no rank",
            dtype.name()
        )));
    }
    let bad: Vec<(usize, i64)> = verdicts
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, v)| *v >= 0)
        .collect();
    let Some((first, index)) = bad.first() else {
        return Ok(());
    };
    let more = match bad.len() {
        1 => String::new(),
        n => format!(" (and {} more ranks)", n - 1),
    };
    Err(Error::remote(format!(
        "{context}: refused because rank {first} has a NaN at input element {index}{more} \
         (TORCHCOMM_NAN_CHECK); the operation ran on no rank"
    )))
}

/// Every rank's verdict, by a one-element all_gather on `comm` (on the
/// operation's stream, in device memory, for a device backend: nccl).
fn exchange(comm: &Comm, op: &Op, mine: i64, opts: &OpOptions) -> Result<Vec<i64>> {
    let n = comm.size() as usize;
    if n == 1 {
        return Ok(vec![mine]);
    }
    let blocking = OpOptions {
        async_op: false,
        timeout: opts.timeout,
        stream: opts.stream,
        hints: Vec::new(),
    };
    if comm.backend().buffer_home() == BufferHome::Device {
        return exchange_on_device(comm, op, mine, &blocking);
    }
    let input = [mine];
    let mut output = vec![-1i64; n];
    let gather = Op::all_gather_single(
        Ptr(output.as_mut_ptr().cast()),
        Ptr(input.as_ptr() as *mut _),
        1,
        DType::I64,
    );
    comm.submit_unhooked(gather, &blocking)?.wait_blocking()?;
    Ok(output)
}

fn exchange_on_device(comm: &Comm, op: &Op, mine: i64, blocking: &OpOptions) -> Result<Vec<i64>> {
    let n = comm.size() as usize;
    let ordinal = device_of(comm, op)?;
    let device = cuda::Device::open(ordinal)?;
    let _current = device.scoped()?;
    // [mine | everyone's], one allocation per check (a debugging aid).
    let buf = cuda::DeviceBuffer::zeroed(&device, (n + 1) * 8)?;
    cuda::copy_to_device(buf.ptr(), &mine.to_ne_bytes())?;
    let gather = Op::all_gather_single(
        Ptr(buf.ptr().cast::<u8>().wrapping_add(8).cast()),
        Ptr(buf.ptr()),
        1,
        DType::I64,
    );
    comm.submit_unhooked(gather, blocking)?;
    cuda::stream_synchronize(blocking.stream as _)?;
    let mut bytes = vec![0u8; n * 8];
    cuda::copy_to_host(&mut bytes, buf.ptr().cast::<u8>().wrapping_add(8).cast())?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect())
}

/// The CUDA device of `op`'s buffers (the comm's device when it has none).
fn device_of(comm: &Comm, op: &Op) -> Result<i32> {
    let mut walked = op.clone();
    let mut found = None;
    for_each_buffer(&mut walked, comm.rank(), comm.size(), &mut |p, bytes, _| {
        if found.is_none() && bytes > 0 && cuda::memory_type(p.0)? != MemoryType::Host {
            found = Some(crate::backends::host_executor::staging::pointer_device(
                p.0,
            )?);
        }
        Ok(())
    })?;
    Ok(found.unwrap_or(match comm.device() {
        crate::types::Device::Cuda(Some(i)) => i as i32,
        _ => 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_nan_of_each_float_type() {
        let f32s: Vec<u8> = [1.0f32, 2.0, f32::NAN, f32::NAN]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        assert_eq!(first_nan(&f32s, DType::F32), Some(2));
        let f64s: Vec<u8> = [f64::INFINITY, f64::NAN]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        assert_eq!(first_nan(&f64s, DType::F64), Some(1));
        // f16: 0x7c00 is +inf (not NaN), 0x7e00 a NaN; bf16: 0x7f80 +inf,
        // 0xffc1 a negative NaN.
        let f16s: Vec<u8> = [0x3c00u16, 0x7c00, 0xfc00, 0x7e00]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        assert_eq!(first_nan(&f16s, DType::F16), Some(3));
        let bf16s: Vec<u8> = [0x3f80u16, 0x7f80, 0xffc1]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        assert_eq!(first_nan(&bf16s, DType::BF16), Some(2));
        assert_eq!(first_nan(&f16s[..6], DType::F16), None);
        assert_eq!(first_nan(&[0xff; 8], DType::I32), None);
    }

    #[test]
    fn checks_collectives_on_floats_and_broadcast_inputs_on_the_root_only() {
        let p = Ptr(8 as *mut _);
        let bcast = Op::broadcast(p, 2, DType::F16, 1);
        assert_eq!(checked_dtype(&bcast), Some(DType::F16));
        assert!(inputs(&bcast, 0, 2).is_empty());
        assert_eq!(inputs(&bcast, 1, 2).len(), 1);
        let send = Op::send(p, 2, DType::F32, 1, 0);
        assert_eq!(checked_dtype(&send), None);
        let ints = Op::all_reduce(p, 2, DType::I32, crate::types::ReduceOp::SUM);
        assert_eq!(checked_dtype(&ints), None);
        assert_eq!(checked_dtype(&Op::Barrier), None);
    }
}
