//! The nccl backend where the GPU pieces are missing (no driver, no GPU, no
//! or a wrong libnccl): `TC_ERR_UNAVAILABLE` naming what was looked for,
//! never a panic or an abort.
//!
//! NCCL is loaded once per process, so every case runs in a child process
//! (this test binary re-executed with `TC_NCCL_ROLE`). The case with a real
//! libnccl runs when `TORCHCOMM_TEST_NCCL_LIBRARY` names one (e.g. the
//! `nvidia-nccl-cu13` wheel's `nvidia/nccl/lib/libnccl.so.2`); otherwise it
//! says it was skipped. A unit test of the crate (under `comm`, above the
//! loader in the module graph): the cases look at the loader's table
//! (`nccl()`, its optional entry points) as well as at `Comm::new`.

use super::{Comm, CommOptions};
use crate::error::ErrorKind;
use crate::nccl_loader as loader;
use crate::store::FileStore;
use crate::types::Device;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// The full name of this module's test `name`, as the harness selects it.
fn test_path(name: &str) -> String {
    format!(
        "{}::{name}",
        module_path!().split_once("::").map_or("", |p| p.1)
    )
}

fn child(test: &str, role: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        &test_path(test),
        "--nocapture",
        "--test-threads=1",
    ])
    .env("TC_NCCL_ROLE", role)
    .env_remove("TORCHCOMM_NCCL_LIBRARY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {role} failed:\n{text}");
    text
}

