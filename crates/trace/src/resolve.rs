//! From raw tracepoint events (one dump per process) to one path of
//! timestamps per packet, and from paths to per-layer records.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Event kinds, as numbered by `eudp_engine::tracepoint::Kind`.
pub mod kind {
    pub const SEND_CALL: u8 = 1;
    pub const TAKE: u8 = 5;
    pub const BATCH: u8 = 6;
    pub const SYS_ENTER: u8 = 7;
    pub const SYS_RETURN: u8 = 8;
    pub const KMSG: u8 = 9;
    pub const TX_SCHED: u8 = 10;
    pub const TX_SOFT: u8 = 11;
    pub const RX_ENTER: u8 = 12;
    pub const RX_SOFT: u8 = 13;
    pub const RX_PUSH: u8 = 14;
    pub const RECV_CALL: u8 = 17;
    pub const APP_SEQ: u8 = 18;
    /// An endpoint's addresses: extra = 1 (send side: b = destination) or
    /// 2 (receive side: b = source); a = local address.
    pub const EP_ADDR: u8 = 19;
}

/// One raw event: `[ts_ns, kind, ep, thread, a, b, extra]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawEvent(pub u64, pub u8, pub u64, pub u64, pub u64, pub u64, #[serde(default)] pub u64);

impl RawEvent {
    fn ts(&self) -> u64 {
        self.0
    }
    fn kind(&self) -> u8 {
        self.1
    }
    fn ep(&self) -> u64 {
        self.2
    }
    fn thread(&self) -> u64 {
        self.3
    }
    fn a(&self) -> u64 {
        self.4
    }
    fn b(&self) -> u64 {
        self.5
    }
    fn extra(&self) -> u64 {
        self.6
    }
}

/// A process's dump (`EUDP_TRACE` file).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Dump {
    #[serde(default)]
    pub clock: String,
    #[serde(default)]
    pub dropped: u64,
    /// The process that wrote it (0 in dumps made without one).
    #[serde(default)]
    pub pid: u32,
    pub events: Vec<RawEvent>,
}

/// Parses a dump.
pub fn parse_dump(text: &str) -> Result<Dump, String> {
    serde_json::from_str(text).map_err(|e| format!("invalid trace dump: {e}"))
}

/// The points of a packet's path, in path order (`CLOCK_MONOTONIC_RAW` ns;
/// `None` where the stack has no such point or it was not recorded).
pub const POINTS: [&str; 11] = [
    "app_send_enter",
    "l1_enqueue",
    "engine_take",
    "batch_formed",
    "syscall_enter",
    "tx_sched",
    "tx_software",
    "rx_software",
    "rx_read",
    "ring_delivery",
    "app_recv_return",
];

/// One packet's timestamps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Path {
    pub packet: u64,
    pub bytes: u64,
    /// Indexed like [`POINTS`].
    pub points: [Option<u64>; 11],
    /// Off-path points: the application's send call returns, the send
    /// syscall returns, the receive syscall was entered, the application's
    /// receive call was entered.
    pub app_send_return: Option<u64>,
    pub syscall_return: Option<u64>,
    pub rx_syscall_enter: Option<u64>,
    pub app_recv_enter: Option<u64>,
    /// Datagrams in the kernel message that carried it (GSO run length).
    pub msg_datagrams: u64,
}

fn by_thread(d: &Dump, ep_pick: impl Fn(&RawEvent) -> bool) -> Vec<Vec<RawEvent>> {
    let mut m: HashMap<u64, Vec<RawEvent>> = HashMap::new();
    for e in d.events.iter().filter(|e| ep_pick(e)) {
        m.entry(e.thread()).or_default().push(*e);
    }
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort_by_key(|x| x.0);
    v.into_iter().map(|x| x.1).collect()
}

/// The endpoint with the most events of `k` (the traced socket of a
/// worker) and how many it has.
fn main_ep_count(d: &Dump, k: u8) -> Option<(u64, usize)> {
    let mut c: HashMap<u64, usize> = HashMap::new();
    for e in d.events.iter().filter(|e| e.kind() == k) {
        *c.entry(e.ep()).or_default() += 1;
    }
    c.into_iter().max_by_key(|x| (x.1, std::cmp::Reverse(x.0)))
}

