//! Setup shared by the async sender's tests.

use eudp_engine::async_udp::{AsyncConfig, AsyncSender, SendEngine};
use std::net::UdpSocket;

/// The engines this kernel has: `MsgZerocopy` always, `Uring` where io_uring
/// zero-copy sends exist (Linux 6.1; said on stderr where not).
pub fn engines() -> Vec<SendEngine> {
    let mut v = vec![SendEngine::MsgZerocopy];
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    let cfg = AsyncConfig { engine: SendEngine::Uring, ..AsyncConfig::default() };
    match AsyncSender::<Vec<u8>>::new(probe, cfg) {
        Ok(_) => v.push(SendEngine::Uring),
        Err(e) => eprintln!("SKIPPED the io_uring engine: {e}"),
    }
    v
}
