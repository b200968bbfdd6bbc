//! Where the engine's own file descriptors go.
//!
//! Every descriptor the engine keeps for itself (its epoll set, eventfds and
//! timerfds, the sockets of its backends) is made with [`new_private`] (or
//! adopted with [`private`]) and closed by dropping the [`Private`] that
//! holds it. Both go through a process-wide [`Placement`]: by default there
//! is none and a descriptor stays where the kernel put it. The preload shim installs one that moves these descriptors
//! out of the program's own range (above its soft `RLIMIT_NOFILE`), so a
//! program under the shim gets the descriptor numbers it would get on the
//! kernel and cannot close the engine's descriptors by number.

use std::io;
use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// A process-wide policy for the engine's own descriptors.
#[derive(Debug)]
pub struct Placement {
    /// Runs `make`, which creates one descriptor (or hands over one the
    /// engine was given), so that it can succeed even when the program's
    /// descriptors are at its limit, and returns the descriptor to keep: the
    /// one made, or a duplicate of it elsewhere (the original then closed).
    /// Fails only when `make` does.
    pub make: fn(&mut dyn FnMut() -> io::Result<OwnedFd>) -> io::Result<OwnedFd>,
    /// Called with a kept descriptor's number just before it is closed.
    pub release: fn(RawFd),
    /// Called with that number just after the close: between the two the
    /// number is neither the engine's (released) nor free (still open).
    pub closed: fn(RawFd),
    /// `dup3` onto a kept descriptor's number, past any interposed `dup3`
    /// that protects kept numbers from the program.
    pub dup3: fn(RawFd, RawFd, i32) -> i32,
    /// Whether a descriptor handed to [`private`] is kept already (the
    /// placement made it, as the shim's duplicate of a socket it adopts):
    /// then it stays as it is without a call of `make`, which would open a
    /// window around nothing (two to four syscalls per adoption).
    pub kept: fn(RawFd) -> bool,
}

static PLACEMENT: OnceLock<&'static Placement> = OnceLock::new();

/// Installs the process-wide placement; only the first call counts (returns
/// whether this one did).
pub fn set_placement(p: &'static Placement) -> bool {
    PLACEMENT.set(p).is_ok()
}

/// A descriptor-holding value `T` (an [`OwnedFd`], a `TcpStream`, …) whose
/// descriptor was placed by [`private`]; dropping it tells the placement
/// before and after the descriptor is closed.
#[derive(Debug)]
pub struct Private<T: AsRawFd> {
    // Declaration order is drop order: the release runs before `inner`
    // closes, `closed` after.
    #[allow(dead_code)] // held for its drop
    release: Tell,
    inner: T,
    #[allow(dead_code)] // held for its drop
    closed: Tell,
}

impl<T: AsRawFd> Private<T> {
    fn new(inner: T) -> Private<T> {
        let fd = inner.as_raw_fd();
        Private { release: Tell(fd, |p| p.release), inner, closed: Tell(fd, |p| p.closed) }
    }
}

/// Tells the placement (the callback `.1` picks) about descriptor `.0`
/// when dropped.
#[derive(Debug)]
struct Tell(RawFd, fn(&Placement) -> fn(RawFd));

impl Drop for Tell {
    fn drop(&mut self) {
        if let Some(p) = PLACEMENT.get() {
            (self.1)(p)(self.0);
        }
    }
}

/// A new descriptor of the engine's own: `make` creates it, through the
/// placement if there is one.
pub fn new_private<T: AsRawFd + From<OwnedFd> + Into<OwnedFd>>(
    make: impl FnOnce() -> io::Result<T>,
) -> io::Result<Private<T>> {
    let fd = match PLACEMENT.get() {
        Some(p) => {
            let mut make = Some(make);
            let mut once = || match make.take() {
                Some(f) => f().map(Into::into),
                None => Err(io::Error::other("descriptor already made")),
            };
            T::from((p.make)(&mut once)?)
        }
        None => make()?,
    };
    Ok(Private::new(fd))
}

