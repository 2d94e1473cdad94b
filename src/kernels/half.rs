//! float16 and bfloat16 conversions to and from f32 (round to nearest even),
//! shared by the host reduction kernels, the nccl backend's scalar
//! arguments, sparse all-reduce and tc-perf.

/// IEEE binary16 bits to f32 (exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let body = (h & 0x7fff) << 13; // exponent and mantissa moved to f32 positions
    let exp = body & 0x0f80_0000;
    let value = if exp == 0x0f80_0000 {
        // Inf or NaN: force the f32 exponent to all ones.
        body | 0x7f80_0000
    } else if exp == 0 {
        // Zero or subnormal: interpret the mantissa as a multiple of 2^-24
        // by building 2^-14 * (1 + m) and subtracting 2^-14.
        let biased = f32::from_bits(body + (113 << 23)) - f32::from_bits(113 << 23);
        biased.to_bits()
    } else {
        body + ((127 - 15) << 23)
    };
    f32::from_bits(value | sign)
}

/// f32 to IEEE binary16 bits, rounding to nearest even; NaN stays NaN.
#[inline(always)]
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = (x >> 16) & 0x8000;
    let u = x & 0x7fff_ffff;
    let r = if u >= 0x4780_0000 {
        // |f| >= 65536 (overflows to infinity whatever the rounding), Inf, NaN.
        if u > 0x7f80_0000 {
            0x7e00
        } else {
            0x7c00
        }
    } else if u < 0x3880_0000 {
        // Below the smallest normal half (2^-14): let the FPU round the
        // mantissa into place by adding 0.5, whose ulp is 2^-24.
        let magic = 126u32 << 23;
        (f32::from_bits(u) + f32::from_bits(magic)).to_bits() - magic
    } else {
        let odd = (u >> 13) & 1;
        // Rebias the exponent from 127 to 15 and add the rounding bias.
        let v = u
            .wrapping_add(15u32.wrapping_sub(127) << 23)
            .wrapping_add(0xfff + odd);
        v >> 13
    };
    (r | sign) as u16
}

/// bfloat16 bits to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 to bfloat16 bits, rounding to nearest even; NaN stays NaN.
#[inline(always)]
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if (x & 0x7fff_ffff) > 0x7f80_0000 {
        return ((x >> 16) | 0x40) as u16;
    }
    let bias = 0x7fff + ((x >> 16) & 1);
    (x.wrapping_add(bias) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {f}");
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // Halfway between 1.0 and the next half (1 + 2^-10): ties to even.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 0x3c01);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(1e10), 0x7c00);
        assert_eq!(f32_to_f16(-1e10), 0xfc00);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000); // tie to even (zero)
        assert_eq!(f32_to_f16(3.0 * 2f32.powi(-25)), 0x0002);
        assert_eq!(f32_to_f16(f32::NAN) & 0x7c00, 0x7c00);
    }

    #[test]
    fn bf16_conversions() {
        for h in 0..=u16::MAX {
            let f = bf16_to_f32(h);
            if f.is_nan() {
                assert!(bf16_to_f32(f32_to_bf16(f)).is_nan());
            } else {
                assert_eq!(f32_to_bf16(f), h);
            }
        }
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80); // tie to even
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    }
}
