//! Result codes and the crate's error type.
//!
//! Every fallible C call returns a `tc_result_t`; the detail of the last
//! failure on a thread is kept in a thread-local string (`tc_last_error`).
//! Codes start at 1000 so they can never be mistaken for errno values, and a
//! retired code is never reused.

use std::cell::RefCell;
use std::ffi::CString;

/// Result code of every fallible call: `TC_SUCCESS` (0) or a `TC_ERR_*` value.
#[allow(non_camel_case_types)]
pub type tc_result_t = i32;

/// The call succeeded.
pub const TC_SUCCESS: tc_result_t = 0;
/// A pointer argument that must not be NULL was NULL (the message names it).
pub const TC_ERR_NULL_ARGUMENT: tc_result_t = 1001;
/// An argument has a value outside its domain: unknown enum value, negative or
/// overflowing count, rank out of range, bad options magic, invalid UTF-8.
pub const TC_ERR_INVALID_ARGUMENT: tc_result_t = 1002;
/// The call is not valid in the object's current state (use after finalize,
/// mismatched collective across ranks, ...).
pub const TC_ERR_INVALID_USAGE: tc_result_t = 1003;
/// The operation is not implemented for this backend, dtype or reduce op.
pub const TC_ERR_UNSUPPORTED: tc_result_t = 1004;
/// A library, driver or device that the call needs is not present.
pub const TC_ERR_UNAVAILABLE: tc_result_t = 1005;
/// The operation did not finish within its timeout.
pub const TC_ERR_TIMEOUT: tc_result_t = 1006;
/// A peer failed, vanished or reported an error.
pub const TC_ERR_REMOTE: tc_result_t = 1007;
/// The communicator was aborted (by the caller or after an earlier failure).
pub const TC_ERR_ABORTED: tc_result_t = 1008;
/// A CUDA driver call failed (the message carries CUDA's error name).
pub const TC_ERR_CUDA: tc_result_t = 1009;
/// An NCCL call failed (the message carries NCCL's error string).
pub const TC_ERR_NCCL: tc_result_t = 1010;
/// An operating-system call (socket, file, thread) failed.
pub const TC_ERR_SYSTEM: tc_result_t = 1011;
/// A bug in libtorchcomm: an invariant did not hold.
pub const TC_ERR_INTERNAL: tc_result_t = 1012;
/// A panic inside libtorchcomm was caught at the C boundary.
pub const TC_ERR_PANIC: tc_result_t = 1013;
/// A caller-provided output buffer is too small; the needed size was reported.
pub const TC_ERR_BUFFER_TOO_SMALL: tc_result_t = 1014;
/// A key or object that was asked for does not exist.
pub const TC_ERR_NOT_FOUND: tc_result_t = 1015;
/// Memory of a size the caller chose (a gradient, a sparse tensor's
/// entries, ...) could not be allocated; the message names the argument and
/// the number of bytes. Nothing was changed.
pub const TC_ERR_OUT_OF_MEMORY: tc_result_t = 1016;

