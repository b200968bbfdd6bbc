//! A stamped GSO message the kernel refuses as too long is sent in pieces
//! (`UdpSocket::send_batch`): every piece that carries its datagrams is
//! stamped, and the pieces the backend reports are the kernel's `OPT_ID`
//! keys in order, so a sampled datagram in a later piece has its own
//! stamps. Its own process: the GSO segment limit the refusal lowers is
//! the process's.

use eudp_engine::backend::kernel::{self, OutMsg, UdpSocket};
use eudp_engine::sys::timestamp::{read_tx_timestamps, SO_TIMESTAMPING};
use std::collections::BTreeMap;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// More segments than any kernel's UDP_MAX_SEGMENTS so far: refused with
/// EINVAL, then sent as pieces of 64.
const SEGS: usize = 200;

#[test]
fn every_piece_of_a_split_stamped_message_is_stamped_under_its_key() {
    let rx = UdpSocket::new(false).unwrap();
    rx.bind(&"127.0.0.1:0".parse().unwrap()).unwrap();
    rx.enable_gro();
    rx.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20).unwrap();
    let dst = rx.local_addr().unwrap();
    let tx = UdpSocket::new(false).unwrap();
    tx.bind(&"127.0.0.1:0".parse().unwrap()).unwrap();
    // As a sampled trace sets it: keys and reporting, TX records per message.
    let flags =
        (libc::SOF_TIMESTAMPING_OPT_ID | libc::SOF_TIMESTAMPING_OPT_TSONLY | libc::SOF_TIMESTAMPING_SOFTWARE) as i32;
    tx.set_option(libc::SOL_SOCKET, SO_TIMESTAMPING, flags).unwrap();
    let payload = vec![7u8; SEGS * 64];
    let iov = [IoSlice::new(&payload)];
    let r = tx.send_batch(&[OutMsg { dst: Some(dst), iov: &iov, segment: Some(64), stamp: true }]);
    assert_eq!(r.unwrap(), 1, "the refused message counts as sent");
    let pieces = kernel::take_split_pieces();
    // The refused whole (it took key 0 before the kernel counted its
    // segments), then the pieces.
    assert_eq!(pieces, [0, 64, 64, 64, 8], "the sends the split made, in datagrams");
    // Both stamps of every piece that went out, under its place's key.
    let mut keys: BTreeMap<u32, u32> = BTreeMap::new();
    let until = Instant::now() + Duration::from_secs(2);
    let want: BTreeMap<u32, u32> =
        pieces.iter().enumerate().filter(|&(_, &n)| n > 0).map(|(k, _)| (k as u32, 2)).collect();
    while keys.values().sum::<u32>() < want.values().sum() && Instant::now() < until {
        read_tx_timestamps(tx.as_raw_fd(), &mut |key, _sched, _ns| *keys.entry(key).or_default() += 1);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(keys, want, "TX stamps per OPT_ID key");
}
