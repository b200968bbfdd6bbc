//! A deterministic simulated channel between one `SendFlow` and one
//! `RecvFlow` on a virtual clock: seeded loss, duplication and reordering.
//! Shared by the flow tests and by the transition table's conformance test
//! (`traces` gives each side's recorded events).
#![allow(dead_code)]

use eudp_engine::emp::config::EmpConfig;
use eudp_engine::emp::event::FlowEvent;
use eudp_engine::emp::flow::recv::{RecvFlow, Verdict};
use eudp_engine::emp::flow::send::{SendDone, SendFlow};
use eudp_wire::emp::{self, Frame, DATA_HEADER_LEN};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the channel does to each frame, in percent.
#[derive(Clone, Copy, Debug)]
pub struct Impairment {
    pub loss: u32,
    pub duplicate: u32,
    pub reorder: u32,
    /// A first frame finds no posted receive (EMP's unmatched rule).
    pub unmatched: u32,
}

impl Impairment {
    pub const NONE: Impairment = Impairment { loss: 0, duplicate: 0, reorder: 0, unmatched: 0 };
}

/// The outcome of one simulated run.
#[derive(Debug, Default)]
pub struct Outcome {
    pub sent: Vec<(u64, Vec<u8>)>,
    pub delivered: Vec<(u64, Vec<u8>)>,
    pub done: Vec<SendDone>,
    pub data_lost: u64,
    pub data_duplicated: u64,
    pub elapsed: Duration,
    pub refused: u64,
    pub sender: eudp_engine::emp::flow::send::SendCounters,
    pub receiver: eudp_engine::emp::flow::recv::RecvCounters,
    pub send_events: Vec<FlowEvent>,
    pub recv_events: Vec<FlowEvent>,
}

/// splitmix64: small, seeded, good enough to drive a channel.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn percent(&mut self, p: u32) -> bool {
        (self.next() % 100) < u64::from(p)
    }
}

struct InFlight {
    at: Duration,
    order: u64,
    bytes: Vec<u8>,
}

/// A one-way channel with a base delay and the impairments.
struct Channel {
    q: Vec<InFlight>,
    order: u64,
}

impl Channel {
    fn push(&mut self, rng: &mut Rng, imp: &Impairment, now: Duration, bytes: Vec<u8>, data: bool, out: &mut Outcome) {
        if rng.percent(imp.loss) {
            if data {
                out.data_lost += 1;
            }
            return;
        }
        let copies = if rng.percent(imp.duplicate) { 2 } else { 1 };
        if copies == 2 && data {
            out.data_duplicated += 1;
        }
        for _ in 0..copies {
            let extra = if rng.percent(imp.reorder) { Duration::from_micros(rng.next() % 400) } else { Duration::ZERO };
            self.order += 1;
            self.q.push(InFlight {
                at: now + Duration::from_micros(50) + extra,
                order: self.order,
                bytes: bytes.clone(),
            });
        }
    }

    fn due(&mut self, now: Duration) -> Vec<Vec<u8>> {
        self.q.sort_by_key(|f| (f.at, f.order));
        let n = self.q.iter().take_while(|f| f.at <= now).count();
        self.q.drain(..n).map(|f| f.bytes).collect()
    }

    fn next_at(&self) -> Option<Duration> {
        self.q.iter().map(|f| f.at).min()
    }
}

/// Message `i` of a run: a length from the seed, bytes from the index.
pub fn message(rng: &mut Rng, i: usize, max_len: usize) -> Vec<u8> {
    let len = (rng.next() as usize) % (max_len + 1);
    (0..len).map(|k| (k as u64 * 31 + i as u64 * 7) as u8).collect()
}

