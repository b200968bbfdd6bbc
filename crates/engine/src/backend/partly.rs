//! The error of a batch send that stopped inside a message: how a backend
//! tells the engine that the first datagrams of a GSO message went out and
//! the rest waits for room.

use std::io;

/// The first `datagrams` datagrams of a message went out before the
/// kernel's send buffer filled (a split GSO message, see
/// [`super::kernel::UdpSocket::send_batch_nowait`]); the rest was not sent.
#[derive(Debug)]
pub struct PartlySent {
    pub datagrams: usize,
}

impl std::fmt::Display for PartlySent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "send buffer full after {} datagrams of the message", self.datagrams)
    }
}

impl std::error::Error for PartlySent {}

/// `e` as is when nothing was sent, else `WouldBlock` carrying [`PartlySent`]
/// when `e` is a full send buffer (other errors after a partial send are
/// returned as they are: the caller drops the rest).
pub(crate) fn partly(sent: usize, e: io::Error) -> io::Error {
    if sent == 0 || e.kind() != io::ErrorKind::WouldBlock {
        return e;
    }
    io::Error::new(io::ErrorKind::WouldBlock, PartlySent { datagrams: sent })
}

/// The error a backend returns when only the first `datagrams` datagrams
/// of a GSO message went out (read back with [`partly_sent`]).
pub fn partly_sent_error(datagrams: usize) -> io::Error {
    partly(datagrams, io::ErrorKind::WouldBlock.into())
}

/// The datagrams of the first message that went out, when a send failed
/// with [`PartlySent`].
pub fn partly_sent(e: &io::Error) -> Option<usize> {
    e.get_ref().and_then(|x| x.downcast_ref::<PartlySent>()).map(|p| p.datagrams)
}
