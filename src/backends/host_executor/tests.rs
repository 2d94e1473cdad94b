//! The host executor over a fake host backend: what it tells the comm, when
//! it runs the backend, and how a stop ends it.

use super::*;
use crate::backends::submission::PostHook;
use crate::backends::{CommEvents, Issue};
use crate::error::ErrorKind;
use crate::op::{OpOptions, Ptr};
use crate::types::{DType, ReduceOp};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Weak;

#[derive(Default)]
struct Fake {
    runs: AtomicUsize,
    fail: bool,
    /// What `run_at_once` does: [`AT_ONCE_NEVER`] (not asked),
    /// [`AT_ONCE_DONE`], [`AT_ONCE_DECLINED`] or [`AT_ONCE_FAILED`].
    at_once: AtomicUsize,
    /// Calls of `run_at_once`.
    at_once_runs: AtomicUsize,
    /// Calls of `idle`, which answers "never again" (None).
    idle_calls: AtomicUsize,
    /// What the executor handed `attach_idle_wake`.
    idle_wake: Mutex<Option<IdleWake>>,
}

const AT_ONCE_NEVER: usize = 0;
const AT_ONCE_DONE: usize = 1;
const AT_ONCE_DECLINED: usize = 2;
const AT_ONCE_FAILED: usize = 3;

impl HostBackend for Fake {
    fn run(&self, _op: &Op, _deadline: &Deadline) -> Result<()> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if self.fail {
            return Err(Error::new(ErrorKind::Remote, "peer lost"));
        }
        Ok(())
    }

    fn may_run_at_once(&self, _op: &Op) -> bool {
        self.at_once.load(Ordering::SeqCst) != AT_ONCE_NEVER
    }

    fn run_at_once(&self, _op: &Op) -> Option<Result<()>> {
        self.at_once_runs.fetch_add(1, Ordering::SeqCst);
        match self.at_once.load(Ordering::SeqCst) {
            AT_ONCE_DONE => Some(Ok(())),
            AT_ONCE_FAILED => Some(Err(Error::invalid_usage("does not match"))),
            _ => None,
        }
    }

    fn idle(&self) -> Option<Duration> {
        self.idle_calls.fetch_add(1, Ordering::SeqCst);
        None
    }

    fn attach_idle_wake(&self, wake: IdleWake) {
        *lock(&self.idle_wake) = Some(wake);
    }
}

impl Abilities for Fake {
    fn abort(&self) {}
}

#[derive(Default)]
struct Probe {
    failures: Mutex<Vec<ErrorKind>>,
    /// What the comm was told of each submission, in order.
    told: Mutex<Vec<&'static str>>,
    /// Issues and failures as they came: "issued", "failed".
    events: Mutex<Vec<&'static str>>,
}

impl CommEvents for Probe {
    fn issued(&self, _: u64, _: &Op, _: bool, issue: Issue<'_>, _: std::time::Instant) {
        lock(&self.events).push("issued");
        lock(&self.told).push(match issue {
            Issue::Refused(_) => "refused",
            Issue::Watched(_) => "watched",
            Issue::Done(_) => "done",
        })
    }
    fn check_active(&self) -> Result<()> {
        Ok(())
    }
    fn operation_failed(&self, err: Error) {
        lock(&self.events).push("failed");
        lock(&self.failures).push(err.kind);
    }
}

