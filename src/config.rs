//! Process-wide settings read once from the environment at load time, and
//! the logger (stderr lines prefixed with host, pid and rank, or a callback
//! installed by the embedding application).

use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

/// Log levels, as `TORCHCOMM_DEBUG` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(i32)]
pub enum Level {
    None = 0,
    Warn = 1,
    Info = 2,
    Trace = 3,
}

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The most entries a flight recorder may keep (a typo of a few digits
/// must not reserve gigabytes).
const MAX_FLIGHT_RECORDER: usize = 1 << 20;

/// Settings from `TORCHCOMM_*` variables.
#[derive(Debug, Clone)]
pub struct Config {
    pub timeout: Duration,
    pub abort_on_error: bool,
    pub log_level: Level,
    /// `TORCHCOMM_CHECK_COLLECTIVES=1`: verify before every collective that
    /// all ranks called the same operation with the same arguments.
    pub check_collectives: bool,
    /// `TORCHCOMM_FLIGHT_RECORDER=N`: operations each comm's flight recorder
    /// keeps (0: off).
    pub flight_recorder: usize,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

#[ctor::ctor]
fn load_config_at_startup() {
    // Reading at load time makes a bad value warn once, early, and keeps the
    // settings fixed for the process's life.
    let _ = config();
}

pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        Config::from_lookup(|k| std::env::var(k).ok(), &mut |m| emit(Level::Warn, m))
    })
}

impl Config {
    /// Parses settings through `lookup`; bad values are reported through
    /// `warn` and replaced by the default.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        warn: &mut dyn FnMut(&str),
    ) -> Config {
        let log_level = match lookup("TORCHCOMM_DEBUG").map(|v| v.trim().to_ascii_uppercase()) {
            None => Level::Warn,
            Some(v) => {
                match v.as_str() {
                    "" | "WARN" => Level::Warn,
                    "NONE" => Level::None,
                    "INFO" => Level::Info,
                    "TRACE" => Level::Trace,
                    _ => {
                        warn(&format!("TORCHCOMM_DEBUG={v:?} is not one of NONE, WARN, INFO, TRACE; using WARN"));
                        Level::Warn
                    }
                }
            }
        };
        let timeout = match lookup("TORCHCOMM_TIMEOUT_SECONDS") {
            None => DEFAULT_TIMEOUT,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Duration::from_secs_f64(s),
                _ => {
                    warn(&format!(
                        "TORCHCOMM_TIMEOUT_SECONDS={v:?} is not a positive number of seconds; using {}",
                        DEFAULT_TIMEOUT.as_secs()
                    ));
                    DEFAULT_TIMEOUT
                }
            },
        };
        let abort_on_error = parse_bool(
            lookup("TORCHCOMM_ABORT_ON_ERROR"),
            "TORCHCOMM_ABORT_ON_ERROR",
            true,
            warn,
        );
        let check_collectives = parse_bool(
            lookup("TORCHCOMM_CHECK_COLLECTIVES"),
            "TORCHCOMM_CHECK_COLLECTIVES",
            false,
            warn,
        );
        let flight_recorder = match lookup("TORCHCOMM_FLIGHT_RECORDER") {
            None => crate::recorder::DEFAULT_ENTRIES,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_FLIGHT_RECORDER => n,
                _ => {
                    warn(&format!(
                        "TORCHCOMM_FLIGHT_RECORDER={v:?} is not a number of operations in [0, {MAX_FLIGHT_RECORDER}]; using {}",
                        crate::recorder::DEFAULT_ENTRIES
                    ));
                    crate::recorder::DEFAULT_ENTRIES
                }
            },
        };
        Config {
            timeout,
            abort_on_error,
            log_level,
            check_collectives,
            flight_recorder,
        }
    }
}

pub(crate) fn parse_bool(
    value: Option<String>,
    name: &str,
    default: bool,
    warn: &mut dyn FnMut(&str),
) -> bool {
    match value.as_deref().map(|v| v.trim().to_ascii_lowercase()) {
        None => default,
        Some(v) => match v.as_str() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            _ => {
                warn(&format!(
                    "{name}={v:?} is not a boolean (0/1, true/false); using {}",
                    default as i32
                ));
                default
            }
        },
    }
}

/// C log callback: `level` is `TC_LOG_*`, `message` is valid for the call only.
pub type LogCallback = extern "C" fn(level: i32, message: *const c_char, user_data: *mut c_void);

struct Sink {
    callback: LogCallback,
    user_data: *mut c_void,
}
// The callback's user data is owned by the application, which promised in
// tc_set_log_callback's contract that it may be used from any thread.
unsafe impl Send for Sink {}
unsafe impl Sync for Sink {}

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

/// Rank shown in log prefixes: the rank of the last comm created (-1 before).
static LOG_RANK: AtomicI32 = AtomicI32::new(-1);

pub fn set_log_rank(rank: i32) {
    LOG_RANK.store(rank, Ordering::Relaxed);
}

