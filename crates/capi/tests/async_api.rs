//! The asynchronous C ABI called from Rust over loopback (127.0.0.1 only):
//! several threads waiting on one sender while another sends.

use eudp_capi::*;
use libc::{sockaddr, sockaddr_in, socklen_t, AF_INET};
use std::mem::size_of;
use std::net::UdpSocket;
use std::ptr::null;
use std::sync::mpsc;
use std::time::Duration;

fn sin(port: u16) -> sockaddr_in {
    sockaddr_in {
        sin_family: AF_INET as _,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes([127, 0, 0, 1]) },
        sin_zero: [0; 8],
    }
}

/// A sender handle that may cross threads (the C ABI allows it).
#[derive(Clone, Copy)]
struct Handle(*mut eudp_async);
// SAFETY: the C ABI documents its handles as usable from several threads.
unsafe impl Send for Handle {}

/// Opens a sender with `flags` connected to `peer`, or `None` where this
/// engine is not in the kernel.
fn open(peer: u16, flags: u32) -> Option<Handle> {
    let lo = sin(0);
    let p = sin(peer);
    let cfg = eudp_async_config { max_in_flight: 16, flags };
    let len = size_of::<sockaddr_in>() as socklen_t;
    // SAFETY: live addresses and config for the call.
    let h = unsafe {
        eudp_async_open(
            (&lo as *const sockaddr_in).cast::<sockaddr>(),
            len,
            (&p as *const sockaddr_in).cast::<sockaddr>(),
            len,
            &cfg,
        )
    };
    if h.is_null() {
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EOPNOTSUPP));
        eprintln!("SKIPPED flags {flags}: engine not in this kernel");
        return None;
    }
    Some(Handle(h))
}

#[test]
fn waiters_on_one_sender_do_not_block_its_sends_and_all_wake() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = rx.local_addr().unwrap().port();
    for flags in [0, EUDP_ASYNC_URING] {
        let Some(h) = open(port, flags) else { continue };
        // Two threads wait without limit on a sender with nothing in flight.
        let (woke_tx, woke) = mpsc::channel();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let woke_tx = woke_tx.clone();
                std::thread::spawn(move || {
                    let h = h;
                    // SAFETY: a live handle (closed only after the join).
                    let r = unsafe { eudp_async_wait(h.0, -1) };
                    woke_tx.send(r).unwrap();
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        // A send while they wait goes through (the wait holds no lock) ...
        let (sent_tx, sent) = mpsc::channel();
        let buf = vec![7u8; 100];
        let sender = {
            let p = buf.as_ptr() as usize;
            std::thread::spawn(move || {
                let h = h;
                let m = eudp_async_msg { buf: p as *const _, len: 100, addr: null(), addrlen: 0, token: 42 };
                // SAFETY: a live handle; the buffer outlives its completion (read below).
                sent_tx.send(unsafe { eudp_async_send(h.0, &m, 1) }).unwrap();
            })
        };
        assert_eq!(sent.recv_timeout(Duration::from_secs(10)), Ok(1), "a send blocked behind a waiter");
        // ... and its completion wakes every waiter, none collecting it.
        for _ in 0..2 {
            assert_eq!(woke.recv_timeout(Duration::from_secs(10)), Ok(1), "a waiter did not wake");
        }
        sender.join().unwrap();
        for w in waiters {
            w.join().unwrap();
        }
        let mut c = [eudp_async_completion { token: 0, buf: null(), result: 0, flags: 0, reserved: 0 }; 4];
        // SAFETY: a live handle; `c` has room for 4.
        assert_eq!(unsafe { eudp_async_completions(h.0, c.as_mut_ptr(), 4) }, 1);
        assert_eq!((c[0].token, c[0].result), (42, 100));
        // SAFETY: a live handle, not used afterwards.
        assert_eq!(unsafe { eudp_async_close(h.0) }, 0);
        drop(buf);
    }
}
