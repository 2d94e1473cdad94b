//! What a live comm lets its user read and change after creation: its ranks
//! in the root comm's numbering, its backend's version, its default timeout
//! and the hints that may change while it runs.

use super::Comm;
use crate::error::{Error, Result};
use std::ffi::{CStr, CString};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Hints `tc_comm_set_hints` accepts on a live comm.
pub const LIVE_HINTS: [&str; 2] = ["timeout_ms", "abort_on_error"];

/// Hints read only when a comm is created (its backend's connection and
/// NCCL's config): a live comm refuses them with `TC_ERR_UNSUPPORTED`.
const CREATION_HINTS: [&str; 15] = [
    "gloo.hostname",
    "gloo.iface",
    "blocking",
    "cga_cluster_size",
    "min_ctas",
    "max_ctas",
    "split_share",
    "traffic_class",
    "collnet_enable",
    "cta_policy",
    "shrink_share",
    "nvls_ctas",
    "n_channels_per_net_peer",
    "nvlink_centric_sched",
    "net_name",
];

/// One validated live change.
enum Change {
    Timeout(Duration),
    AbortOnError(bool),
}

/// A version string as C reads it (a NUL inside, never expected, is cut).
pub(super) fn c_version(version: String) -> CString {
    let end = version.find('\0').unwrap_or(version.len());
    CString::new(&version[..end]).unwrap_or_default()
}

fn is_creation_hint(key: &str) -> bool {
    let bare = key.strip_prefix("nccl.").unwrap_or(key);
    CREATION_HINTS.contains(&key)
        || CREATION_HINTS.contains(&bare)
        || bare == "high_priority_stream"
}

fn parse_change(i: usize, key: &str, value: &str) -> Result<Change> {
    let bad = |what: &str| {
        Error::invalid_argument(format!(
            "argument 'hints[{i}]': hint {key}={value:?}: {what}"
        ))
    };
    match key {
        "timeout_ms" => match value.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Change::Timeout(Duration::from_millis(ms))),
            _ => Err(bad("expected a positive number of milliseconds")),
        },
        "abort_on_error" => match value.trim() {
            "0" => Ok(Change::AbortOnError(false)),
            "1" => Ok(Change::AbortOnError(true)),
            _ => Err(bad("expected 0 or 1")),
        },
        k if is_creation_hint(k) => Err(Error::unsupported(format!(
            "argument 'hints[{i}]': hint {key:?} is read only when a comm is created; \
             a live comm can change {} (create a comm with it instead, e.g. by tc_comm_split)",
            LIVE_HINTS.join(", ")
        ))),
        _ => Err(Error::invalid_argument(format!(
            "argument 'hints[{i}]': unknown hint {key:?}; a live comm can change {}",
            LIVE_HINTS.join(", ")
        ))),
    }
}

impl Comm {
    /// This comm's ranks in the root comm's numbering: `0..size` for a comm
    /// made by `tc_comm_new`, and for a comm made by split the root ranks of
    /// the members it was split from, composed through every level.
    pub fn root_ranks(&self) -> &[i32] {
        &self.root_ranks
    }

    /// The root ranks of a child made of `members` (ranks of this comm).
    pub(crate) fn child_root_ranks(&self, members: &[i32]) -> Vec<i32> {
        members
            .iter()
            .map(|r| self.root_ranks[*r as usize])
            .collect()
    }

    /// The backend's version ("gloo ..." or the loaded NCCL's).
    pub fn backend_version(&self) -> &CStr {
        &self.backend_version
    }

    /// Sets the default timeout of operations issued from now on; an
    /// operation already issued keeps the deadline it was issued with.
    pub fn set_timeout(&self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::invalid_argument(
                "argument 'timeout_ms': must be positive",
            ));
        }
        self.check_active()?;
        let ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        self.timeout_ms.store(ms, Ordering::Relaxed);
        Ok(())
    }

    /// Applies `hints` (see [`LIVE_HINTS`]) all or nothing: any hint refused
    /// leaves every setting as it was.
    pub fn set_hints(&self, hints: &[(String, String)]) -> Result<()> {
        self.check_active()?;
        let changes = hints
            .iter()
            .enumerate()
            .map(|(i, (k, v))| parse_change(i, k, v))
            .collect::<Result<Vec<_>>>()?;
        for change in changes {
            match change {
                Change::Timeout(t) => self.set_timeout(t)?,
                Change::AbortOnError(on) => self.abort_on_error.store(on, Ordering::Relaxed),
            }
        }
        Ok(())
    }

    /// Whether a failure aborts the process (creation option, or the
    /// `abort_on_error` hint since).
    pub fn abort_on_error(&self) -> bool {
        self.abort_on_error.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn live_hints_parse_and_creation_hints_are_refused_by_name() {
        assert!(matches!(
            parse_change(0, "timeout_ms", "250"),
            Ok(Change::Timeout(t)) if t == Duration::from_millis(250)
        ));
        assert!(matches!(
            parse_change(0, "abort_on_error", "0"),
            Ok(Change::AbortOnError(false))
        ));
        for (key, kind) in [
            ("nccl.min_ctas", ErrorKind::Unsupported),
            ("gloo.iface", ErrorKind::Unsupported),
            ("high_priority_stream", ErrorKind::Unsupported),
            ("no_such_hint", ErrorKind::InvalidArgument),
        ] {
            let e = parse_change(2, key, "1").err().unwrap();
            assert_eq!(e.kind, kind, "{key}: {}", e.message);
            assert!(
                e.message.contains("hints[2]") && e.message.contains(key),
                "{}",
                e.message
            );
        }
        for (key, value) in [
            ("timeout_ms", "0"),
            ("timeout_ms", "x"),
            ("abort_on_error", "2"),
        ] {
            let e = parse_change(0, key, value).err().unwrap();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{}", e.message);
        }
    }
}
