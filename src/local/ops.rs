//! reduce_add, scatter and gather of a device group.

use super::check::{bytes_of, disjoint, on_place, sum_counts, torch_chunks, Place, Span};
use super::copy_path::{self, End};
use super::nccl_path::{self, ReduceItem};
use super::{index_arg, LocalGroup, Streams};
use crate::cuda::RawStream;
use crate::error::{Error, Result};
use crate::types::DType;
use std::ffi::c_void;

impl LocalGroup {
    /// Every member must be a CUDA device (reduce_add, as torch).
    pub(super) fn all_cuda(&self, func: &str) -> Result<()> {
        match self.places.iter().position(|p| *p == Place::Cpu) {
            Some(i) => Err(Error::invalid_argument(format!(
                "argument 'g': member {i} of the group is the CPU; {func} takes CUDA devices only"
            ))),
            None => Ok(()),
        }
    }

    /// Checks the sources (`srcs[i]` on member i) and destination of one
    /// sum, adding their spans; the destination may be `srcs[root]`.
    pub(super) fn check_sum(
        &self,
        srcs: &[*const c_void],
        dst: *mut c_void,
        root: usize,
        bytes: usize,
        names: (&dyn Fn(usize) -> String, &str),
        spans: &mut Vec<Span>,
    ) -> Result<()> {
        for (i, s) in srcs.iter().enumerate() {
            let name = names.0(i);
            on_place(*s, bytes, self.places[i], &name)?;
            spans.push(Span::new(*s, bytes, name, false));
        }
        on_place(dst, bytes, self.places[root], names.1)?;
        if !std::ptr::eq(dst as *const c_void, srcs[root]) {
            spans.push(Span::new(dst, bytes, names.1.to_string(), true));
        }
        Ok(())
    }

    /// `dst` (on member `root`) = the sum of `srcs[i]` (on member i).
    pub fn reduce_add(
        &self,
        srcs: &[*const c_void],
        count: usize,
        dtype: DType,
        dst: *mut c_void,
        root: usize,
        streams: Streams,
    ) -> Result<()> {
        self.all_cuda("tc_local_reduce_add")?;
        index_arg(root, self.size(), "dst_index")?;
        let bytes = bytes_of(count, dtype, "count")?;
        let mut spans = Vec::new();
        self.check_sum(
            srcs,
            dst,
            root,
            bytes,
            (&|i| format!("srcs[{i}]"), "dst"),
            &mut spans,
        )?;
        disjoint(spans)?;
        if bytes == 0 {
            return Ok(());
        }
        let item = [(srcs.to_vec(), dst, count, dtype)];
        self.reduce_items(root, &item, streams, "tc_local_reduce_add")
    }

    /// Issues checked sums into `root` on the NCCL path when it can, else as
    /// copies with the sum on pinned staging.
    pub(super) fn reduce_items(
        &self,
        root: usize,
        items: &[(Vec<*const c_void>, *mut c_void, usize, DType)],
        streams: Streams,
        func: &str,
    ) -> Result<()> {
        let nccl_items: Option<Vec<ReduceItem>> = items
            .iter()
            .map(|(srcs, dst, count, dt)| {
                nccl_path::sum_type(*dt).map(|types| ReduceItem {
                    srcs: srcs.clone(),
                    dst: *dst,
                    count: *count,
                    types,
                })
            })
            .collect();
        let all = self.all_streams(streams);
        let ctxs = self.device_ctxs();
        let outcome = match &nccl_items {
            Some(list) => self.with_nccl(|c| c.reduce(&ctxs, root, list, &all)),
            None => Err("a data type this NCCL cannot sum".to_string()),
        };
        match outcome {
            Ok(r) => {
                crate::log_info!(
                    "{func}: NCCL path, {} devices, {} sum(s)",
                    self.size(),
                    items.len()
                );
                r
            }
            Err(why) => {
                crate::log_info!(
                    "{func}: copies path ({why}), {} devices, {} sum(s)",
                    self.size(),
                    items.len()
                );
                for (_, _, _, dt) in items {
                    copy_path::sum_kernel(*dt)?;
                }
                for (srcs, dst, count, dt) in items {
                    let ends: Vec<End> = srcs
                        .iter()
                        .enumerate()
                        .map(|(i, s)| self.member_end(i, *s, streams))
                        .collect();
                    let to = self.member_end(root, *dst, streams);
                    copy_path::reduce_add(&ends, &to, *count, *dt, &self.staging)?;
                }
                Ok(())
            }
        }
    }