/// The endpoint with the most events of `k`.
fn main_ep(d: &Dump, k: u8) -> Option<u64> {
    main_ep_count(d, k).map(|x| x.0)
}

/// Calls of kind `k` on `d`'s busiest endpoint for that kind (the one
/// [`join`] follows).
pub fn main_ep_calls(d: &Dump, k: u8) -> usize {
    main_ep_count(d, k).map_or(0, |x| x.1)
}

/// The flow of a program to chart: which dump and endpoint sent, which
/// received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub tx: usize,
    pub tx_ep: u64,
    pub rx: usize,
    pub rx_ep: u64,
}

/// The addresses `d`'s endpoints recorded for `side` (1 send, 2 receive):
/// endpoint -> (local, remote), packed as the engine packs them (IPv4
/// `ip << 16 | port`, other IPv6 `1 << 48 | port`).
fn ep_addrs(d: &Dump, side: u64) -> HashMap<u64, (u64, u64)> {
    d.events
        .iter()
        .filter(|e| e.kind() == kind::EP_ADDR && e.extra() == side)
        .map(|e| (e.ep(), (e.a(), e.b())))
        .collect()
}

/// Two packed addresses name the same socket: equal ports, and equal IPv4
/// addresses where both are known (a wildcard-bound socket reports 0.0.0.0).
fn same_addr(x: u64, y: u64) -> bool {
    let port = |v: u64| v & 0xffff;
    // The IPv4 address, or 1 << 32 for an IPv6 one (compared by port only).
    let ip = |v: u64| v >> 16;
    let loose = |v: u64| ip(v) == 0 || ip(v) >> 32 != 0;
    port(x) != 0 && port(x) == port(y) && (ip(x) == ip(y) || loose(x) || loose(y))
}

/// Of the dumps of one program's processes, the flow to chart. The sender
/// is the endpoint with the most send calls (ties: the earlier dump). Its
/// receiver is the endpoint, in any dump, whose local address is the
/// sender's first destination and whose first arrival came from the
/// sender's address (the endpoints record both, [`kind::EP_ADDR`]); with
/// several, the one that took in the most datagrams; none, when receivers
/// recorded addresses: `None` (the receiver left no dump). Dumps without
/// addresses fall back to the endpoint with the most receive calls in
/// another dump, else in the sender's own. `None` also when nothing was
/// sent or nothing received.
pub fn pick_flow(dumps: &[Dump]) -> Option<Flow> {
    let (tx, tx_ep, _) = dumps
        .iter()
        .enumerate()
        .filter_map(|(i, d)| main_ep_count(d, kind::SEND_CALL).map(|(ep, n)| (i, ep, n)))
        .max_by_key(|x| (x.2, std::cmp::Reverse(x.0)))?;
    let pushes = |d: &Dump, ep: u64| {
        d.events.iter().filter(|e| e.kind() == kind::RX_PUSH && e.ep() == ep).map(|e| e.b()).sum::<u64>()
    };
    if let Some(&(local, dst)) = ep_addrs(&dumps[tx], 1).get(&tx_ep) {
        let mut best: Option<(u64, usize, u64)> = None;
        for (i, d) in dumps.iter().enumerate() {
            for (ep, (rx_local, src)) in ep_addrs(d, 2) {
                if same_addr(rx_local, dst) && same_addr(src, local) {
                    let n = pushes(d, ep);
                    if !matches!(best, Some(b) if b.0 >= n) {
                        best = Some((n, i, ep));
                    }
                }
            }
        }
        if let Some((_, rx, rx_ep)) = best {
            return Some(Flow { tx, tx_ep, rx, rx_ep });
        }
        // Receivers recorded their addresses and none is this sender's:
        // its receiver left no trace (another process's receive, or the
        // sender's replies, would be a different flow).
        if dumps.iter().any(|d| !ep_addrs(d, 2).is_empty()) {
            return None;
        }
    }
    let rx_in = |i: usize| main_ep_count(&dumps[i], kind::RECV_CALL).map(|(ep, n)| (n, i, ep));
    let other = (0..dumps.len()).filter(|&i| i != tx).filter_map(rx_in).max_by_key(|x| (x.0, std::cmp::Reverse(x.1)));
    let (_, rx, rx_ep) = other.or_else(|| rx_in(tx))?;
    Some(Flow { tx, tx_ep, rx, rx_ep })
}

