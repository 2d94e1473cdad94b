//! Value types shared by every operation: dtypes, reduce ops, devices, hints.
//!
//! Enum-like values cross the C boundary as plain `int32_t` and are validated
//! here; typing them as Rust enums in signatures would make an unknown value
//! undefined behaviour.

#![allow(non_camel_case_types)]

use crate::error::{Error, Result};
use std::ffi::{c_char, c_void, CStr};

/// Element type of a buffer (`TC_FLOAT32`, ...).
pub type tc_dtype_t = i32;
pub const TC_FLOAT32: tc_dtype_t = 0;
pub const TC_FLOAT64: tc_dtype_t = 1;
pub const TC_FLOAT16: tc_dtype_t = 2;
pub const TC_BFLOAT16: tc_dtype_t = 3;
pub const TC_INT8: tc_dtype_t = 4;
pub const TC_UINT8: tc_dtype_t = 5;
pub const TC_INT32: tc_dtype_t = 6;
pub const TC_INT64: tc_dtype_t = 7;
/// One byte per element, 0 or 1.
pub const TC_BOOL: tc_dtype_t = 8;
pub const TC_UINT32: tc_dtype_t = 9;
pub const TC_UINT64: tc_dtype_t = 10;
pub const TC_FLOAT8_E4M3: tc_dtype_t = 11;
pub const TC_FLOAT8_E5M2: tc_dtype_t = 12;

/// Reduction kind (`TC_SUM`, ...), the `kind` field of `tc_reduce_op_t`.
pub type tc_red_kind_t = i32;
pub const TC_SUM: tc_red_kind_t = 0;
pub const TC_PRODUCT: tc_red_kind_t = 1;
pub const TC_MIN: tc_red_kind_t = 2;
pub const TC_MAX: tc_red_kind_t = 3;
/// Bitwise and; integer and bool dtypes only.
pub const TC_BAND: tc_red_kind_t = 4;
/// Bitwise or; integer and bool dtypes only.
pub const TC_BOR: tc_red_kind_t = 5;
/// Bitwise xor; integer and bool dtypes only.
pub const TC_BXOR: tc_red_kind_t = 6;
/// Multiply each input by a factor, then sum.
pub const TC_PREMUL_SUM: tc_red_kind_t = 7;
/// Sum, then divide by the world size (integer division truncates).
pub const TC_AVG: tc_red_kind_t = 8;

/// Device kind, the `type` field of `tc_device_t`.
pub const TC_DEVICE_CPU: i32 = 0;
pub const TC_DEVICE_CUDA: i32 = 1;

/// A reduction: its kind and, for `TC_PREMUL_SUM`, the factor.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_reduce_op_t {
    /// One of `TC_SUM` ... `TC_AVG`.
    pub kind: tc_red_kind_t,
    /// `TC_PREMUL_SUM` factor when `premul_factor_ptr` is NULL.
    pub premul_factor: f64,
    /// `TC_PREMUL_SUM` factor as one element of the operation's dtype, in
    /// device memory for CUDA buffers or host memory otherwise; NULL to use
    /// `premul_factor`.
    pub premul_factor_ptr: *const c_void,
}

/// A device: `TC_DEVICE_CPU` (index ignored) or `TC_DEVICE_CUDA` with an
/// index, -1 meaning local rank % number of visible devices.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct tc_device_t {
    pub r#type: i32,
    pub index: i32,
}

/// A backend hint: a key/value pair of NUL-terminated strings, copied by the
/// library during the call that receives it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_hint_t {
    pub key: *const c_char,
    pub value: *const c_char,
}

/// Validated dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    U8,
    I32,
    I64,
    Bool,
    U32,
    U64,
    F8E4M3,
    F8E5M2,
}

impl DType {
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::U32,
        DType::U64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Validates a C dtype value; `arg` names the argument in the error.
    pub fn from_c(value: tc_dtype_t, arg: &str) -> Result<DType> {
        usize::try_from(value)
            .ok()
            .and_then(|i| DType::ALL.get(i).copied())
            .ok_or_else(|| {
                Error::invalid_argument(format!("argument '{arg}': unknown dtype {value}"))
            })
    }

