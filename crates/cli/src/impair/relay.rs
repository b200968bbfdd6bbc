//! The impairment relay (`eudp worker impair`): a layer-2 bridge between
//! two interfaces that drops, duplicates and holds back UDP datagrams with
//! seeded randomness and forwards every other frame unchanged.
//!
//! Only UDP frames (IPv4 or IPv6) are impaired: ARP, neighbour discovery
//! and TCP pass untouched so addresses resolve and control connections
//! stay up, and the relay's counts describe exactly the datagrams a test
//! sends. Each direction has its own counts and its own hold-back queue.

use super::sys::{self, PacketSocket};
use serde::Serialize;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the relay does to each UDP frame, in percent, and for how long.
#[derive(clap::Args, Debug, Clone)]
pub struct RelayArgs {
    /// The interface towards host a.
    #[arg(long)]
    pub left: String,
    /// The interface towards host b.
    #[arg(long)]
    pub right: String,
    /// Percentage of UDP frames dropped.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Percentage of UDP frames sent twice.
    #[arg(long, default_value_t = 0.0)]
    pub dup: f64,
    /// Percentage of UDP frames held back behind the next --reorder-depth frames.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// How many later frames overtake a held-back frame.
    #[arg(long, default_value_t = 3)]
    pub reorder_depth: u32,
    /// Seed of the random choices (the same seed, the same choices for the same frames).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Upper bound on the relay's run (seconds).
    #[arg(long, default_value_t = 60.0)]
    pub secs: f64,
}

/// Counts of one direction. `udp_*` are the impaired UDP frames; `frames`
/// counts everything that arrived.
#[derive(Debug, Default, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct DirCounts {
    pub frames: u64,
    pub udp: u64,
    pub dropped: u64,
    pub duplicated: u64,
    /// Frames held back and released after at least one later frame.
    pub reordered: u64,
    /// Frames forwarded (duplicates included).
    pub forwarded: u64,
    /// Frames the outgoing interface refused.
    pub send_errors: u64,
}

/// The relay's summary, printed as one JSON line when it ends.
#[derive(Debug, Default, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Summary {
    pub left_to_right: DirCounts,
    pub right_to_left: DirCounts,
    pub secs: f64,
    /// Why it ended: `signal` or `time limit`.
    pub ended_by: String,
}

/// A seeded generator (splitmix64): reproducible choices without a crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: f64) -> bool {
        pct > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) * 100.0 < pct
    }
}

/// Whether an Ethernet frame carries a UDP datagram (IPv4 or IPv6, one
/// VLAN tag at most, no IPv6 extension headers).
pub fn is_udp(frame: &[u8]) -> bool {
    let mut off = 12;
    let ty = |o: usize| frame.get(o..o + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let mut t = ty(off);
    if t == Some(0x8100) {
        off += 4;
        t = ty(off);
    }
    let ip = off + 2;
    match t {
        Some(0x0800) => frame.get(ip + 9) == Some(&17),
        Some(0x86DD) => frame.get(ip + 6) == Some(&17),
        _ => false,
    }
}

/// What to do with one UDP frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Drop,
    Forward,
    Duplicate,
    HoldBack,
}

/// The per-frame choice; one draw per impairment, in a fixed order, so a
/// seed gives the same verdicts whatever the rates.
pub fn choose(rng: &mut Rng, a: &RelayArgs) -> Verdict {
    let (drop, dup, hold) = (rng.chance(a.loss), rng.chance(a.dup), rng.chance(a.reorder));
    if drop {
        Verdict::Drop
    } else if hold && a.reorder_depth > 0 {
        Verdict::HoldBack
    } else if dup {
        Verdict::Duplicate
    } else {
        Verdict::Forward
    }
}

/// One direction: frames from `from` go out of `to`.
struct Direction<'a> {
    from: &'a PacketSocket,
    to: &'a PacketSocket,
    counts: DirCounts,
    /// Held-back frames and how many more fresh frames must pass them.
    held: VecDeque<(Vec<u8>, u32)>,
    rng: Rng,
    last_frame: Instant,
    depth: u32,
}

/// Held frames wait at most this long for later ones: with no traffic
/// behind them they go out anyway, so nothing stays queued.
const HOLD_LIMIT: Duration = Duration::from_millis(20);

impl Direction<'_> {
    fn out(&mut self, frame: &[u8]) {
        let mut tries = 0;
        loop {
            match self.to.send(frame) {
                Ok(()) => {
                    self.counts.forwarded += 1;
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && tries < 10 => {
                    tries += 1;
                    let _ = eudp_engine::sys::poll::poll_writable(self.to.raw_fd(), Some(Duration::from_millis(1)));
                }
                Err(_) => {
                    self.counts.send_errors += 1;
                    return;
                }
            }
        }
    }

    /// Releases held frames whose countdown has run out (`all`: every one).
    fn release(&mut self, all: bool) {
        while let Some((_, left)) = self.held.front() {
            if *left > 0 && !all {
                break;
            }
            if let Some((f, left)) = self.held.pop_front() {
                // A frame no later one overtook arrives in order after all.
                if left == self.depth {
                    self.counts.reordered -= 1;
                }
                self.out(&f);
            }
        }
    }

    /// Moves every frame waiting on `from`, at most `budget` of them.
    fn pump(&mut self, buf: &mut [u8], a: &RelayArgs, budget: usize) -> std::io::Result<usize> {
        let mut n = 0;
        while n < budget {
            let Some(len) = self.from.recv(buf)? else { break };
            n += 1;
            self.last_frame = Instant::now();
            self.counts.frames += 1;
            let frame = &buf[..len];
            if !is_udp(frame) {
                self.out(frame);
                continue;
            }
            self.counts.udp += 1;
            match choose(&mut self.rng, a) {
                Verdict::Drop => self.counts.dropped += 1,
                Verdict::HoldBack => {
                    self.counts.reordered += 1;
                    self.held.push_back((frame.to_vec(), a.reorder_depth));
                }
                v => {
                    self.out(frame);
                    if v == Verdict::Duplicate {
                        self.counts.duplicated += 1;
                        self.out(frame);
                    }
                    for h in self.held.iter_mut() {
                        h.1 = h.1.saturating_sub(1);
                    }
                    self.release(false);
                }
            }
        }
        if !self.held.is_empty() && self.last_frame.elapsed() > HOLD_LIMIT {
            self.release(true);
        }
        Ok(n)
    }
}

