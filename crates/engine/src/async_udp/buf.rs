//! [`SendBuf`]: what a caller's send buffer must promise.

/// A buffer whose bytes stay at one address while it moves: the kernel
/// reads a zero-copy send's pages after the send call returns, so the bytes
/// must not move with the value that owns them (a `Vec`'s heap block does
/// not; an inline array would).
pub trait SendBuf: Send {
    fn bytes(&self) -> &[u8];
}

impl SendBuf for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl SendBuf for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}
