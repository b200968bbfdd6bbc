//! The discrete-event simulator.
//!
//! Each stage of a stack is a thread (state machine) that takes the packets
//! of its flow in order. For one packet it:
//!
//! 1. waits until the packet is ready: admitted by the workload (first stage),
//!    the previous stage finished it (coarse) or delivered `threshold_bytes`
//!    (fine, 000 §4.3), and a credit is free when the stage takes one;
//! 2. takes its `hold` resources for the whole packet (e.g. a lock that
//!    serialises two DMA engines);
//! 3. runs its per-packet overhead on the `on` resources (priority-ordered);
//! 4. moves the packet's bytes in fragments: a fine-grained stage moves all
//!    bytes that have arrived so far (at least the threshold), paying the
//!    start-up `S` per fragment; each fragment is cut into chunks and every
//!    chunk occupies the `use` resources (bus, memory ports, CPU) for its
//!    duration, which is where contention between stages appears;
//! 5. releases everything, returns credits and wakes its neighbours.
//!
//! Resources have a capacity in units (CPUs, memory accesses per cycle) and a
//! waiting list served by priority, then arrival order. Nothing here knows a
//! published result: latency and bandwidth are read off the simulated clock.

use crate::des::{ns, ps, Queue};
use crate::preset::{Preset, StartRule};
use serde::Serialize;
use std::collections::HashMap;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Message size in bytes.
    pub msg_bytes: u64,
    /// Number of messages, all handed to the stack at time 0 (burst/stream).
    pub messages: usize,
    /// Also run the mirror flow (rx side sends to tx side) at the same time.
    pub bidirectional: bool,
    /// Keep per-packet stage records (timeline).
    pub timeline: bool,
}

/// One timeline rectangle: a stage working on a packet.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Record {
    pub layer: String,
    pub stage: String,
    pub packet: usize,
    pub message: usize,
    pub flow: usize,
    /// `sender` or `receiver`.
    pub host: String,
    pub t_start_ns: f64,
    pub t_end_ns: f64,
    pub bytes: u64,
}

/// Busy time of one resource.
#[derive(Debug, Clone, Serialize)]
pub struct ResourceUse {
    pub name: String,
    pub capacity: u32,
    /// Unit-time busy (ns) divided by capacity.
    pub busy_ns: f64,
    pub first_ns: f64,
    pub last_ns: f64,
}

/// Outcome of a run.
#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    /// Per flow, per message: (start ns, end ns).
    pub messages: Vec<Vec<(f64, f64)>>,
    pub records: Vec<Record>,
    pub resources: Vec<ResourceUse>,
    pub events: u64,
    pub end_ns: f64,
}

impl SimResult {
    /// One-way latency of the first message of flow 0 (ns).
    pub fn latency_ns(&self) -> f64 {
        let (s, e) = self.messages[0][0];
        e - s
    }

    /// Steady-state bandwidth of one flow in bits per ns (Gbit/s), measured
    /// between the completions of the first fifth and the last message.
    pub fn flow_bits_per_ns(&self, flow: usize, msg_bytes: u64) -> f64 {
        let m = &self.messages[flow];
        let n = m.len();
        if n < 2 {
            return msg_bytes as f64 * 8.0 / (m[0].1 - m[0].0);
        }
        let k0 = (n / 5).max(1) - 1;
        let dt = m[n - 1].1 - m[k0].1;
        (n - 1 - k0) as f64 * msg_bytes as f64 * 8.0 / dt
    }

    /// Sum of all flows' steady-state bandwidths (bits per ns).
    pub fn total_bits_per_ns(&self, msg_bytes: u64) -> f64 {
        (0..self.messages.len()).map(|f| self.flow_bits_per_ns(f, msg_bytes)).sum()
    }