    /// Splits `count` elements at `src` (on `src_place`) along dimension 0
    /// into `dsts[i]` on member i: `chunk_counts` elements each, or
    /// torch.chunk's split when None.
    #[allow(clippy::too_many_arguments)]
    pub fn scatter(
        &self,
        src: *const c_void,
        src_place: Place,
        count: usize,
        dtype: DType,
        chunk_counts: Option<&[usize]>,
        dsts: &[*mut c_void],
        streams: Streams,
    ) -> Result<()> {
        let bytes = bytes_of(count, dtype, "count")?;
        let from = self.place_end(
            src_place,
            src,
            self.stream_on(src_place, streams),
            "src_device",
        )?;
        let chunks = match chunk_counts {
            Some(c) => {
                let total = sum_counts(c, "chunk_counts")?;
                if total != count {
                    return Err(Error::invalid_argument(format!(
                        "argument 'chunk_counts': the chunks hold {total} elements, count is {count}"
                    )));
                }
                c.to_vec()
            }
            None => torch_chunks(count, self.size()),
        };
        on_place(src, bytes, src_place, "src")?;
        let mut spans = vec![Span::new(src, bytes, "src".into(), false)];
        for (i, d) in dsts.iter().enumerate() {
            let name = format!("dsts[{i}]");
            let b = chunks[i] * dtype.size();
            on_place(*d, b, self.places[i], &name)?;
            spans.push(Span::new(*d, b, name, true));
        }
        disjoint(spans)?;
        crate::log_info!(
            "tc_local_scatter: copies path, {} devices, chunks {chunks:?}",
            self.size()
        );
        let mut offset = 0;
        for (i, d) in dsts.iter().enumerate() {
            let b = chunks[i] * dtype.size();
            // SAFETY: inside the checked source buffer.
            let part = End {
                ptr: unsafe { src.cast::<u8>().add(offset) } as *mut c_void,
                ..from.clone()
            };
            copy_path::copy(&self.member_end(i, *d, streams), &part, b)?;
            offset += b;
        }
        Ok(())
    }

    /// Concatenates `srcs[i]` (`counts[i]` elements on member i) in member
    /// order into `dst` on `dst_place`, ordered on `stream` there.
    pub fn gather(
        &self,
        srcs: &[*const c_void],
        counts: &[usize],
        dtype: DType,
        dst: *mut c_void,
        dst_place: Place,
        stream: RawStream,
    ) -> Result<()> {
        let to = self.place_end(dst_place, dst, stream, "dst_device")?;
        let total = sum_counts(counts, "counts")?;
        let bytes = bytes_of(total, dtype, "counts")?;
        on_place(dst, bytes, dst_place, "dst")?;
        let mut spans = vec![Span::new(dst, bytes, "dst".into(), true)];
        for (i, s) in srcs.iter().enumerate() {
            let name = format!("srcs[{i}]");
            let b = counts[i] * dtype.size();
            on_place(*s, b, self.places[i], &name)?;
            spans.push(Span::new(*s, b, name, false));
        }
        disjoint(spans)?;
        crate::log_info!(
            "tc_local_gather: copies path, {} devices into {dst_place}",
            self.size()
        );
        // Sources are ordered on their device's legacy stream, or on
        // `stream` when they live on the destination's device.
        let mut offset = 0;
        for (i, s) in srcs.iter().enumerate() {
            let b = counts[i] * dtype.size();
            let mut from = self.member_end(i, *s, Streams(None));
            if from.place == dst_place {
                from.stream = stream;
            }
            // SAFETY: inside the checked destination buffer.
            let part = End {
                ptr: unsafe { dst.cast::<u8>().add(offset) }.cast(),
                ..to.clone()
            };
            copy_path::copy(&part, &from, b)?;
            offset += b;
        }
        Ok(())
    }
}