/// Joins a sender dump and a receiver dump (they may be the same) into one
/// path per sent packet. The receiver's n-th datagram is the sender's n-th
/// send (the scenario checks order and loss from the payloads).
pub fn join(sender: &Dump, receiver: &Dump) -> Vec<Path> {
    join_eps(sender, main_ep(sender, kind::SEND_CALL), receiver, main_ep(receiver, kind::RX_PUSH))
}

/// As [`join`] for the given sending and receiving endpoints.
pub fn join_eps(sender: &Dump, tx_ep: Option<u64>, receiver: &Dump, rx_ep: Option<u64>) -> Vec<Path> {
    let mut paths: Vec<Path> = Vec::new();
    let idx = |paths: &mut Vec<Path>, seq: u64| -> usize {
        let i = seq as usize;
        if paths.len() <= i {
            let from = paths.len();
            paths.extend((from..=i).map(|p| Path { packet: p as u64, ..Path::default() }));
        }
        i
    };
    if let Some(ep) = tx_ep {
        let threads = by_thread(sender, |e| e.ep() == ep);
        let mut q2seq: HashMap<u64, u64> = HashMap::new();
        let mut q_take: HashMap<u64, u64> = HashMap::new();
        let mut q_batch: HashMap<u64, u64> = HashMap::new();
        // kernel message -> (packets, syscall enter, syscall return)
        let mut kmsgs: HashMap<u64, (Vec<u64>, Option<u64>, u64)> = HashMap::new();
        let mut kmsg_refs: Vec<(u64, u64, u64, bool, Option<u64>, u64)> = Vec::new();
        let mut stamps: Vec<RawEvent> = Vec::new();
        for t in &threads {
            let mut sys_enter: Option<u64> = None;
            for e in t {
                match e.kind() {
                    kind::SEND_CALL => {
                        // Enter time in a, return in ts; a queued datagram
                        // entered L1 just before the call returned, a direct
                        // post was decided just after it was entered.
                        let (q, bytes, direct) = unpack_send(e.b());
                        let i = idx(&mut paths, e.extra());
                        paths[i].points[0] = Some(e.a());
                        paths[i].app_send_return = Some(e.ts());
                        paths[i].bytes = bytes;
                        if direct {
                            for p in 1..=3 {
                                paths[i].points[p] = Some(e.a());
                            }
                        } else {
                            paths[i].points[1] = Some(e.ts());
                            q2seq.insert(q, e.extra());
                        }
                    }
                    kind::TAKE => {
                        for q in e.a()..e.a() + e.b() {
                            q_take.insert(q, e.ts());
                        }
                    }
                    kind::BATCH => {
                        for q in e.a()..e.a() + e.b() {
                            q_batch.insert(q, e.ts());
                        }
                    }
                    kind::SYS_ENTER => sys_enter = Some(e.ts()),
                    kind::KMSG => {
                        let (first, count, direct) = unpack(e.b());
                        kmsg_refs.push((e.a(), first, count, direct, sys_enter, e.ts()));
                    }
                    kind::TX_SCHED | kind::TX_SOFT => stamps.push(*e),
                    _ => {}
                }
            }
        }
        for (q, seq) in &q2seq {
            let i = idx(&mut paths, *seq);
            let take = q_take.get(q).copied();
            paths[i].points[2] = take;
            paths[i].points[3] = q_batch.get(q).copied();
            // The datagram was in L1 before the call returned and before the
            // engine took it: a caller preempted between its enqueue and its
            // return lets the engine take the datagram first.
            if let (Some(enq), Some(t)) = (paths[i].points[1], take) {
                paths[i].points[1] = Some(enq.min(t));
            }
        }
        for (k, first, count, direct, enter, ret) in kmsg_refs {
            let seqs: Vec<u64> = if direct {
                vec![first]
            } else {
                (first..first + count).filter_map(|q| q2seq.get(&q).copied()).collect()
            };
            for &s in &seqs {
                let i = idx(&mut paths, s);
                paths[i].points[4] = enter;
                paths[i].syscall_return = Some(ret);
                paths[i].msg_datagrams = count;
            }
            kmsgs.insert(k & 0xffff_ffff, (seqs, enter, ret));
        }
        for e in stamps {
            if let Some((seqs, _, _)) = kmsgs.get(&(e.a() & 0xffff_ffff)) {
                let p = if e.kind() == kind::TX_SCHED { 5 } else { 6 };
                for &s in seqs {
                    paths[s as usize].points[p] = Some(e.ts());
                }
            }
        }
    }
    // Arrival index -> application seq, where the application tagged them.
    let tags: HashMap<u64, u64> =
        receiver.events.iter().filter(|e| e.kind() == kind::APP_SEQ).map(|e| (e.a(), e.b())).collect();
    let seq_of = |arrival: u64| tags.get(&arrival).copied().unwrap_or(arrival);
    if let Some(ep) = rx_ep {
        for t in by_thread(receiver, |e| e.ep() == ep) {
            let mut rx_enter = None;
            for e in &t {
                match e.kind() {
                    kind::RX_ENTER => rx_enter = Some(e.ts()),
                    kind::RX_SOFT | kind::RX_PUSH => {
                        for s in e.a()..e.a() + e.b() {
                            let i = idx(&mut paths, seq_of(s));
                            if e.kind() == kind::RX_SOFT {
                                paths[i].points[7] = Some(e.ts());
                            } else {
                                paths[i].points[8] = Some(e.ts());
                                paths[i].rx_syscall_enter = rx_enter;
                            }
                        }
                    }
                    kind::RECV_CALL => {
                        // The datagram left the ring in this call; its
                        // return marks the delivery.
                        let i = idx(&mut paths, seq_of(e.b()));
                        paths[i].points[9] = Some(e.ts());
                        paths[i].points[10] = Some(e.ts());
                        paths[i].app_recv_enter = Some(e.a());
                    }
                    _ => {}
                }
            }
        }
    }
    paths
}

