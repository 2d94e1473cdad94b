//! What the point-to-point tests over shared memory share: non-blocking
//! sends and receives of byte buffers, and a fixed shuffle for waiting out
//! of order.

#![allow(dead_code)]

use crate::gloo_common::{assert_all_ok, launch, ptr};
use std::sync::Arc;
use std::time::Duration;
use torchcomm::{Comm, DType, Op, OpOptions, Work};

pub fn start(comm: &Comm, op: Op) -> Arc<dyn Work> {
    let opts = OpOptions {
        async_op: true,
        ..Default::default()
    };
    comm.submit(op, &opts).unwrap()
}

pub fn isend(comm: &Comm, buf: &mut [u8], dtype: DType, peer: usize, tag: u32) -> Arc<dyn Work> {
    let count = buf.len() / dtype.size();
    start(comm, Op::send(ptr(buf), count, dtype, peer as i32, tag))
}

pub fn irecv(comm: &Comm, buf: &mut [u8], dtype: DType, peer: usize, tag: u32) -> Arc<dyn Work> {
    let count = buf.len() / dtype.size();
    start(comm, Op::recv(ptr(buf), count, dtype, peer as i32, tag))
}

/// A fixed shuffle of `0..n` (waits out of order).
pub fn shuffled(n: usize, seed: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, x % (i + 1));
    }
    v
}

/// Runs `test` on `n` ranks in role `role`, shared-memory point-to-point
/// on: every rank prints one `RESULT ok` and says the rings carry
/// point-to-point.
pub fn shm_p2p_job(test: &str, role: &str, n: usize) {
    let env = [("TORCHCOMM_DEBUG", "INFO"), ("TORCHCOMM_SHM_P2P", "1")];
    let out = launch(test, role, n, &env, Duration::from_secs(240));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["ok"], "{}", o.describe());
        assert!(
            o.stderr.contains("point-to-point too"),
            "rank {}: shared-memory point-to-point is on: {}",
            o.rank,
            o.describe()
        );
    }
}
