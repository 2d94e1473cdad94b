//! The ring all-reduce (reduce-scatter, then all-gather) with every block
//! sent in segments: a rank combines (or keeps) each segment as it arrives
//! and at once sends it on to the right-hand neighbour for the next step,
//! so that the steps overlap and the combine runs while the next segments
//! travel. Over TCP a 2-rank 64 MiB all_reduce otherwise waits for a whole
//! 32 MiB block, combines it with the network idle, and only then starts
//! the all-gather.
//!
//! Step s (0 .. 2(n - 1)) sends block `me - s - 1` and receives block
//! `me - s - 2` (mod n): the block received in step s is the one sent in
//! step s + 1, segment by segment. Every segment of one step has the same
//! tag: UCX matches a sender's messages of one tag in the order sent.

use super::{blocks, combine, Ctx, ReduceFn, Request};
use crate::error::Result;

/// Bytes of one segment: small enough that UCX over TCP sends it eagerly
/// in one message (`Worker::open` makes messages of up to 64 KiB and the
/// check header eager; one of 64 KiB already goes in two fragments of
/// UCX's 64 KiB receive segment), so that a segment costs no rendezvous
/// round trip and the first ones arrive while the rest are still sent.
/// 2-rank all_reduce over TCP loopback, 10-12 interleaved rounds on this
/// loaded 2-core VM, medians, us: 1 MiB 770-897 with 512 KiB segments
/// (one rendezvous per block), 936 with 128 KiB, 569-749 with 62 KiB,
/// 1,078-1,121 with 64 KiB and 65,472 B (two fragments); 4 MiB 4,916
/// against 3,746, 64 MiB 89.7 against 84.6 ms; 4 ranks 4 MiB 17.0 against
/// 10.8 ms. The same on every rank whatever its transport: the ranks'
/// segments must match.
const SEGMENT_BYTES: usize = 62 << 10;

impl Ctx<'_> {
    /// All-reduce of `count` elements of `es` bytes at `buf` (`count` at
    /// least the rank count).
    pub(super) unsafe fn ring_all_reduce(
        &mut self,
        buf: *mut u8,
        count: usize,
        es: usize,
        f: ReduceFn,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let (right, left) = ((me + 1) % n, (me + n - 1) % n);
        let (counts, offsets) = blocks(count, n);
        let per_segment = (SEGMENT_BYTES / es).max(1);
        let counts = &counts;
        // (element offset in the block, element count) of each segment.
        let segments = |b: usize| {
            (0..counts[b])
                .step_by(per_segment)
                .map(move |at| (at, per_segment.min(counts[b] - at)))
        };
        let at = |b: usize, from: usize| buf.add((offsets[b] + from) * es);
        let steps = 2 * (n - 1);
        let sent = |s: usize| (me + 2 * n - s - 1) % n;
        let received = |s: usize| (me + 2 * n - s - 2) % n;
        let tmp = self.spare.at_least(counts[0] * es);

        // A block of one small segment travels inside the check message
        // (`check.rs`), as the other rings' first messages do.
        let first = sent(0);
        let whole: Vec<_> = match counts[first] <= per_segment {
            true => vec![(right, at(first, 0) as *const u8, counts[first] * es)],
            false => Vec::new(),
        };
        let mut sends: Vec<Request> = match self.send_check(0, &whole) {
            Some(_) => Vec::new(),
            None => segments(first)
                .map(|(from, c)| self.w.send(right, at(first, from), c * es, self.tag(me, 0)))
                .collect(),
        };
        self.await_check(&mut sends)?;
        for s in 0..steps {
            let b = received(s);
            let reduce = s < n - 1;
            let into = if reduce { tmp } else { at(b, 0) };
            let mut reqs: Vec<Request> = Vec::new();
            for (from, c) in segments(b) {
                let (buf, len) = (into.add(from * es), c * es);
                match (s == 0)
                    .then(|| self.take_folded(0, (left, buf, len)))
                    .flatten()
                {
                    Some(Ok(())) => {
                        let mut r = Request::posted(std::ptr::null_mut(), left, true);
                        r.info.length = len;
                        reqs.push(r);
                    }
                    Some(Err(e)) => {
                        reqs.append(&mut sends);
                        self.w.withdraw(&mut reqs, &e);
                        return Err(e);
                    }
                    None => reqs.push(self.w.recv(left, buf, len, (self.tag(left, s as u64), !0))),
                }
            }
            let (posted, this_step) = (reqs.len(), sends.len());
            reqs.append(&mut sends);
            for (i, (from, c)) in segments(b).enumerate() {
                if let Err(e) = self.w.wait(&mut reqs[i..=i], self.d, self.alive, self.what) {
                    self.w.withdraw(&mut reqs, &e);
                    return Err(e);
                }
                if reqs[i].info.length != c * es {
                    let e = self.size_mismatch(left, reqs[i].info.length, c * es);
                    self.w.withdraw(&mut reqs, &e);
                    return Err(e);
                }
                if reduce {
                    combine(f, at(b, from), tmp.add(from * es), c);
                }
                if s + 1 < steps {
                    let t = self.tag(me, s as u64 + 1);
                    reqs.push(self.w.send(right, at(b, from), c * es, t));
                }
            }
            // This step's sends (posted in the previous step) are done
            // before the next step receives into their blocks.
            let own = posted + this_step;
            if let Err(e) = self
                .w
                .wait(&mut reqs[posted..own], self.d, self.alive, self.what)
            {
                self.w.withdraw(&mut reqs, &e);
                return Err(e);
            }
            sends = reqs.split_off(own);
        }
        Ok(())
    }
}
