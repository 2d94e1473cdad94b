//! Host arithmetic shared by every user: the elementwise reduction kernels
//! with their AVG/PREMUL_SUM scaling (`reduce`: the Gloo, shared-memory,
//! hierarchy and UCX transports, sparse all-reduce and the local copy path),
//! and the float16/bfloat16 conversions (`half`: those kernels, the NCCL
//! backend's scalar arguments, sparse all-reduce and the gradient reducer).

pub mod half;
pub mod reduce;
