//! The gradient reducer: buckets of gradients exchanged as soon as complete.
//!
//! A reducer owns the bucket layout of a fixed gradient list. As the caller
//! marks gradients ready (in any order), each bucket whose gradients are all
//! ready is copied into its flat buffer and handed to the hook, strictly in
//! bucket order, so the exchange overlaps the rest of the caller's backward
//! pass. `finalize` launches what is left, agrees with every rank on whether
//! the iteration is complete (one small all-gather), waits, and writes the
//! results back.

mod buckets;
mod device;
pub mod hooks;
#[cfg(test)]
mod kernel_tests;
pub mod layout;
mod lowrank;
mod parts;
pub mod powersgd;

use crate::coalesced::Buffer;
use crate::comm::{Comm, Op, OpOptions, Ptr};
use crate::device_ops::{self, CommScratch};
use crate::error::{Error, ErrorKind, Result};
use crate::layout_check::{agree, Layout};
use crate::types::{DType, Device};
use crate::work::{DoneWork, Work};
use buckets::{build_buckets, place_grads};
use device::DeviceCopies;
use hooks::{tc_grad_bucket_t, CommHook};
use std::sync::Arc;

/// Creation options (see `tc_reducer_options_t`).
#[derive(Debug, Clone, Copy)]
pub struct ReducerOptions {
    pub bucket_cap_bytes: usize,
    pub first_bucket_bytes: usize,
    /// The gradients live in the buckets (the reducer allocates them): no
    /// copy in or out.
    pub gradient_as_bucket_view: bool,
    /// The stream the gradients are produced on (device memory): copies and
    /// the built-in hooks are ordered on it.
    pub stream: *mut std::ffi::c_void,
}

impl Default for ReducerOptions {
    fn default() -> Self {
        ReducerOptions {
            bucket_cap_bytes: 25 << 20,
            first_bucket_bytes: 1 << 20,
            gradient_as_bucket_view: false,
            stream: std::ptr::null_mut(),
        }
    }
}

/// Gradients never marked whose indices the agreement record carries.
const NAMED_MISSING: usize = 6;
/// Words per rank of the agreement record: missing count, hook failed,
/// the first missing indices.
const RECORD_WORDS: usize = 2 + NAMED_MISSING;

/// The finalize all-gather of every rank's record: its buffers, which must
/// stay put while it runs, and its work.
struct Agreement {
    mine: Vec<u64>,
    all: Vec<u64>,
    work: Option<Result<Arc<dyn Work>>>,
}

struct Bucket {
    dtype: DType,
    members: Vec<usize>,
    offsets: Vec<usize>,
    lengths: Vec<usize>,
    count: usize,
    /// 8-byte aligned flat buffer (host buckets).
    storage: Vec<u64>,
    /// The flat buffer in device memory (nccl comms), instead of `storage`.
    scratch: Option<CommScratch>,
    /// Gradients not yet marked this iteration.
    pending: usize,
    view: tc_grad_bucket_t,
    /// The works of its exchange this iteration (one, or one per piece).
    works: Vec<Arc<dyn Work>>,
    /// Launching in parts: gradients at the front copied in (or, as views,
    /// counted) this iteration, and elements launched.
    ready_members: usize,
    launched: usize,
}

impl Bucket {
    fn storage_ptr(&mut self) -> *mut u8 {
        match &self.scratch {
            Some(s) => s.ptr().cast(),
            None => self.storage.as_mut_ptr().cast(),
        }
    }
}

#[derive(Clone, Copy)]
struct Grad {
    ptr: Ptr,
    dtype: DType,
    /// (bucket, offset in elements); None for empty gradients.
    slot: Option<(usize, usize)>,
}