/// The error kinds of the Rust side; each maps to exactly one `TC_ERR_*` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorKind {
    NullArgument = TC_ERR_NULL_ARGUMENT,
    InvalidArgument = TC_ERR_INVALID_ARGUMENT,
    InvalidUsage = TC_ERR_INVALID_USAGE,
    Unsupported = TC_ERR_UNSUPPORTED,
    Unavailable = TC_ERR_UNAVAILABLE,
    Timeout = TC_ERR_TIMEOUT,
    Remote = TC_ERR_REMOTE,
    Aborted = TC_ERR_ABORTED,
    Cuda = TC_ERR_CUDA,
    Nccl = TC_ERR_NCCL,
    System = TC_ERR_SYSTEM,
    Internal = TC_ERR_INTERNAL,
    Panic = TC_ERR_PANIC,
    BufferTooSmall = TC_ERR_BUFFER_TOO_SMALL,
    NotFound = TC_ERR_NOT_FOUND,
    OutOfMemory = TC_ERR_OUT_OF_MEMORY,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 16] = [
        ErrorKind::NullArgument,
        ErrorKind::InvalidArgument,
        ErrorKind::InvalidUsage,
        ErrorKind::Unsupported,
        ErrorKind::Unavailable,
        ErrorKind::Timeout,
        ErrorKind::Remote,
        ErrorKind::Aborted,
        ErrorKind::Cuda,
        ErrorKind::Nccl,
        ErrorKind::System,
        ErrorKind::Internal,
        ErrorKind::Panic,
        ErrorKind::BufferTooSmall,
        ErrorKind::NotFound,
        ErrorKind::OutOfMemory,
    ];

    pub fn code(self) -> tc_result_t {
        self as i32
    }

    pub fn from_code(code: tc_result_t) -> Option<ErrorKind> {
        Self::ALL.iter().copied().find(|k| k.code() == code)
    }

    /// Static description, NUL-terminated for `tc_result_string`.
    pub fn describe(self) -> &'static str {
        match self {
            ErrorKind::NullArgument => "null argument\0",
            ErrorKind::InvalidArgument => "invalid argument\0",
            ErrorKind::InvalidUsage => "invalid usage\0",
            ErrorKind::Unsupported => "unsupported operation\0",
            ErrorKind::Unavailable => "library or device unavailable\0",
            ErrorKind::Timeout => "timed out\0",
            ErrorKind::Remote => "remote peer failed\0",
            ErrorKind::Aborted => "communicator aborted\0",
            ErrorKind::Cuda => "CUDA error\0",
            ErrorKind::Nccl => "NCCL error\0",
            ErrorKind::System => "system error\0",
            ErrorKind::Internal => "internal error\0",
            ErrorKind::Panic => "panic caught at the C boundary\0",
            ErrorKind::BufferTooSmall => "buffer too small\0",
            ErrorKind::NotFound => "not found\0",
            ErrorKind::OutOfMemory => "out of memory\0",
        }
    }
}

/// An error with its kind and a message for the user (which argument, which
/// peer, which OS/CUDA/NCCL error).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }
    pub fn null_argument(name: &str) -> Error {
        Error::new(
            ErrorKind::NullArgument,
            format!("argument '{name}' is NULL"),
        )
    }
    pub fn invalid_argument(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }
    pub fn invalid_usage(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidUsage, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unsupported, message)
    }
    /// `what` (naming the argument that chose the size) could not get
    /// `bytes` bytes of memory.
    pub fn out_of_memory(what: &str, bytes: u128) -> Error {
        Error::new(
            ErrorKind::OutOfMemory,
            format!("{what}: out of memory allocating {bytes} bytes"),
        )
    }
    pub fn unavailable(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unavailable, message)
    }
    pub fn timeout(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Timeout, message)
    }
    pub fn remote(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Remote, message)
    }
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }
    pub fn system(context: impl std::fmt::Display, err: std::io::Error) -> Error {
        let kind = match err.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => ErrorKind::Timeout,
            std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof => ErrorKind::Remote,
            _ => ErrorKind::System,
        };
        Error::new(kind, format!("{context}: {err}"))
    }
    pub fn code(&self) -> tc_result_t {
        self.kind.code()
    }
    /// Prefixes the message with context, keeping the kind.
    pub fn context(mut self, context: impl std::fmt::Display) -> Error {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Error {
        Error::system("I/O error", err)
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error detail.
pub fn set_last_error(message: &str) {
    // Interior NULs would truncate the C string; replace them instead.
    let clean = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = clean);
}

/// Pointer to this thread's last error detail; valid until this thread's next
/// failing call.
pub fn last_error_ptr() -> *const libc::c_char {
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

/// Empties this thread's last error detail (what `tc_last_error` returns),
/// so that a caller can tell whether the next call set one.
pub fn clear_last_error() {
    LAST_ERROR.with(|slot| *slot.borrow_mut() = CString::default());
}