    /// Use of a named resource.
    pub fn resource(&self, name: &str) -> Option<&ResourceUse> {
        self.resources.iter().find(|r| r.name == name)
    }
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Admit(usize),
    Granted(usize),
    Timer(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    WaitHold,
    /// Spin lock: waiting for the CPU the step will spin on.
    WaitSpinCpu,
    /// Spin lock: holding the CPU, looping until the lock is granted.
    Spin,
    WaitOverhead,
    Overhead,
    Startup,
    WaitChunk,
    Chunk,
    WaitUpstream,
    WaitOverheadAfter,
    OverheadAfter,
    Finished,
}

struct Res {
    name: String,
    cap: u32,
    used: u32,
    busy_unit_ps: u128,
    first: Option<u64>,
    last: u64,
}

struct Req {
    thread: usize,
    units: Vec<(usize, u32)>,
    prio: i32,
    seq: u64,
}

struct StageC {
    name: String,
    layer: String,
    host: &'static str,
    g_ps: u64,
    msg_ps: u64,
    on: Vec<(usize, u32)>,
    uses: Vec<(usize, u32)>,
    hold: Vec<(usize, u32)>,
    chunk: u64,
    fine: bool,
    /// starts a packet only once upstream finished its message's last segment
    whole: bool,
    threshold: u64,
    startup_ps: u64,
    header: u64,
    prio: i32,
    after: bool,
    data: bool,
    /// a `hold` lock spins: take the `on` CPU first and keep it busy while
    /// waiting for the lock
    spin: bool,
    /// per-byte ps for each distinct packet size
    per_byte: HashMap<u64, f64>,
    credit_take: Vec<usize>,
    credit_give: Vec<usize>,
    msg_at_end: bool,
    /// per-packet overhead on every n-th segment (and the last) only
    every: u64,
    /// stage whose progress gates this one (None for the first stage)
    up: Option<usize>,
    /// stages gated by this one
    downs: Vec<usize>,
}

struct Pkt {
    msg: usize,
    /// index of the segment within its message
    idx: u64,
    bytes: u64,
    first: bool,
    last: bool,
    /// index of the last segment of the same message
    last_pkt: usize,
}

/// A stage thread of one flow.
struct Thread {
    flow: usize,
    stage: usize,
    pkt: usize,
    phase: Phase,
    started: u64,
    /// chunk/fragment bookkeeping
    frag_left: u64,
    chunk_now: u64,
    held: Vec<(usize, u32)>,
    header_due: bool,
    /// when a spinning step got its CPU (ps)
    spin_since: u64,
}

struct FlowC {
    stages: Vec<StageC>,
    pkts: Vec<Pkt>,
    admitted: usize,
    /// delivered[stage][pkt]
    delivered: Vec<Vec<u64>>,
    finished: Vec<Vec<bool>>,
    credits: Vec<u32>,
    credit_per_msg: Vec<bool>,
    complete_at: usize,
    threads: Vec<usize>,
    msg_start: Vec<u64>,
    msg_end: Vec<u64>,
    /// ping-pong: messages posted so far, and per message whether it
    /// reached `complete_at` and whether every stage (acks too) finished it
    msgs_posted: usize,
    msg_complete: Vec<bool>,
    msg_done: Vec<bool>,
}

/// The simulator state.
struct Sim {
    q: Queue<Ev>,
    res: Vec<Res>,
    pending: Vec<Req>,
    seq: u64,
    flows: Vec<FlowC>,
    threads: Vec<Thread>,
    records: Vec<Record>,
    keep_records: bool,
    pingpong: bool,
}

fn swap_side(name: &str) -> String {
    if let Some(r) = name.strip_prefix("tx.") {
        format!("rx.{r}")
    } else if let Some(r) = name.strip_prefix("rx.") {
        format!("tx.{r}")
    } else {
        name.to_string()
    }
}

/// Packet sizes a message of `msg` bytes is cut into.
pub fn packetise(msg: u64, mtu: u64, segment: Option<u64>) -> Vec<u64> {
    let unit = segment.map(|s| s.min(mtu)).unwrap_or(mtu).max(1);
    if msg == 0 {
        return vec![0];
    }
    let mut v = Vec::new();
    let mut left = msg;
    while left > 0 {
        let b = left.min(unit);
        v.push(b);
        left -= b;
    }
    v
}

/// Runs `stack` of `preset` under `w`.
pub fn run(preset: &Preset, stack: &str, w: &Workload) -> Result<SimResult, String> {
    run_mode(preset, stack, w, false)
}

/// Ping-pong of `rounds` round trips of `msg_bytes` (the latency method of
/// 000 §5.2 and 003 §6.2): flow 0 sends, flow 1 (the mirror) replies. A side
/// posts its next message once the other side's message has reached
/// `complete_at` and every stage of its own previous message has finished
/// (003's sender waits for the acknowledgement too). Returns the run and
/// half the mean round-trip time (ns).
pub fn pingpong(preset: &Preset, stack: &str, msg_bytes: u64, rounds: usize) -> Result<(SimResult, f64), String> {
    let w = Workload { msg_bytes, messages: rounds.max(1), bidirectional: true, timeline: false };
    let r = run_mode(preset, stack, &w, true)?;
    let n = w.messages;
    let half = (r.messages[1][n - 1].1 - r.messages[0][0].0) / (2 * n) as f64;
    Ok((r, half))
}

fn run_mode(preset: &Preset, stack: &str, w: &Workload, pingpong: bool) -> Result<SimResult, String> {
    let st = preset.stacks.get(stack).ok_or_else(|| {
        format!(
            "preset {} has no stack {stack:?} (stacks: {})",
            preset.name,
            preset.stacks.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    })?;
    if w.messages == 0 {
        return Err("need at least one message".into());
    }
    let mut names: Vec<String> = preset.resources.keys().cloned().collect();
    if w.bidirectional {
        for n in preset.resources.keys() {
            let s = swap_side(n);
            if !names.contains(&s) {
                return Err(format!("bidirectional run needs resource {s} (mirror of {n})"));
            }
        }
    }
    names.sort();
    let mut rid: HashMap<String, usize> = names.iter().enumerate().map(|(i, n)| (n.clone(), i)).collect();
    let mut res: Vec<Res> = names
        .iter()
        .map(|n| Res {
            name: n.clone(),
            cap: preset.resources[n].capacity(),
            used: 0,
            busy_unit_ps: 0,
            first: None,
            last: 0,
        })
        .collect();
    let mtu = st.mtu_bytes.v as u64;
    let seg = st.segment_bytes.as_ref().map(|c| c.v as u64);
    let sizes = packetise(w.msg_bytes, mtu, seg);
    let nflows = if w.bidirectional { 2 } else { 1 };
    // Full-duplex buses: the host-bound direction is a second resource.
    for n in &names {
        if preset.resources[n].duplex() {
            let d = format!("{n}@to_host");
            rid.insert(d.clone(), res.len());
            res.push(Res { name: d, cap: 1, used: 0, busy_unit_ps: 0, first: None, last: 0 });
        }
    }
    let mut sim = Sim {
        q: Queue::new(),
        res,
        pending: Vec::new(),
        seq: 0,
        flows: Vec::new(),
        threads: Vec::new(),
        records: Vec::new(),
        keep_records: w.timeline,
        pingpong,
    };
    for f in 0..nflows {
        let map = |n: &str| -> usize {
            let n = if f == 1 { swap_side(n) } else { n.to_string() };
            rid[&n]
        };
        let map_use = |u: &crate::preset::Use| -> usize {
            let n = if f == 1 { swap_side(u.res()) } else { u.res().to_string() };
            match u.dir() {
                Some("to_host") if rid.contains_key(&format!("{n}@to_host")) => rid[&format!("{n}@to_host")],
                _ => rid[&n],
            }
        };
        let mut stages = Vec::new();
        for s in &st.stages {
            let mut per_byte = HashMap::new();
            for &b in &sizes {
                per_byte.entry(b).or_insert_with(|| s.per_byte_ns(preset, b as f64) * 1000.0);
            }
            let host = match (s.side.as_str(), f) {
                ("tx", 0) | ("rx", 1) => "sender",
                _ => "receiver",
            };
            stages.push(StageC {
                name: s.name.clone(),
                layer: s.layer.clone(),
                host,
                g_ps: ps(s.g_ns()),
                msg_ps: ps(s.per_message_us.as_ref().map(|c| c.v * 1000.0).unwrap_or(0.0)),
                on: s.on.iter().map(|u| (map_use(u), u.units())).collect(),
                uses: s.uses.iter().map(|u| (map_use(u), u.units())).collect(),
                hold: s.hold.iter().map(|h| (map(h), 1)).collect(),
                chunk: s.chunk_bytes.as_ref().map(|c| c.v as u64).unwrap_or(u64::MAX).max(1),
                fine: s.start == StartRule::Fine,
                whole: s.start == StartRule::Message,
                threshold: s.threshold() as u64,
                startup_ps: ps(s.s_ns()),
                header: s.header_bytes.as_ref().map(|c| c.v as u64).unwrap_or(0),
                prio: s.priority,
                after: s.overhead_after,
                data: s.per_byte.is_some(),
                // Spinning needs a CPU to spin on and the overhead before the
                // data; a step that took the lock first and asked for its CPU
                // afterwards could deadlock against a spinner.
                spin: !s.on.is_empty() && !s.overhead_after && s.hold.iter().any(|h| preset.resources[h].spins()),
                per_byte,
                credit_take: Vec::new(),
                credit_give: Vec::new(),
                msg_at_end: s.per_message_at_end,
                every: s.every_packets.as_ref().map(|c| c.v.max(1.0) as u64).unwrap_or(1),
                up: match &s.after {
                    Some(a) => st.stages.iter().position(|x| x.name == a.stage),
                    None => stages.len().checked_sub(1),
                },
                downs: Vec::new(),
            });
        }
        for i in 0..stages.len() {
            if let Some(u) = stages[i].up {
                stages[u].downs.push(i);
            }
        }
        let mut credits = Vec::new();
        for (ci, c) in st.credits.iter().enumerate() {
            credits.push(c.count.v as u32);
            // names were checked when the preset was validated
            let a = st.stages.iter().position(|s| s.name == c.acquire_at).unwrap_or(0);
            let r = st.stages.iter().position(|s| s.name == c.release_at).unwrap_or(0);
            stages[a].credit_take.push(ci);
            stages[r].credit_give.push(ci);
        }
        for c in &st.credits {
            let a = st.stages.iter().position(|s| s.name == c.acquire_at).unwrap_or(0);
            let r = st.stages.iter().position(|s| s.name == c.release_at).unwrap_or(0);
            if r < a {
                return Err(format!(
                    "credit {} is released (at {}) before it is taken (at {})",
                    c.name, c.release_at, c.acquire_at
                ));
            }
        }
        let mut pkts = Vec::new();
        for m in 0..w.messages {
            let last_pkt = (m + 1) * sizes.len() - 1;
            for (i, &b) in sizes.iter().enumerate() {
                pkts.push(Pkt { msg: m, idx: i as u64, bytes: b, first: i == 0, last: i + 1 == sizes.len(), last_pkt });
            }
        }
        let ns_ = stages.len();
        let np = pkts.len();
        let fi = sim.flows.len();
        let mut threads = Vec::new();
        for s in 0..ns_ {
            threads.push(sim.threads.len());
            sim.threads.push(Thread {
                flow: fi,
                stage: s,
                pkt: 0,
                phase: Phase::Idle,
                started: 0,
                frag_left: 0,
                chunk_now: 0,
                held: Vec::new(),
                header_due: false,
                spin_since: 0,
            });
        }
        sim.flows.push(FlowC {
            stages,
            pkts,
            admitted: 0,
            delivered: vec![vec![0; np]; ns_],
            finished: vec![vec![false; np]; ns_],
            credits,
            credit_per_msg: st.credits.iter().map(|c| c.per_message).collect(),
            complete_at: match &st.complete_at {
                Some(c) => st.stages.iter().position(|s| &s.name == c).unwrap_or(ns_ - 1),
                None => ns_ - 1,
            },
            threads,
            msg_start: vec![0; w.messages],
            msg_end: vec![0; w.messages],
            msgs_posted: usize::from(pingpong && sim.flows.is_empty()),
            msg_complete: vec![false; w.messages],
            msg_done: vec![false; w.messages],
        });
    }
    for f in 0..if pingpong { 1 } else { nflows } {
        sim.q.at(0, Ev::Admit(f));
    }
    let limit = 2_000_000_000u64;
    while let Some((_, e)) = sim.q.pop() {
        match e {
            Ev::Admit(f) => {
                let fl = &mut sim.flows[f];
                if pingpong {
                    fl.admitted = fl.pkts.iter().position(|p| p.msg >= fl.msgs_posted).unwrap_or(fl.pkts.len());
                } else {
                    fl.admitted = fl.pkts.len();
                }
                let t0 = sim.flows[f].threads[0];
                sim.poke(t0);
            }
            Ev::Granted(t) => sim.granted(t),
            Ev::Timer(t) => sim.timer(t),
        }
        if sim.q.fired() > limit {
            return Err("event limit reached (runaway simulation)".into());
        }
    }
    // Completeness check: every thread must have finished all packets.
    for t in &sim.threads {
        let fl = &sim.flows[t.flow];
        if t.pkt < fl.pkts.len() {
            return Err(format!(
                "deadlock: stage {} stopped at packet {} in phase {:?} (check credits and hold resources)",
                fl.stages[t.stage].name, t.pkt, t.phase
            ));
        }
    }
    let end = sim.q.now();
    Ok(SimResult {
        messages: sim
            .flows
            .iter()
            .map(|f| f.msg_start.iter().zip(&f.msg_end).map(|(&s, &e)| (ns(s), ns(e))).collect())
            .collect(),
        records: sim.records,
        resources: sim
            .res
            .iter()
            .map(|r| ResourceUse {
                name: r.name.clone(),
                capacity: r.cap,
                busy_ns: r.busy_unit_ps as f64 / 1000.0 / r.cap as f64,
                first_ns: ns(r.first.unwrap_or(0)),
                last_ns: ns(r.last),
            })
            .collect(),
        events: sim.q.fired(),
        end_ns: ns(end),
    })
}

impl Sim {
    fn now(&self) -> u64 {
        self.q.now()
    }

    /// Re-evaluates a thread that may be waiting.
    fn poke(&mut self, t: usize) {
        match self.threads[t].phase {
            Phase::Idle => self.try_start(t),
            Phase::WaitUpstream => self.transfer(t),
            _ => {}
        }
    }

    fn upstream_state(&self, t: usize) -> (u64, bool) {
        let th = &self.threads[t];
        let fl = &self.flows[th.flow];
        let b = fl.pkts[th.pkt].bytes;
        let Some(s) = fl.stages[th.stage].up else {
            return (b, true);
        };
        if fl.stages[th.stage].whole {
            let fin = fl.finished[s][fl.pkts[th.pkt].last_pkt];
            return (if fin { b } else { 0 }, fin);
        }
        let fin = fl.finished[s][th.pkt];
        let del = if fin || !fl.stages[s].data {
            if fin {
                b
            } else {
                0
            }
        } else {
            fl.delivered[s][th.pkt]
        };
        (del, fin)
    }

    fn try_start(&mut self, t: usize) {
        let (f, s, p) = (self.threads[t].flow, self.threads[t].stage, self.threads[t].pkt);
        let fl = &self.flows[f];
        if p >= fl.pkts.len() {
            self.threads[t].phase = Phase::Finished;
            return;
        }
        if s == 0 && p >= fl.admitted {
            return;
        }
        let (del, fin) = self.upstream_state(t);
        let st = &fl.stages[s];
        let b = fl.pkts[p].bytes;
        let ready = if s == 0 || fin {
            true
        } else if st.fine {
            del >= st.threshold.min(b).max(1)
        } else {
            false
        };
        if !ready {
            return;
        }
        let counts = |c: usize| !fl.credit_per_msg[c] || fl.pkts[p].first;
        if st.credit_take.iter().any(|&c| counts(c) && fl.credits[c] == 0) {
            return;
        }
        let takes: Vec<usize> = st.credit_take.iter().copied().filter(|&c| counts(c)).collect();
        for c in takes {
            self.flows[f].credits[c] -= 1;
        }
        if self.flows[f].pkts[p].first && s == 0 {
            let m = self.flows[f].pkts[p].msg;
            self.flows[f].msg_start[m] = self.now();
        }
        self.threads[t].started = self.now();
        self.threads[t].header_due = true;
        let hold = self.flows[f].stages[s].hold.clone();
        if hold.is_empty() {
            self.begin_overhead(t);
        } else if self.flows[f].stages[s].spin && self.overhead_ps(t) > 0 {
            // 003 §2: request the semaphore, then loop on the CPU until it
            // is granted; the CPU comes first and is busy while it waits.
            self.threads[t].phase = Phase::WaitSpinCpu;
            let on = self.flows[f].stages[s].on.clone();
            let prio = self.flows[f].stages[s].prio;
            self.request(t, on, prio);
        } else {
            self.threads[t].phase = Phase::WaitHold;
            let prio = self.flows[f].stages[s].prio;
            self.request(t, hold, prio);
        }
    }

    fn stage(&self, t: usize) -> &StageC {
        let th = &self.threads[t];
        &self.flows[th.flow].stages[th.stage]
    }

    fn overhead_ps(&self, t: usize) -> u64 {
        let th = &self.threads[t];
        let fl = &self.flows[th.flow];
        let st = &fl.stages[th.stage];
        let pk = &fl.pkts[th.pkt];
        let g = if st.every <= 1 || pk.last || (pk.idx + 1).is_multiple_of(st.every) { st.g_ps } else { 0 };
        g + if (st.msg_at_end && pk.last) || (!st.msg_at_end && pk.first) { st.msg_ps } else { 0 }
    }

    fn begin_overhead(&mut self, t: usize) {
        if self.stage(t).after {
            self.threads[t].frag_left = 0;
            self.transfer(t);
            return;
        }
        self.run_overhead(t, Phase::WaitOverhead, Phase::Overhead);
    }

    fn run_overhead(&mut self, t: usize, wait: Phase, run: Phase) {
        let d = self.overhead_ps(t);
        let on = self.stage(t).on.clone();
        if d == 0 {
            self.threads[t].phase = run;
            self.after_overhead(t);
        } else if on.is_empty() {
            self.threads[t].phase = run;
            self.q.after(d, Ev::Timer(t));
        } else {
            self.threads[t].phase = wait;
            let prio = self.stage(t).prio;
            self.request(t, on, prio);
        }
    }

    fn after_overhead(&mut self, t: usize) {
        match self.threads[t].phase {
            Phase::Overhead => {
                self.threads[t].frag_left = 0;
                self.transfer(t)
            }
            Phase::OverheadAfter => self.finish(t),
            _ => unreachable!(),
        }
    }

    /// Moves data: starts the next chunk or fragment, or waits for upstream.
    fn transfer(&mut self, t: usize) {
        let (f, s, p) = (self.threads[t].flow, self.threads[t].stage, self.threads[t].pkt);
        let st = &self.flows[f].stages[s];
        let b = self.flows[f].pkts[p].bytes;
        if !st.data {
            return self.end_data(t);
        }
        let done = self.flows[f].delivered[s][p];
        if self.threads[t].frag_left == 0 {
            if done >= b {
                return self.end_data(t);
            }
            let (del, fin) = self.upstream_state(t);
            let avail = del.saturating_sub(done);
            let enough = if st.fine { avail > 0 && (fin || avail >= st.threshold.max(1)) } else { fin && avail > 0 };
            if !enough {
                self.threads[t].phase = Phase::WaitUpstream;
                return;
            }
            self.threads[t].frag_left = avail;
            if st.startup_ps > 0 {
                self.threads[t].phase = Phase::Startup;
                let d = st.startup_ps;
                self.q.after(d, Ev::Timer(t));
                return;
            }
        }
        self.next_chunk(t);
    }

    fn next_chunk(&mut self, t: usize) {
        let st = self.stage(t);
        let c = st.chunk.min(self.threads[t].frag_left);
        let uses = st.uses.clone();
        let prio = st.prio;
        self.threads[t].chunk_now = c;
        if uses.is_empty() {
            self.threads[t].phase = Phase::Chunk;
            let d = self.chunk_ps(t);
            self.q.after(d, Ev::Timer(t));
        } else {
            self.threads[t].phase = Phase::WaitChunk;
            self.request(t, uses, prio);
        }
    }

    fn chunk_ps(&mut self, t: usize) -> u64 {
        let th = &self.threads[t];
        let fl = &self.flows[th.flow];
        let st = &fl.stages[th.stage];
        let b = fl.pkts[th.pkt].bytes;
        let pb = st.per_byte[&b];
        let extra = if th.header_due { st.header } else { 0 };
        let d = ((th.chunk_now + extra) as f64 * pb).round() as u64;
        self.threads[t].header_due = false;
        d
    }

    fn end_data(&mut self, t: usize) {
        if self.stage(t).after {
            self.run_overhead(t, Phase::WaitOverheadAfter, Phase::OverheadAfter);
        } else {
            self.finish(t);
        }
    }

    fn finish(&mut self, t: usize) {
        let now = self.now();
        let (f, s, p) = (self.threads[t].flow, self.threads[t].stage, self.threads[t].pkt);
        let held = std::mem::take(&mut self.threads[t].held);
        if !held.is_empty() {
            self.release(&held);
        }
        let b = self.flows[f].pkts[p].bytes;
        self.flows[f].delivered[s][p] = b;
        self.flows[f].finished[s][p] = true;
        let gives = self.flows[f].stages[s].credit_give.clone();
        let mut wake: Vec<usize> = Vec::new();
        for c in gives {
            if self.flows[f].credit_per_msg[c] && !self.flows[f].pkts[p].last {
                continue;
            }
            self.flows[f].credits[c] += 1;
            for (si, stg) in self.flows[f].stages.iter().enumerate() {
                if stg.credit_take.contains(&c) {
                    wake.push(self.flows[f].threads[si]);
                }
            }
        }
        if self.keep_records {
            let st = &self.flows[f].stages[s];
            let pk = &self.flows[f].pkts[p];
            self.records.push(Record {
                layer: st.layer.clone(),
                stage: st.name.clone(),
                packet: p,
                message: pk.msg,
                flow: f,
                host: st.host.to_string(),
                t_start_ns: ns(self.threads[t].started),
                t_end_ns: ns(now),
                bytes: pk.bytes,
            });
        }
        if self.flows[f].pkts[p].last {
            let m = self.flows[f].pkts[p].msg;
            if s == self.flows[f].complete_at {
                self.flows[f].msg_end[m] = now;
                self.flows[f].msg_complete[m] = true;
            }
            if self.flows[f].finished.iter().all(|st| st[p]) {
                self.flows[f].msg_done[m] = true;
            }
            if self.pingpong {
                self.pingpong_admit();
            }
        }
        self.threads[t].pkt += 1;
        self.threads[t].phase = Phase::Idle;
        self.try_start(t);
        for k in 0..self.flows[f].stages[s].downs.len() {
            let d = self.flows[f].threads[self.flows[f].stages[s].downs[k]];
            self.poke(d);
        }
        for w in wake {
            self.poke(w);
        }
    }

    /// Ping-pong: posts each side's next message once the other side's
    /// message has arrived and its own previous one is finished. The post is
    /// an event at the current time, so work the NIC starts on its own at
    /// this instant (an acknowledgement) is queued before the reply.
    fn pingpong_admit(&mut self) {
        for f in 0..self.flows.len() {
            let m = self.flows[f].msgs_posted;
            if m >= self.flows[f].msg_start.len() || (f == 0 && m == 0) {
                continue;
            }
            let (other, om) = if f == 0 { (1, m - 1) } else { (0, m) };
            let arrived = self.flows[other].msg_complete[om];
            let own_done = m == 0 || self.flows[f].msg_done[m - 1];
            if arrived && own_done {
                self.flows[f].msgs_posted += 1;
                self.q.at(self.now(), Ev::Admit(f));
            }
        }
    }

    fn request(&mut self, t: usize, units: Vec<(usize, u32)>, prio: i32) {
        self.pending.push(Req { thread: t, units, prio, seq: self.seq });
        self.seq += 1;
        self.grant();
    }

    fn grant(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.pending.sort_by(|a, b| b.prio.cmp(&a.prio).then(a.seq.cmp(&b.seq)));
        let now = self.now();
        let mut i = 0;
        while i < self.pending.len() {
            let ok = self.pending[i].units.iter().all(|&(r, u)| self.res[r].used + u <= self.res[r].cap.max(u));
            if ok {
                let req = self.pending.remove(i);
                for &(r, u) in &req.units {
                    let rs = &mut self.res[r];
                    rs.used += u;
                    rs.first.get_or_insert(now);
                }
                self.threads[req.thread].held.extend(req.units.iter().copied());
                self.q.at(now, Ev::Granted(req.thread));
            } else {
                i += 1;
            }
        }
    }

    /// Releases everything a thread took for the current step except `hold`.
    fn release(&mut self, units: &[(usize, u32)]) {
        let now = self.now();
        for &(r, u) in units {
            let rs = &mut self.res[r];
            rs.used -= u;
            rs.last = rs.last.max(now);
        }
        self.grant();
    }

    fn step_units(&self, t: usize) -> Vec<(usize, u32)> {
        let st = self.stage(t);
        match self.threads[t].phase {
            Phase::Overhead | Phase::OverheadAfter => st.on.clone(),
            Phase::Chunk => st.uses.clone(),
            _ => Vec::new(),
        }
    }

    fn account(&mut self, units: &[(usize, u32)], dur: u64) {
        for &(r, u) in units {
            self.res[r].busy_unit_ps += dur as u128 * u as u128;
        }
    }

    fn drop_step(&mut self, t: usize, units: &[(usize, u32)]) {
        // remove `units` from the thread's held list (hold resources stay)
        let held = &mut self.threads[t].held;
        for u in units {
            if let Some(i) = held.iter().position(|h| h == u) {
                held.remove(i);
            }
        }
        self.release(units);
    }

    fn granted(&mut self, t: usize) {
        match self.threads[t].phase {
            Phase::WaitHold => self.begin_overhead(t),
            Phase::WaitSpinCpu => {
                self.threads[t].phase = Phase::Spin;
                self.threads[t].spin_since = self.now();
                let hold = self.stage(t).hold.clone();
                let prio = self.stage(t).prio;
                self.request(t, hold, prio);
            }
            Phase::Spin => {
                // lock granted: the CPU was busy spinning until now, and the
                // step's overhead runs on it without asking again
                self.threads[t].phase = Phase::Overhead;
                let units = self.step_units(t);
                let spun = self.now() - self.threads[t].spin_since;
                let d = self.overhead_ps(t);
                self.account(&units, spun + d);
                self.q.after(d, Ev::Timer(t));
            }
            Phase::WaitOverhead | Phase::WaitOverheadAfter => {
                self.threads[t].phase =
                    if self.threads[t].phase == Phase::WaitOverhead { Phase::Overhead } else { Phase::OverheadAfter };
                let d = self.overhead_ps(t);
                let units = self.step_units(t);
                self.account(&units, d);
                self.q.after(d, Ev::Timer(t));
            }
            Phase::WaitChunk => {
                self.threads[t].phase = Phase::Chunk;
                let d = self.chunk_ps(t);
                let units = self.step_units(t);
                self.account(&units, d);
                self.q.after(d, Ev::Timer(t));
            }
            ph => unreachable!("grant in phase {ph:?}"),
        }
    }

    fn timer(&mut self, t: usize) {
        match self.threads[t].phase {
            Phase::Overhead | Phase::OverheadAfter => {
                let units = self.step_units(t);
                self.drop_step(t, &units);
                self.after_overhead(t);
            }
            Phase::Startup => self.next_chunk(t),
            Phase::Chunk => {
                let units = self.step_units(t);
                self.drop_step(t, &units);
                let (f, s, p) = (self.threads[t].flow, self.threads[t].stage, self.threads[t].pkt);
                let c = self.threads[t].chunk_now;
                self.flows[f].delivered[s][p] += c;
                self.threads[t].frag_left -= c;
                for k in 0..self.flows[f].stages[s].downs.len() {
                    let d = self.flows[f].threads[self.flows[f].stages[s].downs[k]];
                    if self.threads[d].pkt == p {
                        self.poke(d);
                    }
                }
                self.transfer(t);
            }
            ph => unreachable!("timer in phase {ph:?}"),
        }
    }
}
