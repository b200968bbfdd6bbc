//! The impairment topology: hosts `a` and `b` in one subnet, joined through
//! a relay host `r` that bridges them at layer 2 with its own program
//! ([`super::relay`]), plus an nftables loss rule for host `b`.
//!
//! `a` is 198.18.7.1 and `b` 198.18.7.2 (/24, inside the RFC 2544 range and
//! apart from the plain testbed's 198.18.0.0/24, so both can exist at once).
//! Offloads are off on every veth end: the relay moves frames as they are
//! on the wire, so they must be whole segments with finished checksums.

use crate::testbed::check_name;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// IPv4 address of host `a`.
pub const IMP_A: &str = "198.18.7.1";
/// IPv4 address of host `b`.
pub const IMP_B: &str = "198.18.7.2";

fn run(cmd: &[&str]) -> Result<(), String> {
    let out =
        Command::new(cmd[0]).args(&cmd[1..]).stdin(Stdio::null()).output().map_err(|e| format!("{}: {e}", cmd[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed: {}", cmd.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Three namespaces a — r — b by name; dropping the guard stops the relay
/// and removes them.
#[derive(Debug)]
pub struct ImpairBed {
    pub name: String,
    relay: Option<Child>,
}

impl ImpairBed {
    /// Namespace of host `a`, `r` or `b`.
    pub fn netns(&self, host: char) -> String {
        format!("eudpi-{}-{host}", self.name)
    }

    /// Interface `end` of the topology: `a` and `b` in the hosts, `l` (to
    /// a) and `r` (to b) in the relay. At most 15 bytes.
    pub fn veth(&self, end: char) -> String {
        format!("ei{}{end}", self.name)
    }

    /// Builds the topology, replacing leftovers of the same name. The relay
    /// is not running yet: see [`ImpairBed::start_relay`].
    pub fn up(name: &str) -> Result<ImpairBed, String> {
        check_name(name)?;
        let bed = ImpairBed { name: name.to_string(), relay: None };
        bed.teardown();
        bed.create().inspect_err(|_| bed.teardown())?;
        Ok(bed)
    }

    fn create(&self) -> Result<(), String> {
        let (na, nr, nb) = (self.netns('a'), self.netns('r'), self.netns('b'));
        for ns in [&na, &nr, &nb] {
            run(&["ip", "netns", "add", ns])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        let (va, vl, vr, vb) = (self.veth('a'), self.veth('l'), self.veth('r'), self.veth('b'));
        run(&["ip", "link", "add", &va, "netns", &na, "type", "veth", "peer", "name", &vl, "netns", &nr])?;
        run(&["ip", "link", "add", &vb, "netns", &nb, "type", "veth", "peer", "name", &vr, "netns", &nr])?;
        // The relay host has no addresses and sends nothing of its own.
        let _ = run(&["ip", "netns", "exec", &nr, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"]);
        for dev in [&vl, &vr] {
            run(&["ip", "-n", &nr, "link", "set", dev, "promisc", "on", "up"])?;
        }
        for (ns, dev, v4) in [(&na, &va, IMP_A), (&nb, &vb, IMP_B)] {
            run(&["ip", "-n", ns, "addr", "add", &format!("{v4}/24"), "dev", dev])?;
            run(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            let _ = run(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"]);
            let _ = run(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.core.rmem_max=33554432"]);
            let _ = run(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.core.wmem_max=33554432"]);
        }
        for (ns, dev) in [(&na, &va), (&nr, &vl), (&nr, &vr), (&nb, &vb)] {
            // Checksum offload off turns segmentation offloads off with it.
            run(&["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off", "rx", "off", "gro", "off"])?;
        }
        // Static neighbours, as in the plain testbed: no ARP warm-up.
        let mac = |ns: &str, dev: &str| -> Result<String, String> {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "cat", &format!("/sys/class/net/{dev}/address")])
                .output()
                .map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let (mac_a, mac_b) = (mac(&na, &va)?, mac(&nb, &vb)?);
        run(&["ip", "-n", &na, "neigh", "replace", IMP_B, "lladdr", &mac_b, "dev", &va, "nud", "permanent"])?;
        run(&["ip", "-n", &nb, "neigh", "replace", IMP_A, "lladdr", &mac_a, "dev", &vb, "nud", "permanent"])?;
        Ok(())
    }

    /// Starts the relay in host `r`: `program` is the eudp executable,
    /// `impair` the relay's options after `--left`/`--right` (e.g.
    /// `["--loss", "1", "--seed", "3"]`). Waits for its `ready`.
    pub fn start_relay(&mut self, program: &str, impair: &[&str]) -> Result<(), String> {
        if self.relay.is_some() {
            return Err("the relay is already running".into());
        }
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns('r'), program, "worker", "impair"]);
        c.args(["--left", &self.veth('l'), "--right", &self.veth('r')]).args(impair);
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("relay: {e}"))?;
        let mut line = String::new();
        let got = child.stdout.as_mut().map(|o| BufReader::new(o).read_line(&mut line));
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("relay did not start ({got:?}): {}", err.trim()));
        }
        self.relay = Some(child);
        Ok(())
    }

    /// Stops the relay (SIGINT, as Ctrl-C would) and returns its summary.
    pub fn stop_relay(&mut self) -> Result<super::relay::Summary, String> {
        let mut child = self.relay.take().ok_or("no relay is running")?;
        crate::sys::interrupt(&child);
        let t0 = Instant::now();
        while child.try_wait().map_err(|e| e.to_string())?.is_none() {
            if t0.elapsed() > Duration::from_secs(5) {
                let _ = child.kill();
                let _ = child.wait();
                return Err("relay did not stop in 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut out = String::new();
        if let Some(o) = child.stdout.as_mut() {
            let _ = o.read_to_string(&mut out);
        }
        let mut err = String::new();
        if let Some(e) = child.stderr.as_mut() {
            let _ = e.read_to_string(&mut err);
        }
        let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
        serde_json::from_str(line).map_err(|e| format!("relay summary {line:?}: {e}; stderr: {}", err.trim()))
    }

    /// A command that runs `program` inside host `host` (`a`, `r` or `b`).
    pub fn command(&self, host: char, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns(host), program]);
        c
    }

    /// Removes everything; missing pieces are fine.
    pub fn teardown(&self) {
        for h in ['a', 'r', 'b'] {
            let _ = Command::new("ip").args(["netns", "del", &self.netns(h)]).stderr(Stdio::null()).status();
        }
    }
}

impl Drop for ImpairBed {
    fn drop(&mut self) {
        if let Some(mut c) = self.relay.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.teardown();
    }
}

/// The nftables table the loss rule lives in.
const NFT_TABLE: &str = "eudpimp";

/// Drops `pct` percent of the UDP datagrams arriving in namespace `ns`
/// (random, counted), replacing an earlier rule.
pub fn nft_loss(ns: &str, pct: u32) -> Result<(), String> {
    if pct > 100 {
        return Err(format!("nft loss {pct}%: a percentage 0..100"));
    }
    nft_clear(ns);
    let script = format!(
        "table inet {NFT_TABLE} {{\n chain input {{\n  type filter hook input priority -10; policy accept;\n  \
         meta l4proto udp numgen random mod 100 < {pct} counter drop\n }}\n}}\n"
    );
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    if let Some(mut i) = c.stdin.take() {
        std::io::Write::write_all(&mut i, script.as_bytes()).map_err(|e| format!("nft: {e}"))?;
    }
    let out = c.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if !out.status.success() {
        return Err(format!("nft in {ns}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

/// Packets the loss rule in `ns` has dropped.
pub fn nft_dropped(ns: &str) -> Result<u64, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "table", "inet", NFT_TABLE])
        .output()
        .map_err(|e| format!("nft: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_once("counter packets ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("no loss counter in {ns}: {}", String::from_utf8_lossy(&out.stderr).trim()))
}

/// Removes the loss rule's table from `ns` (absent is fine).
pub fn nft_clear(ns: &str) {
    let _ = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "delete", "table", "inet", NFT_TABLE])
        .stderr(Stdio::null())
        .status();
}
