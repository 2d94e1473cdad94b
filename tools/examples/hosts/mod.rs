//! What the examples run across hosts made of network namespaces
//! (hier_hosts, ucx_hosts) share: their environment, submitting an
//! operation, and the bytes each host's link sent.

use std::ffi::c_void;
use torchcomm::{Comm, DType, Op, OpOptions, Ptr};

/// The environment variable `name`; its absence is the launcher's mistake.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

pub fn submit(comm: &Comm, op: Op) {
    comm.submit(op, &OpOptions::default())
        .unwrap_or_else(|e| panic!("rank {}: {}", comm.rank(), e.message));
}

/// Bytes sent so far on this host's link, named by the environment
/// variable `iface_var`.
pub fn tx_bytes(iface_var: &str) -> u64 {
    let path = format!("/sys/class/net/{}/statistics/tx_bytes", env(iface_var));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

/// Sums one reading per host (its first rank's) over `comm`.
pub fn total_over_hosts(comm: &Comm, host: usize, mine: u64) -> u64 {
    let n = comm.size() as usize;
    let mut input = [host as u64, mine];
    let mut all = vec![0u64; 2 * n];
    submit(
        comm,
        Op::all_gather_single(
            Ptr(all.as_mut_ptr() as *mut c_void),
            Ptr(input.as_mut_ptr() as *mut c_void),
            2,
            DType::U64,
        ),
    );
    let mut seen = Vec::new();
    let mut total = 0;
    for pair in all.chunks(2) {
        if !seen.contains(&pair[0]) {
            seen.push(pair[0]);
            total += pair[1];
        }
    }
    total
}
