//! `tc_store_*`: rendezvous stores (a TCPStore client or server speaking
//! torch's c10d protocol, a FileStore, and a PrefixStore view).
//!
//! Keys are NUL-terminated UTF-8 strings, as Python's `store.set("k", ...)`
//! sees them; values are byte buffers. Every handle is thread-safe.

use crate::error::{tc_result_t, Error, Result};
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::{
    arg_out, arg_slice, boundary, boundary_void, handle_ref, into_handle, malloc_copy, take_handle,
};
use crate::options::timeout_from_ms;
use crate::store::{FileStore, PrefixStore, StoreRef, TcpStore, TcpStoreOptions};
use crate::types::c_string;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

pub use crate::store::handle::{tc_store, tc_store_t};

impl Handle for tc_store {
    const TYPE: HandleType = HandleType::Store;
}

unsafe fn keys_from_c<'a>(keys: *const *const c_char, n: usize) -> Result<Vec<&'a str>> {
    let ptrs = arg_slice(keys, n, "keys")?;
    ptrs.iter()
        .enumerate()
        .map(|(i, k)| c_string(*k, &format!("keys[{i}]")))
        .collect()
}

/// A value argument: refused beyond the store's value limit (8 MiB, torch's
/// TCPStore limit, for every kind of store) before anything is read or
/// copied, so that a length like `SIZE_MAX` fails cleanly.
pub(crate) unsafe fn value_arg<'a>(
    p: *const c_void,
    name: &str,
    len: usize,
    len_name: &str,
) -> Result<&'a [u8]> {
    if len > crate::store::wire::MAX_VALUE_LEN {
        return Err(Error::invalid_argument(format!(
            "argument '{len_name}': {len} bytes are over the store's value limit of {} bytes",
            crate::store::wire::MAX_VALUE_LEN
        )));
    }
    arg_slice(p.cast::<u8>(), len, name)
}

/// Frees memory the library allocated for the caller (values from
/// `tc_store_get_alloc` and `tc_store_compare_set`, the text of
/// `tc_comm_dump_flight_recorder`). NULL is ignored.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn tc_free(ptr: *mut c_void) {
    unsafe { libc::free(ptr) }
}

/// Creates a TCP store speaking PyTorch's TCPStore protocol.
///
/// With `is_server` nonzero, hosts a server in this process on `port` (0:
/// any free port; see `tc_store_tcp_port`), listening only on the
/// interface(s) of `host` ("127.0.0.1": loopback only; "": every
/// interface), and connects to it; the server lives until the handle (and
/// every comm using it) is gone. When `TORCHCOMM_STORE_TOKEN` is set, the
/// client presents it and a hosted server requires it of every client.
/// A lost connection is made again on the next call. Otherwise connects to `host:port`, retrying until
/// the timeout. `world_size` -1 does not wait for workers; a positive value
/// makes every process ADD 1 to the key `init/` and the server host wait
/// until `world_size` joined (torch's behaviour); 0 is rejected.
/// `timeout_ms` <= 0 means the library default (`TORCHCOMM_TIMEOUT`); it
/// bounds connecting and every get or wait. `host` must be non-NULL.
/// On success `*out` receives a handle to free with `tc_store_free`; on
/// failure it is untouched (a connect failure names host and port).
#[no_mangle]
pub extern "C" fn tc_store_tcp_new(
    host: *const c_char,
    port: u16,
    is_server: c_int,
    world_size: i32,
    timeout_ms: i64,
    out: *mut *mut tc_store_t,
) -> tc_result_t {
    boundary("tc_store_tcp_new", || {
        let out = unsafe { arg_out(out, "out")? };
        let host = unsafe { c_string(host, "host")? };
        let world_size = match world_size {
            -1 => None,
            n if n > 0 => Some(n as u32),
            n => {
                return Err(Error::invalid_argument(format!(
                    "argument 'world_size': {n} is neither positive nor -1"
                )))
            }
        };
        if is_server == 0 && port == 0 {
            return Err(Error::invalid_argument(
                "argument 'port': 0 is only valid with is_server",
            ));
        }
        let opts = TcpStoreOptions {
            host: host.to_string(),
            port,
            is_server: is_server != 0,
            world_size,
            wait_for_workers: true,
            timeout: timeout_from_ms(timeout_ms).unwrap_or(crate::config::config().timeout),
            token: crate::store::server::token_from_env(),
        };
        let store = TcpStore::new(&opts)?;
        let port = store.port();
        *out = into_handle(tc_store {
            inner: Arc::new(store),
            port,
        });
        Ok(())
    })
}

/// Writes the port of a TCP store (the one its server picked when created
/// with port 0). `TC_ERR_INVALID_USAGE` for a file or prefix store.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_tcp_port(store: *const tc_store_t, port: *mut u16) -> tc_result_t {
    boundary("tc_store_tcp_port", || {
        let (store, port) = unsafe { (handle_ref(store, "store")?, arg_out(port, "port")?) };
        if store.port == 0 {
            return Err(Error::invalid_usage("the store is not a TCP store"));
        }
        *port = store.port;
        Ok(())
    })
}

