//! NCCL's data types and reduction ops for an operation: the dtype
//! mapping, the built-in ops, and PreMulSum ops created per call
//! ([`RedOp`], destroyed on drop).

use super::loader::*;
use super::NcclBackend;
use crate::cuda;
use crate::error::{Error, Result};
use crate::types::{DType, PremulFactor, RedKind, ReduceOp};
use std::ffi::c_void;

/// A reduction op for one call; a PreMulSum op is destroyed on drop (the
/// enqueue that created it still holds its use of the comm).
pub(super) struct RedOp<'a> {
    pub(super) op: NcclRedOp,
    owned: Option<&'a NcclBackend>,
}

impl Drop for RedOp<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.owned {
            if let Some(destroy) = b.lib.red_op_destroy {
                // SAFETY: created on this comm by ncclRedOpCreatePreMulSum;
                // NCCL allows destroying it once the calls using it returned.
                // An aborted comm took its ops with it.
                let _ = b.call("ncclRedOpDestroy", |c| unsafe { destroy(self.op, c) });
            }
        }
    }
}

impl NcclBackend {
    pub(super) fn dtype(&self, d: DType) -> Result<NcclDataType> {
        Ok(match d {
            DType::F32 => NCCL_FLOAT32,
            DType::F64 => NCCL_FLOAT64,
            DType::F16 => NCCL_FLOAT16,
            DType::BF16 => NCCL_BFLOAT16,
            DType::I8 => NCCL_INT8,
            DType::U8 | DType::Bool => NCCL_UINT8,
            DType::I32 => NCCL_INT32,
            DType::I64 => NCCL_INT64,
            DType::U32 => NCCL_UINT32,
            DType::U64 => NCCL_UINT64,
            DType::F8E4M3 | DType::F8E5M2 if !self.lib.has_fp8() => {
                return Err(Error::unsupported(format!(
                    "dtype {} needs NCCL 2.24 or newer; the loaded NCCL is {}",
                    d.name(),
                    self.lib.version_string()
                )))
            }
            DType::F8E4M3 => NCCL_FLOAT8_E4M3,
            DType::F8E5M2 => NCCL_FLOAT8_E5M2,
        })
    }

    /// The built-in NCCL op for `op` on `dtype`, or None for PREMUL_SUM;
    /// errors for what NCCL cannot do.
    pub(super) fn builtin_op(&self, op: &ReduceOp, dtype: DType) -> Result<Option<NcclRedOp>> {
        let unsupported = |why: &str| {
            Err(Error::unsupported(format!(
                "reduce op {} on {}: {why}",
                op.kind.name(),
                dtype.name()
            )))
        };
        Ok(Some(match (op.kind, dtype) {
            (RedKind::BAnd | RedKind::BOr | RedKind::BXor, _) => {
                return unsupported("NCCL has no bitwise reductions")
            }
            (RedKind::Sum | RedKind::Max, DType::Bool) => NCCL_MAX,
            (RedKind::Product | RedKind::Min, DType::Bool) => NCCL_MIN,
            (RedKind::Avg | RedKind::PremulSum, DType::Bool) => {
                return unsupported("not defined on bool")
            }
            (RedKind::Sum, _) => NCCL_SUM,
            (RedKind::Product, _) => NCCL_PROD,
            (RedKind::Min, _) => NCCL_MIN,
            (RedKind::Max, _) => NCCL_MAX,
            // NCCL's one-rank path has no float8 pre-multiply kernel in its
            // host code (2.28, 2.29: ncclInvalidArgument); the average of
            // one rank's values is those values, which its SUM (a copy) is.
            (RedKind::Avg, DType::F8E4M3 | DType::F8E5M2) if self.size == 1 => NCCL_SUM,
            (RedKind::Avg, _) => NCCL_AVG,
            (RedKind::PremulSum, DType::F16 | DType::BF16 | DType::F32 | DType::F64) => {
                if self.lib.red_op_create_pre_mul_sum.is_none() {
                    return unsupported("the loaded NCCL lacks ncclRedOpCreatePreMulSum");
                }
                return Ok(None);
            }
            (RedKind::PremulSum, _) => {
                return unsupported(
                    "NCCL pre-multiplies float16, bfloat16, float32 and float64 only",
                )
            }
        }))
    }

    /// The op for one call (creating a PreMulSum op when needed).
    pub(super) fn red_op(&self, op: &ReduceOp, dtype: DType) -> Result<RedOp<'_>> {
        if let Some(b) = self.builtin_op(op, dtype)? {
            return Ok(RedOp { op: b, owned: None });
        }
        let create = self
            .lib
            .red_op_create_pre_mul_sum
            .ok_or_else(|| Error::unsupported("ncclRedOpCreatePreMulSum missing"))?;
        let dt = self.dtype(dtype)?;
        let mut host = [0u8; 8];
        let host_value = |f: f64, host: &mut [u8; 8]| match dtype {
            DType::F64 => host.copy_from_slice(&f.to_ne_bytes()),
            DType::F32 => host[..4].copy_from_slice(&(f as f32).to_ne_bytes()),
            DType::F16 => {
                host[..2].copy_from_slice(&crate::kernels::half::f32_to_f16(f as f32).to_ne_bytes())
            }
            _ => host[..2]
                .copy_from_slice(&crate::kernels::half::f32_to_bf16(f as f32).to_ne_bytes()),
        };
        let (scalar, residence) = match op.factor {
            PremulFactor::Host(f) => {
                host_value(f, &mut host);
                (host.as_mut_ptr() as *mut c_void, NCCL_SCALAR_HOST_IMMEDIATE)
            }
            PremulFactor::Pointer(p) => match cuda::memory_type(p)? {
                cuda::MemoryType::Host => {
                    // SAFETY: the caller passes one element of `dtype` at `p`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            p as *const u8,
                            host.as_mut_ptr(),
                            dtype.size(),
                        )
                    };
                    (host.as_mut_ptr() as *mut c_void, NCCL_SCALAR_HOST_IMMEDIATE)
                }
                _ => (p as *mut c_void, NCCL_SCALAR_DEVICE),
            },
        };
        let mut handle: NcclRedOp = 0;
        // SAFETY: `scalar` is read now (host) or by the kernel (device, the
        // caller keeps it alive); valid out-pointer.
        self.call("ncclRedOpCreatePreMulSum", |c| unsafe {
            create(&mut handle, scalar, dt, residence, c)
        })?;
        Ok(RedOp {
            op: handle,
            owned: Some(self),
        })
    }
}
