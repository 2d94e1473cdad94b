//! Per-operation hooks: functions the application registers on a comm
//! (`tc_comm_add_pre_hook` / `tc_comm_add_post_hook`), called with a
//! description of every operation the comm issues, and the built-in NaN
//! check (`TORCHCOMM_NAN_CHECK=1`, [`nan`]).
//!
//! When they run (the contract the C header states):
//! - pre hooks: on the calling thread, after the operation passed argument
//!   validation and before anything is issued (and before the NaN check);
//! - post hooks: exactly once for every operation whose pre hooks ran, with
//!   its outcome. Host operations: when the operation finished, before its
//!   work reports completion (so a `tc_work_wait` that returned has seen
//!   them), on the thread that ran it (the comm's progress thread, or the
//!   calling thread for a blocking call run inline). Device operations (the
//!   nccl backend): on the calling thread once the operation is enqueued on
//!   the stream (`completed` is 0 then). An operation refused before it
//!   was issued (the NaN check, a shut-down comm): on the calling thread.
//!
//! A hook must not issue operations on its comm nor register or remove
//! hooks: such a call from inside a hook fails with `TC_ERR_INVALID_USAGE`
//! (an operation issued from the progress thread would wait for itself).
//! Removing a hook waits for its running calls to return, so its data may
//! be freed once the removal returned.
//!
//! Cost without hooks and without the NaN check: one relaxed atomic load
//! per operation ([`Hooks::active`]).

pub mod nan;
pub mod window;

use crate::comm::{Comm, Op, OpOptions};
use crate::error::{Error, Result};
use crate::op::{for_each_buffer, PointToPoint, Use};
use crate::types::{DType, ReduceOp};
use crate::util::lock;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// One buffer of an operation, as hooks see it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_op_buffer_t {
    /// The caller's address (a device address for CUDA buffers).
    pub ptr: *mut c_void,
    /// Elements of `dtype`.
    pub count: usize,
    pub dtype: crate::types::tc_dtype_t,
    /// The peer of a batch member or of a send/recv (-1, `TC_ANY_SOURCE`,
    /// on a receive from any source); -1 otherwise.
    pub peer: i32,
}

/// [`crate::op::OP_NAMES`] as C strings, in the same order.
/// Sized by `OP_NAMES`, so an operation added there without its C name here
/// does not compile.
const C_OP_NAMES: [&std::ffi::CStr; crate::op::OP_NAMES.len()] = [
    c"send",
    c"recv",
    c"batch_p2p",
    c"broadcast",
    c"reduce",
    c"all_reduce",
    c"all_gather",
    c"all_gather_single",
    c"all_gather_v",
    c"reduce_scatter",
    c"reduce_scatter_single",
    c"reduce_scatter_v",
    c"all_to_all",
    c"all_to_all_single",
    c"all_to_all_v_single",
    c"barrier",
    c"scatter",
    c"gather",
    c"gather_single",
    c"window_put",
    c"window_get",
    c"window_signal",
    c"window_wait_signal",
    c"refused",
];

/// The static C string of an operation's name.
pub fn c_op_name(name: &str) -> &'static std::ffi::CStr {
    crate::op::OP_NAMES
        .iter()
        .position(|n| *n == name)
        .map_or(c"unknown", |i| C_OP_NAMES[i])
}

/// The description of one operation, built once before its pre hooks and
/// shared with its post hooks.
pub struct OpRecord {
    pub name: &'static str,
    pub seq: u64,
    pub dtype: Option<DType>,
    /// -1 when the operation has no root / no single peer.
    pub root: i32,
    pub peer: i32,
    pub reduce_op: Option<ReduceOp>,
    pub async_op: bool,
    /// Buffers read (in-place buffers appear in both lists).
    pub inputs: Vec<tc_op_buffer_t>,
    /// Buffers written.
    pub outputs: Vec<tc_op_buffer_t>,
    /// The tag of a send or recv, else 0.
    pub tag: u32,
    /// Point-to-point operations (send, recv, batch): the tag of each
    /// buffer of `inputs` / `outputs`, in the same order; empty otherwise.
    pub input_tags: Vec<u32>,
    pub output_tags: Vec<u32>,
    /// A window put or get: the byte offset in the target's window.
    pub window_offset: usize,
}

