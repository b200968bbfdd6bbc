//! `eudp worker emp`: one EMP endpoint of a measured exchange, run by
//! `eudp bench --emp` in the testbed's hosts and by tests on loopback.
//!
//! The client drives a pattern (ping-pong, stream, both directions) for
//! `--secs`, then sends an end message; the server answers it once its own
//! sends are done, and both exit. Message `i` carries tag `i` and bytes
//! derived from `i`, so a receiver checks every byte. The client prints one
//! JSON line; the server prints one for stream and bidir.

use clap::{Args, ValueEnum};
use eudp_engine::emp::{Completion, EmpConfig, EmpCounters, EmpEndpoint, Op, PeerId, Status};
use serde_json::json;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The end message's tag; data tags keep this bit clear.
const END: u64 = 1 << 63;
/// Receives kept posted for data messages.
const POSTED: u64 = 512;
/// Receive contexts: data receives count up from here, below the sends'.
const RECV_BASE: u64 = 1 << 62;
/// The end message's receive context.
const END_RECV: u64 = u64::MAX;
/// The end message's send context.
const END_SEND: u64 = u64::MAX - 1;
/// Messages one call of `pump` sends at most before the sender reads its
/// completions.
const PUMP_BATCH: u64 = 64;
/// How long the server waits for the client's end message with no frame
/// arriving: longer than a flow's deadline (`EmpConfig::deadline`), since
/// the client's sends either make progress within that or fail and its end
/// message follows. A fixed time from the server's start instead would
/// cut off a client that a loaded host started or ran late.
const SERVER_QUIET: Duration = Duration::from_secs(12);
/// The server's bound beyond `--secs`, whatever arrives.
const SERVER_LIMIT: Duration = Duration::from_secs(120);

/// When frames last arrived, from the endpoint's count of them.
struct Heard {
    count: u64,
    since: Instant,
}

impl Heard {
    fn new(count: u64) -> Heard {
        Heard { count, since: Instant::now() }
    }

    /// Takes the current count; true while the last new frame is less
    /// than [`SERVER_QUIET`] ago.
    fn recent(&mut self, count: u64) -> bool {
        if count != self.count {
            (self.count, self.since) = (count, Instant::now());
        }
        self.since.elapsed() < SERVER_QUIET
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Server,
    Client,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pattern {
    Pingpong,
    Stream,
    Bidir,
}

/// Placement of the protocol's steps on engine threads (paper 003, Table 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scheme {
    Base,
    So,
    Ro,
    Dsr,
    Sr,
}

/// The worker's arguments.
#[derive(Args, Debug, Clone)]
pub struct EmpArgs {
    #[arg(long, value_enum)]
    pub role: Role,
    /// The address to bind.
    #[arg(long)]
    pub local: SocketAddr,
    /// The other worker's address.
    #[arg(long)]
    pub peer: SocketAddr,
    #[arg(long, value_enum)]
    pub pattern: Pattern,
    /// Message size (bytes).
    #[arg(long)]
    pub size: usize,
    /// How long the client drives the pattern (seconds).
    #[arg(long)]
    pub secs: f64,
    /// Step placement on engine threads (paper 003, Table 2).
    #[arg(long, value_enum, default_value = "base")]
    pub scheme: Scheme,
    /// Frames in flight per flow.
    #[arg(long)]
    pub window: Option<u32>,
    /// Frames per acknowledgment.
    #[arg(long)]
    pub ack_group: Option<u32>,
    /// Microseconds a waiting thread polls before it sleeps (default: the
    /// endpoint's).
    #[arg(long)]
    pub spin_us: Option<u64>,
    /// Microseconds the acknowledgment of a message's last frame waits
    /// for a reply to carry it (0: at once; default: the endpoint's).
    #[arg(long)]
    pub ack_delay_us: Option<u64>,
}

fn scheme_name(s: Scheme) -> &'static str {
    match s {
        Scheme::Base => "base",
        Scheme::So => "so",
        Scheme::Ro => "ro",
        Scheme::Dsr => "dsr",
        Scheme::Sr => "sr",
    }
}

fn engine_scheme(s: Scheme) -> eudp_engine::emp::Scheme {
    use eudp_engine::emp::Scheme as E;
    match s {
        Scheme::Base => E::Base,
        Scheme::So => E::SendOnly,
        Scheme::Ro => E::ReceiveOnly,
        Scheme::Dsr => E::DedicatedSendReceive,
        Scheme::Sr => E::SendReceive,
    }
}

