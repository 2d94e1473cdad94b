//! Point-to-point: sends, receives and batches over Gloo's unbound
//! buffers, each transfer preceded by a (count, dtype) exchange so that a
//! size mismatch fails cleanly instead of terminating the process.

use super::*;

impl GlooBackend {
    pub(super) fn slot(kind: u64, seq: u64) -> u64 {
        (SLOT_PREFIX_P2P << 56) | (kind << 48) | (seq & 0xffff_ffff_ffff)
    }

    /// Point-to-point transfers issued together: first each transfer's
    /// (count, dtype) is exchanged with its peer, then the data of every
    /// transfer whose sides agree moves; disagreeing transfers fail on both
    /// sides without touching Gloo's data path.
    pub(super) unsafe fn p2p(&self, ops: &[P2p], d: &Deadline) -> Result<()> {
        let me = self.rank;
        let mut errors = Self::local_transfers(ops, me);
        let remote: Vec<&P2p> = ops.iter().filter(|o| o.peer != me).collect();
        if remote.is_empty() {
            return if errors.is_empty() {
                Ok(())
            } else {
                Err(Error::invalid_usage(errors.join("; ")))
            };
        }
        self.check_not_broken()?;
        self.gloo_remote(&remote, &mut errors, d)?;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid_usage(errors.join("; ")))
        }
    }

    /// Transfers to self pair up in order, like messages between ranks:
    /// copies them and returns the pairs that disagree.
    ///
    /// # Safety
    /// As for [`GlooBackend::p2p`].
    unsafe fn local_transfers(ops: &[P2p], me: i32) -> Vec<String> {
        let local_sends: Vec<&P2p> = ops.iter().filter(|o| o.peer == me && o.is_send).collect();
        let local_recvs: Vec<&P2p> = ops.iter().filter(|o| o.peer == me && !o.is_send).collect();
        let mut errors: Vec<String> = Vec::new();
        if local_sends.len() != local_recvs.len() {
            errors.push(format!(
                "{} sends to self but {} receives from self in one batch",
                local_sends.len(),
                local_recvs.len()
            ));
        } else {
            for (s, r) in local_sends.iter().zip(&local_recvs) {
                if s.count != r.count || s.dtype != r.dtype {
                    errors.push(format!(
                        "send of {} {} to self does not match the receive of {} {}",
                        s.count,
                        s.dtype.name(),
                        r.count,
                        r.dtype.name()
                    ));
                } else {
                    copy(r.buf.as_u8(), s.buf.as_u8(), s.count * s.dtype.size());
                }
            }
        }
        errors
    }

    /// The transfers to other ranks through Gloo: the (count, dtype)
    /// exchange, then the data of those that agree (others to `errors`).
    ///
    /// # Safety
    /// As for [`GlooBackend::p2p`].
    unsafe fn gloo_remote(
        &self,
        remote: &[&P2p],
        errors: &mut Vec<String>,
        d: &Deadline,
    ) -> Result<()> {
        // Sequence numbers per peer and direction.
        let seqs: Vec<u64> = {
            let mut s = lock(&self.seqs);
            remote
                .iter()
                .map(|o| {
                    let v = if o.is_send { &mut s.send } else { &mut s.recv };
                    let q = v[o.peer as usize];
                    v[o.peer as usize] += 1;
                    q
                })
                .collect()
        };
        let mut my_desc: Vec<[u64; 2]> = remote
            .iter()
            .map(|o| [o.count as u64, o.dtype.to_c() as u64])
            .collect();
        let mut their_desc: Vec<[u64; 2]> = vec![[u64::MAX; 2]; remote.len()];
        let mut transfers = Vec::with_capacity(remote.len() * 2);
        for (i, o) in remote.iter().enumerate() {
            let (mine_kind, theirs_kind) = if o.is_send {
                (SLOT_KIND_SENDER_DESC, SLOT_KIND_RECEIVER_DESC)
            } else {
                (SLOT_KIND_RECEIVER_DESC, SLOT_KIND_SENDER_DESC)
            };
            transfers.push(shim::Transfer {
                peer: o.peer,
                is_send: 1,
                buf: my_desc[i].as_mut_ptr() as *mut c_void,
                nbytes: 16,
                slot: Self::slot(mine_kind, seqs[i]),
            });
            transfers.push(shim::Transfer {
                peer: o.peer,
                is_send: 0,
                buf: their_desc[i].as_mut_ptr() as *mut c_void,
                nbytes: 16,
                slot: Self::slot(theirs_kind, seqs[i]),
            });
        }
        self.ctx()
            .p2p(&transfers, d.left()?)
            .map_err(|e| self.fail("point-to-point size exchange", e))?;
        transfers.clear();
        for (i, o) in remote.iter().enumerate() {
            if my_desc[i] != their_desc[i] {
                let dt = |v: u64| DType::ALL.get(v as usize).map_or("?", |d| d.name());
                let (verb, their_verb) = if o.is_send {
                    ("send of", "receive of")
                } else {
                    ("receive of", "send of")
                };
                errors.push(format!(
                    "{verb} {} {} {} rank {} does not match that rank's {their_verb} {} {}",
                    my_desc[i][0],
                    dt(my_desc[i][1]),
                    if o.is_send { "to" } else { "from" },
                    o.peer,
                    their_desc[i][0],
                    dt(their_desc[i][1])
                ));
                continue;
            }
            let bytes = o.count * o.dtype.size();
            if bytes == 0 {
                continue;
            }
            transfers.push(shim::Transfer {
                peer: o.peer,
                is_send: o.is_send as c_int,
                buf: o.buf.0,
                nbytes: bytes,
                slot: Self::slot(SLOT_KIND_DATA, seqs[i]),
            });
        }
        if !transfers.is_empty() {
            self.ctx()
                .p2p(&transfers, d.left()?)
                .map_err(|e| self.fail("point-to-point transfer", e))?;
        }
        Ok(())
    }

    /// Send, receive and batch through the shared-memory rings (see
    /// `intra_host::p2p`); transfers to self as on the Gloo path.
    ///
    /// # Safety
    /// As for [`GlooBackend::p2p`].
    pub(super) unsafe fn shm_p2p(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        d: &Deadline,
    ) -> Result<()> {
        let single;
        let ops: &[P2p] = match op {
            Op::Send {
                buf,
                count,
                dtype,
                peer,
            }
            | Op::Recv {
                buf,
                count,
                dtype,
                peer,
            } => {
                single = [P2p {
                    is_send: matches!(op, Op::Send { .. }),
                    buf: *buf,
                    count: *count,
                    dtype: *dtype,
                    peer: *peer,
                }];
                &single
            }
            Op::Batch { ops } => ops,
            _ => return Err(misrouted("point_to_point", op)),
        };
        let me = self.rank;
        let mut errors = Self::local_transfers(ops, me);
        let remote: Vec<intra_host::Transfer> = ops
            .iter()
            .filter(|o| o.peer != me)
            .map(|o| intra_host::Transfer {
                is_send: o.is_send,
                peer: o.peer as usize,
                // The op's tag once P2p carries one.
                tag: 0,
                buf: o.buf.as_u8(),
                count: o.count,
                dtype: o.dtype,
            })
            .collect();
        if !remote.is_empty() {
            self.check_not_broken()?;
            let alive = || self.check_not_broken();
            errors.extend(ih.point_to_point(&remote, d, &alive)?);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid_usage(errors.join("; ")))
        }
    }
}
