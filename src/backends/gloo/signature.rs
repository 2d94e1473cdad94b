//! What ranks must agree on for a collective, and the always-on checks
//! built on it: the shared-memory path's [`Fingerprint`], compared at every
//! operation's first sync (see [`super::shared_memory`]), and the Gloo path's
//! tag salt ([`tag_salt`]), which keeps the messages of ranks that called
//! different collectives from ever matching; plus their descriptions for
//! messages.

use crate::op::{Op, OP_NAMES};
use crate::types::{DType, RedKind};

/// What every rank must agree on for a collective, published next to the
/// phase word at the operation's first sync and compared by every rank
/// after it: an always-on check that costs no extra synchronisation.
/// Fields, not a hash, so that a mismatch names the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint {
    /// Operation code (the backend's numbering, below 256).
    pub op: u8,
    /// 0 for none, else the dtype's C value + 1.
    pub dtype: u8,
    /// 0 for none, else the reduce op's C value + 1.
    pub red: u8,
    /// Whether `count` is a digest of per-rank counts (the v-variants).
    pub counts_digest: bool,
    pub count: u64,
    /// The root as an i64 (-1 for none).
    pub root: u64,
}

impl Fingerprint {
    pub(super) fn packed(&self) -> u64 {
        self.op as u64
            | (self.dtype as u64) << 8
            | (self.red as u64) << 16
            | (self.counts_digest as u64) << 24
    }

    pub(super) fn unpack(packed: u64, count: u64, root: u64) -> Fingerprint {
        Fingerprint {
            op: packed as u8,
            dtype: (packed >> 8) as u8,
            red: (packed >> 16) as u8,
            counts_digest: (packed >> 24) & 1 == 1,
            count,
            root,
        }
    }

    /// The first field (in the order a reader checks a call) that differs.
    pub(super) fn differing_field(&self, other: &Fingerprint) -> &'static str {
        if self.op != other.op {
            "operation"
        } else if self.dtype != other.dtype {
            "dtype"
        } else if self.count != other.count && self.counts_digest {
            "per-rank counts"
        } else if self.count != other.count {
            "count"
        } else if self.root != other.root {
            "root"
        } else {
            "reduce op"
        }
    }
}

/// A digest of per-rank counts, for a v-variant's fingerprint.
pub fn counts_digest(counts: &[usize]) -> u64 {
    counts
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64 ^ counts.len() as u64, |h, c| {
            (h ^ *c as u64).wrapping_mul(0x0100_0000_01b3)
        })
}

pub(super) fn describe_sig(v: &[u64]) -> String {
    let op = OP_NAMES.get(v[0] as usize).copied().unwrap_or("?");
    if v[0] == Op::Barrier.code() as u64 {
        return "barrier()".into();
    }
    let dtype = if v[1] == 0 {
        "-".to_string()
    } else {
        DType::ALL
            .get(v[1] as usize - 1)
            .map_or("?".into(), |d| d.name().to_string())
    };
    let red = if v[4] == 0 {
        String::new()
    } else {
        format!(
            ", op {}",
            RedKind::ALL
                .get(v[4] as usize - 1)
                .map_or("?", |k| k.name())
        )
    };
    let root = v[3] as i64;
    let root = if root >= 0 {
        format!(", root {root}")
    } else {
        String::new()
    };
    format!("{op}(dtype {dtype}, count {}{root}{red})", v[2])
}

/// (op code, dtype + 1 or 0, count, root as i64, reduce op + 1 or 0) of
/// a collective, as the collective check exchanges them; None for
/// point-to-point operations.
pub(super) fn signature_words(op: &Op) -> Option<[u64; 5]> {
    let (dtype, count, root) = op.signature()?;
    let red = op.reduce_op().map_or(0, |r| r.kind as u64 + 1);
    Some([
        op.code() as u64,
        dtype.map_or(0, |d| d.to_c() as u64 + 1),
        count as u64,
        root as i64 as u64,
        red,
    ])
}

/// Appended to timeouts while the full collective check is off.
pub(super) const CHECK_HINT: &str = "; if the ranks may have called different collectives (operation, dtype, count, root \
     or reduce op), set TORCHCOMM_CHECK_COLLECTIVES=1 on every rank: it checks every call and names the field that differs";

/// Bits of a Gloo tag that count calls; the rest carry [`tag_salt`].
pub(super) const TAG_COUNTER_BITS: u32 = 12;

