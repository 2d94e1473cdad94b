//! `tc_store_new_callbacks`, `tc_store_reply_*`: a store served by the
//! application's C functions (`tc_store_callbacks_t`):
//! how a store the library cannot speak to itself (torch's FileStore,
//! HashStore, a user's Python store) serves comm bootstrap like any other.
//!
//! Each callback returns a result code and answers through a
//! [`tc_store_reply_t`]: a value (get, compare_set) and, on failure, a
//! message. A failure becomes an error naming the operation and key.

#![allow(non_camel_case_types)]

use crate::error::{tc_result_t, Error, ErrorKind, Result, TC_SUCCESS};
use crate::ffi::store::value_arg;
use crate::ffi::{arg_out, boundary, into_handle};
use crate::options::{read_versioned, timeout_from_ms, Versioned};
use crate::store::handle::{tc_store, tc_store_t};
use crate::store::Store;
use crate::types::c_string;
use std::ffi::{c_char, c_int, c_void, CString};
use std::mem::size_of;
use std::sync::Arc;
use std::time::Duration;

pub const TC_STORE_CALLBACKS_MAGIC: u32 = 0x5443_5343;
pub const TC_STORE_CALLBACKS_VERSION: u32 = 1;

/// Where a callback puts its answer: a value (`tc_store_reply_value`) and,
/// on failure, a message (`tc_store_reply_error`). Valid only during the
/// callback's call, on the thread that called it.
pub struct tc_store_reply_t {
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) message: Option<String>,
}

/// `set(user_data, key, value, len, reply)`: store `len` bytes at `key`.
pub type tc_store_set_fn = Option<
    extern "C" fn(
        user_data: *mut c_void,
        key: *const c_char,
        value: *const c_void,
        len: usize,
        reply: *mut tc_store_reply_t,
    ) -> tc_result_t,
>;
/// `get(user_data, key, reply)`: wait (up to the store's timeout) for `key`,
/// then answer its value with `tc_store_reply_value`.
pub type tc_store_get_fn = Option<
    extern "C" fn(
        user_data: *mut c_void,
        key: *const c_char,
        reply: *mut tc_store_reply_t,
    ) -> tc_result_t,
>;
/// `add(user_data, key, delta, new_value, reply)`: add to the decimal
/// integer at `key` (missing: 0) and write the result to `*new_value`.
pub type tc_store_add_fn = Option<
    extern "C" fn(
        user_data: *mut c_void,
        key: *const c_char,
        delta: i64,
        new_value: *mut i64,
        reply: *mut tc_store_reply_t,
    ) -> tc_result_t,
>;
/// `check(user_data, keys, n, ready, reply)`: write 1 to `*ready` when all
/// `n` keys exist, else 0, without waiting.
pub type tc_store_check_fn = Option<
    extern "C" fn(
        user_data: *mut c_void,
        keys: *const *const c_char,
        n: usize,
        ready: *mut c_int,
        reply: *mut tc_store_reply_t,
    ) -> tc_result_t,
>;
/// `wait(user_data, keys, n, timeout_ms, reply)`: wait until all `n` keys
/// exist, at most `timeout_ms` (always positive); `TC_ERR_TIMEOUT` after.
pub type tc_store_wait_fn = Option<
    extern "C" fn(
        user_data: *mut c_void,
        keys: *const *const c_char,
        n: usize,
        timeout_ms: i64,
        reply: *mut tc_store_reply_t,
    ) -> tc_result_t,
>;
/// `delete_key(user_data, key, deleted, reply)`: delete `key`; write 1 to
/// `*deleted` when it existed, else 0.
pub type tc_store_delete_fn = Option<
    extern "C" fn(
        user_data: *mut c_void,
        key: *const c_char,
        deleted: *mut c_int,
        reply: *mut tc_store_reply_t,
    ) -> tc_result_t,
>;
/// `compare_set(user_data, key, expected, expected_len, desired,
/// desired_len, reply)`: torch's compare_set (see `tc_store_compare_set`);
/// answer the value now current with `tc_store_reply_value`.
pub type tc_store_compare_set_fn = Option<
    extern "C" fn(
        user_data: *mut c_void,
        key: *const c_char,
        expected: *const c_void,
        expected_len: usize,
        desired: *const c_void,
        desired_len: usize,
        reply: *mut tc_store_reply_t,
    ) -> tc_result_t,
