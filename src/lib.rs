//! libtorchcomm: the TorchComm communication API as a C library.
//!
//! Layout: `ffi` is the thin `extern "C"` layer (one module per C object
//! family); everything under it is safe Rust: `error`, `types`, `options`,
//! `config` (environment and logging), `store` (rendezvous), `op` (the
//! operations, their validation and buffers), `comm` (the
//! communicator and its operations), `window` (one-sided windows), `work`,
//! `backends`; `sparse` (sparse all-reduce, a layer over `comm`).

#![allow(clippy::missing_safety_doc)]

pub mod backends;
pub mod bootstrap;
pub mod coalesced;
pub mod comm;
pub mod config;
pub mod cuda;
pub mod device_ops;
pub mod error;
pub mod ffi;
pub mod kernels;
pub mod layout_check;
pub mod local;
pub mod nccl_loader;
pub mod op;
pub mod options;
pub mod recorder;
pub mod reducer;
pub mod sparse;
pub mod store;
pub mod types;
pub mod util;
pub mod window;
pub mod work;