/// A hash of what the ranks must agree on for a collective, folded into
/// every Gloo tag the collective uses. Gloo matches messages by tag, so
/// ranks that called different collectives (operation, dtype, count, root
/// or reduce op) exchange nothing and fail at the timeout, instead of
/// receiving a message of another size, which makes Gloo's network thread
/// throw (`op.preamble.length <= op.nbytes`, uncatchable: the process
/// terminates) or, at equal sizes, reduce the wrong data. The v-variants'
/// counts are left out: they are compared first, by a message of a size
/// every rank agrees on.
#[inline]
pub(super) fn tag_salt(op: &Op) -> u32 {
    let Some(mut words) = signature_words(op) else {
        return 0;
    };
    if op.agreed_counts().is_some() {
        words[2] = 0;
    }
    let mut h = words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        (h ^ w).wrapping_mul(0x0100_0000_01b3)
    });
    // Mix every input bit into the top bits kept (a small difference in
    // the last word changes only a few low bits before this).
    for k in [0xff51_afd7_ed55_8ccd_u64, 0xc4ce_b9fe_1a85_ec53] {
        h = (h ^ h >> 33).wrapping_mul(k);
    }
    (h >> (32 + TAG_COUNTER_BITS)) as u32
}

/// The shared-memory path's fingerprint of a collective: its signature,
/// with the v-variants' per-rank counts as a digest (ranks must pass the
/// same counts, not only the same total).
pub(super) fn fingerprint(op: &Op) -> Option<Fingerprint> {
    let [code, dtype, count, root, red] = signature_words(op)?;
    let counts = op.agreed_counts();
    Some(Fingerprint {
        op: code as u8,
        dtype: dtype as u8,
        red: red as u8,
        counts_digest: counts.is_some(),
        count: counts.map_or(count, counts_digest),
        root,
    })
}

/// The fingerprint code of a call that failed on its rank before its first
/// transfer: the other ranks fail too instead of waiting for it.
pub(super) const FAILED_ALONE: u8 = u8::MAX;

/// The fingerprint code of a refusal (see [`crate::op::Refusal`]): the
/// other ranks fail with the refusing rank's reason.
pub(super) const REFUSED: u8 = u8::MAX - 1;

pub(super) fn describe_fingerprint(fp: &Fingerprint) -> String {
    if fp.op == FAILED_ALONE {
        return "a collective that failed there before any transfer (see that rank's error)".into();
    }
    if fp.op == REFUSED {
        return "a collective it refused".into();
    }
    let count = if fp.counts_digest { 0 } else { fp.count };
    let text = describe_sig(&[fp.op as u64, fp.dtype as u64, count, fp.root, fp.red as u64]);
    if fp.counts_digest {
        // The digest means nothing to a reader; the field name says it.
        text.replace(", count 0", "")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Ptr;
    use crate::types::{PremulFactor, ReduceOp};

    fn null() -> Ptr {
        Ptr(std::ptr::null_mut())
    }

    fn all_reduce(count: usize, dtype: DType, kind: RedKind) -> Op {
        Op::all_reduce(
            null(),
            count,
            dtype,
            ReduceOp {
                kind,
                factor: PremulFactor::Host(1.0),
            },
        )
    }

    fn broadcast(root: i32) -> Op {
        Op::broadcast(null(), 8, DType::F32, root)
    }

    fn all_gather_v(counts: Vec<usize>) -> Op {
        Op::all_gather_v(null(), null(), counts, DType::F32)
    }

    #[test]
    fn op_codes_index_op_names() {
        let gather = Op::gather(vec![], null(), 1, DType::U8, 0);
        for op in [
            Op::Barrier,
            all_reduce(1, DType::F32, RedKind::Sum),
            broadcast(0),
            all_gather_v(vec![1]),
            gather,
        ] {
            assert_eq!(OP_NAMES[op.code() as usize], op.name());
        }
    }

    /// Ranks whose calls differ in any field use different Gloo tags.
    #[test]
    fn every_field_of_a_call_changes_its_tag_salt() {
        let salts = [
            tag_salt(&all_reduce(8, DType::F32, RedKind::Sum)),
            tag_salt(&all_reduce(6, DType::F32, RedKind::Sum)),
            tag_salt(&all_reduce(8, DType::I32, RedKind::Sum)),
            tag_salt(&all_reduce(8, DType::F32, RedKind::Max)),
            tag_salt(&broadcast(0)),
            tag_salt(&broadcast(1)),
            tag_salt(&Op::Barrier),
        ];
        for (i, a) in salts.iter().enumerate() {
            assert!(*a < 1 << (32 - TAG_COUNTER_BITS));
            for b in &salts[i + 1..] {
                assert_ne!(a, b, "{salts:x?}");
            }
        }
        // The v-variants' counts are compared by a message of their own.
        assert_eq!(
            tag_salt(&all_gather_v(vec![2, 3])),
            tag_salt(&all_gather_v(vec![2, 4]))
        );
    }

    #[test]
    fn fingerprints_tell_per_rank_counts_apart() {
        let a = fingerprint(&all_gather_v(vec![2, 3])).unwrap();
        let b = fingerprint(&all_gather_v(vec![3, 2])).unwrap();
        assert_ne!(a, b);
        assert!(describe_fingerprint(&a).starts_with("all_gather_v(dtype float32"));
        assert!(!describe_fingerprint(&a).contains("count"));
        assert_eq!(
            describe_fingerprint(&fingerprint(&Op::Barrier).unwrap()),
            "barrier()"
        );
    }
}