// The raw addresses are only handed to the application's hooks.
unsafe impl Send for OpRecord {}
unsafe impl Sync for OpRecord {}

/// What a hook is called with.
pub struct HookEvent<'a> {
    pub record: &'a OpRecord,
    /// None for pre hooks; the outcome for post hooks.
    pub outcome: Option<std::result::Result<(), &'a Error>>,
    /// Post hooks: whether the operation finished (false: a device
    /// operation that is only enqueued on its stream).
    pub completed: bool,
}

pub type HookFn = Box<dyn Fn(&HookEvent) + Send + Sync>;

struct Entry {
    id: u64,
    func: HookFn,
    /// Cleared by removal, which takes the write lock and so waits for the
    /// calls in progress (each holds the read lock).
    alive: RwLock<bool>,
}

#[derive(Default, Clone)]
struct HookList {
    pre: Vec<Arc<Entry>>,
    post: Vec<Arc<Entry>>,
}

/// A comm's hooks and NaN-check setting.
pub struct Hooks {
    /// Any hook registered, or the NaN check on: the one load on the path of
    /// every operation.
    active: AtomicBool,
    nan_check: bool,
    list: Mutex<Arc<HookList>>,
    /// The last sequence number given to a window call (their own count:
    /// one-sided calls must not shift the collectives' numbers).
    window_seq: AtomicU64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Set while this thread runs a hook.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Fails when called from inside a hook (see the module docs).
pub fn refuse_inside_hook(what: &str) -> Result<()> {
    if IN_HOOK.with(Cell::get) {
        return Err(Error::invalid_usage(format!(
            "{what} cannot be called from inside an operation hook"
        )));
    }
    Ok(())
}

impl Hooks {
    /// No hooks; the NaN check as `TORCHCOMM_NAN_CHECK` says, read now (at
    /// comm creation).
    pub fn from_environment() -> Hooks {
        let nan_check = crate::config::parse_bool(
            std::env::var("TORCHCOMM_NAN_CHECK").ok(),
            "TORCHCOMM_NAN_CHECK",
            false,
            &mut |m| crate::config::log(crate::config::Level::Warn, m),
        );
        Hooks {
            active: AtomicBool::new(nan_check),
            nan_check,
            list: Mutex::new(Arc::default()),
            window_seq: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    pub fn nan_check(&self) -> bool {
        self.nan_check
    }

    /// Registers `func` as a pre (or post) hook; returns its id.
    pub fn add(&self, post: bool, func: HookFn) -> Result<u64> {
        refuse_inside_hook("adding a hook")?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            id,
            func,
            alive: RwLock::new(true),
        });
        let mut list = lock(&self.list);
        let mut next = HookList::clone(&list);
        if post { &mut next.post } else { &mut next.pre }.push(entry);
        *list = Arc::new(next);
        self.active.store(true, Ordering::Relaxed);
        Ok(id)
    }

    /// Removes the hook `id`, waiting for its calls in progress.
    pub fn remove(&self, id: u64) -> Result<()> {
        refuse_inside_hook("removing a hook")?;
        let removed = {
            let mut list = lock(&self.list);
            let mut next = HookList::clone(&list);
            let mut found = None;
            for v in [&mut next.pre, &mut next.post] {
                if let Some(i) = v.iter().position(|e| e.id == id) {
                    found = Some(v.remove(i));
                }
            }
            let Some(found) = found else {
                return Err(Error::new(
                    crate::error::ErrorKind::NotFound,
                    format!("argument 'id': no hook {id} is registered on this comm"),
                ));
            };
            self.active.store(
                self.nan_check || !next.pre.is_empty() || !next.post.is_empty(),
                Ordering::Relaxed,
            );
            *list = Arc::new(next);
            found
        };
        *removed.alive.write().unwrap_or_else(|e| e.into_inner()) = false;
        Ok(())
    }

    /// Removes every hook (the comm's C handle is being destroyed).
    pub fn clear(&self) {
        let old = std::mem::take(&mut *lock(&self.list));
        self.active.store(self.nan_check, Ordering::Relaxed);
        for e in old.pre.iter().chain(&old.post) {
            *e.alive.write().unwrap_or_else(|e| e.into_inner()) = false;
        }
    }

