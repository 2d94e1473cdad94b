//! `Op::validate`: ranks, counts, buffers and list lengths checked against
//! the comm before any backend sees the operation.

use super::{Op, Ptr};
use crate::error::{Error, Result};
use crate::types::DType;

impl Op {
    /// Checks ranks, counts, buffers and list lengths against a comm of
    /// `size` ranks seen from `rank`.
    pub fn validate(&self, rank: i32, size: i32) -> Result<()> {
        let c = Checks {
            rank,
            size,
            n: size as usize,
        };
        if let Some(op) = self.reduce_op() {
            let dtype = match self.signature() {
                Some((Some(d), _, _)) => d,
                _ => DType::F32,
            };
            op.check_dtype(dtype)?;
        }
        match self {
            Op::Send { .. } | Op::Recv { .. } | Op::Batch { .. } => {
                self.validate_point_to_point(&c)
            }
            Op::Broadcast { .. }
            | Op::Reduce { .. }
            | Op::AllReduce { .. }
            | Op::Barrier
            | Op::Scatter { .. }
            | Op::Gather { .. }
            | Op::GatherSingle { .. } => self.validate_rooted(&c),
            Op::AllGather { .. } | Op::AllGatherSingle { .. } | Op::AllGatherV { .. } => {
                self.validate_all_gathers(&c)
            }
            Op::ReduceScatter { .. }
            | Op::ReduceScatterSingle { .. }
            | Op::ReduceScatterV { .. } => self.validate_reduce_scatters(&c),
            Op::AllToAll { .. } | Op::AllToAllSingle { .. } | Op::AllToAllVSingle { .. } => {
                self.validate_all_to_alls(&c)
            }
            Op::Refused(_) => Ok(()),
        }
    }

    /// Send, receive and batch: peers and buffers.
    fn validate_point_to_point(&self, c: &Checks) -> Result<()> {
        match self {
            Op::Send {
                buf,
                count,
                dtype,
                peer,
                ..
            }
            | Op::Recv {
                buf,
                count,
                dtype,
                peer,
                ..
            } => {
                c.peer(*peer, "peer")?;
                buf_ok(*buf, *count, *dtype, "buf")
            }
            Op::Batch { ops } => {
                for (i, p) in ops.iter().enumerate() {
                    c.peer(p.peer, &format!("batch[{i}].peer"))?;
                    buf_ok(p.buf, p.count, p.dtype, &format!("batch[{i}].buf"))?;
                }
                Ok(())
            }
            _ => Err(Error::internal(format!(
                "validate_point_to_point was handed {}",
                self.name()
            ))),
        }
    }

    /// The collectives on one buffer per rank, and barrier.
    fn validate_rooted(&self, c: &Checks) -> Result<()> {
        match self {
            Op::Broadcast {
                buf,
                count,
                dtype,
                root,
            }
            | Op::Reduce {
                buf,
                count,
                dtype,
                root,
                ..
            } => {
                c.peer(*root, "root")?;
                buf_ok(*buf, *count, *dtype, "buf")
            }
            Op::AllReduce {
                buf, count, dtype, ..
            } => buf_ok(*buf, *count, *dtype, "buf"),
            Op::Barrier => Ok(()),
            Op::Scatter {
                output,
                inputs,
                count,
                dtype,
                root,
            } => {
                c.peer(*root, "root")?;
                buf_ok(*output, *count, *dtype, "output")?;
                if c.rank == *root {
                    c.list(inputs, *count, *dtype, "inputs")?;
                }
                Ok(())
            }
            Op::Gather {
                outputs,
                input,
                count,
                dtype,
                root,
            } => {
                c.peer(*root, "root")?;
                buf_ok(*input, *count, *dtype, "input")?;
                if c.rank == *root {
                    c.list(outputs, *count, *dtype, "outputs")?;
                }
                Ok(())
            }
            Op::GatherSingle {
                output,
                input,
                count,
                dtype,
                root,
            } => {
                c.peer(*root, "root")?;
                buf_ok(*input, *count, *dtype, "input")?;
                if c.rank == *root {
                    buf_ok(*output, c.times_n(*count, "count")?, *dtype, "output")?;
                }
                Ok(())
            }
            _ => Err(Error::internal(format!(
                "validate_rooted was handed {}",
                self.name()
            ))),
        }
    }