pub fn set_log_callback(callback: Option<LogCallback>, user_data: *mut c_void) {
    let mut sink = SINK.write().unwrap_or_else(|e| e.into_inner());
    *sink = callback.map(|callback| Sink {
        callback,
        user_data,
    });
}

pub fn enabled(level: Level) -> bool {
    // Before the config exists (a warning while parsing it), let warnings out.
    let max = CONFIG.get().map_or(Level::Warn, |c| c.log_level);
    level != Level::None && level <= max
}

pub fn log(level: Level, message: &str) {
    if enabled(level) {
        emit(level, message);
    }
}

fn hostname() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: buf is writable for its length.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len()) };
        if rc != 0 {
            return "unknown".into();
        }
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    })
}

fn emit(level: Level, message: &str) {
    let tag = match level {
        Level::None => "",
        Level::Warn => "WARN",
        Level::Info => "INFO",
        Level::Trace => "TRACE",
    };
    let line = format!(
        "{}:{}:{} [torchcomm] {tag} {message}",
        hostname(),
        std::process::id(),
        LOG_RANK.load(Ordering::Relaxed)
    );
    let sink = SINK.read().unwrap_or_else(|e| e.into_inner());
    match sink.as_ref() {
        Some(s) => {
            let c = CString::new(line.replace('\0', "\\0")).unwrap_or_default();
            (s.callback)(level as i32, c.as_ptr(), s.user_data);
        }
        None => eprintln!("{line}"),
    }
}

#[macro_export]
macro_rules! log_warn { ($($t:tt)*) => { $crate::config::log($crate::config::Level::Warn, &format!($($t)*)) } }
#[macro_export]
macro_rules! log_info { ($($t:tt)*) => { if $crate::config::enabled($crate::config::Level::Info) { $crate::config::log($crate::config::Level::Info, &format!($($t)*)) } } }
#[macro_export]
macro_rules! log_trace { ($($t:tt)*) => { if $crate::config::enabled($crate::config::Level::Trace) { $crate::config::log($crate::config::Level::Trace, &format!($($t)*)) } } }

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        let mut warnings = Vec::new();
        let c = Config::from_lookup(
            |k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            },
            &mut |m| warnings.push(m.to_string()),
        );
        (c, warnings)
    }

    #[test]
    fn defaults_without_environment() {
        let (c, w) = parse(&[]);
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert!(c.abort_on_error);
        assert_eq!(c.log_level, Level::Warn);
        assert!(!c.check_collectives);
        assert_eq!(c.flight_recorder, crate::recorder::DEFAULT_ENTRIES);
        assert!(w.is_empty());
    }

    #[test]
    fn good_values_are_taken() {
        let (c, w) = parse(&[
            ("TORCHCOMM_TIMEOUT_SECONDS", "2.5"),
            ("TORCHCOMM_ABORT_ON_ERROR", "0"),
            ("TORCHCOMM_DEBUG", "trace"),
            ("TORCHCOMM_CHECK_COLLECTIVES", "1"),
            ("TORCHCOMM_FLIGHT_RECORDER", "0"),
        ]);
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert!(!c.abort_on_error);
        assert_eq!(c.log_level, Level::Trace);
        assert!(c.check_collectives);
        assert_eq!(c.flight_recorder, 0);
        assert!(w.is_empty());
    }

    #[test]
    fn bad_values_warn_and_default() {
        let (c, w) = parse(&[
            ("TORCHCOMM_TIMEOUT_SECONDS", "-3"),
            ("TORCHCOMM_ABORT_ON_ERROR", "maybe"),
            ("TORCHCOMM_DEBUG", "LOUD"),
            ("TORCHCOMM_FLIGHT_RECORDER", "99999999999"),
        ]);
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert!(c.abort_on_error);
        assert_eq!(c.log_level, Level::Warn);
        assert_eq!(c.flight_recorder, crate::recorder::DEFAULT_ENTRIES);
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w.iter().any(|m| m.contains("TORCHCOMM_TIMEOUT_SECONDS")));
    }
}

#[cfg(test)]
mod callback_tests {
    use super::*;
    use std::sync::Mutex;

    static LINES: Mutex<Vec<(i32, String)>> = Mutex::new(Vec::new());

    extern "C" fn collect(level: i32, message: *const c_char, _user: *mut c_void) {
        let text = unsafe { std::ffi::CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned();
        LINES.lock().unwrap().push((level, text));
    }

    #[test]
    fn callback_receives_prefixed_lines() {
        set_log_callback(Some(collect), std::ptr::null_mut());
        crate::log_warn!("hello from the test {}", 7);
        set_log_callback(None, std::ptr::null_mut());
        let lines = LINES.lock().unwrap();
        let (level, line) = lines
            .iter()
            .find(|(_, l)| l.contains("hello from the test 7"))
            .expect("no line");
        assert_eq!(*level, Level::Warn as i32);
        let pid = format!(":{}:", std::process::id());
        assert!(
            line.contains(&pid) && line.contains("[torchcomm] WARN"),
            "{line}"
        );
    }
}