    fn snapshot(&self) -> Arc<HookList> {
        lock(&self.list).clone()
    }
}

/// Runs `entries` with `event`, each only while still registered; a panic
/// in one is contained (hooks are C functions; this is for Rust callers).
fn run(entries: &[Arc<Entry>], event: &HookEvent) {
    let was_inside = IN_HOOK.with(|c| c.replace(true));
    for e in entries {
        let alive = e.alive.read().unwrap_or_else(|e| e.into_inner());
        if *alive {
            let call = std::panic::AssertUnwindSafe(|| (e.func)(event));
            if std::panic::catch_unwind(call).is_err() {
                crate::log_warn!("operation hook {} panicked", e.id);
            }
        }
    }
    IN_HOOK.with(|c| c.set(was_inside));
}

/// The post hooks owed to one issued operation; called once.
pub struct PostHooks {
    record: Arc<OpRecord>,
    hooks: Arc<HookList>,
}

impl PostHooks {
    pub fn seq(&self) -> u64 {
        self.record.seq
    }

    pub fn run(self, result: &Result<()>, completed: bool) {
        if self.hooks.post.is_empty() {
            return;
        }
        let event = HookEvent {
            record: &self.record,
            outcome: Some(result.as_ref().map(|_| ())),
            completed,
        };
        run(&self.hooks.post, &event);
    }
}

impl Comm {
    /// [`Comm::submit`] without hooks or NaN check (the check's own exchange).
    pub(crate) fn submit_unhooked(
        &self,
        mut op: Op,
        opts: &OpOptions,
    ) -> Result<Arc<dyn crate::work::Work>> {
        self.admit(&mut op)?;
        self.issue(op, opts, None, true)
    }