    pub fn to_c(self) -> tc_dtype_t {
        DType::ALL.iter().position(|d| *d == self).unwrap_or(0) as tc_dtype_t
    }

    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::Bool => "bool",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F8E4M3 => "float8_e4m3",
            DType::F8E5M2 => "float8_e5m2",
        }
    }

    pub fn is_floating(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    /// Bytes of `count` elements, or an error naming `arg` on overflow.
    #[inline]
    pub fn bytes(self, count: usize, arg: &str) -> Result<usize> {
        match count.checked_mul(self.size()) {
            Some(b) if b <= isize::MAX as usize => Ok(b),
            _ => Err(self.too_many(count, arg)),
        }
    }

    /// [`DType::bytes`]' error, out of line: every call's validation asks.
    #[cold]
    #[inline(never)]
    fn too_many(self, count: usize, arg: &str) -> Error {
        Error::invalid_argument(format!(
            "argument '{arg}': {count} elements of {} overflow the address space",
            self.name()
        ))
    }
}

/// Validated reduction kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RedKind {
    Sum,
    Product,
    Min,
    Max,
    BAnd,
    BOr,
    BXor,
    PremulSum,
    Avg,
}

impl RedKind {
    pub const ALL: [RedKind; 9] = [
        RedKind::Sum,
        RedKind::Product,
        RedKind::Min,
        RedKind::Max,
        RedKind::BAnd,
        RedKind::BOr,
        RedKind::BXor,
        RedKind::PremulSum,
        RedKind::Avg,
    ];

    /// Whether this kind sums `dtype`'s values in half precision
    /// (float16/bfloat16 SUM, AVG, PREMUL_SUM): every host transport
    /// accumulates such sums in f32 and rounds once, so their results agree
    /// bit for bit.
    pub(crate) fn sums_halves(self, dtype: DType) -> bool {
        matches!(dtype, DType::F16 | DType::BF16)
            && matches!(self, RedKind::Sum | RedKind::Avg | RedKind::PremulSum)
    }

    pub fn from_c(value: tc_red_kind_t, arg: &str) -> Result<RedKind> {
        usize::try_from(value)
            .ok()
            .and_then(|i| RedKind::ALL.get(i).copied())
            .ok_or_else(|| {
                Error::invalid_argument(format!("argument '{arg}': unknown reduce op kind {value}"))
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            RedKind::Sum => "sum",
            RedKind::Product => "prod",
            RedKind::Min => "min",
            RedKind::Max => "max",
            RedKind::BAnd => "band",
            RedKind::BOr => "bor",
            RedKind::BXor => "bxor",
            RedKind::PremulSum => "premul_sum",
            RedKind::Avg => "avg",
        }
    }

    pub fn is_bitwise(self) -> bool {
        matches!(self, RedKind::BAnd | RedKind::BOr | RedKind::BXor)
    }
}

/// Where a PREMUL_SUM factor lives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PremulFactor {
    Host(f64),
    /// One element of the op's dtype at this address (host or device).
    Pointer(*const c_void),
}

/// Validated reduce op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReduceOp {
    pub kind: RedKind,
    pub factor: PremulFactor,
}

unsafe impl Send for ReduceOp {}

impl ReduceOp {
    pub const SUM: ReduceOp = ReduceOp {
        kind: RedKind::Sum,
        factor: PremulFactor::Host(1.0),
    };

    #[inline]
    pub fn from_c(op: &tc_reduce_op_t, arg: &str) -> Result<ReduceOp> {
        // The argument's name is formatted only for the error (out of
        // line): this runs on every reduction call.
        let Some(kind) = usize::try_from(op.kind)
            .ok()
            .and_then(|i| RedKind::ALL.get(i).copied())
        else {
            return Err(Self::refusal(op, arg));
        };
        let factor = if op.premul_factor_ptr.is_null() {
            PremulFactor::Host(op.premul_factor)
        } else {
            PremulFactor::Pointer(op.premul_factor_ptr)
        };
        if kind == RedKind::PremulSum
            && op.premul_factor_ptr.is_null()
            && !op.premul_factor.is_finite()
        {
            return Err(Self::refusal(op, arg));
        }
        Ok(ReduceOp { kind, factor })
    }

    /// Why [`ReduceOp::from_c`] refuses `op`.
    #[cold]
    #[inline(never)]
    fn refusal(op: &tc_reduce_op_t, arg: &str) -> Error {
        if usize::try_from(op.kind)
            .ok()
            .and_then(|i| RedKind::ALL.get(i))
            .is_none()
        {
            return Error::invalid_argument(format!(
                "argument '{arg}.kind': unknown reduce op kind {}",
                op.kind
            ));
        }
        Error::invalid_argument(format!(
            "argument '{arg}.premul_factor' is not finite ({})",
            op.premul_factor
        ))
    }

