//! What the crate's unit tests share about comms.

use crate::comm::{Comm, CommOptions};
use crate::store::FileStore;
use crate::types::Device;
use std::sync::Arc;
use std::time::Duration;

/// A one-rank "gloo" comm named `name` over a file store of its own (the
/// file removed once the comm exists), errors returned rather than
/// aborting, with `timeout` or the default one.
pub(crate) fn one_rank_comm(name: &str, timeout: Option<Duration>) -> Arc<Comm> {
    let path = std::env::temp_dir().join(format!("tc-one-rank-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let store = Arc::new(FileStore::new(&path, 1, Duration::from_secs(10)).unwrap());
    let comm = Comm::new(
        "gloo",
        Device::Cpu,
        CommOptions {
            name: Some(name.into()),
            rank: Some(0),
            world_size: Some(1),
            store: Some(store),
            abort_on_error: Some(false),
            timeout,
            ..Default::default()
        },
    )
    .unwrap();
    let _ = std::fs::remove_file(&path);
    comm
}
