//! The store server's connections: a slab whose keys travel as epoll's
//! per-descriptor data, so an event finds its connection in O(1) however
//! many others are open, and the list of connections with replies to send,
//! so a loop turn touches only the connections that have work.

use std::net::TcpStream;
use std::time::Instant;

/// A connection's key: slot index in the low 32 bits, the slot's generation
/// in the high 32, so a stale event or wait never reaches a later occupant.
pub(super) type ConnId = u64;

pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) peer: String,
    pub(super) inbuf: Vec<u8>,
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    pub(super) validated: bool,
    /// Presented the token (or none is required).
    pub(super) authorized: bool,
    pub(super) eof: bool,
    pub(super) waits: Vec<u64>,
    /// When the backlog last shrank or was empty.
    pub(super) last_drain: Instant,
    /// The epoll events it is registered for.
    pub(super) interest: u32,
    /// Already in [`Conns::take_dirty`]'s list.
    dirty: bool,
}

impl Conn {
    pub(super) fn new(stream: TcpStream, peer: String, authorized: bool, interest: u32) -> Conn {
        Conn {
            stream,
            peer,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            validated: false,
            authorized,
            eof: false,
            waits: Vec::new(),
            last_drain: Instant::now(),
            interest,
            dirty: false,
        }
    }

    pub(super) fn backlog(&self) -> usize {
        self.out.len() - self.out_pos
    }
}

struct Slot {
    generation: u32,
    conn: Option<Conn>,
}

#[derive(Default)]
pub(super) struct Conns {
    slots: Vec<Slot>,
    free: Vec<u32>,
    len: usize,
    dirty: Vec<ConnId>,
}

fn split(id: ConnId) -> (usize, u32) {
    ((id & 0xffff_ffff) as usize, (id >> 32) as u32)
}

impl Conns {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Stores `conn`; its key is what `make_conn` is given, so it can be
    /// registered with epoll before it lands here.
    pub(super) fn insert_with<E>(
        &mut self,
        make_conn: impl FnOnce(ConnId) -> Result<Conn, E>,
    ) -> Result<ConnId, E> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    conn: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        let id = (u64::from(slot.generation) << 32) | u64::from(index);
        match make_conn(id) {
            Ok(c) => {
                slot.conn = Some(c);
                self.len += 1;
                Ok(id)
            }
            Err(e) => {
                self.free.push(index);
                Err(e)
            }
        }
    }

    pub(super) fn get(&self, id: ConnId) -> Option<&Conn> {
        let (index, generation) = split(id);
        let slot = self.slots.get(index)?;
        (slot.generation == generation).then_some(slot.conn.as_ref())?
    }

    pub(super) fn get_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        let (index, generation) = split(id);
        let slot = self.slots.get_mut(index)?;
        (slot.generation == generation).then_some(slot.conn.as_mut())?
    }

    pub(super) fn remove(&mut self, id: ConnId) -> Option<Conn> {
        let (index, generation) = split(id);
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let conn = slot.conn.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index as u32);
        self.len -= 1;
        Some(conn)
    }

    /// Queues `bytes` for connection `id` and remembers it has output.
    pub(super) fn reply(&mut self, id: ConnId, bytes: &[u8]) {
        self.mark(id);
        if let Some(c) = self.get_mut(id) {
            c.out.extend_from_slice(bytes);
        }
    }

    /// Remembers that `id` has work for the end of the loop turn.
    pub(super) fn mark(&mut self, id: ConnId) {
        if let Some(c) = self.get_mut(id) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(id);
            }
        }
    }

    /// The connections marked since the last call (each once).
    pub(super) fn take_dirty(&mut self) -> Vec<ConnId> {
        let ids = std::mem::take(&mut self.dirty);
        for id in &ids {
            if let Some(c) = self.get_mut(*id) {
                c.dirty = false;
            }
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn conn(l: &TcpListener) -> Conn {
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        Conn::new(s, "test".into(), true, 0)
    }

    #[test]
    fn a_reused_slot_does_not_answer_to_its_old_key() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conns = Conns::default();
        let a = conns.insert_with::<()>(|_| Ok(conn(&l))).unwrap();
        assert!(conns.remove(a).is_some());
        let b = conns.insert_with::<()>(|_| Ok(conn(&l))).unwrap();
        assert_eq!(a & 0xffff_ffff, b & 0xffff_ffff, "the slot is reused");
        assert!(conns.get(a).is_none() && conns.remove(a).is_none());
        conns.reply(a, b"x");
        assert!(conns.take_dirty().is_empty());
        conns.reply(b, b"x");
        conns.reply(b, b"y");
        assert_eq!(conns.take_dirty(), vec![b]);
        assert_eq!(conns.get(b).unwrap().out, b"xy");
        assert_eq!(conns.len(), 1);
    }
}