    /// Rejects bitwise reductions on floating-point dtypes.
    pub fn check_dtype(&self, dtype: DType) -> Result<()> {
        if self.kind.is_bitwise() && dtype.is_floating() {
            return Err(Error::unsupported(format!(
                "reduce op {} is defined on integer and bool dtypes only, not {}",
                self.kind.name(),
                dtype.name()
            )));
        }
        Ok(())
    }
}

/// Validated device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    /// `None`: pick local rank % device count.
    Cuda(Option<u32>),
}

impl Device {
    pub fn from_c(dev: tc_device_t, arg: &str) -> Result<Device> {
        match dev.r#type {
            TC_DEVICE_CPU => Ok(Device::Cpu),
            TC_DEVICE_CUDA => match dev.index {
                -1 => Ok(Device::Cuda(None)),
                i if i >= 0 => Ok(Device::Cuda(Some(i as u32))),
                i => Err(Error::invalid_argument(format!(
                    "argument '{arg}.index': {i} is neither a device index nor -1"
                ))),
            },
            t => Err(Error::invalid_argument(format!(
                "argument '{arg}.type': unknown device type {t}"
            ))),
        }
    }

    pub fn to_c(self) -> tc_device_t {
        match self {
            Device::Cpu => tc_device_t {
                r#type: TC_DEVICE_CPU,
                index: 0,
            },
            Device::Cuda(i) => tc_device_t {
                r#type: TC_DEVICE_CUDA,
                index: i.map_or(-1, |i| i as i32),
            },
        }
    }
}

/// Hints copied out of C memory.
pub type Hints = Vec<(String, String)>;

/// Copies `n` hints from C.
///
/// # Safety
/// `hints` must point to `n` valid `tc_hint_t` (or be NULL with `n == 0`).
#[inline]
pub unsafe fn hints_from_c(hints: *const tc_hint_t, n: usize, arg: &str) -> Result<Hints> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if hints.is_null() {
        return Err(Error::null_argument(arg));
    }
    let slice = std::slice::from_raw_parts(hints, n);
    slice
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let key = c_string(h.key, &format!("{arg}[{i}].key"))?;
            let value = c_string(h.value, &format!("{arg}[{i}].value"))?;
            Ok((key.to_owned(), value.to_owned()))
        })
        .collect()
}

/// Borrows a NUL-terminated UTF-8 string from C.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string that outlives `'a`.
pub unsafe fn c_string<'a>(p: *const c_char, arg: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::null_argument(arg));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| Error::invalid_argument(format!("argument '{arg}' is not valid UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c_op(kind: usize, factor: f64, ptr: *const c_void) -> tc_reduce_op_t {
        tc_reduce_op_t {
            kind: kind as tc_red_kind_t,
            premul_factor: factor,
            premul_factor_ptr: ptr,
        }
    }

    /// The reduce op's checks (their messages built out of line): an
    /// unknown kind and a PREMUL_SUM host factor that is not finite are
    /// refused, naming the argument; a factor the op does not use is not
    /// looked at.
    #[test]
    fn reduce_ops_from_c_are_checked() {
        let premul = RedKind::ALL
            .iter()
            .position(|k| *k == RedKind::PremulSum)
            .unwrap();
        let sum = RedKind::ALL
            .iter()
            .position(|k| *k == RedKind::Sum)
            .unwrap();
        let unknown = ReduceOp::from_c(&c_op(RedKind::ALL.len(), 1.0, std::ptr::null()), "op");
        let e = unknown.unwrap_err();
        assert!(
            e.message.contains("'op.kind': unknown reduce op kind"),
            "{}",
            e.message
        );
        let e = ReduceOp::from_c(&c_op(premul, f64::NAN, std::ptr::null()), "op").unwrap_err();
        assert!(
            e.message.contains("'op.premul_factor' is not finite"),
            "{}",
            e.message
        );
        let x = 2.0f64;
        let by_pointer = ReduceOp::from_c(&c_op(premul, f64::NAN, (&x as *const f64).cast()), "op");
        assert!(matches!(
            by_pointer.unwrap().factor,
            PremulFactor::Pointer(_)
        ));
        let ok = ReduceOp::from_c(&c_op(premul, 0.5, std::ptr::null()), "op").unwrap();
        assert_eq!(
            (ok.kind, ok.factor),
            (RedKind::PremulSum, PremulFactor::Host(0.5))
        );
        let ok = ReduceOp::from_c(&c_op(sum, f64::INFINITY, std::ptr::null()), "op").unwrap();
        assert_eq!(ok.kind, RedKind::Sum);
    }
}