/// Creates a store kept in the file at `path` (created if missing) on a
/// filesystem every process shares. `world_size` > 0: the last of that many
/// handles to be freed deletes the file; -1: the file is kept. The timeout
/// of get and wait is the library default. On success `*out` receives a
/// handle to free with `tc_store_free`; on failure it is untouched.
#[no_mangle]
pub extern "C" fn tc_store_file_new(
    path: *const c_char,
    world_size: i32,
    out: *mut *mut tc_store_t,
) -> tc_result_t {
    boundary("tc_store_file_new", || {
        let out = unsafe { arg_out(out, "out")? };
        let path = unsafe { c_string(path, "path")? };
        let store = FileStore::new(path, world_size, crate::config::config().timeout)?;
        *out = into_handle(tc_store::new(Arc::new(store)));
        Ok(())
    })
}

/// Creates a view of `base` in which every key `k` is `prefix/k` (torch's
/// PrefixStore). The new handle keeps the base store alive, so `base` may be
/// freed first. `prefix` is copied. On success `*out` receives a handle to
/// free with `tc_store_free`; on failure it is untouched.
#[no_mangle]
pub extern "C" fn tc_store_prefix_new(
    base: *mut tc_store_t,
    prefix: *const c_char,
    out: *mut *mut tc_store_t,
) -> tc_result_t {
    boundary("tc_store_prefix_new", || {
        let out = unsafe { arg_out(out, "out")? };
        let base = unsafe { handle_ref(base, "base")? };
        let prefix = unsafe { c_string(prefix, "prefix")? };
        let inner: StoreRef = Arc::new(PrefixStore::new(prefix, base.inner.clone()));
        *out = into_handle(tc_store {
            inner,
            port: base.port,
        });
        Ok(())
    })
}

/// Sets `key` to the `len` bytes at `value` (NULL allowed when `len` is 0),
/// waking processes waiting for it. Returns only once the server stored it
/// (a TCP store confirms each set). `TC_ERR_INVALID_ARGUMENT` naming the
/// limit for a value over 8 MiB or a key over 8 KiB. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_set(
    store: *mut tc_store_t,
    key: *const c_char,
    value: *const c_void,
    len: usize,
) -> tc_result_t {
    boundary("tc_store_set", || {
        let store = unsafe { handle_ref(store, "store")? };
        let key = unsafe { c_string(key, "key")? };
        let value = unsafe { value_arg(value, "value", len, "len")? };
        store.inner.set(key, value)
    })
}

/// Waits (up to the store's timeout) for `key`, then copies its value into
/// `buf`. `*value_len` (when `value_len` is non-NULL) receives the value's
/// size whether or not it fits; if `buf_len` is smaller, nothing is copied
/// and `TC_ERR_BUFFER_TOO_SMALL` is returned, so a call with `buf` NULL and
/// `buf_len` 0 asks for the size. `TC_ERR_TIMEOUT` when the key did not
/// appear in time. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_get(
    store: *mut tc_store_t,
    key: *const c_char,
    buf: *mut c_void,
    buf_len: usize,
    value_len: *mut usize,
) -> tc_result_t {
    boundary("tc_store_get", || {
        let store = unsafe { handle_ref(store, "store")? };
        let key = unsafe { c_string(key, "key")? };
        if buf.is_null() && buf_len > 0 {
            return Err(Error::null_argument("buf"));
        }
        let value = store.inner.get(key)?;
        if !value_len.is_null() {
            unsafe { *value_len = value.len() };
        }
        if value.len() > buf_len {
            return Err(Error::new(
                crate::error::ErrorKind::BufferTooSmall,
                format!(
                    "the value of key {key:?} has {} bytes; buf_len is {buf_len}",
                    value.len()
                ),
            ));
        }
        if !value.is_empty() {
            unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), buf.cast::<u8>(), value.len()) };
        }
        Ok(())
    })
}

/// Waits (up to the store's timeout) for `key`, then writes a copy of its
/// value to `*value` (allocated; release it with `tc_free`; never NULL, even
/// for an empty value) and its size to `*len`. Both out-pointers must be
/// non-NULL and are untouched on failure. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_get_alloc(
    store: *mut tc_store_t,
    key: *const c_char,
    value: *mut *mut c_void,
    len: *mut usize,
) -> tc_result_t {
    boundary("tc_store_get_alloc", || {
        let (value_out, len_out) = unsafe { (arg_out(value, "value")?, arg_out(len, "len")?) };
        let store = unsafe { handle_ref(store, "store")? };
        let key = unsafe { c_string(key, "key")? };
        let v = store.inner.get(key)?;
        *value_out = malloc_copy(&v, "argument 'value': the key's value")?;
        *len_out = v.len();
        Ok(())
    })
}