pub struct Reducer {
    comm: Arc<Comm>,
    grads: Vec<Grad>,
    buckets: Vec<Bucket>,
    marked: Vec<bool>,
    next_launch: usize,
    hook: Box<dyn CommHook>,
    hook_error: Option<Error>,
    agreement: Agreement,
    iteration: u64,
    as_view: bool,
    /// Buckets go out piece by piece as their gradients become ready (a hook
    /// that runs in parts, host buckets and gradients).
    in_parts: bool,
    /// Device copies (device buckets, or CUDA gradients on a host comm).
    copies: Option<DeviceCopies>,
}

// SAFETY: the raw pointers are the caller's gradient buffers and the
// reducer's own storage; the reducer is used by one thread at a time.
unsafe impl Send for Reducer {}

impl Reducer {
    /// Collective: every rank passes the same counts, dtypes and options
    /// (checked; a difference fails every rank naming it). With
    /// `gradient_as_bucket_view` the pointers of `grads` are ignored and the
    /// gradients live in the buckets (see [`Reducer::grad_ptr`]).
    pub fn new(
        comm: Arc<Comm>,
        grads: &[Buffer],
        opts: ReducerOptions,
        mut hook: Box<dyn CommHook>,
    ) -> Result<Reducer> {
        comm.check_active()?;
        let on_device = comm.device() != Device::Cpu;
        if on_device {
            device_ops::refuse_capture(opts.stream, "tc_reducer_new")?;
        }
        let mut buckets = Self::agree_on_list(&comm, grads, &opts)?;
        let copies = Self::device_copies(&comm, grads, &mut buckets, &opts)?;
        hook.set_stream(opts.stream);
        let grads = place_grads(grads, &mut buckets, opts.gradient_as_bucket_view);
        let in_parts = hook.runs_in_parts() && copies.is_none();
        Ok(Reducer {
            comm: comm.clone(),
            marked: vec![false; grads.len()],
            grads,
            buckets,
            next_launch: 0,
            hook,
            hook_error: None,
            agreement: Agreement {
                mine: vec![0; RECORD_WORDS],
                all: vec![0; RECORD_WORDS * comm.size() as usize],
                work: None,
            },
            iteration: 0,
            as_view: opts.gradient_as_bucket_view,
            in_parts,
            copies,
        })
    }

    /// Checks the arguments, builds the buckets (their memory is the
    /// caller's to size, so it may not be had) and agrees with every rank on
    /// the list and the options (a difference, bad arguments or no memory on
    /// any rank fails every rank); gives the buckets.
    fn agree_on_list(
        comm: &Arc<Comm>,
        grads: &[Buffer],
        opts: &ReducerOptions,
    ) -> Result<Vec<Bucket>> {
        let entries: Vec<(usize, DType)> = grads.iter().map(|g| (g.count, g.dtype)).collect();
        let buckets = Self::validate(grads, opts).and_then(|()| build_buckets(&entries, opts));
        let scalars = [
            ("arguments valid (1: yes)", buckets.is_ok() as u64),
            ("bucket_cap_bytes", opts.bucket_cap_bytes as u64),
            ("first_bucket_bytes", opts.first_bucket_bytes as u64),
            (
                "gradient_as_bucket_view",
                opts.gradient_as_bucket_view as u64,
            ),
        ];
        let agreed = agree(
            comm,
            "tc_reducer_new",
            0,
            &Layout {
                scalars: &scalars,
                entries,
            },
            opts.stream,
        );
        let buckets = buckets?;
        agreed?;
        Ok(buckets)
    }

    /// On a device comm, moves the buckets to device memory from the comm's
    /// allocator; on a host comm, notes CUDA gradients. Either way gives the
    /// copies' device and stream (None: host memory only).
    fn device_copies(
        comm: &Arc<Comm>,
        grads: &[Buffer],
        buckets: &mut [Bucket],
        opts: &ReducerOptions,
    ) -> Result<Option<DeviceCopies>> {
        let max_grad_bytes = grads.iter().map(|g| g.count * g.dtype.size()).max();
        let on_device = comm.device() != Device::Cpu;
        let device = if on_device {
            for b in buckets.iter_mut() {
                b.scratch = Some(CommScratch::new(comm, b.count * b.dtype.size())?);
                b.storage = Vec::new();
            }
            match buckets.first_mut() {
                Some(b) => Some(device_ops::device_of(Ptr(b.storage_ptr().cast()))?),
                None => None,
            }
        } else if opts.gradient_as_bucket_view {
            None
        } else {
            device_ops::first_device(grads.iter().map(|g| (g.ptr, g.count * g.dtype.size())))?
        };
        Ok(device
            .map(|d| DeviceCopies::new(d, opts.stream, !on_device, max_grad_bytes.unwrap_or(0))))
    }

