//! Step stamps: each of the seven steps of [`crate::emp::stages`] records
//! its start and end per frame (per message for send bookkeeping) on the
//! tracepoints' clock, with the thread that ran it, while tracing is on
//! ([`crate::tracepoint::on`]). A stage holds a [`Step`] for its work; the
//! step is recorded when the guard drops, once the stage has named what it
//! worked on (a peer and a frame). Off, a step costs the switch's load and
//! the drop's test.
//!
//! A record is one [`Kind::EmpStep`] event: `ts` its end, `a` its start,
//! `b` the peer's address ([`pack_addr`]), `extra` the packed
//! [`StepRecord`] words. Before a thread's first record comes one
//! [`Kind::EmpThread`] event naming the thread's role, so that a reader
//! can check the placement against [`crate::emp::scheme::Scheme::placement`].

use crate::emp::scheme::Stage;
use crate::tracepoint::{on, pack_addr, span_end, span_mark, span_start, Kind};
use eudp_wire::emp::{Control, DataHeader, Frame};
use std::cell::Cell;
use std::net::SocketAddr;

/// The frame is a message's first.
pub const FIRST: u8 = 1;
/// The frame is a message's last.
pub const LAST: u8 = 2;
/// The frame is an acknowledgment (its `seq` is the acknowledgment's `next`).
pub const CONTROL: u8 = 4;
/// The acknowledgment is negative.
pub const NAK: u8 = 8;
/// The record is a whole message (send bookkeeping; `seq` is its length).
pub const MESSAGE: u8 = 16;

/// [`Kind::EmpThread`]'s role of a thread that is no engine thread.
pub const ROLE_APPLICATION: u64 = 0;

thread_local! {
    static LABELLED: Cell<bool> = const { Cell::new(false) };
}

/// One step in progress; recorded when dropped if tracing was on at its
/// start and the stage named its frame.
#[derive(Debug)]
#[must_use = "a step is recorded when it drops"]
pub struct Step {
    start: u64,
    stage: Stage,
    peer: u64,
    seq: u32,
    flags: u8,
}

impl Step {
    /// Starts step `stage` now.
    #[inline(always)]
    pub fn begin(stage: Stage) -> Self {
        let start = if on() { start_on_thread() } else { 0 };
        Step { start, stage, peer: 0, seq: 0, flags: 0 }
    }

    /// True while this step is being recorded.
    #[inline(always)]
    fn live(&self) -> bool {
        self.start != 0
    }

    /// The step worked on data frame `h` (`len` payload bytes) of `peer`.
    #[inline]
    pub fn data(&mut self, peer: SocketAddr, h: &DataHeader, len: usize) {
        if self.live() {
            let last = h.offset as usize + len == h.msg_len as usize;
            self.name(peer, h.seq, if h.offset == 0 { FIRST } else { 0 } | if last { LAST } else { 0 });
        }
    }

    /// The step worked on an acknowledgment (`nak`: a negative one) of `peer`.
    #[inline]
    pub fn control(&mut self, peer: SocketAddr, c: &Control, nak: bool) {
        if self.live() {
            self.name(peer, c.next, CONTROL | if nak { NAK } else { 0 });
        }
    }

    /// The step worked on `frame` from `peer`.
    #[inline]
    pub fn frame(&mut self, peer: SocketAddr, frame: &Frame<'_>) {
        match frame {
            Frame::Data(d) => self.data(peer, &d.header, d.payload.len()),
            Frame::Ack(c) => self.control(peer, c, false),
            Frame::Nak(c) => self.control(peer, c, true),
        }
    }

    /// The step took a message of `len` bytes for the peer `peer` finds
    /// (looked up only while recording).
    #[inline]
    pub fn message(&mut self, peer: impl FnOnce() -> Option<SocketAddr>, len: usize) {
        if self.live() {
            if let Some(a) = peer() {
                self.name(a, len.min(u32::MAX as usize) as u32, MESSAGE);
            }
        }
    }

    fn name(&mut self, peer: SocketAddr, seq: u32, flags: u8) {
        self.peer = pack_addr(Some(peer));
        self.seq = seq;
        self.flags = flags;
    }
}

impl Drop for Step {
    #[inline]
    fn drop(&mut self) {
        if self.live() && self.peer != 0 {
            record(self);
        }
    }
}

/// A step's start; a thread's first also names the thread's role, which
/// creates its event buffer before the step's clock starts.
#[inline(never)]
fn start_on_thread() -> u64 {
    if !LABELLED.with(Cell::get) {
        LABELLED.with(|c| c.set(true));
        span_mark(Kind::EmpThread, thread_role(std::thread::current().name()));
    }
    span_start()
}

#[inline(never)]
fn record(s: &Step) {
    let rec = StepRecord { stage: s.stage, seq: s.seq, flags: s.flags };
    span_end(Kind::EmpStep, s.start, rec.pack(), s.peer);
}

/// The role of a thread by its name: 1 + the engine thread's index
/// (`eudp-emp` for the base scheme's, `eudp-emp-SCHEME-I` for the
/// others'), [`ROLE_APPLICATION`] for any other thread.
pub fn thread_role(name: Option<&str>) -> u64 {
    match name {
        Some("eudp-emp") => 1,
        Some(n) if n.starts_with("eudp-emp-") => {
            n.rsplit('-').next().and_then(|i| i.parse::<u64>().ok()).map_or(ROLE_APPLICATION, |i| i + 1)
        }
        _ => ROLE_APPLICATION,
    }
}

/// The words of one step record, as `extra` packs them: the frame's
/// sequence number (bits 0–31), the stage (32–34), the flags (35–39).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRecord {
    pub stage: Stage,
    pub seq: u32,
    pub flags: u8,
}

impl StepRecord {
    pub fn pack(self) -> u64 {
        u64::from(self.seq) | (self.stage as u64) << 32 | u64::from(self.flags & 0x1f) << 35
    }

    pub fn unpack(extra: u64) -> Option<Self> {
        let stage = *Stage::ALL.get(((extra >> 32) & 7) as usize)?;
        Some(StepRecord { stage, seq: extra as u32, flags: ((extra >> 35) & 0x1f) as u8 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_pack_and_roles_parse() {
        for stage in Stage::ALL {
            let r = StepRecord { stage, seq: u32::MAX - 3, flags: FIRST | LAST | NAK };
            assert_eq!(StepRecord::unpack(r.pack()), Some(r));
            assert!(r.pack() < 1 << 40);
        }
        assert_eq!(thread_role(Some("eudp-emp")), 1);
        assert_eq!(thread_role(Some("eudp-emp-ro-1")), 2);
        assert_eq!(thread_role(Some("main")), ROLE_APPLICATION);
        assert_eq!(thread_role(None), ROLE_APPLICATION);
    }
}