>;
/// `num_keys(user_data, n, reply)`: write the number of keys to `*n`.
pub type tc_store_num_keys_fn = Option<
    extern "C" fn(user_data: *mut c_void, n: *mut i64, reply: *mut tc_store_reply_t) -> tc_result_t,
>;
/// `destroy(user_data)`: the store is gone; release `user_data`.
pub type tc_store_destroy_fn = Option<extern "C" fn(user_data: *mut c_void)>;

/// The functions of a store served by the application
/// (`tc_store_new_callbacks`). Initialize with `TC_STORE_CALLBACKS_INIT`,
/// then set the functions. Each returns `TC_SUCCESS` or an error code
/// (`TC_ERR_TIMEOUT` for a get or wait that ran out of time; another code of
/// this library is kept; any other nonzero value becomes `TC_ERR_REMOTE`),
/// with a message through `tc_store_reply_error` if it likes. Keys are
/// NUL-terminated UTF-8 and every pointer argument is valid only during the
/// call. A callback must not unwind (no C++ exception, no longjmp) through
/// the library.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_store_callbacks_t {
    /// `sizeof(tc_store_callbacks_t)` as the caller compiled it.
    pub size: usize,
    /// Must be `TC_STORE_CALLBACKS_MAGIC`.
    pub magic: u32,
    /// `TC_STORE_CALLBACKS_VERSION` as the caller compiled it.
    pub version: u32,
    /// Passed to every callback as is.
    pub user_data: *mut c_void,
    /// Required.
    pub set: tc_store_set_fn,
    /// Required.
    pub get: tc_store_get_fn,
    /// Required.
    pub add: tc_store_add_fn,
    /// Required.
    pub check: tc_store_check_fn,
    /// Required.
    pub wait: tc_store_wait_fn,
    /// Optional: NULL makes `tc_store_delete` fail with `TC_ERR_UNSUPPORTED`.
    pub delete_key: tc_store_delete_fn,
    /// Optional: NULL makes `tc_store_compare_set` fail with
    /// `TC_ERR_UNSUPPORTED`.
    pub compare_set: tc_store_compare_set_fn,
    /// Optional: NULL makes `tc_store_num_keys` fail with `TC_ERR_UNSUPPORTED`.
    pub num_keys: tc_store_num_keys_fn,
    /// Optional: called once, when the last reference to the store (the
    /// handle, prefix stores over it, comms bootstrapped with it) is gone,
    /// possibly on a library thread.
    pub destroy: tc_store_destroy_fn,
    /// The timeout the store's own get and wait keep, in milliseconds (the
    /// wait callback gets it when the library waits with the store's
    /// timeout). 0 or `TC_UNSET`: `TORCHCOMM_TIMEOUT_SECONDS`, else 600 s.
    pub timeout_ms: i64,
}

impl Versioned for tc_store_callbacks_t {
    const MAGIC: u32 = TC_STORE_CALLBACKS_MAGIC;
    const NAME: &'static str = "tc_store_callbacks_t";
    fn defaults() -> Self {
        tc_store_callbacks_t {
            size: size_of::<Self>(),
            magic: TC_STORE_CALLBACKS_MAGIC,
            version: TC_STORE_CALLBACKS_VERSION,
            user_data: std::ptr::null_mut(),
            set: None,
            get: None,
            add: None,
            check: None,
            wait: None,
            delete_key: None,
            compare_set: None,
            num_keys: None,
            destroy: None,
            timeout_ms: crate::options::TC_UNSET as i64,
        }
    }
}

/// The application's functions, checked for the required ones.
pub struct CallbackStore {
    cb: tc_store_callbacks_t,
    timeout: Duration,
}

// SAFETY: the header requires the callbacks and `user_data` to be usable
// from any thread, concurrently.
unsafe impl Send for CallbackStore {}
unsafe impl Sync for CallbackStore {}

fn c_key(key: &str) -> Result<CString> {
    CString::new(key)
        .map_err(|_| Error::invalid_argument(format!("key {key:?} contains a NUL byte")))
}