/// Creates a one-rank nccl comm over a fresh FileStore.
fn new_nccl_comm() -> crate::error::Result<Arc<Comm>> {
    let path = std::env::temp_dir().join(format!("tc-nccl-unavail-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let store = Arc::new(FileStore::new(&path, 1, Duration::from_secs(5)).unwrap());
    let opts = CommOptions {
        name: Some("nccl_unavail".into()),
        rank: Some(0),
        world_size: Some(1),
        store: Some(store),
        abort_on_error: Some(false),
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    };
    let r = Comm::new("nccl", Device::Cuda(None), opts);
    let _ = std::fs::remove_file(&path);
    r
}

fn role() -> Option<String> {
    std::env::var("TC_NCCL_ROLE").ok()
}

#[test]
fn no_driver_or_library_is_unavailable_and_says_what_was_looked_for() {
    match role().as_deref() {
        None => {
            let out = child(
                "no_driver_or_library_is_unavailable_and_says_what_was_looked_for",
                "default",
                &[],
            );
            assert!(out.contains("CHILD OK"), "{out}");
        }
        Some(_) => {
            match new_nccl_comm() {
                Ok(c) => {
                    // A machine with a GPU and NCCL: creating works.
                    c.finalize().unwrap();
                    println!("CHILD OK (a GPU and NCCL are present; nothing was missing)");
                }
                Err(e) => {
                    assert_eq!(e.kind, ErrorKind::Unavailable, "{}", e.message);
                    let cuda_missing = crate::cuda::available().is_err();
                    let nccl_missing = loader::nccl().is_err();
                    assert!(cuda_missing || nccl_missing, "{}", e.message);
                    if cuda_missing {
                        assert!(e.message.contains("libcuda"), "{}", e.message);
                    }
                    if nccl_missing {
                        assert!(e.message.contains("libnccl.so.2"), "{}", e.message);
                    }
                    println!("CHILD OK: {}", e.message);
                }
            }
        }
    }
}

#[test]
fn explicit_library_path_that_does_not_load_is_named() {
    match role().as_deref() {
        None => {
            let out = child(
                "explicit_library_path_that_does_not_load_is_named",
                "explicit",
                &[("TORCHCOMM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")],
            );
            assert!(out.contains("CHILD OK"), "{out}");
        }
        Some(_) => {
            let e = new_nccl_comm().err().expect("no NCCL at /nonexistent");
            assert_eq!(e.kind, ErrorKind::Unavailable, "{}", e.message);
            assert!(
                e.message
                    .contains("TORCHCOMM_NCCL_LIBRARY=/nonexistent/libnccl.so.2"),
                "{}",
                e.message
            );
            println!("CHILD OK: {}", e.message);
        }
    }
}

#[test]
fn a_real_libnccl_loads_and_makes_a_unique_id() {
    match role().as_deref() {
        None => {
            let Some(lib) = std::env::var("TORCHCOMM_TEST_NCCL_LIBRARY")
                .ok()
                .filter(|p| !p.is_empty())
            else {
                println!("SKIPPED a_real_libnccl_loads_and_makes_a_unique_id: TORCHCOMM_TEST_NCCL_LIBRARY is not set");
                return;
            };
            let out = child(
                "a_real_libnccl_loads_and_makes_a_unique_id",
                "real",
                &[("TORCHCOMM_NCCL_LIBRARY", &lib)],
            );
            assert!(out.contains("CHILD OK"), "{out}");
            println!(
                "{}",
                out.lines()
                    .filter(|l| l.contains("CHILD OK"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        Some(_) => {
            let lib = loader::nccl().unwrap_or_else(|e| panic!("{}", e.message));
            let mut id = loader::UniqueId { internal: [0; 128] };
            let r = unsafe { (lib.get_unique_id)(&mut id) };
            lib.check(r, "ncclGetUniqueId", std::ptr::null_mut())
                .unwrap();
            assert!(id.internal.iter().any(|b| *b != 0));
            // The optional entry points this version has are found under
            // the names the table uses (a misspelt name would read as
            // "absent" and silently turn a feature off).
            let v = lib.version;
            let since = |x: i32, y: i32| v >= x * 10000 + y * 100; // NCCL_VERSION(x, y, 0), x.y >= 2.9
            let optional = [
                ("ncclGetLastError", lib.get_last_error.is_some(), true),
                ("ncclCommSplit", lib.comm_split.is_some(), true),
                (
                    "ncclRedOpCreatePreMulSum",
                    lib.red_op_create_pre_mul_sum.is_some(),
                    true,
                ),
                ("ncclRedOpDestroy", lib.red_op_destroy.is_some(), true),
                (
                    "ncclCommRegister",
                    lib.comm_register.is_some(),
                    since(2, 19),
                ),
                (
                    "ncclCommDeregister",
                    lib.comm_deregister.is_some(),
                    since(2, 19),
                ),
                ("ncclMemAlloc", lib.mem_alloc.is_some(), since(2, 19)),
                ("ncclMemFree", lib.mem_free.is_some(), since(2, 19)),
                ("ncclCommRevoke", lib.comm_revoke.is_some(), since(2, 28)),
                (
                    "ncclCommWindowRegister",
                    lib.comm_window_register.is_some(),
                    since(2, 27),
                ),
                (
                    "ncclCommWindowDeregister",
                    lib.comm_window_deregister.is_some(),
                    since(2, 27),
                ),
                ("ncclAlltoAll", lib.all_to_all.is_some(), since(2, 28)),
                ("ncclGather", lib.gather.is_some(), since(2, 28)),
                ("ncclScatter", lib.scatter.is_some(), since(2, 28)),
                ("ncclPutSignal", lib.put_signal.is_some(), since(2, 29)),
                ("ncclSignal", lib.signal.is_some(), since(2, 29)),
                ("ncclWaitSignal", lib.wait_signal.is_some(), since(2, 29)),
            ];
            for (name, found, expected) in optional {
                assert!(
                    found || !expected,
                    "NCCL {} should export {name}, but the table did not resolve it",
                    lib.version_string()
                );
            }
            // Without a driver, creation still fails cleanly and names both
            // the NCCL that was found and what is missing on the CUDA side.
            let mut outcome = String::from("a driver is present");
            if crate::cuda::available().is_err() {
                let e = new_nccl_comm().err().expect("no driver");
                assert_eq!(e.kind, ErrorKind::Unavailable, "{}", e.message);
                assert!(
                    e.message.contains("libcuda") && !e.message.contains("libnccl.so.2 on"),
                    "{}",
                    e.message
                );
                assert!(
                    e.message
                        .contains(&format!("NCCL {}", lib.version_string())),
                    "{}",
                    e.message
                );
                assert!(e.message.contains(&lib.origin), "{}", e.message);
                outcome = e.message;
            }
            let found: Vec<&str> = optional.iter().filter(|o| o.1).map(|o| o.0).collect();
            println!(
                "CHILD OK: NCCL {} from {}; optional entry points found: {}; tc_comm_new(nccl): {}",
                lib.version_string(),
                lib.origin,
                found.join(" "),
                outcome
            );
        }
    }
}
