//! One process driving several devices, as `torch.cuda.comm` does:
//! broadcast, broadcast_coalesced, scatter, gather, reduce_add and
//! reduce_add_coalesced over a fixed list of devices (a "device group"),
//! with no ranks and no store.
//!
//! Two paths, chosen per call and logged at `TORCHCOMM_DEBUG=INFO`:
//! - NCCL (broadcast and reduce_add and their coalesced forms) when every
//!   member is a CUDA device, none twice, and NCCL loads: one communicator
//!   per device, made once with `ncclCommInitAll` on first use and kept;
//!   each call is one NCCL group with one operation per device.
//! - copies otherwise (a CPU member or source, a repeated device, NCCL
//!   absent or turned off), and always for scatter and gather (as torch).
//!
//! Every operation checks all its arguments (buffers on the right device,
//! no overlapping destinations, no overflowing counts) before it enqueues
//! anything, so a refused call writes nothing.

mod check;
mod copy_path;
mod nccl_path;

pub use check::Place;

use crate::cuda::{self, Device, EventPool, RawStream};
use crate::error::{Error, Result};
use crate::types::DType;
use crate::util::lock;
use check::{bytes_of, disjoint, on_place, Span};
use copy_path::{End, Staging};
use nccl_path::Comms;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// torch's default bucket size of the coalesced forms.
pub const DEFAULT_BUCKET_BYTES: usize = 10 << 20;

/// A device with its retained primary context and pooled events.
#[derive(Clone)]
pub struct DevCtx {
    pub dev: Arc<Device>,
    pub events: Arc<EventPool>,
}

impl DevCtx {
    fn open(ordinal: i32) -> Result<DevCtx> {
        let dev = Device::open(ordinal)?;
        let events = EventPool::new(&dev);
        Ok(DevCtx { dev, events })
    }
}

/// Choices made at creation.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// False: always the copies path.
    pub use_nccl: bool,
    /// Bucket size of the coalesced forms when the call passes 0.
    pub bucket_bytes: usize,
}

/// Lazily made NCCL communicators, or why there are none.
enum CommState {
    Untried,
    Ready(Comms),
    Failed(String),
}

/// A device group (`tc_local_t`).
pub struct LocalGroup {
    places: Vec<Place>,
    /// Per member: its device (None for the CPU).
    ctxs: Vec<Option<DevCtx>>,
    /// Devices outside the group used as a scatter source or a gather
    /// destination, opened on first use.
    others: Mutex<Vec<(i32, DevCtx)>>,
    settings: Settings,
    /// Why the NCCL path cannot serve this group, if it cannot.
    no_nccl: Option<String>,
    /// Held for the whole NCCL issue: comms take one call at a time.
    comms: Mutex<CommState>,
    staging: Staging,
}

/// The per-member streams of a call (NULL array: every legacy stream).
#[derive(Clone, Copy)]
pub struct Streams<'a>(pub Option<&'a [RawStream]>);

impl Streams<'_> {
    fn of(&self, i: usize) -> RawStream {
        self.0.map_or(std::ptr::null_mut(), |s| s[i])
    }
}

fn index_arg(i: usize, n: usize, arg: &str) -> Result<()> {
    if i >= n {
        return Err(Error::invalid_argument(format!(
            "argument '{arg}': {i} is not a member index (the group has {n} devices)"
        )));
    }
    Ok(())
}

impl LocalGroup {
    /// A group over `places` (CUDA ordinals must exist; the CPU is
    /// allowed, and a device may appear more than once).
    pub fn new(places: Vec<Place>, settings: Settings) -> Result<LocalGroup> {
        if places.is_empty() {
            return Err(Error::invalid_argument(
                "argument 'n': a group needs at least one device",
            ));
        }
        let mut opened: Vec<(i32, DevCtx)> = Vec::new();
        let mut ctxs = Vec::with_capacity(places.len());
        for (i, p) in places.iter().enumerate() {
            let Place::Cuda(ord) = *p else {
                ctxs.push(None);
                continue;
            };
            let count = cuda::device_count()?;
            if ord < 0 || ord >= count {
                return Err(Error::invalid_argument(format!(
                    "argument 'devices[{i}]': CUDA device index {ord} is out of range (this process sees {count} devices)"
                )));
            }
            if let Some((_, c)) = opened.iter().find(|(o, _)| *o == ord) {
                ctxs.push(Some(c.clone()));
                continue;
            }
            let c = DevCtx::open(ord)?;
            opened.push((ord, c.clone()));
            ctxs.push(Some(c));
        }
        let no_nccl = if !settings.use_nccl {
            Some("NCCL turned off in the group's options".to_string())
        } else if places.contains(&Place::Cpu) {
            Some("the group has a CPU member".to_string())
        } else if opened.len() < places.len() {
            Some("a device appears more than once in the group".to_string())
        } else {
            None
        };
        Ok(LocalGroup {
            places,
            ctxs,
            others: Mutex::new(Vec::new()),
            settings,
            no_nccl,
            comms: Mutex::new(CommState::Untried),
            staging: Staging::default(),
        })
    }

    pub fn size(&self) -> usize {
        self.places.len()
    }

    fn bucket(&self, asked: usize) -> usize {
        if asked == 0 {
            self.settings.bucket_bytes
        } else {
            asked
        }
    }