/// The paths of the datagrams a trace sampled one in `n` of
/// (`EUDP_TRACE_SAMPLE`: runs of consecutive sequence numbers, one run in
/// `n`, [`eudp_engine::tracepoint::is_sampled`], every layer of them); all
/// paths when `n` is 1. The others have at most the engine's and the
/// kernel's points, which batches record for every datagram they carry.
pub fn sampled(mut paths: Vec<Path>, n: u64) -> Vec<Path> {
    if n > 1 {
        paths.retain(|p| eudp_engine::tracepoint::is_sampled(p.packet, n));
    }
    paths
}

fn unpack(b: u64) -> (u64, u64, bool) {
    (b & ((1 << 47) - 1), b >> 48, (b >> 47) & 1 == 1)
}

fn unpack_send(b: u64) -> (u64, u64, bool) {
    (b & ((1 << 40) - 1), (b >> 40) & 0x7f_ffff, b >> 63 == 1)
}

/// Which part of a host a layer is, and whether its time is service
/// (a resource busy with the packet) or waiting in a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LayerDef {
    pub name: &'static str,
    pub host: &'static str,
    /// Service time (counts for the dominant layer) rather than queueing.
    pub service: bool,
    pub what: &'static str,
}

/// Every layer, in chart order (sender at the top, receiver at the bottom).
pub const LAYERS: [LayerDef; 10] = [
    LayerDef { name: "app.send", host: "sender", service: true, what: "application send call, enter to return" },
    LayerDef { name: "l1", host: "sender", service: false, what: "waiting in L1: enqueue to engine take" },
    LayerDef { name: "engine", host: "sender", service: true, what: "engine: take, batch formed, to syscall enter" },
    LayerDef {
        name: "kernel.tx",
        host: "sender",
        service: true,
        what: "send syscall enter to TX_SCHED (UDP/IP output)",
    },
    LayerDef { name: "qdisc", host: "sender", service: true, what: "TX_SCHED to TX_SOFTWARE (qdisc and driver)" },
    LayerDef {
        name: "veth",
        host: "wire",
        service: true,
        what: "TX_SOFTWARE to RX_SOFTWARE (veth hop, receive softirq)",
    },
    LayerDef {
        name: "socket",
        host: "receiver",
        service: false,
        what: "RX_SOFTWARE to receive syscall enter (socket queue)",
    },
    LayerDef {
        name: "kernel.rx",
        host: "receiver",
        service: true,
        what: "receive syscall enter (or RX_SOFTWARE) to read return",
    },
    LayerDef {
        name: "ring",
        host: "receiver",
        service: false,
        what: "in the eudp ring: push to delivery (the receive call's return)",
    },
    LayerDef {
        name: "app.recv",
        host: "receiver",
        service: true,
        what: "application receive call, from enter (or the ring push, if later) to return",
    },
];

