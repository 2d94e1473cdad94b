//! Host staging of CUDA buffers for host backends (Gloo's host path, seed
//! 001): device buffers of an operation are copied to pinned host memory in
//! the caller's stream order, the host collective runs on the copies, and the
//! outputs are copied back on the caller's stream. Without a CUDA driver no
//! pointer can be device memory, and operations are left untouched.
//!
//! The staged operation completes before the call returns (the host blocks
//! on the caller's stream), whatever `async_op` says.

use crate::cuda::{self, MemoryType, PinnedBuffer};
use crate::error::{Error, Result};
use crate::op::{for_each_buffer, Op, PointToPoint, Ptr, ReductionKind, ScatterKind, Use};
use cudarc::driver::sys;
use std::ffi::c_void;

/// Device buffers of one operation, replaced by pinned host copies.
pub struct Staged {
    /// (device address, its pinned copy, bytes, use)
    copies: Vec<(Ptr, PinnedBuffer, usize, Use)>,
    stream: sys::CUstream,
    device: std::sync::Arc<cuda::Device>,
}

pub(crate) fn pointer_device(ptr: *const c_void) -> Result<i32> {
    let mut ordinal: i32 = 0;
    let attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    // SAFETY: the attribute is an int; `ptr` is only inspected.
    cuda::check(
        unsafe {
            cuda::drv::cuPointerGetAttribute(
                &mut ordinal as *mut i32 as *mut c_void,
                attr as u32,
                ptr as sys::CUdeviceptr,
            )
        },
        "cuPointerGetAttribute(DEVICE_ORDINAL)",
    )?;
    Ok(ordinal)
}

/// Whether [`stage_in`] has anything to look at: not when `op` names no
/// buffer (a barrier, a refusal) or its one buffer is on the caller's
/// stack. Asked inline before the call, which most host calls then skip.
#[inline]
pub fn may_stage(op: &Op) -> bool {
    has_buffers(op) && !one_buffer_on_callers_stack(op)
}

/// Whether `op` names any buffer at all (a barrier or a refusal names
/// none).
#[inline]
fn has_buffers(op: &Op) -> bool {
    !matches!(op, Op::Barrier | Op::Refused(_))
}

/// Whether `op` has one buffer and it is on the caller's stack, so host
/// memory (see [`cuda::on_callers_stack`]); false for the other families,
/// which take the look for the driver.
#[inline]
fn one_buffer_on_callers_stack(op: &Op) -> bool {
    let (buf, count, dtype) = match op {
        Op::Reduction(r) => match &r.kind {
            ReductionKind::AllReduce { buf, count } | ReductionKind::Reduce { buf, count, .. } => {
                (*buf, *count, r.dtype)
            }
            _ => return false,
        },
        Op::Scatter(s) => match &s.kind {
            ScatterKind::Broadcast { buf } => (*buf, s.count, s.dtype),
            _ => return false,
        },
        Op::PointToPoint(PointToPoint::One(p)) => (p.buf, p.count, p.dtype),
        _ => return false,
    };
    // Validated: the size does not overflow.
    cuda::on_callers_stack(buf.0, count * dtype.size())
}

fn synchronize(stream: sys::CUstream) -> Result<()> {
    // SAFETY: the stream is the caller's (NULL: the legacy default stream).
    cuda::stream_synchronize(stream)
}