fn c_keys(keys: &[&str]) -> Result<(Vec<CString>, Vec<*const c_char>)> {
    let owned = keys.iter().map(|k| c_key(k)).collect::<Result<Vec<_>>>()?;
    let ptrs = owned.iter().map(|k| k.as_ptr()).collect();
    Ok((owned, ptrs))
}

impl CallbackStore {
    pub fn new(cb: tc_store_callbacks_t) -> Result<CallbackStore> {
        let missing = [
            ("set", cb.set.is_none()),
            ("get", cb.get.is_none()),
            ("add", cb.add.is_none()),
            ("check", cb.check.is_none()),
            ("wait", cb.wait.is_none()),
        ];
        if let Some((name, _)) = missing.iter().find(|(_, m)| *m) {
            return Err(Error::null_argument(&format!("callbacks->{name}")));
        }
        let timeout = timeout_from_ms(cb.timeout_ms).unwrap_or(crate::config::config().timeout);
        Ok(CallbackStore { cb, timeout })
    }

    /// Runs one callback with a fresh reply; a failure names `what`.
    fn call(
        &self,
        what: impl FnOnce() -> String,
        f: impl FnOnce(*mut tc_store_reply_t) -> tc_result_t,
    ) -> Result<Option<Vec<u8>>> {
        let mut reply = tc_store_reply_t {
            value: None,
            message: None,
        };
        let rc = f(&mut reply);
        if rc == TC_SUCCESS {
            return Ok(reply.value);
        }
        let kind = ErrorKind::from_code(rc).unwrap_or(ErrorKind::Remote);
        let detail = reply
            .message
            .unwrap_or_else(|| format!("it returned {rc} without a message"));
        Err(Error::new(
            kind,
            format!("store callback {} failed: {detail}", what()),
        ))
    }

    fn value(&self, what: impl FnOnce() -> String, v: Option<Vec<u8>>) -> Result<Vec<u8>> {
        v.ok_or_else(|| {
            Error::new(
                ErrorKind::Remote,
                format!(
                    "store callback {} succeeded without answering a value (tc_store_reply_value)",
                    what()
                ),
            )
        })
    }
}

impl Drop for CallbackStore {
    fn drop(&mut self) {
        if let Some(destroy) = self.cb.destroy {
            destroy(self.cb.user_data);
        }
    }
}