fn init(name: &str, size: i32, probe: &Arc<Probe>) -> BackendInit {
    let path = std::env::temp_dir().join(format!("tc-host-exec-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    // One process uses the store whatever the comm's size: it removes its
    // file when that one is done with it.
    let store = crate::store::file::FileStore::new(&path, 1, Duration::from_secs(30)).unwrap();
    let init = BackendInit {
        rank: 0,
        size,
        local_rank: 0,
        name: name.into(),
        device: crate::types::Device::Cpu,
        store: Arc::new(store),
        timeout: Duration::from_secs(30),
        abort_on_error: false,
        hints: Vec::new(),
        link: CommLink::default(),
    };
    init.link
        .connect(Arc::downgrade(probe) as Weak<dyn CommEvents>);
    init
}

/// A submission's outcome, what the comm was told and what the post hook
/// saw (outcome ok, completed).
type Seen = (
    Result<Arc<dyn Work>>,
    Vec<&'static str>,
    Option<(bool, bool)>,
);

/// Submits `op` to `ex`, whose comm is `probe` (see [`Seen`]), with a
/// post hook.
fn submit(ex: &HostExecutor<Fake>, probe: &Probe, op: Op, async_op: bool) -> Seen {
    submit_with(ex, probe, op, async_op, true)
}

/// [`submit`], with a post hook or not (the post hook's part of [`Seen`]
/// then None).
fn submit_with(
    ex: &HostExecutor<Fake>,
    probe: &Probe,
    op: Op,
    async_op: bool,
    hooked: bool,
) -> Seen {
    let opts = OpOptions {
        async_op,
        ..OpOptions::default()
    };
    let label: Arc<str> = "comm 'test' (rank 0/1)".into();
    let seen = Arc::new(Mutex::new(None));
    let post_seen = seen.clone();
    let sub = Submission {
        opts: &opts,
        timeout: Duration::from_secs(30),
        may_be_device: false,
        label: &label,
        comm: &ex.shared.link,
        seq: 1,
        post: hooked.then(|| -> PostHook {
            Box::new(move |r: &Result<()>, done| {
                *lock(&post_seen) = Some((r.is_ok(), done));
            })
        }),
    };
    let r = ex.submit(op, sub);
    let seen = *lock(&seen);
    (r, std::mem::take(&mut *lock(&probe.told)), seen)
}

/// Waits for `work` to finish without waiting on it (which would run
/// the queue on this thread, see [`WaitHelp`]).
fn finished_unwaited(work: &dyn Work) {
    while !work.status().is_finished() {
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn all_reduce(data: &mut [f32]) -> Op {
    Op::all_reduce(
        Ptr(data.as_mut_ptr().cast()),
        data.len(),
        DType::F32,
        ReduceOp::SUM,
    )
}

#[test]
fn ops_run_on_the_host_backend_and_the_comm_is_told_once() {
    let probe = Arc::new(Probe::default());
    let ex = HostExecutor::start(Fake::default(), &init("runs", 1, &probe)).unwrap();
    // A barrier of one rank has nothing to do: no run, complete at once.
    let (r, told, post) = submit(&ex, &probe, Op::Barrier, false);
    assert!(r.unwrap().status().is_finished());
    assert_eq!((told, post), (vec!["done"], Some((true, true))));
    assert_eq!(ex.shared.backend.runs.load(Ordering::SeqCst), 0);
    // Blocking (inline) and asynchronous (progress thread) calls run it.
    let mut data = [1.0f32; 4];
    let (r, told, post) = submit(&ex, &probe, all_reduce(&mut data), false);
    assert!(r.unwrap().status().is_finished());
    assert_eq!((told, post), (vec!["watched"], Some((true, true))));
    let (r, told, _) = submit(&ex, &probe, all_reduce(&mut data), true);
    r.unwrap().wait_blocking().unwrap();
    assert_eq!(told, vec!["watched"]);
    assert_eq!(ex.shared.backend.runs.load(Ordering::SeqCst), 2);
    assert!(lock(&probe.failures).is_empty());
    // Once stopped, an operation is refused and the backend not called.
    ex.stop(&Error::invalid_usage("finalized"));
    let e = submit(&ex, &probe, all_reduce(&mut data), false)
        .0
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{}", e.message);
    assert!(e.message.contains("shutting down"), "{}", e.message);
    assert_eq!(ex.shared.backend.runs.load(Ordering::SeqCst), 2);
}

#[test]
fn a_failed_run_fails_its_work_and_is_reported_to_the_comm() {
    let probe = Arc::new(Probe::default());
    let fake = Fake {
        fail: true,
        ..Fake::default()
    };
    let ex = HostExecutor::start(fake, &init("fails", 2, &probe)).unwrap();
    let (r, told, post) = submit(&ex, &probe, Op::Barrier, false);
    let e = r.err().expect("the run failed");
    assert_eq!(e.kind, ErrorKind::Remote, "{}", e.message);
    assert!(
        e.message.contains("barrier on comm 'test'"),
        "{}",
        e.message
    );
    assert_eq!((told, post), (vec!["watched"], Some((false, true))));
    assert_eq!(*lock(&probe.failures), vec![ErrorKind::Remote]);
    ex.stop(&Error::invalid_usage("finalized"));
}

/// An asynchronous call that the backend completes at once is finished
/// when submitted (its failure on its work and told to the comm), without
/// the progress thread; one the backend declines goes to the progress
/// thread; none is tried at once while another operation runs or waits;
/// a blocking call with nothing ahead is tried at once first.
#[test]
fn an_async_call_completes_at_once_only_with_nothing_ahead() {
    let probe = Arc::new(Probe::default());
    let ex = HostExecutor::start(Fake::default(), &init("at-once", 2, &probe)).unwrap();
    let fake = &ex.shared.backend;
    let mut data = [1.0f32; 4];
    fake.at_once.store(AT_ONCE_DONE, Ordering::SeqCst);
    let (r, told, post) = submit(&ex, &probe, all_reduce(&mut data), true);
    assert_eq!(r.unwrap().status(), crate::work::WorkStatus::Completed);
    assert_eq!((told, post), (vec!["watched"], Some((true, true))));
    assert_eq!(fake.at_once_runs.load(Ordering::SeqCst), 1);
    assert_eq!(fake.runs.load(Ordering::SeqCst), 0, "no progress thread");

    fake.at_once.store(AT_ONCE_FAILED, Ordering::SeqCst);
    let (r, _, post) = submit(&ex, &probe, all_reduce(&mut data), true);
    let e = r.unwrap().wait_blocking().unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{}", e.message);
    assert!(e.message.contains("on comm 'test'"), "{}", e.message);
    assert_eq!(post, Some((false, true)));
    assert_eq!(*lock(&probe.failures), vec![ErrorKind::InvalidUsage]);

    fake.at_once.store(AT_ONCE_DECLINED, Ordering::SeqCst);
    let (r, _, _) = submit(&ex, &probe, all_reduce(&mut data), true);
    // Polled, not waited for: a waiter would run it itself.
    finished_unwaited(&*r.unwrap());
    assert_eq!(fake.at_once_runs.load(Ordering::SeqCst), 3);
    assert_eq!(
        fake.runs.load(Ordering::SeqCst),
        1,
        "run by the progress thread"
    );

    // Another operation holds the slot: queued behind it, not tried.
    fake.at_once.store(AT_ONCE_DONE, Ordering::SeqCst);
    // (The progress thread releases the slot just after the completion.)
    ex.shared.queue.wait_idle();
    assert_eq!(ex.shared.queue.claim(), Claim::Inline);
    let (r, _, _) = submit(&ex, &probe, all_reduce(&mut data), true);
    let work = r.unwrap();
    assert!(!work.status().is_finished(), "waits for the running one");
    assert_eq!(fake.at_once_runs.load(Ordering::SeqCst), 3);
    ex.shared.queue.finished();
    finished_unwaited(&*work);
    work.wait_blocking().unwrap();
    assert_eq!(fake.runs.load(Ordering::SeqCst), 2);

    // A blocking call is tried at once too, and run in full when declined.
    ex.shared.queue.wait_idle();
    let (r, told, post) = submit(&ex, &probe, all_reduce(&mut data), false);
    assert_eq!(r.unwrap().status(), crate::work::WorkStatus::Completed);
    assert_eq!((told, post), (vec!["watched"], Some((true, true))));
    assert_eq!(fake.at_once_runs.load(Ordering::SeqCst), 4);
    assert_eq!(fake.runs.load(Ordering::SeqCst), 2, "not run in full");
    fake.at_once.store(AT_ONCE_DECLINED, Ordering::SeqCst);
    let (r, _, _) = submit(&ex, &probe, all_reduce(&mut data), false);
    assert_eq!(r.unwrap().status(), crate::work::WorkStatus::Completed);
    assert_eq!(fake.at_once_runs.load(Ordering::SeqCst), 5);
    assert_eq!(fake.runs.load(Ordering::SeqCst), 3, "run in full, inline");
    ex.stop(&Error::invalid_usage("finalized"));
}

/// A call without post hooks that the backend completes at once takes no
/// work of its own: it shares the executor's done work (told to the comm
/// as done); one that fails gets a work holding its error, told to the
/// comm before its failure; one the backend declines takes a work and
/// is not tried at once a second time.
#[test]
fn a_call_completed_at_once_takes_no_work_of_its_own() {
    let probe = Arc::new(Probe::default());
    let ex = HostExecutor::start(Fake::default(), &init("no-work", 2, &probe)).unwrap();
    let fake = &ex.shared.backend;
    let mut data = [1.0f32; 4];
    fake.at_once.store(AT_ONCE_DONE, Ordering::SeqCst);
    let (first, told, _) = submit_with(&ex, &probe, all_reduce(&mut data), false, false);
    let (second, _, _) = submit_with(&ex, &probe, all_reduce(&mut data), true, false);
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.status(), crate::work::WorkStatus::Completed);
    assert!(Arc::ptr_eq(&first, &second), "one shared done work");
    assert!(Arc::ptr_eq(&first, &ex.done));
    assert_eq!(told, vec!["done"]);
    assert_eq!(ex.works.kept(), 0, "no work taken");

    fake.at_once.store(AT_ONCE_FAILED, Ordering::SeqCst);
    lock(&probe.events).clear();
    let (r, told, _) = submit_with(&ex, &probe, all_reduce(&mut data), false, false);
    let e = r.err().expect("failed at once");
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{}", e.message);
    assert!(
        e.message.contains("all_reduce on comm 'test'"),
        "{}",
        e.message
    );
    assert_eq!(told, vec!["done"]);
    assert_eq!(*lock(&probe.events), vec!["issued", "failed"]);
    let (r, _, _) = submit_with(&ex, &probe, all_reduce(&mut data), true, false);
    let work = r.expect("an asynchronous call's failure is on its work");
    assert!(!Arc::ptr_eq(&work, &ex.done));
    assert_eq!(work.status(), crate::work::WorkStatus::Error);
    let e = work.wait_blocking().unwrap_err();
    assert!(e.message.contains("does not match"), "{}", e.message);
    assert_eq!(ex.shared.queue.claim(), Claim::Inline, "slot released");
    ex.shared.queue.finished();

    fake.at_once.store(AT_ONCE_DECLINED, Ordering::SeqCst);
    let tried = fake.at_once_runs.load(Ordering::SeqCst);
    let (r, told, _) = submit_with(&ex, &probe, all_reduce(&mut data), false, false);
    assert_eq!(r.unwrap().status(), crate::work::WorkStatus::Completed);
    assert_eq!(told, vec!["watched"]);
    assert_eq!(
        fake.at_once_runs.load(Ordering::SeqCst),
        tried + 1,
        "tried once"
    );
    assert_eq!(fake.runs.load(Ordering::SeqCst), 1, "run in full");
    let (r, _, _) = submit_with(&ex, &probe, all_reduce(&mut data), true, false);
    finished_unwaited(&*r.unwrap());
    assert_eq!(
        fake.at_once_runs.load(Ordering::SeqCst),
        tried + 2,
        "tried once"
    );
    assert_eq!(
        fake.runs.load(Ordering::SeqCst),
        2,
        "run by the progress thread"
    );
    ex.stop(&Error::invalid_usage("finalized"));
}

/// Waits (up to 10 s) until `f` holds.
fn eventually(f: impl Fn() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while !f() {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// A backend with nothing to do while idle (`idle` answers None) leaves its
/// progress thread asleep until the next job or its wake: no periodic
/// look. The wake makes the thread ask again.
#[test]
fn an_idle_progress_thread_sleeps_until_woken() {
    let probe = Arc::new(Probe::default());
    let ex = HostExecutor::start(Fake::default(), &init("idle-wake", 1, &probe)).unwrap();
    let backend = &ex.shared.backend;
    assert!(eventually(|| backend.idle_calls.load(Ordering::SeqCst) >= 1));
    std::thread::sleep(Duration::from_millis(100));
    let asleep = backend.idle_calls.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        backend.idle_calls.load(Ordering::SeqCst),
        asleep,
        "asked again while nothing happened"
    );
    let wake = lock(&backend.idle_wake)
        .clone()
        .expect("the executor hands a wake");
    wake.wake();
    assert!(
        eventually(|| backend.idle_calls.load(Ordering::SeqCst) > asleep),
        "the wake did not make the thread ask again"
    );
    drop(ex);
    wake.wake(); // the executor is gone: nothing happens
}

/// With no progress thread to run them, a waiter runs the jobs queued up
/// to its own (not the one behind it), each tried at once first, then
/// run in full when declined.
#[test]
fn a_waiter_runs_the_queued_jobs_up_to_its_own() {
    let probe = Arc::new(Probe::default());
    let shared = Arc::new(Shared {
        backend: Fake::default(),
        queue: Arc::default(),
        link: init("waiter", 2, &probe).link,
    });
    let help: Weak<dyn WaitHelp> = Arc::downgrade(&shared) as Weak<Shared<Fake>>;
    let timeout = Duration::from_secs(30);
    let works: Vec<Arc<HostWork>> = (0..3)
        .map(|_| Arc::new(HostWork::new("barrier", "test".into(), timeout).helped_by(help.clone())))
        .collect();
    for work in &works {
        let job = Job {
            op: Op::Barrier,
            timeout,
            work: work.clone(),
        };
        assert!(shared.queue.push(job).is_ok());
    }
    let fake = &shared.backend;
    fake.at_once.store(AT_ONCE_DONE, Ordering::SeqCst);
    works[1].wait_blocking().unwrap();
    assert!(works[0].status().is_finished(), "the job ahead ran first");
    assert!(!works[2].status().is_finished(), "not the one behind");
    assert_eq!(fake.at_once_runs.load(Ordering::SeqCst), 2);
    assert_eq!(fake.runs.load(Ordering::SeqCst), 0);
    fake.at_once.store(AT_ONCE_DECLINED, Ordering::SeqCst);
    works[2].wait_blocking().unwrap();
    assert_eq!(fake.at_once_runs.load(Ordering::SeqCst), 3);
    assert_eq!(fake.runs.load(Ordering::SeqCst), 1, "run in full");
    assert_eq!(shared.queue.claim(), Claim::Inline, "the slot was released");
}