    /// The device context for `place`: a member's, or one opened for a
    /// device outside the group.
    fn ctx_for(&self, place: Place, arg: &str) -> Result<Option<DevCtx>> {
        let Place::Cuda(ord) = place else {
            return Ok(None);
        };
        if let Some(c) = self.places.iter().position(|p| *p == place) {
            return Ok(self.ctxs[c].clone());
        }
        let count = cuda::device_count()?;
        if ord < 0 || ord >= count {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': CUDA device index {ord} is out of range (this process sees {count} devices)"
            )));
        }
        let mut others = lock(&self.others);
        if let Some((_, c)) = others.iter().find(|(o, _)| *o == ord) {
            return Ok(Some(c.clone()));
        }
        let c = DevCtx::open(ord)?;
        others.push((ord, c.clone()));
        Ok(Some(c))
    }

    /// Member `i`'s end of a copy.
    fn member_end(&self, i: usize, ptr: *const c_void, streams: Streams) -> End {
        End {
            ptr: ptr as *mut c_void,
            place: self.places[i],
            stream: streams.of(i),
            ctx: self.ctxs[i].clone(),
        }
    }

    /// An end on `place` with `stream` (a device outside the group, or the
    /// CPU).
    fn place_end(
        &self,
        place: Place,
        ptr: *const c_void,
        stream: RawStream,
        arg: &str,
    ) -> Result<End> {
        Ok(End {
            ptr: ptr as *mut c_void,
            place,
            stream,
            ctx: self.ctx_for(place, arg)?,
        })
    }

    /// The stream a call uses on `place`: the first member's on that
    /// device, else the legacy stream.
    fn stream_on(&self, place: Place, streams: Streams) -> RawStream {
        self.places
            .iter()
            .position(|p| *p == place)
            .map_or(std::ptr::null_mut(), |i| streams.of(i))
    }

    fn device_ctxs(&self) -> Vec<DevCtx> {
        self.ctxs.iter().flatten().cloned().collect()
    }

    /// Runs `f` with the group's NCCL comms, or says why the copies path
    /// runs instead (Err carries the reason, for the log).
    fn with_nccl(
        &self,
        f: impl FnOnce(&Comms) -> Result<()>,
    ) -> std::result::Result<Result<()>, String> {
        if let Some(why) = &self.no_nccl {
            return Err(why.clone());
        }
        let mut state = lock(&self.comms);
        if let CommState::Untried = *state {
            let ords: Vec<i32> = self
                .places
                .iter()
                .map(|p| if let Place::Cuda(o) = p { *o } else { -1 })
                .collect();
            *state = match Comms::create(&ords) {
                Ok(c) => CommState::Ready(c),
                Err(e) => CommState::Failed(format!("NCCL unusable: {}", e.message)),
            };
        }
        match &*state {
            CommState::Ready(c) => Ok(f(c)),
            CommState::Failed(why) => Err(why.clone()),
            CommState::Untried => Err("NCCL not initialized".into()),
        }
    }

    fn all_streams(&self, streams: Streams) -> Vec<RawStream> {
        (0..self.size()).map(|i| streams.of(i)).collect()
    }

    /// Broadcast from member `root` (`src`) to `dsts[i]` on member i.
    pub fn broadcast(
        &self,
        src: *const c_void,
        root: usize,
        dsts: &[*mut c_void],
        count: usize,
        dtype: DType,
        streams: Streams,
    ) -> Result<()> {
        index_arg(root, self.size(), "src_index")?;
        let bytes = bytes_of(count, dtype, "count")?;
        let mut spans = vec![Span::new(src, bytes, "src".into(), false)];
        on_place(src, bytes, self.places[root], "src")?;
        for (i, d) in dsts.iter().enumerate() {
            let name = format!("dsts[{i}]");
            on_place(*d, bytes, self.places[i], &name)?;
            if !(i == root && std::ptr::eq(*d as *const c_void, src)) {
                spans.push(Span::new(*d, bytes, name, true));
            }
        }
        disjoint(spans)?;
        if bytes == 0 {
            return Ok(());
        }
        let items = [(src, dsts.to_vec(), bytes)];
        self.broadcast_items(root, &items, streams, "tc_local_broadcast")
    }

    /// Issues checked broadcasts from `root` on the NCCL path when it can,
    /// else as copies.
    fn broadcast_items(
        &self,
        root: usize,
        items: &[(*const c_void, Vec<*mut c_void>, usize)],
        streams: Streams,
        func: &str,
    ) -> Result<()> {
        let all = self.all_streams(streams);
        let ctxs = self.device_ctxs();
        match self.with_nccl(|c| c.broadcast(&ctxs, root, items, &all)) {
            Ok(r) => {
                crate::log_info!(
                    "{func}: NCCL path, {} devices, {} buffer(s)",
                    self.size(),
                    items.len()
                );
                r
            }
            Err(why) => {
                crate::log_info!(
                    "{func}: copies path ({why}), {} devices, {} buffer(s)",
                    self.size(),
                    items.len()
                );
                for (src, dsts, bytes) in items {
                    let from = self.member_end(root, *src, streams);
                    for (i, d) in dsts.iter().enumerate() {
                        copy_path::copy(&self.member_end(i, *d, streams), &from, *bytes)?;
                    }
                }
                Ok(())
            }
        }
    }
}

mod coalesced;
mod ops;