    /// Whether the buckets are device memory (an nccl comm).
    pub fn on_device(&self) -> bool {
        self.copies.as_ref().is_some_and(|c| !c.host_buckets)
    }

    fn validate(grads: &[Buffer], opts: &ReducerOptions) -> Result<()> {
        if opts.bucket_cap_bytes == 0 {
            return Err(Error::invalid_argument(
                "argument 'opts.bucket_cap_bytes' is 0",
            ));
        }
        for (i, g) in grads.iter().enumerate() {
            layout::check_grad_dtype(g.dtype, &format!("dtypes[{i}]"))?;
            g.dtype.bytes(g.count, &format!("counts[{i}]"))?;
            if !opts.gradient_as_bucket_view && g.count > 0 && g.ptr.is_null() {
                return Err(Error::null_argument(&format!("grads[{i}]")));
            }
        }
        Ok(())
    }

    pub fn comm(&self) -> &Arc<Comm> {
        &self.comm
    }

    /// Element count of every gradient, in list order.
    pub fn grad_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.grads.len()];
        for b in &self.buckets {
            for (&g, &len) in b.members.iter().zip(&b.lengths) {
                counts[g] = len;
            }
        }
        counts
    }

    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Where gradient `index` lives: the caller's buffer, or its view in a
    /// bucket with `gradient_as_bucket_view` (NULL for an empty gradient).
    pub fn grad_ptr(&self, index: usize) -> Result<Ptr> {
        self.check_index(index).map(|()| self.grads[index].ptr)
    }

    pub fn set_hook(&mut self, mut hook: Box<dyn CommHook>) -> Result<()> {
        if self.next_launch > 0 || self.marked.iter().any(|&m| m) {
            return Err(Error::invalid_usage(
                "the hook can only be changed between iterations (after tc_reducer_finalize)",
            ));
        }
        hook.set_stream(
            self.copies
                .as_ref()
                .map_or(std::ptr::null_mut(), |c| c.stream.0),
        );
        // The last finalize's cast back may still read the old hook's
        // device buffers.
        if let Some(c) = &self.copies {
            c.device.scoped().and_then(|_g| c.synchronize())?;
        }
        self.in_parts = hook.runs_in_parts() && self.copies.is_none();
        self.hook = hook;
        Ok(())
    }

    fn check_index(&self, index: usize) -> Result<()> {
        if index >= self.grads.len() {
            return Err(Error::invalid_argument(format!(
                "argument 'grad_index': {index} is out of range (the reducer has {} gradients)",
                self.grads.len()
            )));
        }
        Ok(())
    }

    /// Gradient `index` is final for this iteration. Launches every bucket
    /// that is complete and has all earlier buckets launched. A hook failure
    /// is returned here and again by `finalize`.
    pub fn mark_ready(&mut self, index: usize) -> Result<()> {
        self.check_index(index)?;
        if self.marked[index] {
            return Err(Error::invalid_usage(format!(
                "gradient {index} was already marked ready in iteration {}",
                self.iteration
            )));
        }
        self.marked[index] = true;
        if let Some((b, _)) = self.grads[index].slot {
            self.buckets[b].pending -= 1;
        }
        if self.in_parts {
            return self.launch_ready_parts();
        }
        let mut first_error = Ok(());
        while self.next_launch < self.buckets.len() && self.buckets[self.next_launch].pending == 0 {
            let r = self.launch(self.next_launch);
            self.next_launch += 1;
            if first_error.is_ok() {
                first_error = r;
            }
        }
        first_error
    }

    /// Copies bucket `b` in (gradients never marked count as zeros) and runs
    /// the hook on it.
    fn launch(&mut self, b: usize) -> Result<()> {
        if let Err(e) = self.copy_in(b) {
            let e = e.context(format!("copying bucket {b} in"));
            self.hook_error.get_or_insert_with(|| e.clone());
            return Err(e);
        }
        let bucket = &mut self.buckets[b];
        let base = bucket.storage_ptr();
        bucket.view.buffer = base.cast();
        bucket.view.dtype = bucket.dtype.to_c();
        bucket.view.count = bucket.count;
        match self.hook.run(&self.comm, &mut bucket.view) {
            Ok(work) => {
                bucket.works.push(work);
                Ok(())
            }
            Err(e) => {
                let e = e.context(format!("communication hook on bucket {b}"));
                self.hook_error.get_or_insert_with(|| e.clone());
                Err(e)
            }
        }
    }

    /// Copies bucket `b`'s gradients in (zeros for those never marked).
    fn copy_in(&mut self, b: usize) -> Result<()> {
        let bucket = &mut self.buckets[b];
        let base = bucket.storage_ptr();
        let es = bucket.dtype.size();
        let _current = self
            .copies
            .as_ref()
            .map(|c| c.device.scoped())
            .transpose()?;
        for (k, &g) in bucket.members.iter().enumerate() {
            // SAFETY: the bucket holds the gradient at its offset.
            let dst = unsafe { base.add(bucket.offsets[k] * es) };
            let len = bucket.lengths[k] * es;
            let src = self.grads[g].ptr.as_u8();
            match &mut self.copies {
                Some(c) if !self.marked[g] => c.zero(dst, len)?,
                Some(c) if !self.as_view => c.copy(dst, src, len)?,
                // SAFETY: host memory: the caller's gradient holds `len` bytes.
                None if !self.marked[g] => unsafe { std::ptr::write_bytes(dst, 0, len) },
                None if !self.as_view => unsafe { std::ptr::copy_nonoverlapping(src, dst, len) },
                _ => {}
            }
        }
        self.copies.as_ref().map_or(Ok(()), |c| c.settle())
    }

    /// Ends the iteration: launches the buckets not yet launched, agrees with
    /// every rank on whether all gradients were marked and every hook ran,
    /// waits for every bucket and writes the results back. On any failure
    /// nothing is written back (with `gradient_as_bucket_view` the buckets
    /// may hold partial results), every rank gets an error naming the cause,
    /// and the reducer is ready for the next iteration.
    pub fn finalize(&mut self) -> Result<()> {
        self.begin_finalize();
        self.end_finalize()
    }

    /// The part of `finalize` that issues operations (so that they take
    /// their place in the comm's order at the call): launches the buckets
    /// not yet launched and enqueues the agreement all-gather.
    pub fn begin_finalize(&mut self) {
        let missing: Vec<usize> = (0..self.marked.len())
            .filter(|&i| !self.marked[i])
            .collect();
        while self.next_launch < self.buckets.len() {
            let _ = match self.in_parts {
                true => self.launch_rest(self.next_launch),
                false => self.launch(self.next_launch),
            };
            self.next_launch += 1;
        }
        // Every hook has run: a bucket it left unusable is a hook failure,
        // agreed on below, so no rank writes anything back.
        if self.hook_error.is_none() {
            self.hook_error = self.check_views().err();
        }
        let record = &mut self.agreement.mine;
        record.fill(0);
        record[0] = missing.len() as u64;
        record[1] = self.hook_error.is_some() as u64;
        for (slot, &m) in record[2..].iter_mut().zip(&missing) {
            *slot = m as u64;
        }
        let op = Op::all_gather_single(
            Ptr(self.agreement.all.as_mut_ptr().cast()),
            Ptr(record.as_mut_ptr().cast()),
            RECORD_WORDS,
            DType::U64,
        );
        if self.on_device() {
            // NCCL reads device memory only: a blocking exchange through
            // device scratch, ordered on the reducer's stream.
            let stream = self
                .copies
                .as_ref()
                .map_or(std::ptr::null_mut(), |c| c.stream.0);
            let done = device_ops::host_collective(&self.comm, op, stream);
            self.agreement.work = Some(done.map(|()| Arc::new(DoneWork(Ok(()))) as Arc<dyn Work>));
            return;
        }
        let async_op = OpOptions {
            async_op: true,
            ..OpOptions::default()
        };
        self.agreement.work = Some(self.comm.submit(op, &async_op));
    }

    /// The rest of `finalize`: waits, checks, writes back, and readies the
    /// next iteration whatever the outcome.
    pub fn end_finalize(&mut self) -> Result<()> {
        let result = self.finish_iteration();
        self.reset();
        result
    }

    /// `finalize` on device buckets (an nccl comm): the copies out are
    /// enqueued on the reducer's stream, and the work completes when they
    /// are done (`wait` on it keeps a stream ordered after them).
    pub fn finalize_device(&mut self) -> Result<Arc<dyn Work>> {
        self.begin_finalize();
        let result = self.finish_iteration();
        self.reset();
        result?;
        let copies = self.copies.as_ref().expect("device buckets have copies");
        let _current = copies.device.scoped()?;
        Ok(Arc::new(copies.end_work(&self.comm)?))
    }

    fn finish_iteration(&mut self) -> Result<()> {
        // The agreement was issued last: on a host comm, whose operations
        // finish in issue order, the buckets are done once it is, so waiting
        // for it first wakes this thread once instead of once per piece.
        let agreed = match self.agreement.work.take() {
            Some(w) => w.and_then(|w| w.wait_blocking()),
            None => Err(Error::invalid_usage("finalize was not begun")),
        };
        let stream = self
            .copies
            .as_ref()
            .filter(|c| !c.host_buckets)
            .map(|c| c.stream.0);
        let mut work_error = Ok(());
        for bucket in &mut self.buckets {
            for work in bucket.works.drain(..) {
                // Device buckets: the stream waits, the host does not.
                let r = match stream {
                    Some(s) => work.wait(s),
                    None => work.wait_blocking(),
                };
                if work_error.is_ok() {
                    work_error = r;
                }
            }
        }
        agreed?;
        report_missing(&self.agreement.all, self.iteration)?;
        if let Some(e) = self.hook_error.take() {
            return Err(e);
        }
        let records = self.agreement.all.chunks(RECORD_WORDS);
        if let Some(r) = records.clone().position(|rec| rec[1] != 0) {
            return Err(Error::remote(format!(
                "iteration {}: the communication hook failed on rank {r}",
                self.iteration
            )));
        }
        work_error?;
        self.write_back()
    }

    /// Checks what the hooks left in every bucket's view (its count, and
    /// that a replaced buffer's dtype can be cast back), so that a bad one
    /// fails the iteration before anything is written back.
    fn check_views(&mut self) -> Result<()> {
        let on_device = self.on_device();
        for bucket in &mut self.buckets {
            let view = bucket.view;
            let bad = |what: String| {
                Error::invalid_usage(format!(
                    "the communication hook {what} of bucket {}; nothing was written back",
                    view.index
                ))
            };
            if view.count != bucket.count {
                return Err(bad(format!(
                    "changed the count from {} to {}",
                    bucket.count, view.count
                )));
            }
            if view.buffer.cast::<u8>() == bucket.storage_ptr() {
                continue;
            }
            let from = DType::from_c(view.dtype, "bucket.dtype")?;
            let castable = match on_device {
                true => device::check_cast(from, bucket.dtype),
                false => layout::check_cast(from, bucket.dtype),
            };
            castable.map_err(|e| bad(format!("left a buffer that cannot be cast back ({e})")))?;
        }
        Ok(())
    }

    /// Casts buffers that hooks replaced back into the buckets, then copies
    /// the buckets into the gradients (the views were checked by
    /// [`Reducer::check_views`]).
    fn write_back(&mut self) -> Result<()> {
        let _current = self
            .copies
            .as_ref()
            .map(|c| c.device.scoped())
            .transpose()?;
        let on_device = self.on_device();
        for bucket in &mut self.buckets {
            let base = bucket.storage_ptr();
            let view = bucket.view;
            if view.buffer.cast::<u8>() != base && on_device {
                let copies = self.copies.as_mut().expect("device buckets have copies");
                let from = DType::from_c(view.dtype, "bucket.dtype")?;
                copies
                    .cast_back(base, bucket.dtype, view.buffer, from, bucket.count)
                    .map_err(|e| e.context(format!("bucket {}", view.index)))?;
            } else if view.buffer.cast::<u8>() != base {
                let from = DType::from_c(view.dtype, "bucket.dtype")?;
                // SAFETY: the hook's buffer holds `count` elements of its
                // dtype and stays valid until finalize returns.
                unsafe {
                    layout::cast(view.buffer.cast(), from, base, bucket.dtype, bucket.count)?
                };
            }
            if self.as_view {
                continue;
            }
            let es = bucket.dtype.size();
            for (k, &g) in bucket.members.iter().enumerate() {
                // SAFETY: as in `copy_in`, the other way round.
                let src = unsafe { base.add(bucket.offsets[k] * es) };
                let (dst, len) = (self.grads[g].ptr.as_u8(), bucket.lengths[k] * es);
                match &self.copies {
                    Some(c) => c.copy(dst, src, len)?,
                    None => unsafe { std::ptr::copy_nonoverlapping(src, dst, len) },
                }
            }
        }
        self.copies.as_ref().map_or(Ok(()), |c| c.settle())
    }

    /// Waits for the buckets of an unfinished iteration (their buffers are
    /// about to be freed), ignoring their errors.
    pub fn wait_outstanding(&mut self) {
        for b in &mut self.buckets {
            for w in b.works.drain(..) {
                let _ = w.wait_blocking();
            }
        }
        if let Some(Ok(w)) = self.agreement.work.take() {
            let _ = w.wait_blocking();
        }
        // Device buckets are freed with the reducer: the stream must be past
        // every copy and exchange that uses them.
        if let Some(c) = &self.copies {
            let _ = c.device.scoped().and_then(|_g| c.synchronize());
        }
    }

    fn reset(&mut self) {
        self.marked.iter_mut().for_each(|m| *m = false);
        for b in &mut self.buckets {
            b.pending = b.members.len();
            b.works.clear();
            b.ready_members = 0;
            b.launched = 0;
            b.view.buffer = b.storage_ptr().cast();
            b.view.dtype = b.dtype.to_c();
            b.view.count = b.count;
        }
        self.next_launch = 0;
        self.hook_error = None;
        self.iteration += 1;
    }
}

/// Fails every rank alike when some rank left gradients unmarked.
fn report_missing(records: &[u64], iteration: u64) -> Result<()> {
    let mut parts = Vec::new();
    for (r, rec) in records.chunks(RECORD_WORDS).enumerate() {
        let n = rec[0] as usize;
        if n == 0 {
            continue;
        }
        let named: Vec<String> = rec[2..2 + n.min(NAMED_MISSING)]
            .iter()
            .map(|i| i.to_string())
            .collect();
        let more = if n > NAMED_MISSING {
            format!(" and {} more", n - NAMED_MISSING)
        } else {
            String::new()
        };
        parts.push(format!("rank {r}: {}{more}", named.join(", ")));
    }
    if parts.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::InvalidUsage,
        format!(
            "iteration {iteration}: gradients never marked ready ({}); nothing was written back",
            parts.join("; ")
        ),
    ))
}
