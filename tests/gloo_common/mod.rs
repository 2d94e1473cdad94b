//! Multi-process harness of the gloo tests: the test binary re-executes
//! itself once per rank (`TC_GLOO_ROLE` selects the child's job), with a
//! TCP store server hosted by the parent test.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::store::{StoreRef, TcpStore, TcpStoreOptions, TcpStoreServer};
use torchcomm::Device;
use torchcomm::Result;
use torchcomm::{Comm, CommOptions, Op, OpOptions};

pub struct Outcome {
    pub rank: usize,
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.and_then(|s| s.signal())
    }
    /// Lines the child printed as `RESULT key=value ...`.
    /// Asserts that this rank's process was killed by SIGKILL.
    pub fn assert_killed(&self) {
        assert_eq!(self.signal(), Some(libc::SIGKILL), "{}", self.describe());
    }

    pub fn results(&self) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.find("RESULT ").map(|p| l[p + 7..].to_string()))
            .collect()
    }
    pub fn describe(&self) -> String {
        format!(
            "rank {} status {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.rank, self.status, self.stdout, self.stderr
        )
    }
}

/// A buffer as an operation takes it.
pub fn ptr<T>(v: &mut [T]) -> torchcomm::Ptr {
    torchcomm::Ptr(v.as_mut_ptr().cast())
}

/// The child's role, when this process is a rank of a launched job.
pub fn role() -> Option<String> {
    std::env::var("TC_GLOO_ROLE").ok()
}

pub fn rank() -> i32 {
    std::env::var("TC_GLOO_RANK").unwrap().parse().unwrap()
}

pub fn size() -> i32 {
    std::env::var("TC_GLOO_SIZE").unwrap().parse().unwrap()
}

fn out_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tc-gloo-test-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `size` ranks of `test` (this binary's test of that name) in role
/// `role`; kills what is still running after `limit`.
pub fn launch(
    test: &str,
    role: &str,
    size: usize,
    env: &[(&str, &str)],
    limit: Duration,
) -> Vec<Outcome> {
    launch_with(test, role, size, env, limit, |_, _| {})
}

/// Like [`launch`], calling `watch(elapsed, children)` while waiting.
pub fn launch_with(
    test: &str,
    role: &str,
    size: usize,
    env: &[(&str, &str)],
    limit: Duration,
    mut watch: impl FnMut(Duration, &mut [Child]),
) -> Vec<Outcome> {
    let server = TcpStoreServer::start(0).unwrap();
    let dir = out_dir(test);
    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for r in 0..size {
        let out = std::fs::File::create(dir.join(format!("{role}-{r}.out"))).unwrap();
        let err = std::fs::File::create(dir.join(format!("{role}-{r}.err"))).unwrap();
        let mut cmd = Command::new(&exe);
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env("TC_GLOO_ROLE", role)
            .env("TC_GLOO_RANK", r.to_string())
            .env("TC_GLOO_SIZE", size.to_string())
            .env("TC_GLOO_PORT", server.port().to_string())
            .env("TORCHCOMM_ABORT_ON_ERROR", "0")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        children.push(cmd.spawn().unwrap());
    }
    let start = Instant::now();
    let mut status: Vec<Option<ExitStatus>> = vec![None; size];
    loop {
        for (i, c) in children.iter_mut().enumerate() {
            if status[i].is_none() {
                status[i] = c.try_wait().unwrap();
            }
        }
        if status.iter().all(|s| s.is_some()) {
            break;
        }
        if start.elapsed() > limit {
            for (i, c) in children.iter_mut().enumerate() {
                if status[i].is_none() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            break;
        }
        watch(start.elapsed(), &mut children);
        std::thread::sleep(Duration::from_millis(20));
    }
    let outcomes = (0..size)
        .map(|r| Outcome {
            rank: r,
            status: status[r],
            stdout: std::fs::read_to_string(dir.join(format!("{role}-{r}.out")))
                .unwrap_or_default(),
            stderr: std::fs::read_to_string(dir.join(format!("{role}-{r}.err")))
                .unwrap_or_default(),
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    outcomes
}

/// Asserts every rank exited 0.
pub fn assert_all_ok(outcomes: &[Outcome]) {
    for o in outcomes {
        assert!(o.ok(), "{}", o.describe());
    }
}

/// The store of this child (a client of the parent's server).
pub fn child_store() -> StoreRef {
    let port: u16 = std::env::var("TC_GLOO_PORT").unwrap().parse().unwrap();
    Arc::new(
        TcpStore::new(&TcpStoreOptions::client(
            "127.0.0.1",
            port,
            Duration::from_secs(30),
        ))
        .unwrap(),
    )
}

/// A gloo comm over `store` for this child's rank, failing calls (not the
/// process) on errors.
pub fn child_comm_on(
    store: StoreRef,
    name: &str,
    rank: i32,
    size: i32,
    timeout: Duration,
) -> Result<Arc<Comm>> {
    child_comm_hinted(store, name, (rank, size), timeout, Vec::new())
}

/// [`child_comm_on`] with backend hints.
pub fn child_comm_hinted(
    store: StoreRef,
    name: &str,
    (rank, size): (i32, i32),
    timeout: Duration,
    hints: Vec<(String, String)>,
) -> Result<Arc<Comm>> {
    Comm::new(
        "gloo",
        Device::Cpu,
        CommOptions {
            name: Some(name.to_string()),
            timeout: Some(timeout),
            abort_on_error: Some(false),
            rank: Some(rank),
            world_size: Some(size),
            store: Some(store),
            hints,
        },
    )
}

pub fn child_comm(name: &str, timeout: Duration) -> Arc<Comm> {
    child_comm_on(child_store(), name, rank(), size(), timeout).unwrap()
}

/// Runs `op` to completion.
pub fn run(comm: &Comm, op: Op) -> Result<()> {
    comm.submit(op, &OpOptions::default()).map(|_| ())
}

/// How long a whole job of [`world_tests!`] may take unless it says.
pub const WORLD_LIMIT: Duration = Duration::from_secs(300);

/// Launches `size` ranks of `test` in `role`: each must exit 0 having
/// printed exactly one `RESULT` line; what still runs after `limit` is
/// killed (a hang fails the test then).
pub fn run_world_within(test: &str, role: &str, size: usize, limit: Duration) {
    let out = launch(test, role, size, &[], limit);
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

/// One `#[test]` per line `name: "role", child_fn, size;`: the test
/// launches `size` ranks of itself in that role ([`run_world_within`],
/// [`WORLD_LIMIT`] or `LIMIT` after a first line `within LIMIT;`) and each
/// rank runs `child_fn`. For files that
/// `#[macro_use] mod gloo_common;`.
#[allow(unused_macros)]
macro_rules! world_tests {
    (within $limit:expr; $($name:ident: $role:literal, $child:ident, $size:literal;)*) => {$(
        #[test]
        fn $name() {
            match gloo_common::role().as_deref() {
                Some($role) => $child(),
                Some(_) => {}
                None => gloo_common::run_world_within(stringify!($name), $role, $size, $limit),
            }
        }
    )*};
    ($($name:ident: $role:literal, $child:ident, $size:literal;)*) => {
        world_tests! { within gloo_common::WORLD_LIMIT; $($name: $role, $child, $size;)* }
    };
}