fn pattern_name(p: Pattern) -> &'static str {
    match p {
        Pattern::Pingpong => "pingpong",
        Pattern::Stream => "stream",
        Pattern::Bidir => "bidir",
    }
}

/// The bytes of message `i`.
fn fill(i: u64, size: usize) -> Vec<u8> {
    let seed = (i.wrapping_mul(0x9E37_79B9) >> 7) as u8;
    (0..size).map(|k| seed.wrapping_add((k as u8).wrapping_mul(31))).collect()
}

/// True when `data` is message `i`'s bytes.
fn intact(i: u64, data: &[u8]) -> bool {
    let seed = (i.wrapping_mul(0x9E37_79B9) >> 7) as u8;
    data.iter().enumerate().all(|(k, &b)| b == seed.wrapping_add((k as u8).wrapping_mul(31)))
}

fn counters_json(c: &EmpCounters) -> serde_json::Value {
    json!({
        "frames_sent": c.frames_sent,
        "frames_received": c.frames_received,
        "retransmits": c.retransmits,
        "naks_sent": c.naks_sent,
        "naks_received": c.naks_received,
        "duplicates": c.duplicates,
        "unmatched": c.unmatched,
        "timeouts": c.timeouts,
        "acks_sent": c.acks_sent,
        "acks_piggybacked": c.acks_piggybacked,
        "acks_received": c.acks_received,
        "gaps": c.gaps,
        "held": c.held,
        "go_backs": c.go_backs,
        "stale": c.stale,
        "malformed": c.malformed,
        "unknown_peer": c.unknown_peer,
        "give_ups": c.give_ups,
    })
}

/// Runs the worker; the process's exit status.
pub fn main(a: &EmpArgs) -> i32 {
    match run(a) {
        Ok(line) => {
            if let Some(l) = line {
                println!("{l}");
            }
            0
        }
        Err(e) => {
            eprintln!("eudp worker emp: {e}");
            1
        }
    }
}

fn run(a: &EmpArgs) -> Result<Option<serde_json::Value>, String> {
    if a.size > eudp_wire::emp::MAX_MESSAGE as usize {
        return Err(format!("--size {} is over the 16 MiB EMP maximum", a.size));
    }
    let mut cfg = EmpConfig { scheme: engine_scheme(a.scheme), ..EmpConfig::default() };
    // EUDP_EMP_BLOCKING_WAIT=0: waiters sleep in epoll instead of leasing
    // the socket (EmpConfig::blocking_wait); `eudp bench` records EUDP_*
    // settings.
    if let Ok(v) = std::env::var("EUDP_EMP_BLOCKING_WAIT") {
        cfg.blocking_wait = v == "1";
    }
    if let Some(w) = a.window {
        cfg.window = w;
    }
    if let Some(g) = a.ack_group {
        cfg.ack_group = g;
    }
    if let Some(us) = a.spin_us {
        cfg.poll_spin = Duration::from_micros(us);
    }
    if let Some(us) = a.ack_delay_us {
        cfg.ack_delay = Duration::from_micros(us);
    }
    let ep = EmpEndpoint::bind(a.local, cfg).map_err(|e| format!("bind {}: {e}", a.local))?;
    let peer = ep.insert(a.peer);
    let mut w = Worker {
        ep,
        peer,
        size: a.size,
        received: 0,
        bytes_received: 0,
        corrupt: 0,
        errors: 0,
        posted: 0,
        end_received: false,
    };
    match a.role {
        Role::Server => w.server(a),
        Role::Client => w.client(a),
    }
}

struct Worker {
    ep: EmpEndpoint,
    peer: PeerId,
    size: usize,
    received: u64,
    bytes_received: u64,
    corrupt: u64,
    errors: u64,
    /// Data receives posted so far (their contexts count up).
    posted: u64,
    /// The peer's end message has completed (it can overtake the
    /// acknowledgment of our own, so `finish` may be the one that sees it).
    end_received: bool,
}

impl Worker {
    fn post_data(&mut self, n: u64) -> Result<(), String> {
        for _ in 0..n {
            self.ep.recv(Some(self.peer), 0, !END, self.size, RECV_BASE + self.posted).map_err(|e| e.to_string())?;
            self.posted += 1;
        }
        Ok(())
    }

    /// A data message received: checked, counted, its receive posted again.
    fn took(&mut self, c: &Completion) -> Result<(), String> {
        if c.status != Status::Ok {
            self.errors += 1;
            return Ok(());
        }
        self.received += 1;
        self.bytes_received += c.data.len() as u64;
        if c.len != self.size || !intact(c.tag, &c.data) {
            self.corrupt += 1;
        }
        self.post_data(1)
    }