/// The layers a stack has: the plain-kernel path has no L1, engine or ring.
pub fn layers_of(stack: &str) -> Vec<LayerDef> {
    LAYERS.iter().copied().filter(|l| stack != "kernel" || !matches!(l.name, "l1" | "engine" | "ring")).collect()
}

/// The interval a packet spends in a layer, or `None` when a point is missing.
pub fn interval(p: &Path, layer: &str) -> Option<(u64, u64)> {
    let pt = |i: usize| p.points[i];
    let r = match layer {
        "app.send" => (pt(0)?, p.app_send_return?),
        "l1" => (pt(1)?, pt(2)?),
        "engine" => (pt(2)?, pt(4)?),
        "kernel.tx" => (pt(4)?, pt(5)?),
        "qdisc" => (pt(5)?, pt(6)?),
        "veth" => (pt(6)?, pt(7)?),
        "socket" => {
            let s = pt(7)?;
            (s, p.rx_syscall_enter.unwrap_or(s).max(s).min(pt(8)?))
        }
        "kernel.rx" => {
            let s = pt(7)?;
            (p.rx_syscall_enter.unwrap_or(s).max(s).min(pt(8)?), pt(8)?)
        }
        "ring" => (pt(8)?, pt(9)?),
        "app.recv" => {
            let ready = pt(8)?;
            (p.app_recv_enter.unwrap_or(ready).max(ready), pt(10)?)
        }
        _ => return None,
    };
    Some(r)
}

/// One rectangle of a time-flow chart; a superset of the model's
/// `TraceRecord` (the model's `sim chart` reads these files).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub stack: String,
    pub host: String,
    pub layer: String,
    pub packet: u64,
    pub bytes: u64,
    /// Nanoseconds from the stack's first application send.
    pub t_start_ns: f64,
    pub t_end_ns: f64,
}

/// Layer records of one stack's paths, times relative to its first send.
/// A layer whose end precedes its start (clock mapping noise) is clamped to
/// zero width. Returns the records and the (packet, layer) pairs missing.
pub fn records(stack: &str, paths: &[Path]) -> (Vec<Record>, Vec<(u64, &'static str)>) {
    let t0 = paths.iter().filter_map(|p| p.points[0]).min().unwrap_or(0);
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for l in layers_of(stack) {
        for p in paths {
            match interval(p, l.name) {
                Some((s, e)) => out.push(Record {
                    stack: stack.into(),
                    host: l.host.into(),
                    layer: l.name.into(),
                    packet: p.packet,
                    bytes: p.bytes,
                    t_start_ns: s as f64 - t0 as f64,
                    t_end_ns: (e.max(s)) as f64 - t0 as f64,
                }),
                None => missing.push((p.packet, l.name)),
            }
        }
    }
    (out, missing)
}

/// Violations of path order: (packet, earlier point, later point, how far
/// back in ns) for every pair of consecutive present points that go back
/// in time by more than `tolerance_ns`.
pub fn order_violations(paths: &[Path], tolerance_ns: u64) -> Vec<(u64, &'static str, &'static str, u64)> {
    let mut v = Vec::new();
    for p in paths {
        let mut last: Option<(usize, u64)> = None;
        for (i, t) in p.points.iter().enumerate() {
            if let Some(t) = *t {
                if let Some((j, lt)) = last {
                    if lt > t + tolerance_ns {
                        v.push((p.packet, POINTS[j], POINTS[i], lt - t));
                    }
                }
                last = Some((i, t));
            }
        }
    }
    v
}