/// Replaces the device buffers of `op` by pinned host copies (inputs copied
/// on `stream`, which is then synchronized). `None` when no buffer is device
/// memory (always, without a CUDA driver). Callers ask [`may_stage`] first:
/// it spares most host calls the look for the driver (which, without one,
/// takes the loader's lock).
pub fn stage_in(op: &mut Op, rank: i32, size: i32, stream: *mut c_void) -> Result<Option<Staged>> {
    if !cuda::may_hold_device_memory() {
        return Ok(None);
    }
    let mut on_device = None;
    for_each_buffer(op, rank, size, &mut |p, bytes, _| {
        if on_device.is_none() && bytes > 0 && cuda::memory_type(p.0)? != MemoryType::Host {
            on_device = Some(pointer_device(p.0)?);
        }
        Ok(())
    })?;
    let Some(ordinal) = on_device else {
        return Ok(None);
    };
    let device = cuda::Device::open(ordinal)?;
    let _current = device.scoped()?;
    let stream = stream as sys::CUstream;
    // A host collective cannot be part of a CUDA graph, and synchronizing a
    // capturing stream (below) would fail and invalidate the caller's
    // capture: refuse first, leaving the capture intact.
    if cuda::capture_status(stream)? != cuda::Capture::None {
        return Err(Error::unsupported(
            "CUDA buffers on a host backend cannot be captured into a CUDA graph (the stream is capturing): the host \
             collective would run once now, not at each replay",
        ));
    }
    let mut copies = Vec::new();
    for_each_buffer(op, rank, size, &mut |p, bytes, usage| {
        if bytes == 0 || cuda::memory_type(p.0)? == MemoryType::Host {
            return Ok(());
        }
        let pinned = PinnedBuffer::new(&device, bytes)?;
        if usage != Use::Out {
            cuda::memcpy_async(pinned.ptr(), p.0, bytes, stream)?;
        }
        let host = Ptr(pinned.ptr());
        copies.push((*p, pinned, bytes, usage));
        *p = host;
        Ok(())
    })?;
    synchronize(stream)?;
    Ok(Some(Staged {
        copies,
        stream,
        device,
    }))
}

