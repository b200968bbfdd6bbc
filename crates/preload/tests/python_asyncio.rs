//! A Python asyncio UDP echo server and client (epoll + nonblocking
//! sockets, recvfrom/sendto) under the shim: every reply byte-exact.

mod common;
use common::*;
use std::process::Command;

const SCRIPT: &str = r#"
import asyncio, sys
N = int(sys.argv[1])
class Echo(asyncio.DatagramProtocol):
    def connection_made(self, t): self.t = t
    def datagram_received(self, d, a): self.t.sendto(d, a)
class Client(asyncio.DatagramProtocol):
    def __init__(self, done): self.done, self.got = done, []
    def datagram_received(self, d, a):
        self.got.append(d)
        if len(self.got) == N: self.done.set_result(self.got)
async def main():
    loop = asyncio.get_running_loop()
    st, _ = await loop.create_datagram_endpoint(Echo, local_addr=('127.0.0.1', 0))
    port = st.get_extra_info('sockname')[1]
    done = loop.create_future()
    ct, cp = await loop.create_datagram_endpoint(lambda: Client(done), remote_addr=('127.0.0.1', port))
    sent = []
    for i in range(N):
        d = bytes((i * 7 + j) % 256 for j in range(1 + (i * 13) % 1400))
        sent.append(d)
        ct.sendto(d)
        # At most 32 unanswered (well inside the echo socket's receive
        # buffer): bursts larger than it can hold are dropped by UDP on the
        # kernel as under the shim whenever the loop lags (seen on a loaded
        # machine: 240-249 of 300 echoed on the kernel itself).
        t0 = loop.time()
        while i + 1 - len(cp.got) >= 32 and loop.time() - t0 < 5:
            await asyncio.sleep(0.0005)
    got = await asyncio.wait_for(done, 20)
    assert sorted(got) == sorted(sent), "payload mismatch"
    print("echoed", len(got), sum(map(len, got)))
    ct.close(); st.close()
asyncio.run(main())
"#;

#[test]
fn asyncio_echo() {
    let n = 300;
    let mut k = Command::new("python3");
    k.args(["-c", SCRIPT, &n.to_string()]);
    let kernel = k.output().unwrap();
    assert!(kernel.status.success(), "{}", String::from_utf8_lossy(&kernel.stderr));
    let stats = stat_dir("asyncio");
    let mut c = Command::new("python3");
    c.args(["-c", SCRIPT, &n.to_string()]);
    let out = preloaded(c, &stats);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, kernel.stdout);
    let r = reports(&stats);
    // Both directions on the engine: 2n datagrams sent and received.
    assert_eq!(total(&r, "datagrams_sent"), 2 * n, "{r:#?}");
    assert_eq!(total(&r, "datagrams_received"), 2 * n);
    let _ = std::fs::remove_dir_all(&stats);
}