/// Sends `messages` through the channel until all complete or `limit` of
/// virtual time passes. With `dead`, nothing reaches the receiver.
pub fn run(
    cfg: &EmpConfig,
    seed: u64,
    imp: Impairment,
    messages: usize,
    max_len: usize,
    dead: bool,
    limit: Duration,
) -> Outcome {
    let base = Instant::now();
    let mut rng = Rng::new(seed);
    let mut out = Outcome::default();
    let mut s = SendFlow::new(cfg, 0x5eed_0000 ^ seed as u32, base);
    let mut r = RecvFlow::new(cfg);
    let (mut fwd, mut back) = (Channel { q: Vec::new(), order: 0 }, Channel { q: Vec::new(), order: 0 });
    let mut pending: VecDeque<(u64, Vec<u8>)> =
        (0..messages).map(|i| (i as u64, message(&mut rng, i, max_len))).collect();
    let mut assembling: Option<(u64, Vec<u8>)> = None;
    let mut buf = vec![0u8; DATA_HEADER_LEN + cfg.frame_payload];
    let mut t = Duration::ZERO;
    let mut steps = 0u64;
    while t < limit && steps < 5_000_000 {
        steps += 1;
        let now = base + t;
        while let Some((tag, data)) = pending.pop_front() {
            match s.queue(tag, data.clone(), tag) {
                Ok(()) => out.sent.push((tag, data)),
                Err((_, d)) => {
                    out.refused += 1;
                    pending.push_front((tag, d));
                    break;
                }
            }
        }
        while let Some(f) = s.next_frame(now) {
            let n = DATA_HEADER_LEN + f.payload.len();
            emp::encode_data_header(&f.header, f.payload.len(), &mut buf).unwrap();
            buf[DATA_HEADER_LEN..n].copy_from_slice(f.payload);
            if !dead {
                fwd.push(&mut rng, &imp, t, buf[..n].to_vec(), true, &mut out);
            } else {
                out.data_lost += 1;
            }
        }
        for bytes in fwd.due(t) {
            let Ok(Frame::Data(d)) = emp::parse(&bytes) else { panic!("the channel corrupts nothing") };
            let mut frame = Some((d.header, d.payload.to_vec()));
            while let Some((h, payload)) = frame.take() {
                let Verdict::Expected { restarted } = r.classify(&h, &payload) else { break };
                if restarted {
                    assembling = None;
                }
                if h.offset == 0 && rng.percent(imp.unmatched) {
                    r.unmatched(&h);
                    break;
                }
                if h.offset == 0 {
                    assembling = Some((h.tag, Vec::with_capacity(h.msg_len as usize)));
                }
                let (tag, m) = assembling.as_mut().expect("a message in progress");
                assert_eq!((*tag, m.len()), (h.tag, h.offset as usize), "frames arrive in order");
                m.extend_from_slice(&payload);
                let last = h.offset as usize + payload.len() == h.msg_len as usize;
                r.accept(&h, last);
                if last {
                    out.delivered.push(assembling.take().unwrap());
                }
                // A held frame that is now the expected one goes the same way.
                frame = r.take_ready().map(|f| (f.header, f.payload));
            }
            if let Some((c, nak)) = r.take_control() {
                let mut cb = [0u8; emp::SACK_CONTROL_LEN];
                let n = emp::encode_control(&c, nak, &mut cb).unwrap();
                back.push(&mut rng, &imp, t, cb[..n].to_vec(), false, &mut out);
            }
        }
        for bytes in back.due(t) {
            match emp::parse(&bytes) {
                Ok(Frame::Ack(c)) => s.on_control(c, false, base + t),
                Ok(Frame::Nak(c)) => s.on_control(c, true, base + t),
                other => panic!("not a control frame: {other:?}"),
            }
        }
        s.on_timer(base + t);
        while let Some(d) = s.pop_done() {
            out.done.push(d);
        }
        if out.done.len() == messages && fwd.q.is_empty() && back.q.is_empty() {
            break;
        }
        // Advance to the next thing that happens.
        let mut next = [fwd.next_at(), back.next_at(), s.wake_at().map(|w| w.duration_since(base))]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(t + Duration::from_millis(1));
        if s.has_frame() || !pending.is_empty() {
            next = next.min(t + Duration::from_micros(10));
        }
        t = next.max(t + Duration::from_nanos(1));
    }
    out.elapsed = t;
    out.sender = s.counters();
    out.receiver = r.counters();
    out.send_events = s.take_events();
    out.recv_events = r.take_events();
    out
}

/// The recorded events of both sides of a run under loss, duplication and
/// reordering: (sender's, receiver's), for checking against the table.
pub fn traces(seed: u64) -> (Vec<FlowEvent>, Vec<FlowEvent>) {
    let cfg = EmpConfig { frame_payload: 100, window: 8, ack_group: 3, record_events: true, ..EmpConfig::default() };
    let imp = Impairment { loss: 10, duplicate: 10, reorder: 20, unmatched: 10 };
    let o = run(&cfg, seed, imp, 40, 700, false, Duration::from_secs(600));
    (o.send_events, o.recv_events)
}