impl Staged {
    /// Copies the outputs back on the caller's stream and waits for them (the
    /// pinned copies are freed on return).
    pub fn finish(self) -> Result<()> {
        let _current = self.device.scoped()?;
        for (device_ptr, pinned, bytes, usage) in &self.copies {
            if *usage != Use::In {
                cuda::memcpy_async(device_ptr.0, pinned.ptr(), *bytes, self.stream)?;
            }
        }
        synchronize(self.stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    fn p(x: usize) -> Ptr {
        Ptr(x as *mut c_void)
    }

    fn buffers(mut op: Op, rank: i32, size: i32) -> Vec<(usize, usize, Use)> {
        let mut seen = Vec::new();
        for_each_buffer(&mut op, rank, size, &mut |ptr, bytes, u| {
            seen.push((ptr.0 as usize, bytes, u));
            Ok(())
        })
        .unwrap();
        seen
    }

    #[test]
    fn buffer_map_gives_sizes_and_directions() {
        let ag = Op::all_gather_v(p(1), p(2), vec![1, 2, 3], DType::F32);
        assert_eq!(buffers(ag, 1, 3), vec![(2, 8, Use::In), (1, 24, Use::Out)]);
        let rs = Op::reduce_scatter_single(p(1), p(2), 5, DType::F64, crate::types::ReduceOp::SUM);
        assert_eq!(
            buffers(rs, 0, 4),
            vec![(2, 160, Use::In), (1, 40, Use::Out)]
        );
        let ar = Op::all_reduce(p(9), 3, DType::BF16, crate::types::ReduceOp::SUM);
        assert_eq!(buffers(ar, 0, 2), vec![(9, 6, Use::InOut)]);
        let a2av = Op::all_to_all_v_single(p(1), vec![1, 1], p(2), vec![2, 3], DType::I64);
        assert_eq!(
            buffers(a2av, 0, 2),
            vec![(2, 40, Use::In), (1, 16, Use::Out)]
        );
        let gather_off_root = Op::gather(vec![], p(3), 4, DType::U8, 0);
        assert_eq!(buffers(gather_off_root, 1, 2), vec![(3, 4, Use::In)]);
        assert!(buffers(Op::Barrier, 0, 2).is_empty());
    }

    /// The operations staging skips without asking for the driver name no
    /// buffer at all; every other one may.
    #[test]
    fn only_operations_without_buffers_skip_the_look() {
        let refused = Op::Refused(crate::op::Refusal {
            call: "tc_all_reduce",
            rank: 0,
            error: crate::error::Error::invalid_argument("test"),
        });
        for op in [Op::Barrier, refused] {
            assert!(!has_buffers(&op), "{}", op.name());
            assert!(buffers(op, 0, 2).is_empty());
        }
        let ar = Op::all_reduce(p(9), 3, DType::F32, crate::types::ReduceOp::SUM);
        let send = Op::send(p(9), 3, DType::F32, 1, 0);
        for op in [ar, send] {
            assert!(has_buffers(&op), "{}", op.name());
            assert!(!buffers(op, 0, 2).is_empty());
        }
    }

    /// With a driver (a GPU, or the simulated one of `make sim-gpu-test`): a
    /// staged operation on a capturing stream is refused before anything is
    /// enqueued, and the caller's capture stays valid.
    #[test]
    fn staging_under_capture_is_refused_and_the_capture_survives() {
        if !cuda::is_available() || cuda::device_count().map_or(true, |n| n < 1) {
            return;
        }
        let dev = cuda::Device::open(0).unwrap();
        let _g = dev.scoped().unwrap();
        let stream = cuda::Stream::new(&dev, 0).unwrap();
        let buf = cuda::DeviceBuffer::zeroed(&dev, 64).unwrap();
        cuda::begin_capture(stream.raw()).unwrap();
        let mut op = Op::all_reduce(Ptr(buf.ptr()), 16, DType::F32, crate::types::ReduceOp::SUM);
        let e = stage_in(&mut op, 0, 1, stream.raw() as *mut c_void)
            .err()
            .expect("staging under capture must fail");
        assert_eq!(
            e.kind,
            crate::error::ErrorKind::Unsupported,
            "{}",
            e.message
        );
        assert!(e.message.contains("captur"), "{}", e.message);
        cuda::GraphExec::end_capture(&dev, stream.raw()).expect("the capture must still be valid");
    }

    /// The look for the driver is made again at every call: a driver the
    /// program loads after its first host call (as torch or the CUDA
    /// runtime would) is seen, and a device buffer of a later call is
    /// staged. Run in a process of its own (this test binary again, this
    /// test alone), since loading a driver changes the whole process; on
    /// the simulated driver of `make sim-gpu-test`, skipped without it.
    #[test]
    fn a_driver_loaded_after_the_first_call_is_seen() {
        const NAME: &str =
            "backends::host_executor::staging::tests::a_driver_loaded_after_the_first_call_is_seen";
        let sim =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/sim_gpu/libcuda.so.1");
        if std::env::var_os("TC_STAGING_CHILD").is_none() {
            if !sim.exists() {
                return;
            }
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
                .env("TC_STAGING_CHILD", "1")
                .env_remove("LD_LIBRARY_PATH")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        let mut host = [1.0f32; 4];
        let sum = crate::types::ReduceOp::SUM;
        let mut op = Op::all_reduce(Ptr(host.as_mut_ptr().cast()), 4, DType::F32, sum);
        assert!(stage_in(&mut op, 0, 1, std::ptr::null_mut())
            .unwrap()
            .is_none());
        assert!(!cuda::may_hold_device_memory(), "no driver loaded yet");
        // The program loads the driver itself, after that first call.
        std::mem::forget(unsafe { libloading::Library::new(&sim) }.unwrap());
        assert!(
            cuda::may_hold_device_memory(),
            "the driver loaded since must be seen"
        );
        let dev = cuda::Device::open(0).unwrap();
        let _g = dev.scoped().unwrap();
        let buf = cuda::DeviceBuffer::zeroed(&dev, 16).unwrap();
        let mut op = Op::all_reduce(Ptr(buf.ptr()), 4, DType::F32, sum);
        let staged = stage_in(&mut op, 0, 1, std::ptr::null_mut()).unwrap();
        let staged = staged.expect("a device buffer of a later call is staged");
        staged.finish().unwrap();
    }

    #[test]
    fn without_cuda_nothing_is_staged() {
        if cuda::is_available() {
            return; // a machine with a GPU stack: covered by the GPU suite
        }
        let mut data = [1.0f32; 4];
        let mut op = Op::all_reduce(
            Ptr(data.as_mut_ptr().cast()),
            4,
            DType::F32,
            crate::types::ReduceOp::SUM,
        );
        assert!(stage_in(&mut op, 0, 1, std::ptr::null_mut())
            .unwrap()
            .is_none());
    }
}