    fn server(&mut self, a: &EmpArgs) -> Result<Option<serde_json::Value>, String> {
        let start = Instant::now();
        let limit = start + Duration::from_secs_f64(a.secs.max(0.0)) + SERVER_LIMIT;
        self.ep.recv(Some(self.peer), END, 0, 64, END_RECV).map_err(|e| e.to_string())?;
        self.post_data(POSTED)?;
        let bidir = a.pattern == Pattern::Bidir;
        let (mut next, mut in_flight, mut ended) = (0u64, 0u64, false);
        let mut heard = Heard::new(self.ep.counters().frames_received);
        while Instant::now() < limit && heard.recent(self.ep.counters().frames_received) {
            if bidir && !ended {
                next += self.pump(&mut in_flight, next, None)?;
            }
            if ended && in_flight == 0 {
                break;
            }
            let Some(c) = self.ep.wait(Some(Duration::from_millis(100))) else { continue };
            match (c.op, c.context) {
                (Op::Recv, END_RECV) => ended = true,
                (Op::Recv, _) => {
                    self.took(&c)?;
                    if a.pattern == Pattern::Pingpong && c.status == Status::Ok {
                        self.send_blocking(c.tag, c.data, c.tag)?;
                        in_flight += 1;
                    }
                }
                (Op::Send, _) => {
                    in_flight -= 1;
                    if c.status != Status::Ok {
                        self.errors += 1;
                    }
                }
            }
        }
        if !ended {
            return Err(format!(
                "the client's end message never came ({:.1} s after the start, {:.1} s after the last frame; received {}; counters {})",
                start.elapsed().as_secs_f64(),
                heard.since.elapsed().as_secs_f64(),
                self.received,
                counters_json(&self.ep.counters())
            ));
        }
        self.finish()?;
        let line = json!({
            "role": "server",
            "pattern": pattern_name(a.pattern),
            "size": a.size,
            "messages_received": self.received,
            "bytes_received": self.bytes_received,
            "corrupt": self.corrupt,
            "errors": self.errors,
            "counters": counters_json(&self.ep.counters()),
        });
        Ok((a.pattern != Pattern::Pingpong).then_some(line))
    }