    pub(crate) fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The flight recorder's next sequence number (hooks see it first).
    fn reserve_seq(&self) -> u64 {
        self.recorder.reserve()
    }
}

/// The hooked path of `Comm::submit` (taken only while [`Hooks::active`]):
/// pre hooks, the NaN check, then the usual issue with the post hooks
/// attached.
pub fn submit_hooked(comm: &Comm, op: Op, opts: &OpOptions) -> Result<Arc<dyn crate::work::Work>> {
    refuse_inside_hook("an operation")?;
    let hooks = comm.hooks().snapshot();
    let record = Arc::new(describe(
        &op,
        opts,
        comm.reserve_seq(),
        comm.rank(),
        comm.size(),
    ));
    if !hooks.pre.is_empty() {
        let event = HookEvent {
            record: &record,
            outcome: None,
            completed: false,
        };
        run(&hooks.pre, &event);
    }
    let post = PostHooks { record, hooks };
    if comm.hooks().nan_check() {
        if let Err(e) = nan::check(comm, &op, opts) {
            post.run(&Err(e.clone()), true);
            return Err(e);
        }
    }
    comm.issue(op, opts, Some(post), true)
}

/// The hooks' description of `op` as `rank` of `size` sees it.
fn describe(op: &Op, opts: &OpOptions, seq: u64, rank: i32, size: i32) -> OpRecord {
    let mut record = OpRecord {
        name: op.name(),
        seq,
        dtype: op.dtype(),
        root: -1,
        peer: -1,
        reduce_op: op.reduce_op().copied(),
        async_op: opts.async_op,
        inputs: Vec::new(),
        outputs: Vec::new(),
        tag: 0,
        input_tags: Vec::new(),
        output_tags: Vec::new(),
        window_offset: 0,
    };
    let r = &mut record;
    let mut push = |ptr: *mut c_void, bytes: usize, dtype: DType, usage: Use, peer: i32, tag| {
        let b = tc_op_buffer_t {
            ptr,
            count: bytes / dtype.size(),
            dtype: dtype.to_c(),
            peer,
        };
        if usage != Use::Out {
            r.inputs.push(b);
            r.input_tags.extend(tag);
        }
        if usage != Use::In {
            r.outputs.push(b);
            r.output_tags.extend(tag);
        }
    };
    let (mut peer, mut p2p_tag) = (-1, None);
    let root = match op {
        Op::PointToPoint(PointToPoint::One(p)) => {
            (peer, p2p_tag) = (p.peer, Some(p.tag));
            -1
        }
        _ => op.signature().map_or(-1, |s| s.2),
    };
    if let Op::PointToPoint(PointToPoint::Batch(ops)) = op {
        for p in ops {
            let usage = if p.is_send { Use::In } else { Use::Out };
            push(
                p.buf.0,
                p.count * p.dtype.size(),
                p.dtype,
                usage,
                p.peer,
                Some(p.tag),
            );
        }
    } else if let Some(dtype) = op.dtype() {
        // for_each_buffer rewrites addresses for staging; a copy is walked.
        let mut walked = op.clone();
        let _ = for_each_buffer(&mut walked, rank, size, &mut |p, bytes, usage| {
            push(p.0, bytes, dtype, usage, peer, p2p_tag);
            Ok(())
        });
    }
    (record.root, record.peer, record.tag) = (root, peer, p2p_tag.unwrap_or(0));
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Ptr;

    #[test]
    fn describes_buffers_roots_and_batches() {
        let p = |x: usize| Ptr(x as *mut c_void);
        let bcast = Op::broadcast(p(16), 3, DType::F32, 1);
        let r = describe(&bcast, &OpOptions::default(), 7, 0, 2);
        assert_eq!((r.name, r.seq, r.root, r.peer), ("broadcast", 7, 1, -1));
        assert!(r.tag == 0 && r.input_tags.is_empty() && r.output_tags.is_empty());
        assert_eq!((r.inputs.len(), r.outputs.len()), (1, 1));
        assert_eq!((r.inputs[0].ptr as usize, r.inputs[0].count), (16, 3));
        let batch = Op::batch(vec![
            crate::comm::P2p {
                is_send: true,
                buf: p(8),
                count: 2,
                dtype: DType::F64,
                peer: 1,
                tag: 0,
                source: None,
            },
            crate::comm::P2p {
                is_send: false,
                buf: p(32),
                count: 5,
                dtype: DType::I32,
                peer: 2,
                tag: 9,
                source: None,
            },
        ]);
        let r = describe(&batch, &OpOptions::default(), 1, 0, 3);
        assert!(r.dtype.is_none());
        assert_eq!((r.inputs[0].count, r.inputs[0].peer), (2, 1));
        assert_eq!((r.outputs[0].count, r.outputs[0].peer), (5, 2));
        assert_eq!(
            (r.tag, &r.input_tags[..], &r.output_tags[..]),
            (0, &[0][..], &[9][..])
        );
        let send = Op::send(p(8), 4, DType::F32, 1, 77);
        let r = describe(&send, &OpOptions::default(), 2, 0, 2);
        assert_eq!((r.peer, r.tag, &r.input_tags[..]), (1, 77, &[77][..]));
        assert!(r.outputs.is_empty() && r.output_tags.is_empty());
        let ag = Op::all_gather_single(p(64), p(8), 2, DType::BF16);
        let r = describe(&ag, &OpOptions::default(), 1, 1, 4);
        assert_eq!((r.inputs[0].count, r.outputs[0].count), (2, 8));
    }

    #[test]
    fn c_names_match_the_op_names() {
        for name in crate::op::OP_NAMES {
            assert_eq!(c_op_name(name).to_str().unwrap(), name);
        }
    }

    #[test]
    fn removal_and_reentry_rules() {
        let hooks = Hooks {
            active: AtomicBool::new(false),
            nan_check: false,
            list: Mutex::new(Arc::default()),
            window_seq: AtomicU64::new(0),
        };
        let id = hooks.add(true, Box::new(|_| {})).unwrap();
        assert!(hooks.active());
        assert_eq!(
            hooks.remove(id + 1000).unwrap_err().kind,
            crate::error::ErrorKind::NotFound
        );
        hooks.remove(id).unwrap();
        assert!(!hooks.active());
        IN_HOOK.with(|c| c.set(true));
        let e = hooks.add(false, Box::new(|_| {})).unwrap_err();
        IN_HOOK.with(|c| c.set(false));
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidUsage);
    }
}