/// Adds `delta` to the decimal integer stored at `key` (a missing key counts
/// as 0) and writes the result to `*new_value` (may be NULL). The stored
/// value is ASCII decimal, so a get returns e.g. "6". Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_add(
    store: *mut tc_store_t,
    key: *const c_char,
    delta: i64,
    new_value: *mut i64,
) -> tc_result_t {
    boundary("tc_store_add", || {
        let store = unsafe { handle_ref(store, "store")? };
        let key = unsafe { c_string(key, "key")? };
        let v = store.inner.add(key, delta)?;
        if !new_value.is_null() {
            unsafe { *new_value = v };
        }
        Ok(())
    })
}

/// torch's compare_set: if `key` holds `expected`, replace it with `desired`;
/// if `key` is missing and `expected_len` is 0, set it to `desired`; if it is
/// missing and `expected` is not empty, store nothing. Values over 8 MiB are
/// refused with `TC_ERR_INVALID_ARGUMENT`. `*current` receives
/// an allocated copy (free with `tc_free`) of the value now current, or of
/// `expected` in the last case, and `*current_len` its size. Buffers may be
/// NULL when their length is 0. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_compare_set(
    store: *mut tc_store_t,
    key: *const c_char,
    expected: *const c_void,
    expected_len: usize,
    desired: *const c_void,
    desired_len: usize,
    current: *mut *mut c_void,
    current_len: *mut usize,
) -> tc_result_t {
    boundary("tc_store_compare_set", || {
        let (cur_out, len_out) = unsafe {
            (
                arg_out(current, "current")?,
                arg_out(current_len, "current_len")?,
            )
        };
        let store = unsafe { handle_ref(store, "store")? };
        let key = unsafe { c_string(key, "key")? };
        let expected = unsafe { value_arg(expected, "expected", expected_len, "expected_len")? };
        let desired = unsafe { value_arg(desired, "desired", desired_len, "desired_len")? };
        let v = store.inner.compare_set(key, expected, desired)?;
        *cur_out = malloc_copy(&v, "argument 'current': the key's value")?;
        *len_out = v.len();
        Ok(())
    })
}

/// Writes 1 to `*ready` when all `n` keys exist, else 0, without waiting.
/// `keys` may be NULL when `n` is 0. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_check(
    store: *mut tc_store_t,
    keys: *const *const c_char,
    n: usize,
    ready: *mut c_int,
) -> tc_result_t {
    boundary("tc_store_check", || {
        let ready = unsafe { arg_out(ready, "ready")? };
        let store = unsafe { handle_ref(store, "store")? };
        let keys = unsafe { keys_from_c(keys, n)? };
        *ready = store.inner.check(&keys)? as c_int;
        Ok(())
    })
}

/// Waits until all `n` keys exist. `timeout_ms` <= 0 means the store's
/// timeout. On expiry returns `TC_ERR_TIMEOUT` ("wait timeout after {ms}ms,
/// keys: /k") and the store stays usable. Thread-safe; a waiting call holds
/// its TCP connection, so other threads' calls on the same handle queue
/// behind it.
#[no_mangle]
pub extern "C" fn tc_store_wait(
    store: *mut tc_store_t,
    keys: *const *const c_char,
    n: usize,
    timeout_ms: i64,
) -> tc_result_t {
    boundary("tc_store_wait", || {
        let store = unsafe { handle_ref(store, "store")? };
        let keys = unsafe { keys_from_c(keys, n)? };
        store.inner.wait(&keys, timeout_from_ms(timeout_ms))
    })
}

/// Deletes `key`; `*deleted` (may be NULL) receives 1 when it existed, else
/// 0. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_delete(
    store: *mut tc_store_t,
    key: *const c_char,
    deleted: *mut c_int,
) -> tc_result_t {
    boundary("tc_store_delete", || {
        let store = unsafe { handle_ref(store, "store")? };
        let key = unsafe { c_string(key, "key")? };
        let d = store.inner.delete(key)?;
        if !deleted.is_null() {
            unsafe { *deleted = d as c_int };
        }
        Ok(())
    })
}

/// Writes the number of keys in the whole store to `*n` (a TCP store counts
/// the `init/` key of wait-for-workers too, as torch does). Thread-safe.
#[no_mangle]
pub extern "C" fn tc_store_num_keys(store: *mut tc_store_t, n: *mut i64) -> tc_result_t {
    boundary("tc_store_num_keys", || {
        let n = unsafe { arg_out(n, "n")? };
        let store = unsafe { handle_ref(store, "store")? };
        *n = store.inner.num_keys()?;
        Ok(())
    })
}

/// Frees a store handle; NULL is ignored. A hosted server stays up while
/// prefix stores or comms created from this handle still use it. Must not
/// race with other calls on the same handle. A handle that is not a live
/// store (freed already) is left alone with a warning and `tc_last_error`
/// set.
#[no_mangle]
pub extern "C" fn tc_store_free(store: *mut tc_store_t) {
    boundary_void("tc_store_free", || {
        drop(unsafe { take_handle(store, "store")? });
        Ok(())
    })
}