    /// Sends data messages from `next` on until the flow's queue is full,
    /// `until` has passed or [`PUMP_BATCH`] went; returns how many went.
    /// The engine completes sends while the loop runs, so on a loaded
    /// host (this thread preempted between sends) the queue may never
    /// fill: without the bounds the sender streamed on far past `--secs`
    /// with its completions unread, and the server stopped waiting.
    fn pump(&mut self, in_flight: &mut u64, next: u64, until: Option<Instant>) -> Result<u64, String> {
        let mut i = next;
        loop {
            if i - next >= PUMP_BATCH || until.is_some_and(|u| Instant::now() >= u) {
                return Ok(i - next);
            }
            match self.ep.send(self.peer, i, fill(i, self.size), i) {
                Ok(()) => {
                    i += 1;
                    *in_flight += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(i - next),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn send_blocking(&self, tag: u64, data: Vec<u8>, context: u64) -> Result<(), String> {
        let mut data = Some(data);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let d = data.take().expect("kept for a retry");
            match self.ep.send(self.peer, tag, d.clone(), context) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < until => {
                    data = Some(d);
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// The end handshake's last step on either side: the end message goes
    /// out and is acknowledged.
    fn finish(&mut self) -> Result<(), String> {
        self.send_blocking(END, Vec::new(), END_SEND)?;
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            let Some(c) = self.ep.wait(Some(Duration::from_millis(100))) else { continue };
            match (c.op, c.context) {
                (Op::Send, END_SEND) => {
                    return if c.status == Status::Ok {
                        Ok(())
                    } else {
                        Err(format!("end message: {:?} (counters {})", c.status, counters_json(&self.ep.counters())))
                    };
                }
                (Op::Recv, END_RECV) => self.end_received = true,
                (Op::Recv, _) => self.took(&c)?,
                (Op::Send, _) => {}
            }
        }
        Err("the end message was never acknowledged".into())
    }

    /// Keeps the endpoint open after the server's end message until frames
    /// stop arriving: when the acknowledgment of that message is lost, the
    /// server sends it again and its handshake needs the answer.
    fn linger(&self) {
        let quiet = Duration::from_millis(600);
        let until = Instant::now() + Duration::from_secs(3);
        let (mut seen, mut since) = (self.ep.counters().frames_received, Instant::now());
        while Instant::now() < until && since.elapsed() < quiet {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.ep.counters().frames_received;
            if now != seen {
                (seen, since) = (now, Instant::now());
            }
        }
    }

    fn client(&mut self, a: &EmpArgs) -> Result<Option<serde_json::Value>, String> {
        self.ep.recv(Some(self.peer), END, 0, 64, END_RECV).map_err(|e| e.to_string())?;
        let secs = Duration::from_secs_f64(a.secs.max(0.0));
        let start = Instant::now();
        let mut lat: Vec<u64> = Vec::new();
        let (mut sent, mut acked) = (0u64, 0u64);
        let mut last_ack = start;
        match a.pattern {
            Pattern::Pingpong => {
                self.post_data(1)?;
                while start.elapsed() < secs {
                    let t = Instant::now();
                    self.send_blocking(sent, fill(sent, self.size), sent)?;
                    sent += 1;
                    let (mut got_reply, mut got_ack) = (false, false);
                    while !(got_reply && got_ack) {
                        let c = self.ep.wait(Some(Duration::from_secs(10))).ok_or("no reply within 10 s")?;
                        match c.op {
                            Op::Recv => {
                                lat.push(t.elapsed().as_nanos() as u64);
                                self.took(&c)?;
                                got_reply = true;
                            }
                            Op::Send => {
                                got_ack = true;
                                if c.status == Status::Ok {
                                    acked += 1;
                                } else {
                                    self.errors += 1;
                                }
                            }
                        }
                    }
                }
                last_ack = Instant::now();
            }
            Pattern::Stream | Pattern::Bidir => {
                if a.pattern == Pattern::Bidir {
                    self.post_data(POSTED)?;
                }
                let mut in_flight = 0u64;
                let mut stopped = false;
                let until = start + secs;
                loop {
                    if !stopped && Instant::now() >= until {
                        stopped = true;
                    }
                    if !stopped {
                        sent += self.pump(&mut in_flight, sent, Some(until))?;
                    }
                    if stopped && in_flight == 0 {
                        break;
                    }
                    let c = match self.ep.wait(Some(Duration::from_millis(50))) {
                        Some(c) => c,
                        None if stopped && Instant::now() > until + Duration::from_secs(30) => {
                            return Err("sends still unacknowledged 30 s after the end".into());
                        }
                        None => continue,
                    };
                    match c.op {
                        Op::Recv => self.took(&c)?,
                        Op::Send => {
                            in_flight -= 1;
                            if c.status == Status::Ok {
                                acked += 1;
                                last_ack = Instant::now();
                            } else {
                                self.errors += 1;
                            }
                        }
                    }
                }
            }
        }
        let elapsed = last_ack.duration_since(start).as_secs_f64().max(1e-9);
        self.finish()?;
        // The server's end message says it has stopped sending too.
        let until = Instant::now() + Duration::from_secs(15);
        while !self.end_received {
            let c = self.ep.wait(Some(Duration::from_millis(100)));
            match c {
                Some(c) if c.op == Op::Recv && c.context == END_RECV => break,
                Some(c) if c.op == Op::Recv => self.took(&c)?,
                _ if Instant::now() > until => return Err("the server's end message never came".into()),
                _ => {}
            }
        }
        self.linger();
        if a.pattern == Pattern::Stream && (acked != sent || self.errors > 0) {
            return Err(format!("{acked} of {sent} messages acknowledged, {} errors", self.errors));
        }
        let bytes = acked * a.size as u64;
        let mut line = json!({
            "pattern": pattern_name(a.pattern),
            "size": a.size,
            "scheme": scheme_name(a.scheme),
            "secs": elapsed,
            "messages": acked,
            "bytes": bytes,
            "errors": self.errors,
            "counters": counters_json(&self.ep.counters()),
        });
        if a.pattern == Pattern::Pingpong {
            lat.sort_unstable();
            let q = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied();
            line["lat_ns"] = json!({"p50": q(0.5), "p99": q(0.99), "max": lat.last().copied()});
            // Replies received and byte-checked, so a caller sees each one matched.
            line["messages_received"] = json!(self.received);
            line["corrupt"] = json!(self.corrupt);
        } else {
            line["mbit_s"] = json!(bytes as f64 * 8.0 / elapsed / 1e6);
            if a.pattern == Pattern::Bidir {
                line["messages_received"] = json!(self.received);
                line["bytes_received"] = json!(self.bytes_received);
                line["corrupt"] = json!(self.corrupt);
                line["mbit_s_both"] = json!((bytes + self.bytes_received) as f64 * 8.0 / elapsed / 1e6);
            }
        }
        Ok(Some(line))
    }
}
