//! Where a posted receive's bytes land: a buffer the engine allocates, the
//! caller's own vector, or caller memory by address (the C ABI). Frames
//! are copied straight to their offset in it, so a message the caller's
//! buffer takes is copied once, from the frame.

use crate::emp::completion::{Completion, Op, Status};
use crate::emp::peer::PeerId;
use crate::sys::user_buffer::UserBuffer;

/// The buffer of a posted receive.
#[derive(Debug)]
pub enum RecvBuffer {
    /// The engine allocates up to `capacity` bytes as frames arrive; the
    /// completion's `data` holds them.
    Alloc { capacity: usize, data: Vec<u8> },
    /// The caller's vector: bytes land from index 0 up to its length, and
    /// the completion's `data` hands it back.
    Vec(Vec<u8>),
    /// Caller memory by address; the completion hands nothing back (the
    /// bytes are in place).
    User(UserBuffer),
}

impl RecvBuffer {
    /// A buffer the engine allocates, of up to `capacity` bytes.
    pub fn alloc(capacity: usize) -> RecvBuffer {
        RecvBuffer::Alloc { capacity, data: Vec::new() }
    }

    /// Bytes of a message the buffer takes; the rest is truncated.
    pub fn capacity(&self) -> usize {
        match self {
            RecvBuffer::Alloc { capacity, .. } => *capacity,
            RecvBuffer::Vec(v) => v.len(),
            RecvBuffer::User(u) => u.len(),
        }
    }

    /// A message of `msg_len` bytes starts (again, after an abandoned one).
    pub fn start(&mut self, msg_len: usize) {
        if let RecvBuffer::Alloc { capacity, data } = self {
            data.clear();
            data.reserve_exact((*capacity).min(msg_len));
        }
    }

    /// A frame's bytes at `offset` of the message (frames come in order);
    /// what lies beyond the capacity is dropped.
    pub fn place(&mut self, offset: usize, bytes: &[u8]) {
        let n = self.capacity().saturating_sub(offset).min(bytes.len());
        if n == 0 {
            return;
        }
        match self {
            // In order, the bytes so far end at this offset.
            RecvBuffer::Alloc { data, .. } => data.extend_from_slice(&bytes[..n]),
            RecvBuffer::Vec(v) => v[offset..offset + n].copy_from_slice(&bytes[..n]),
            RecvBuffer::User(u) => {
                u.write(offset, &bytes[..n]);
            }
        }
    }

    /// A whole message received elsewhere (the unexpected queue) into this
    /// buffer; an allocated one takes the vector itself, shortened.
    fn fill(&mut self, mut whole: Vec<u8>) {
        match self {
            RecvBuffer::Alloc { capacity, data } => {
                whole.truncate(*capacity);
                *data = whole;
            }
            _ => {
                self.start(whole.len());
                self.place(0, &whole);
            }
        }
    }

    /// The completion's `data` once `placed` bytes of a message landed:
    /// the allocated bytes; the caller's vector shortened to them (its
    /// allocation kept); empty for caller memory.
    fn into_data(self, placed: usize) -> Vec<u8> {
        match self {
            RecvBuffer::Alloc { data, .. } => data,
            RecvBuffer::Vec(mut v) => {
                v.truncate(placed);
                v
            }
            RecvBuffer::User(_) => Vec::new(),
        }
    }

    /// The completion's `data` of a receive no message reached: the
    /// caller's vector as posted.
    fn unused(self) -> Vec<u8> {
        match self {
            RecvBuffer::Vec(v) => v,
            _ => Vec::new(),
        }
    }
}

/// A receive's completion once its message of `len` bytes with `tag` from
/// `peer` landed in `buffer`: `Truncated` (with the message's true length
/// in `len`) when the buffer was shorter.
pub fn received(context: u64, buffer: RecvBuffer, peer: PeerId, tag: u64, len: usize) -> Completion {
    let capacity = buffer.capacity();
    let status = if len > capacity { Status::Truncated } else { Status::Ok };
    let data = buffer.into_data(len.min(capacity));
    Completion { op: Op::Recv, status, context, peer: Some(peer), tag, len, data }
}

/// A queued unexpected message handed to a receive posted later: copied
/// into the receive's buffer.
pub fn received_whole(context: u64, mut buffer: RecvBuffer, peer: PeerId, tag: u64, whole: Vec<u8>) -> Completion {
    let len = whole.len();
    buffer.fill(whole);
    received(context, buffer, peer, tag, len)
}

/// A receive that ends without a message (`Canceled`, `Closed`): the
/// caller's vector comes back as posted.
pub fn unmatched(context: u64, buffer: RecvBuffer, tag: u64, status: Status) -> Completion {
    Completion { op: Op::Recv, status, context, peer: None, tag, len: 0, data: buffer.unused() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_land_at_their_offsets_and_the_rest_is_truncated() {
        let mut b = RecvBuffer::Vec(vec![0xEE; 5]);
        b.start(7);
        b.place(0, &[1, 2, 3]);
        b.place(3, &[4, 5, 6]);
        b.place(6, &[7]);
        let c = received(9, b, PeerId(1), 4, 7);
        assert_eq!((c.status, c.len, c.data), (Status::Truncated, 7, vec![1, 2, 3, 4, 5]));
        let mut a = RecvBuffer::alloc(64);
        a.start(4);
        a.place(0, &[1, 2]);
        a.place(2, &[3, 4]);
        let c = received(9, a, PeerId(1), 4, 4);
        assert_eq!((c.status, c.len, c.data), (Status::Ok, 4, vec![1, 2, 3, 4]));
        let c = received_whole(1, RecvBuffer::Vec(vec![0; 3]), PeerId(2), 5, vec![8, 9]);
        assert_eq!((c.status, c.len, c.data), (Status::Ok, 2, vec![8, 9]));
        let c = unmatched(1, RecvBuffer::Vec(vec![7; 3]), 5, Status::Canceled);
        assert_eq!((c.status, c.len, c.data), (Status::Canceled, 0, vec![7; 3]));
    }
}
