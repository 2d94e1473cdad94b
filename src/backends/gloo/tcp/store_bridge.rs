//! The store callbacks the Gloo shim calls for its rendezvous: the
//! comm's store behind a C interface (errors as codes and a message).

use super::shim;
use crate::error::{Error, ErrorKind, Result};
use crate::store::StoreRef;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::time::Duration;

pub(super) fn write_err(err: *mut c_char, errlen: usize, msg: &str) {
    if err.is_null() || errlen == 0 {
        return;
    }
    let n = msg.len().min(errlen - 1);
    // SAFETY: err has errlen writable bytes (shim contract).
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err as *mut u8, n);
        *err.add(n) = 0;
    }
}

pub(super) fn store_call(err: *mut c_char, errlen: usize, f: impl FnOnce() -> Result<()>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            write_err(err, errlen, &e.message);
            if e.kind == ErrorKind::Timeout {
                1
            } else {
                2
            }
        }
        Err(_) => {
            write_err(err, errlen, "panic in the store");
            2
        }
    }
}

pub(super) unsafe fn key_str<'a>(key: *const c_char) -> Result<&'a str> {
    CStr::from_ptr(key)
        .to_str()
        .map_err(|_| Error::internal("store key is not UTF-8"))
}

pub(super) unsafe extern "C" fn store_set(
    user: *mut c_void,
    key: *const c_char,
    data: *const c_void,
    len: usize,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    store_call(err, errlen, || {
        let store = &*(user as *const StoreRef);
        let value = if len == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(data as *const u8, len)
        };
        store.set(key_str(key)?, value)
    })
}

pub(super) unsafe extern "C" fn store_get(
    user: *mut c_void,
    key: *const c_char,
    sink: *mut c_void,
    put: shim::SinkFn,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    store_call(err, errlen, || {
        let store = &*(user as *const StoreRef);
        let v = store.get(key_str(key)?)?;
        put(sink, v.as_ptr() as *const c_void, v.len());
        Ok(())
    })
}

pub(super) unsafe extern "C" fn store_wait(
    user: *mut c_void,
    keys: *const *const c_char,
    nkeys: usize,
    timeout_ms: i64,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    store_call(err, errlen, || {
        let store = &*(user as *const StoreRef);
        let mut ks = Vec::with_capacity(nkeys);
        for i in 0..nkeys {
            ks.push(key_str(*keys.add(i))?);
        }
        store.wait(&ks, Some(Duration::from_millis(timeout_ms.max(1) as u64)))
    })
}
