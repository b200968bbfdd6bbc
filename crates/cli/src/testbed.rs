//! `eudp testbed`: two network-namespace hosts joined by a veth pair.
//!
//! Host `a` is 198.18.0.1 (and 2001:2::1), host `b` is 198.18.0.2 (and
//! 2001:2::2): the benchmarking ranges of RFC 2544 and RFC 5180, so test
//! traffic can never reach a real network. Names are derived from the
//! testbed name, so several testbeds can exist side by side.

use std::process::{Command, Stdio};

/// IPv4 address of host `a`.
pub const ADDR_A: &str = "198.18.0.1";
/// IPv4 address of host `b`.
pub const ADDR_B: &str = "198.18.0.2";
/// IPv6 address of host `a`.
pub const ADDR6_A: &str = "2001:2::1";
/// IPv6 address of host `b`.
pub const ADDR6_B: &str = "2001:2::2";

/// A testbed by name. [`Testbed::up`] returns a guard that tears the testbed
/// down when dropped, so a failing test cannot leak namespaces.
#[derive(Debug)]
pub struct Testbed {
    pub name: String,
    keep: bool,
}

fn run(cmd: &[&str]) -> Result<(), String> {
    let out =
        Command::new(cmd[0]).args(&cmd[1..]).stdin(Stdio::null()).output().map_err(|e| format!("{}: {e}", cmd[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed: {}", cmd.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Checks a testbed name: short and made of safe characters, since it
/// becomes part of namespace and interface names.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 10 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(format!("testbed name {name:?}: use 1-10 characters from [A-Za-z0-9-]"));
    }
    Ok(())
}

impl Testbed {
    /// Namespace of host `a` or `b`.
    pub fn netns(&self, host: char) -> String {
        format!("eudp-{}-{host}", self.name)
    }

    /// The veth interface of host `a` or `b`.
    pub fn veth(&self, host: char) -> String {
        // Interface names are limited to 15 bytes.
        format!("eu{}{host}", self.name)
    }

    /// A handle to an existing testbed (not torn down on drop).
    pub fn existing(name: &str) -> Result<Testbed, String> {
        check_name(name)?;
        Ok(Testbed { name: name.to_string(), keep: true })
    }

    /// Creates the testbed. The returned guard removes it on drop unless
    /// [`Testbed::keep`] is called.
    pub fn up(name: &str) -> Result<Testbed, String> {
        check_name(name)?;
        let tb = Testbed { name: name.to_string(), keep: false };
        // Start from a clean slate if a previous run left pieces behind.
        tb.teardown();
        tb.create().inspect_err(|_| tb.teardown())?;
        Ok(tb)
    }

    fn create(&self) -> Result<(), String> {
        let (na, nb) = (self.netns('a'), self.netns('b'));
        let (va, vb) = (self.veth('a'), self.veth('b'));
        run(&["ip", "netns", "add", &na])?;
        run(&["ip", "netns", "add", &nb])?;
        run(&["ip", "link", "add", &va, "netns", &na, "type", "veth", "peer", "name", &vb, "netns", &nb])?;
        for (ns, dev, v4, v6) in [(&na, &va, ADDR_A, ADDR6_A), (&nb, &vb, ADDR_B, ADDR6_B)] {
            run(&["ip", "-n", ns, "addr", "add", &format!("{v4}/24"), "dev", dev])?;
            run(&["ip", "-n", ns, "addr", "add", &format!("{v6}/64"), "dev", dev, "nodad"])?;
            run(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            // Room for bursts, as on a tuned host; the same for every stack.
            let _ = run(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.core.rmem_max=33554432"]);
            let _ = run(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.core.wmem_max=33554432"]);
        }
        // Static neighbour entries: no ARP/ND warm-up, so the first datagrams
        // of a run are not dropped while addresses resolve.
        let mac = |ns: &str, dev: &str| -> Result<String, String> {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "cat", &format!("/sys/class/net/{dev}/address")])
                .output()
                .map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let (mac_a, mac_b) = (mac(&na, &va)?, mac(&nb, &vb)?);
        for (ns, dev, peer4, peer6, peer_mac) in
            [(&na, &va, ADDR_B, ADDR6_B, &mac_b), (&nb, &vb, ADDR_A, ADDR6_A, &mac_a)]
        {
            for ip in [peer4, peer6] {
                run(&["ip", "-n", ns, "neigh", "replace", ip, "lladdr", peer_mac, "dev", dev, "nud", "permanent"])?;
            }
        }
        // veth needs GRO enabled (or XDP) on the receiver for UDP GRO to
        // coalesce forwarded segments; GSO segments are passed as one skb.
        let _ = run(&["ip", "netns", "exec", &nb, "ethtool", "-K", &vb, "gro", "on"]);
        let _ = run(&["ip", "netns", "exec", &na, "ethtool", "-K", &va, "gro", "on"]);
        Ok(())
    }

    /// Removes everything this testbed created; missing pieces are fine.
    pub fn teardown(&self) {
        // Deleting a namespace deletes the veth end inside it, and its peer.
        for h in ['a', 'b'] {
            let _ = Command::new("ip").args(["netns", "del", &self.netns(h)]).stderr(Stdio::null()).status();
        }
    }

    /// Keeps the testbed after the guard is dropped.
    pub fn keep(mut self) {
        self.keep = true;
    }

    /// A command that runs `program` inside host `host`'s namespace.
    pub fn command(&self, host: char, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns(host), program]);
        c
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if !self.keep {
            self.teardown();
        }
    }
}

/// True when running as root (network namespaces need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Waits (at most `limit`) until the network namespace of process `pid`
/// has a UDP socket on local `port` and, with `listener`, a listening TCP
/// socket (a UOE's, under the `tcp` transport): a server started cold can
/// take longer than any fixed pause, and a client that starts first sends
/// into a closed port.
pub fn wait_udp_server(pid: u32, port: u16, listener: bool, limit: std::time::Duration) -> Result<(), String> {
    // Columns of /proc/net/{udp,tcp}{,6}: sl, local_address, rem_address, st.
    let any = |proto: &str, f: &dyn Fn(&[&str]) -> bool| {
        [proto.to_string(), format!("{proto}6")].iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{p}"))
                .is_ok_and(|t| t.lines().skip(1).any(|l| f(&l.split_whitespace().take(4).collect::<Vec<_>>())))
        })
    };
    let local = format!(":{port:04X}");
    let t0 = std::time::Instant::now();
    // TCP state 0A: listening.
    while !(any("udp", &|c| c.len() == 4 && c[1].ends_with(&local))
        && (!listener || any("tcp", &|c| c.len() == 4 && c[3] == "0A")))
    {
        if t0.elapsed() > limit {
            return Err(format!(
                "process {pid} did not take UDP port {port}{} in {limit:?}",
                if listener { " and listen" } else { "" }
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// A testbed name unique to this process and moment.
pub fn unique_name(prefix: &str) -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let p = prefix.chars().take(3).collect::<String>();
    format!("{p}{:x}", (std::process::id() ^ t) & 0xfffff)
}
