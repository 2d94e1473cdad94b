//! libtorchcomm: the TorchComm communication API as a C library, and the same
//! library as a Rust crate.
//!
//! # Public Rust API
//!
//! What the command-line tools (`tools/`), the examples and the integration
//! tests use; everything else is private to the crate.
//!
//! - At the crate root: the communicator and its operations ([`Comm`],
//!   [`PersistentAllGather`], [`Reconfigurable`] and [`CommSlot`] (the Rust
//!   side of `tc_comm_reconfigure`),
//!   [`CommOptions`], [`Op`], [`OpOptions`], [`Ptr`], [`P2p`]), their works
//!   ([`Work`], [`WorkStatus`]) and windows ([`Window`]); values ([`DType`],
//!   [`Device`], [`ReduceOp`], [`RedKind`], [`PremulFactor`]); errors
//!   ([`Error`], [`ErrorKind`], [`Result`]); sparse all-reduce
//!   ([`sparse_all_reduce`] over [`CooInput`]/[`CooOutput`] of [`CBuf`]s);
//!   float16/bfloat16 conversions ([`f16_to_f32`] and the others); the
//!   settings read from `TORCHCOMM_*` ([`config`], [`Config`], [`Level`]);
//!   the launcher variables bootstrap reads ([`RANK_VARS`], [`SIZE_VARS`],
//!   [`LOCAL_RANK_VARS`]); and [`backend_available`].
//! - [`store`]: rendezvous stores (TCPStore client and server, FileStore,
//!   PrefixStore) and the c10d wire request, for tools that speak it raw.
//! - [`cuda`]: device buffers, streams, timing events, graph capture and
//!   copies, for tools that time operations on a GPU (tc-perf).
//! - [`capi`]: the C API of `include/torchcomm.h` as Rust items (`tc_*`
//!   functions, types and constants).
//!
//! Layout inside: `ffi` is the thin `extern "C"` layer (one module per C
//! object family) over safe Rust: `error`, `types`, `options`, `config`
//! (environment and logging), `store` and `bootstrap` (rendezvous), `op` (the
//! operations, their validation and buffers), `comm` (the communicator and
//! its operations), `work`, `window` (one-sided windows), `recorder` (the
//! flight recorder), `backends` (the `Backend` trait, the host executor, the
//! gloo, nccl and ucx backends); shared below them: `kernels` (host
//! reduction kernels, float16/bfloat16 conversions), `nccl_loader` (NCCL's
//! dlopen table), `cuda` (the driver, loaded at run time), `util`; and
//! layers over `comm`: `coalesced`, `reducer` (the gradient reducer),
//! `sparse`, `local` (device groups), with `device_ops` and `layout_check`
//! below them.
//! See docs/architecture.md.

#![allow(clippy::missing_safety_doc)]

mod backends;
mod bootstrap;
pub mod capi;
mod coalesced;
mod comm;
mod config;
pub mod cuda;
mod device_ops;
mod error;
mod ffi;
mod kernels;
mod layout_check;
mod local;
mod nccl_loader;
mod op;
mod options;
mod recorder;
mod reducer;
mod sparse;
pub mod store;
mod types;
mod util;
mod window;
mod work;

pub use backends::available as backend_available;
pub use bootstrap::{LOCAL_RANK_VARS, RANK_VARS, SIZE_VARS};
pub use comm::{Comm, CommOptions, CommSlot, PersistentAllGather, Reconfigurable};
pub use config::{config, Config, Level};
pub use error::{Error, ErrorKind, Result};
pub use kernels::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use op::{Op, OpOptions, P2p, Ptr, SourceSlot, ANY_SOURCE};
pub use sparse::{sparse_all_reduce, CBuf, CooInput, CooOutput};
pub use types::{DType, Device, PremulFactor, RedKind, ReduceOp};
pub use window::Window;
pub use work::{Work, WorkStatus};