impl Store for CallbackStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let k = c_key(key)?;
        let f = self.cb.set.expect("checked in new");
        self.call(
            || format!("set (key {key:?})"),
            |r| {
                f(
                    self.cb.user_data,
                    k.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    r,
                )
            },
        )?;
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let k = c_key(key)?;
        let f = self.cb.get.expect("checked in new");
        let what = || format!("get (key {key:?})");
        let v = self.call(what, |r| f(self.cb.user_data, k.as_ptr(), r))?;
        self.value(what, v)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let k = c_key(key)?;
        let f = self.cb.add.expect("checked in new");
        let mut out = 0i64;
        self.call(
            || format!("add (key {key:?})"),
            |r| f(self.cb.user_data, k.as_ptr(), delta, &mut out, r),
        )?;
        Ok(out)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let Some(f) = self.cb.compare_set else {
            return Err(Error::unsupported(format!(
                "compare_set (key {key:?}): this callback store has no compare_set function"
            )));
        };
        let k = c_key(key)?;
        let what = || format!("compare_set (key {key:?})");
        let v = self.call(what, |r| {
            f(
                self.cb.user_data,
                k.as_ptr(),
                expected.as_ptr().cast(),
                expected.len(),
                desired.as_ptr().cast(),
                desired.len(),
                r,
            )
        })?;
        self.value(what, v)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let (_owned, ptrs) = c_keys(keys)?;
        let f = self.cb.check.expect("checked in new");
        let mut ready: c_int = 0;
        self.call(
            || format!("check (keys {keys:?})"),
            |r| f(self.cb.user_data, ptrs.as_ptr(), ptrs.len(), &mut ready, r),
        )?;
        Ok(ready != 0)
    }

    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        let (_owned, ptrs) = c_keys(keys)?;
        let f = self.cb.wait.expect("checked in new");
        let ms = timeout
            .unwrap_or(self.timeout)
            .as_millis()
            .clamp(1, i64::MAX as u128) as i64;
        self.call(
            || format!("wait (keys {keys:?}, {ms} ms)"),
            |r| f(self.cb.user_data, ptrs.as_ptr(), ptrs.len(), ms, r),
        )?;
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let Some(f) = self.cb.delete_key else {
            return Err(Error::unsupported(format!(
                "delete (key {key:?}): this callback store has no delete_key function"
            )));
        };
        let k = c_key(key)?;
        let mut deleted: c_int = 0;
        self.call(
            || format!("delete_key (key {key:?})"),
            |r| f(self.cb.user_data, k.as_ptr(), &mut deleted, r),
        )?;
        Ok(deleted != 0)
    }

    fn num_keys(&self) -> Result<i64> {
        let Some(f) = self.cb.num_keys else {
            return Err(Error::unsupported(
                "num_keys: this callback store has no num_keys function",
            ));
        };
        let mut n = 0i64;
        self.call(
            || "num_keys".to_string(),
            |r| f(self.cb.user_data, &mut n, r),
        )?;
        Ok(n)
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// Creates a store served by the application's functions in `*callbacks`
/// (copied during the call; see `tc_store_callbacks_t`): how a store the
/// library does not speak itself (torch's FileStore or HashStore, a store
/// written in Python) serves `tc_comm_new` and the other `tc_store_*` calls.
/// `callbacks` must be non-NULL with `set`, `get`, `add`, `check` and `wait`
/// set (`TC_ERR_NULL_ARGUMENT` naming the missing one otherwise).
///
/// Threads: the library calls the functions from any thread, its own
/// included (a comm's bootstrap, failure diagnosis), several at once, so
/// they and `user_data` must be thread-safe. A get or wait may block up to
/// its timeout. A callback must not free the store it serves.
///
/// Ownership: on success `*out` receives a handle to free with
/// `tc_store_free`; `user_data` then belongs to the store, and `destroy`
/// (if set) is called once with it when the handle and everything created
/// with it (prefix stores, comms) are gone. On failure `*out` is untouched
/// and `destroy` is not called.
#[no_mangle]
pub extern "C" fn tc_store_new_callbacks(
    callbacks: *const tc_store_callbacks_t,
    out: *mut *mut tc_store_t,
) -> tc_result_t {
    boundary("tc_store_new_callbacks", || {
        let out = unsafe { arg_out(out, "out")? };
        if callbacks.is_null() {
            return Err(Error::null_argument("callbacks"));
        }
        let cb = unsafe { read_versioned(callbacks, "callbacks")? };
        let store = CallbackStore::new(cb)?;
        *out = into_handle(tc_store::new(Arc::new(store)));
        Ok(())
    })
}

/// Called by a store callback (get, compare_set) to answer its value: the
/// `len` bytes at `value` (NULL allowed when `len` is 0) are copied; a
/// second call replaces the first. `reply` is the one the callback was
/// given, valid only during that call. Values over 8 MiB are refused.
#[no_mangle]
pub extern "C" fn tc_store_reply_value(
    reply: *mut tc_store_reply_t,
    value: *const c_void,
    len: usize,
) -> tc_result_t {
    boundary("tc_store_reply_value", || {
        let reply = unsafe { arg_out(reply, "reply")? };
        let value = unsafe { value_arg(value, "value", len, "len")? };
        reply.value = Some(value.to_vec());
        Ok(())
    })
}

/// Called by a store callback that fails, before returning its error code:
/// `message` (NUL-terminated, copied) becomes the detail of the error the
/// library reports (`tc_last_error`), after the operation and key. `reply`
/// is the one the callback was given, valid only during that call.
#[no_mangle]
pub extern "C" fn tc_store_reply_error(
    reply: *mut tc_store_reply_t,
    message: *const c_char,
) -> tc_result_t {
    boundary("tc_store_reply_error", || {
        let reply = unsafe { arg_out(reply, "reply")? };
        let message = unsafe { c_string(message, "message")? };
        reply.message = Some(message.to_string());
        Ok(())
    })
}
