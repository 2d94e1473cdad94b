//! The device kernels of the compressing hooks (`crate::cuda::Kernels`)
//! against the host path they must match bit for bit (`layout::cast` and
//! `layout::divide`, what the gloo reducer runs): every float16 and bfloat16
//! value, and float32 values around every float16/bfloat16 rounding
//! boundary plus a spread of all bit patterns, NaNs and infinities
//! included. Needs a driver: a GPU, or the simulated one of
//! `make sim-gpu-test` (which runs it with `cuda::tests`); without one it
//! returns at once.

use super::layout::{cast, divide};
use crate::cuda::{
    available, copy_to_device, copy_to_host, device_count, stream_synchronize, Device,
    DeviceBuffer, Elem, Kernels, Stream,
};
use crate::kernels::half::{bf16_to_f32, f16_to_f32};
use crate::types::DType;
use std::sync::Arc;

struct Rig {
    dev: Arc<Device>,
    stream: Stream,
    kernels: Kernels,
}

fn rig() -> Option<Rig> {
    if available().is_err() || device_count().map_or(true, |n| n < 1) {
        return None;
    }
    let dev = Device::open(0).unwrap();
    let stream = Stream::new(&dev, 0).unwrap();
    let kernels = Kernels::load(&dev).expect("loading the PTX kernels");
    Some(Rig {
        dev,
        stream,
        kernels,
    })
}

fn elem(d: DType) -> Elem {
    match d {
        DType::F32 => Elem::F32,
        DType::F16 => Elem::F16,
        _ => Elem::Bf16,
    }
}

fn to_device(rig: &Rig, bytes: &[u8]) -> DeviceBuffer {
    let b = DeviceBuffer::zeroed(&rig.dev, bytes.len()).unwrap();
    copy_to_device(b.ptr(), bytes).unwrap();
    b
}

fn to_host(rig: &Rig, b: &DeviceBuffer, len: usize) -> Vec<u8> {
    stream_synchronize(rig.stream.raw()).unwrap();
    let mut out = vec![0u8; len];
    copy_to_host(&mut out, b.ptr()).unwrap();
    out
}

/// The first element where two buffers of `size`-byte elements differ.
fn first_difference(a: &[u8], b: &[u8], size: usize) -> Option<usize> {
    a.chunks(size).zip(b.chunks(size)).position(|(x, y)| x != y)
}

fn check_cast(rig: &Rig, src: &[u8], from: DType, to: DType) {
    let n = src.len() / from.size();
    let mut want = vec![0u8; n * to.size()];
    // SAFETY: both buffers hold `n` elements of their dtypes.
    unsafe { cast(src.as_ptr(), from, want.as_mut_ptr(), to, n) }.unwrap();
    let (d_src, d_dst) = (to_device(rig, src), to_device(rig, &want));
    // Poison the destination: every element must be written.
    copy_to_device(d_dst.ptr(), &vec![0xa5; want.len()]).unwrap();
    let s = rig.stream.raw();
    rig.kernels
        .cast(d_src.ptr(), elem(from), d_dst.ptr(), elem(to), n, s)
        .unwrap();
    let got = to_host(rig, &d_dst, want.len());
    if let Some(i) = first_difference(&got, &want, to.size()) {
        let at = |b: &[u8]| b[i * to.size()..(i + 1) * to.size()].to_vec();
        let input = src[i * from.size()..(i + 1) * from.size()].to_vec();
        panic!(
            "{} -> {}: element {i} (input bytes {input:02x?}): device {:02x?}, host {:02x?}",
            from.name(),
            to.name(),
            at(&got),
            at(&want)
        );
    }
}

fn check_divide(rig: &Rig, src: &[u8], dtype: DType, world: u32) {
    let n = src.len() / 2;
    let mut want = src.to_vec();
    // SAFETY: `want` holds `n` 16-bit elements.
    unsafe { divide(want.as_mut_ptr(), dtype, n, world as f64) };
    let buf = to_device(rig, src);
    let s = rig.stream.raw();
    rig.kernels
        .divide(buf.ptr(), elem(dtype), n, world as f32, s)
        .unwrap();
    let got = to_host(rig, &buf, want.len());
    if let Some(i) = first_difference(&got, &want, 2) {
        panic!(
            "{} / {world}: element {i} ({:02x?}): device {:02x?}, host {:02x?}",
            dtype.name(),
            &src[2 * i..2 * i + 2],
            &got[2 * i..2 * i + 2],
            &want[2 * i..2 * i + 2]
        );
    }
}

/// Every 16-bit pattern, as bytes.
fn all_u16() -> Vec<u8> {
    (0..=u16::MAX).flat_map(|h| h.to_ne_bytes()).collect()
}

/// float32 bit patterns: every float16 and bfloat16 value and its
/// neighbours, the midpoints to the next value and theirs (where rounding
/// ties are decided), and a spread over all patterns.
fn f32_samples() -> Vec<u8> {
    let mut v: Vec<u32> = Vec::new();
    for h in 0..=u16::MAX {
        for x in [
            f16_to_f32(h).to_bits(),
            bf16_to_f32(h).to_bits(),
            ((h as u32) << 16) | 0x8000,
        ] {
            v.extend([x.wrapping_sub(1), x, x.wrapping_add(1)]);
        }
        let mid = (f16_to_f32(h) as f64 + f16_to_f32(h.wrapping_add(1)) as f64) / 2.0;
        let m = (mid as f32).to_bits();
        v.extend([m.wrapping_sub(1), m, m.wrapping_add(1)]);
    }
    v.extend((0..1u64 << 18).map(|i| (i * 0x9e37_79b1) as u32));
    v.extend([
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffc0_1234,
    ]);
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

#[test]
fn device_casts_match_the_host_path() {
    let Some(rig) = rig() else { return };
    let _current = rig.dev.scoped().unwrap();
    let halves = all_u16();
    for (from, to) in [
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
        (DType::F16, DType::BF16),
        (DType::BF16, DType::F16),
    ] {
        check_cast(&rig, &halves, from, to);
    }
    let floats = f32_samples();
    check_cast(&rig, &floats, DType::F32, DType::F16);
    check_cast(&rig, &floats, DType::F32, DType::BF16);
}

#[test]
fn device_division_matches_the_host_path() {
    let Some(rig) = rig() else { return };
    let _current = rig.dev.scoped().unwrap();
    let halves = all_u16();
    for world in [1, 2, 3, 4, 5, 7, 8, 1000] {
        check_divide(&rig, &halves, DType::F16, world);
        check_divide(&rig, &halves, DType::BF16, world);
    }
}

#[test]
fn device_kernels_refuse_what_they_lack() {
    let Some(rig) = rig() else { return };
    let _current = rig.dev.scoped().unwrap();
    let s = rig.stream.raw();
    let b = DeviceBuffer::zeroed(&rig.dev, 64).unwrap();
    let e = rig
        .kernels
        .cast(b.ptr(), Elem::F16, b.ptr(), Elem::F16, 4, s)
        .expect_err("no same-type cast kernel");
    assert!(e.message.contains("a copy, not a cast"), "{}", e.message);
    let e = rig
        .kernels
        .divide(b.ptr(), Elem::F32, 4, 2.0, s)
        .expect_err("no float32 division kernel");
    assert!(e.message.contains("float32"), "{}", e.message);
    // Nothing to do: no launch at all.
    rig.kernels.divide(b.ptr(), Elem::F16, 0, 2.0, s).unwrap();
}
