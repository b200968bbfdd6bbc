//! The io_uring send engine of [`super::AsyncSender`]: each GSO run (or
//! lone datagram) is one `SENDMSG_ZC` (or `SEND_ZC`) request, submitted in
//! batches; the request's own completion carries its result, its
//! notification says when the kernel is done with the pages.
//!
//! A request's buffers come back only once both have arrived (a failed
//! request's notification comes too), so a buffer is never the caller's
//! while the kernel may still read it. A run the kernel refuses is sent
//! again one datagram at a time after its notification, so that the error
//! lands on the datagram it belongs to.

use super::buf::SendBuf;
use super::inflight::Held;
use crate::sys::uring_send::{SendEvent, SendRing, ZcSend};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, RawFd};
use std::time::Duration;

/// One request: its datagrams and what the kernel said of it so far.
struct Request<B> {
    held: Held<B>,
    dst: Option<SocketAddr>,
    segment: Option<u16>,
    /// The request's own completion: bytes or errno, and whether a
    /// notification follows.
    sent: Option<(Result<usize, i32>, bool)>,
    /// The notification's copied flag, once it came.
    done: Option<bool>,
}

impl<B> Request<B> {
    fn finished(&self) -> bool {
        matches!(self.sent, Some((_, notif)) if !notif || self.done.is_some())
    }
}

/// A datagram the engine is done with: `(token, buffer, result, copied)`.
pub(super) type Finished<B> = (u64, B, Result<usize, i32>, bool);

pub(super) struct UringEngine<B> {
    ring: SendRing,
    next_tag: u64,
    requests: HashMap<u64, Request<B>>,
    datagrams: usize,
}

impl<B: SendBuf> UringEngine<B> {
    /// An engine for `sock`, which it switches to blocking: a full send
    /// buffer then makes io_uring wait for room instead of failing the send.
    pub(super) fn new(sock: &UdpSocket, max_in_flight: usize) -> io::Result<Self> {
        let ring = SendRing::new(sock.as_fd(), (2 * max_in_flight).min(1 << 16) as u32)?;
        sock.set_nonblocking(false)?;
        Ok(UringEngine { ring, next_tag: 1, requests: HashMap::new(), datagrams: 0 })
    }

    pub(super) fn fd(&self) -> RawFd {
        self.ring.fd()
    }

    pub(super) fn register(&mut self, regions: &[&[u8]]) -> io::Result<()> {
        self.ring.register(regions)
    }

    /// Datagrams whose buffers the kernel may still read.
    pub(super) fn datagrams(&self) -> usize {
        self.datagrams
    }

    /// Submits each group (a GSO run when its segment is set) as one request.
    pub(super) fn send(&mut self, groups: Vec<(Held<B>, Option<SocketAddr>, Option<u16>)>) -> io::Result<()> {
        let mut tags = Vec::with_capacity(groups.len());
        for (held, dst, segment) in groups {
            let tag = self.next_tag;
            self.next_tag += 1;
            self.datagrams += held.len();
            self.requests.insert(tag, Request { held, dst, segment, sent: None, done: None });
            tags.push(tag);
        }
        let requests = &self.requests;
        let sends: Vec<ZcSend<'_>> = tags
            .iter()
            .map(|t| {
                let r = &requests[t];
                let iov = r.held.iter().map(|(_, b, _)| io::IoSlice::new(b.bytes())).collect();
                ZcSend { tag: *t, dst: r.dst, iov, segment: r.segment }
            })
            .collect();
        self.ring.submit(&sends)
    }

    /// Reads the ring's completions; datagrams whose requests are finished
    /// go to `out`. Refused runs are sent again singly.
    pub(super) fn reap(&mut self, out: &mut Vec<Finished<B>>) -> io::Result<()> {
        self.ring.flush()?;
        let mut events = Vec::new();
        self.ring.reap(|e| events.push(e));
        let mut again = Vec::new();
        for e in events {
            let tag = match e {
                SendEvent::Sent { tag, result, notif } => {
                    if let Some(r) = self.requests.get_mut(&tag) {
                        r.sent = Some((result, notif));
                    }
                    tag
                }
                SendEvent::Done { tag, copied } => {
                    if let Some(r) = self.requests.get_mut(&tag) {
                        r.done = Some(copied);
                    }
                    tag
                }
            };
            if !self.requests.get(&tag).is_some_and(Request::finished) {
                continue;
            }
            let r = self.requests.remove(&tag).expect("a finished request");
            self.datagrams -= r.held.len();
            let (result, _) = r.sent.expect("finished requests have a result");
            match result {
                Err(_) if r.held.len() > 1 => {
                    again.extend(r.held.into_iter().map(|d| (vec![d], r.dst, None)));
                }
                Err(errno) => out.extend(r.held.into_iter().map(|(t, b, _)| (t, b, Err(errno), true))),
                Ok(_) => {
                    let copied = r.done.unwrap_or(true);
                    out.extend(r.held.into_iter().map(|(t, b, len)| (t, b, Ok(len), copied)));
                }
            }
        }
        if !again.is_empty() {
            self.send(again)?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for the ring's next completion.
    pub(super) fn wait(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.ring.wait(timeout)
    }

    /// Empties the engine without completing anything; the kernel may still
    /// read these buffers, so the caller must never free them.
    pub(super) fn abandon(&mut self) -> Vec<Held<B>> {
        self.datagrams = 0;
        self.requests.drain().map(|(_, r)| r.held).collect()
    }
}
