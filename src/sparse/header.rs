//! The fixed-size header every rank all-gathers before any data: its
//! verdict on its own input (a [`Problem`] travels as numbers, so every rank
//! can word the same message) and the metadata the ranks must agree on.

use super::{CooInput, Local, MAX_DIMS};
use crate::error::{Error, ErrorKind, Result};
use crate::types::{DType, RedKind};

/// Why a rank refused its own input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Problem {
    Null(&'static str),
    Dims(usize, usize),
    NegativeSize(usize, i64),
    Dtype(i32),
    Op(i64),
    Overflow(&'static str),
    Index {
        dim: usize,
        entry: usize,
        value: i64,
        size: i64,
    },
    /// No memory for the local work on `input.nnz` entries.
    OutOfMemory(OutOfMemoryIn, usize),
}

/// The local step that found no memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfMemoryIn {
    /// The entries' linear indices (8 bytes each).
    Linearising,
    /// Sorting and summing the entries (at least 16 bytes each).
    Coalescing,
}

const NULL_ARGS: [&str; 3] = ["input.shape", "input.indices", "input.values"];
const OVERFLOWS: [&str; 4] = [
    "the product of the dense sizes",
    "nnz x the row length of the values",
    "nnz x sparse_dim indices",
    "the product of the sparse sizes",
];

