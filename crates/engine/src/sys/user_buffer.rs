//! Caller memory that a posted EMP receive writes into by address (the C
//! ABI's `eudp_emp_trecv`): the one place the engine writes through a
//! pointer it did not allocate.

use std::ptr::NonNull;

/// `len` writable bytes at a caller's address, the engine's to write from
/// the receive's post until its completion is handed back.
#[derive(Debug)]
pub struct UserBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is owned by the receive it was posted with (the
// contract of `UserBuffer::new`), which one thread at a time holds under
// the runtime's lock; moving that ownership between threads is sound.
unsafe impl Send for UserBuffer {}

impl UserBuffer {
    /// The buffer of `len` bytes at `ptr`; `None` for a null `ptr` with a
    /// non-zero `len`, or a `len` beyond `isize::MAX`.
    ///
    /// # Safety
    /// `ptr` is writable for `len` bytes, and nothing else reads or writes
    /// them until this value is dropped (the receive's completion handed
    /// back, or the endpoint shut down).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Option<UserBuffer> {
        if len > isize::MAX as usize {
            return None;
        }
        let ptr = match NonNull::new(ptr) {
            Some(p) => p,
            None if len == 0 => NonNull::dangling(),
            None => return None,
        };
        Some(UserBuffer { ptr, len })
    }

    /// Bytes the buffer holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's address (as posted).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Copies `bytes` to `offset`; what lies beyond the buffer's end is
    /// left out. Returns the bytes copied.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> usize {
        let n = self.len.saturating_sub(offset).min(bytes.len());
        if n > 0 {
            // SAFETY: `offset + n <= len`, so the range lies within the
            // caller's `len` writable bytes, which only this value writes
            // (the contract of `new`); `bytes` is a live borrow that cannot
            // overlap memory the caller handed over.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(offset), n) };
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_stay_within_the_buffer() {
        let mut mem = [0u8; 8];
        {
            // SAFETY: `mem` outlives `b` and is not touched while `b` lives.
            let mut b = unsafe { UserBuffer::new(mem.as_mut_ptr(), 6) }.unwrap();
            assert_eq!(b.write(0, &[1, 2, 3, 4]), 4);
            assert_eq!(b.write(4, &[5, 6, 7, 8]), 2);
            assert_eq!(b.write(9, &[9]), 0);
        }
        assert_eq!(mem, [1, 2, 3, 4, 5, 6, 0, 0]);
        // SAFETY: null with length 0 is refused nowhere and written never.
        assert!(unsafe { UserBuffer::new(std::ptr::null_mut(), 0) }.is_some());
        // SAFETY: refused before any use.
        assert!(unsafe { UserBuffer::new(std::ptr::null_mut(), 1) }.is_none());
    }
}