    /// The all-gathers.
    fn validate_all_gathers(&self, c: &Checks) -> Result<()> {
        match self {
            Op::AllGather {
                outputs,
                input,
                count,
                dtype,
            } => {
                buf_ok(*input, *count, *dtype, "input")?;
                c.list(outputs, *count, *dtype, "outputs")
            }
            Op::AllGatherSingle {
                output,
                input,
                count,
                dtype,
            } => {
                buf_ok(*input, *count, *dtype, "input")?;
                buf_ok(*output, c.times_n(*count, "count")?, *dtype, "output")
            }
            Op::AllGatherV {
                output,
                input,
                counts,
                dtype,
            } => {
                let total = c.counts(counts, *dtype, "counts")?;
                buf_ok(*input, counts[c.rank as usize], *dtype, "input")?;
                buf_ok(*output, total, *dtype, "output")
            }
            _ => Err(Error::internal(format!(
                "validate_all_gathers was handed {}",
                self.name()
            ))),
        }
    }

    /// The reduce-scatters.
    fn validate_reduce_scatters(&self, c: &Checks) -> Result<()> {
        match self {
            Op::ReduceScatter {
                output,
                inputs,
                count,
                dtype,
                ..
            } => {
                buf_ok(*output, *count, *dtype, "output")?;
                c.list(inputs, *count, *dtype, "inputs")
            }
            Op::ReduceScatterSingle {
                output,
                input,
                count,
                dtype,
                ..
            } => {
                buf_ok(*output, *count, *dtype, "output")?;
                buf_ok(*input, c.times_n(*count, "count")?, *dtype, "input")
            }
            Op::ReduceScatterV {
                output,
                input,
                counts,
                dtype,
                ..
            } => {
                let total = c.counts(counts, *dtype, "counts")?;
                buf_ok(*output, counts[c.rank as usize], *dtype, "output")?;
                buf_ok(*input, total, *dtype, "input")
            }
            _ => Err(Error::internal(format!(
                "validate_reduce_scatters was handed {}",
                self.name()
            ))),
        }
    }

    /// The all-to-alls.
    fn validate_all_to_alls(&self, c: &Checks) -> Result<()> {
        match self {
            Op::AllToAll {
                outputs,
                inputs,
                count,
                dtype,
            } => {
                c.list(outputs, *count, *dtype, "outputs")?;
                c.list(inputs, *count, *dtype, "inputs")
            }
            Op::AllToAllSingle {
                output,
                input,
                count,
                dtype,
            } => {
                let total = c.times_n(*count, "count")?;
                buf_ok(*output, total, *dtype, "output")?;
                buf_ok(*input, total, *dtype, "input")
            }
            Op::AllToAllVSingle {
                output,
                output_counts,
                input,
                input_counts,
                dtype,
            } => {
                let out_total = c.counts(output_counts, *dtype, "output_counts")?;
                let in_total = c.counts(input_counts, *dtype, "input_counts")?;
                buf_ok(*output, out_total, *dtype, "output")?;
                buf_ok(*input, in_total, *dtype, "input")
            }
            _ => Err(Error::internal(format!(
                "validate_all_to_alls was handed {}",
                self.name()
            ))),
        }
    }
}

/// A comm's shape, and the checks every operation's arguments go through.
struct Checks {
    rank: i32,
    size: i32,
    n: usize,
}

impl Checks {
    fn peer(&self, p: i32, arg: &str) -> Result<()> {
        let size = self.size;
        if p < 0 || p >= size {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': rank {p} is outside [0, {size})"
            )));
        }
        Ok(())
    }

    fn list(&self, l: &[Ptr], count: usize, dtype: DType, arg: &str) -> Result<()> {
        let n = self.n;
        if l.len() != n {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': {} buffers for {n} ranks",
                l.len()
            )));
        }
        for (i, p) in l.iter().enumerate() {
            buf_ok(*p, count, dtype, &format!("{arg}[{i}]"))?;
        }
        Ok(())
    }

    fn counts(&self, c: &[usize], dtype: DType, arg: &str) -> Result<usize> {
        let n = self.n;
        if c.len() != n {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': {} counts for {n} ranks",
                c.len()
            )));
        }
        let total = c.iter().try_fold(0usize, |a, b| a.checked_add(*b));
        let total = total
            .ok_or_else(|| Error::invalid_argument(format!("argument '{arg}': counts overflow")))?;
        dtype.bytes(total, arg)?;
        Ok(total)
    }

    fn times_n(&self, count: usize, arg: &str) -> Result<usize> {
        let n = self.n;
        count.checked_mul(n).ok_or_else(|| {
            Error::invalid_argument(format!(
                "argument '{arg}': count {count} x {n} ranks overflows"
            ))
        })
    }
}

fn buf_ok(p: Ptr, count: usize, dtype: DType, arg: &str) -> Result<()> {
    dtype.bytes(count, arg)?;
    if count > 0 && p.is_null() {
        return Err(Error::null_argument(arg));
    }
    Ok(())
}