fn position(table: &[&'static str], s: &str) -> i64 {
    table.iter().position(|t| *t == s).unwrap_or(0) as i64
}

fn entry(table: &[&'static str], i: i64) -> &'static str {
    table.get(i as usize).copied().unwrap_or("?")
}

impl Problem {
    fn encode(&self) -> [i64; 5] {
        match *self {
            Problem::Null(a) => [1, position(&NULL_ARGS, a), 0, 0, 0],
            Problem::Dims(s, d) => [2, s as i64, d as i64, 0, 0],
            Problem::NegativeSize(d, s) => [3, d as i64, s, 0, 0],
            Problem::Dtype(t) => [4, t as i64, 0, 0, 0],
            Problem::Op(k) => [5, k, 0, 0, 0],
            Problem::Overflow(w) => [6, position(&OVERFLOWS, w), 0, 0, 0],
            Problem::Index {
                dim,
                entry,
                value,
                size,
            } => [7, dim as i64, entry as i64, value, size],
            Problem::OutOfMemory(step, nnz) => [8, step as i64, nnz as i64, 0, 0],
        }
    }

    fn decode(w: &[i64]) -> Option<Problem> {
        Some(match w[0] {
            1 => Problem::Null(entry(&NULL_ARGS, w[1])),
            2 => Problem::Dims(w[1] as usize, w[2] as usize),
            3 => Problem::NegativeSize(w[1] as usize, w[2]),
            4 => Problem::Dtype(w[1] as i32),
            5 => Problem::Op(w[1]),
            6 => Problem::Overflow(entry(&OVERFLOWS, w[1])),
            7 => Problem::Index {
                dim: w[1] as usize,
                entry: w[2] as usize,
                value: w[3],
                size: w[4],
            },
            8 => Problem::OutOfMemory(
                match w[1] {
                    0 => OutOfMemoryIn::Linearising,
                    _ => OutOfMemoryIn::Coalescing,
                },
                w[2] as usize,
            ),
            _ => return None,
        })
    }

    /// The error, worded the same on every rank.
    pub fn error(&self) -> Error {
        let (kind, msg) = match *self {
            Problem::Null(a) => (ErrorKind::NullArgument, format!("argument '{a}' is NULL")),
            Problem::Dims(s, d) => (
                ErrorKind::InvalidArgument,
                format!("sparse_dim {s} + dense_dim {d} exceeds {MAX_DIMS} dimensions"),
            ),
            Problem::NegativeSize(d, s) => (
                ErrorKind::InvalidArgument,
                format!("argument 'input.shape': size of dimension {d} is negative ({s})"),
            ),
            Problem::Dtype(t) => match DType::from_c(t, "input.dtype") {
                Err(e) => (ErrorKind::InvalidArgument, e.message),
                Ok(dt) => (
                    ErrorKind::Unsupported,
                    format!("sparse_all_reduce does not sum {} values", dt.name()),
                ),
            },
            Problem::Op(k) => match RedKind::from_c(k as i32, "op.kind") {
                Err(e) => (ErrorKind::InvalidArgument, e.message),
                Ok(kind) => (
                    ErrorKind::Unsupported,
                    format!(
                        "reduce op {} is not supported by sparse_all_reduce (SUM and AVG are)",
                        kind.name()
                    ),
                ),
            },
            Problem::Overflow(w) => (
                ErrorKind::InvalidArgument,
                format!("input: {w} overflows the address space or int64"),
            ),
            Problem::Index {
                dim,
                entry,
                value,
                size,
            } => (
                ErrorKind::InvalidArgument,
                format!(
                    "argument 'input.indices': index {value} of entry {entry} in dimension {dim} \
                     is outside [0, {size})"
                ),
            ),
            Problem::OutOfMemory(OutOfMemoryIn::Linearising, nnz) => {
                let e = Error::out_of_memory(
                    &format!("argument 'input.nnz': the linear indices of {nnz} entries"),
                    nnz as u128 * 8,
                );
                (e.kind, e.message)
            }
            Problem::OutOfMemory(OutOfMemoryIn::Coalescing, nnz) => (
                ErrorKind::OutOfMemory,
                format!(
                    "argument 'input.nnz': out of memory coalescing {nnz} entries (at least {} bytes)",
                    nnz as u128 * 16
                ),
            ),
        };
        Error::new(kind, msg)
    }
}

const MAGIC: i64 = 0x7370_6172_7365_0001; // "sparse", version 1
const FIXED: usize = 11;
const WORDS: usize = FIXED + MAX_DIMS;

/// [magic, problem (5 words), dtype, op kind, sparse_dim, dense_dim, nnz,
/// sizes (MAX_DIMS words)].
#[derive(Debug, Clone)]
pub struct Header([i64; WORDS]);

impl Header {
    pub fn new(local: &std::result::Result<Local, Problem>, input: &CooInput) -> Header {
        let mut w = [0i64; WORDS];
        w[0] = MAGIC;
        match local {
            Err(p) => w[1..6].copy_from_slice(&p.encode()),
            Ok(l) => {
                w[6] = l.dtype.to_c() as i64;
                w[7] = RedKind::ALL.iter().position(|k| *k == l.kind).unwrap_or(0) as i64;
                w[8] = input.sparse_dim as i64;
                w[9] = input.dense_dim as i64;
                w[10] = l.nnz as i64;
                w[FIXED..FIXED + l.shape.len()].copy_from_slice(&l.shape);
            }
        }
        Header(w)
    }

    pub fn words(&self) -> &[i64] {
        &self.0
    }

    pub fn from_words(words: &[i64]) -> Header {
        let mut w = [0i64; WORDS];
        w.copy_from_slice(words);
        Header(w)
    }

    pub fn nnz(&self) -> usize {
        self.0[10] as usize
    }
}

/// The first difference between rank `r`'s header and rank 0's.
fn mismatch(r: usize, h: &Header, first: &Header) -> Option<Error> {
    let (a, b) = (&h.0, &first.0);
    let differs = |what: String, x: String, y: String| {
        Some(Error::invalid_argument(format!(
            "rank {r}'s input does not match rank 0's: {what} is {x} on rank {r} but {y} on rank 0"
        )))
    };
    let dtype = |v: i64| DType::from_c(v as i32, "dtype").map_or("?", |d| d.name());
    let kind = |v: i64| RedKind::ALL.get(v as usize).map_or("?", |k| k.name());
    if a[6] != b[6] {
        return differs("the dtype".into(), dtype(a[6]).into(), dtype(b[6]).into());
    }
    if a[7] != b[7] {
        return differs("the reduce op".into(), kind(a[7]).into(), kind(b[7]).into());
    }
    for (i, what) in [(8, "sparse_dim"), (9, "dense_dim")] {
        if a[i] != b[i] {
            return differs(what.into(), a[i].to_string(), b[i].to_string());
        }
    }
    let ndims = (a[8] + a[9]) as usize;
    (0..ndims)
        .find(|d| a[FIXED + d] != b[FIXED + d])
        .and_then(|d| {
            differs(
                format!("the size of dimension {d}"),
                a[FIXED + d].to_string(),
                b[FIXED + d].to_string(),
            )
        })
}

/// Every rank's verdict and agreement, the same conclusion on every rank:
/// the first refusal (lowest rank), else the first mismatch with rank 0.
pub fn verdict(all: &[Header], local: std::result::Result<Local, Problem>) -> Result<Local> {
    for (r, h) in all.iter().enumerate() {
        if h.0[0] != MAGIC {
            return Err(Error::internal(format!(
                "sparse_all_reduce: rank {r} sent a malformed header"
            )));
        }
        if h.0[1] != 0 {
            let e = Problem::decode(&h.0[1..6]).map_or_else(
                || Error::internal(format!("rank {r} refused its input for an unknown reason")),
                |p| p.error(),
            );
            return Err(Error::new(
                e.kind,
                format!("rank {r} refused its input: {}", e.message),
            ));
        }
    }
    if let Some(e) = all
        .iter()
        .enumerate()
        .skip(1)
        .find_map(|(r, h)| mismatch(r, h, &all[0]))
    {
        return Err(e);
    }
    local.map_err(|p| p.error())
}