/// Runs the relay until a stop signal or the time limit; prints `ready` on
/// stdout once both sockets are open.
pub fn run(a: &RelayArgs) -> Result<Summary, String> {
    for (name, v) in [("loss", a.loss), ("dup", a.dup), ("reorder", a.reorder)] {
        if !(0.0..=100.0).contains(&v) {
            return Err(format!("--{name} {v}: a percentage 0..100"));
        }
    }
    sys::catch_stop_signals();
    let open =
        |name: &str| sys::ifindex(name).and_then(PacketSocket::open).map_err(|e| format!("interface {name}: {e}"));
    let (left, right) = (open(&a.left)?, open(&a.right)?);
    // Two generators from one seed, so each direction's choices depend
    // only on its own frames.
    let mut l2r = Direction {
        from: &left,
        to: &right,
        counts: DirCounts::default(),
        held: VecDeque::new(),
        rng: Rng::new(a.seed),
        last_frame: Instant::now(),
        depth: a.reorder_depth,
    };
    let mut r2l = Direction {
        from: &right,
        to: &left,
        counts: DirCounts::default(),
        held: VecDeque::new(),
        rng: Rng::new(a.seed ^ 0x5555_5555_5555_5555),
        last_frame: Instant::now(),
        depth: a.reorder_depth,
    };
    {
        use std::io::Write;
        println!("ready");
        let _ = std::io::stdout().flush();
    }
    let t0 = Instant::now();
    let limit = Duration::from_secs_f64(a.secs.max(0.0));
    let mut buf = vec![0u8; 65_536];
    let fds = [left.raw_fd(), right.raw_fd()];
    let ended_by = loop {
        if sys::stopped() {
            break "signal";
        }
        if t0.elapsed() >= limit {
            break "time limit";
        }
        let moved = l2r.pump(&mut buf, a, 256).map_err(|e| e.to_string())?
            + r2l.pump(&mut buf, a, 256).map_err(|e| e.to_string())?;
        if moved == 0 {
            let wait = if l2r.held.is_empty() && r2l.held.is_empty() { 50 } else { 5 };
            let _ = eudp_engine::sys::poll::poll_readable(&fds, Some(Duration::from_millis(wait)));
        }
    };
    l2r.release(true);
    r2l.release(true);
    Ok(Summary {
        left_to_right: l2r.counts,
        right_to_left: r2l.counts,
        secs: t0.elapsed().as_secs_f64(),
        ended_by: ended_by.into(),
    })
}

/// `eudp worker impair`: runs the relay and prints its summary line.
pub fn main(a: &RelayArgs) -> i32 {
    match run(a) {
        Ok(s) => {
            println!("{}", serde_json::to_string(&s).unwrap_or_default());
            0
        }
        Err(e) => {
            eprintln!("eudp worker impair: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(loss: f64, dup: f64, reorder: f64) -> RelayArgs {
        RelayArgs {
            left: String::new(),
            right: String::new(),
            loss,
            dup,
            reorder,
            reorder_depth: 3,
            seed: 7,
            secs: 1.0,
        }
    }

    #[test]
    fn verdicts_follow_the_rates_and_the_seed() {
        let count = |a: &RelayArgs, v: Verdict| {
            let mut r = Rng::new(a.seed);
            (0..100_000).filter(|_| choose(&mut r, a) == v).count()
        };
        assert_eq!(count(&args(0.0, 0.0, 0.0), Verdict::Forward), 100_000);
        let d = count(&args(10.0, 0.0, 0.0), Verdict::Drop);
        assert!((9_000..11_000).contains(&d), "{d}");
        let u = count(&args(0.0, 5.0, 0.0), Verdict::Duplicate);
        assert!((4_000..6_000).contains(&u), "{u}");
        assert_eq!(count(&args(10.0, 0.0, 0.0), Verdict::Drop), d);
    }

    #[test]
    fn only_udp_frames_are_impaired() {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14 + 9] = 17;
        assert!(is_udp(&f));
        f[14 + 9] = 6;
        assert!(!is_udp(&f));
        f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert!(!is_udp(&f));
        f[12..14].copy_from_slice(&0x86DDu16.to_be_bytes());
        f[14 + 6] = 17;
        assert!(is_udp(&f));
        assert!(!is_udp(&f[..10]));
    }
}