/// Adopts a descriptor the engine was handed (or that a call like
/// `accept` made) as one of its own, through the placement if there is one.
/// Fails when the placement found no private number for it (its budget):
/// the placement has closed the descriptor then, rather than leave it on
/// one of the program's numbers.
pub fn private<T: AsRawFd + From<OwnedFd> + Into<OwnedFd>>(fd: T) -> io::Result<Private<T>> {
    let raw = fd.as_raw_fd();
    if PLACEMENT.get().is_some_and(|p| (p.kept)(raw)) {
        return Ok(Private::new(fd));
    }
    let mut fd = Some(fd);
    match new_private(|| fd.take().ok_or_else(|| io::Error::other("taken"))) {
        Ok(p) => Ok(p),
        Err(e) => match fd.take() {
            // Not taken: the descriptor keeps its number.
            Some(fd) => Ok(Private::new(fd)),
            None => Err(e),
        },
    }
}

/// The placement's `dup3` for kept numbers, if one is installed.
pub(crate) fn placement_dup3() -> Option<fn(RawFd, RawFd, i32) -> i32> {
    PLACEMENT.get().map(|p| p.dup3)
}

impl<T: AsRawFd> Private<T> {
    /// The same descriptor held as another type (`OwnedFd` into a
    /// `TcpStream`, say); `f` must keep the descriptor.
    pub fn map<U: AsRawFd>(self, f: impl FnOnce(T) -> U) -> Private<U> {
        let Private { release, inner, closed } = self;
        Private { release, inner: f(inner), closed }
    }
}

impl<T: AsRawFd> Deref for Private<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsRawFd> AsRawFd for Private<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl<T: AsRawFd + AsFd> AsFd for Private<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    static PLACED: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());
    static RELEASED: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());
    /// Each closed number with whether the watched peer (`PEER`) had
    /// seen the close by then (its read found end of file).
    static CLOSED: Mutex<Vec<(RawFd, bool)>> = Mutex::new(Vec::new());
    /// The other end of the first descriptor this test places, nonblocking.
    static PEER: Mutex<Option<std::os::unix::net::UnixStream>> = Mutex::new(None);

    /// Every other test of this process sees the placement too (and may
    /// reuse a closed number at once): the records tolerate a panic
    /// elsewhere rather than poison every later drop.
    fn rec<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn peer_saw_close() -> bool {
        use std::io::Read;
        rec(&PEER).as_mut().is_some_and(|p| matches!(p.read(&mut [0u8; 1]), Ok(0)))
    }

    // Keeps every descriptor where it is (harmless to the other tests of
    // this process, which see it too) and records the calls.
    static RECORD: Placement = Placement {
        make: |make| {
            let fd = make()?;
            rec(&PLACED).push(fd.as_raw_fd());
            Ok(fd)
        },
        release: |fd| rec(&RELEASED).push(fd),
        closed: |fd| {
            let seen = peer_saw_close();
            rec(&CLOSED).push((fd, seen));
        },
        // Not reached by this test.
        dup3: |_, _, _| -1,
        kept: |fd| rec(&PLACED).contains(&fd),
    };

    #[test]
    fn the_placement_sees_every_kept_descriptor_and_its_release_before_the_close() {
        set_placement(&RECORD);
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        *rec(&PEER) = Some(b);
        let raw = a.as_raw_fd();
        let p = private(OwnedFd::from(a)).unwrap();
        assert_eq!(p.as_raw_fd(), raw);
        assert!(rec(&PLACED).contains(&raw));
        assert!(!rec(&RELEASED).contains(&raw));
        drop(p);
        assert!(rec(&RELEASED).contains(&raw));
        // Told again once the descriptor is closed: by then its peer reads
        // end of file (the release came while it was still open).
        let closed = rec(&CLOSED).clone();
        *rec(&PEER) = None;
        assert!(closed.contains(&(raw, true)), "{closed:?}");
        // One the placement made already (as the shim's duplicates) is
        // adopted without another `make`; its drop is still told.
        let (c, _d) = std::os::unix::net::UnixStream::pair().unwrap();
        let raw = c.as_raw_fd();
        rec(&PLACED).push(raw);
        let placed = rec(&PLACED).len();
        let p = private(OwnedFd::from(c)).unwrap();
        assert_eq!(rec(&PLACED).len(), placed);
        assert_eq!(p.as_raw_fd(), raw);
        let told = || rec(&RELEASED).iter().filter(|&&f| f == raw).count();
        let before = told();
        drop(p);
        assert_eq!(told(), before + 1);
    }
}
