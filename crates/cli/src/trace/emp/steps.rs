//! The step records of one traced EMP run, joined per message: which
//! message each record worked on, the cost of each step per message and
//! per frame, the threads that ran it, and the checks `eudp trace --emp`
//! holds a run to (every step for every message, start before end, steps
//! in causal order, engine threads within their scheme's placement).

use eudp_engine::emp::scheme::{Scheme, Stage};
use eudp_engine::emp::steptrace::{StepRecord, CONTROL, FIRST, MESSAGE};
use eudp_engine::tracepoint::{Event, Kind};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Rows of the per-message table: the seven steps, then receive frame of
/// acknowledgments (step 5 run on the sender's side).
pub const ROWS: usize = 8;
/// The row of step 5 on acknowledgment frames.
pub const ACK_FRAME_ROW: usize = 7;

/// The row of a record: its step's index in Table 1, or [`ACK_FRAME_ROW`].
fn row_of(stage: Stage, flags: u8) -> usize {
    if stage == Stage::ReceiveFrame && flags & CONTROL != 0 {
        ACK_FRAME_ROW
    } else {
        stage as usize
    }
}

/// The name of a row.
pub fn row_name(row: usize) -> &'static str {
    match Stage::ALL.get(row) {
        Some(s) => s.name(),
        None => "receive frame (acks)",
    }
}

/// One step record.
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    pub row: usize,
    pub start: u64,
    pub end: u64,
    /// The thread's role: 0 an application thread, 1 + the engine thread's index.
    pub role: u64,
    /// The recording thread (the tracepoints' number for it).
    pub thread: u64,
    pub peer: u64,
    pub seq: u32,
    pub flags: u8,
}

/// What one step did for one message.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Span {
    pub first_start: u64,
    pub last_end: u64,
    /// The message's share of the records' time (ns).
    pub total_ns: f64,
    pub records: u32,
}

impl Span {
    fn add(&mut self, r: &Rec, share: f64) {
        if self.records == 0 || r.start < self.first_start {
            self.first_start = r.start;
        }
        self.last_end = self.last_end.max(r.end);
        self.total_ns += (r.end - r.start) as f64 * share;
        self.records += 1;
    }
}

/// One message: its flow (the sender's packed address), its first
/// sequence number, its frames, and what each row did for it.
#[derive(Clone, Debug)]
pub struct Message {
    pub flow: u64,
    pub first_seq: u32,
    pub frames: u32,
    pub steps: [Option<Span>; ROWS],
}

/// A traced run joined per message.
#[derive(Clone, Debug, Default)]
pub struct Joined {
    pub recs: Vec<Rec>,
    pub messages: Vec<Message>,
    /// Records no message took (e.g. an acknowledgment before any message).
    pub unplaced: usize,
    /// Records of messages sent before the window: a frame of one repeated
    /// (retransmitted, duplicated) or acknowledged late, after the cut.
    pub earlier: usize,
}

/// The step records among `events`, with their threads' roles.
pub fn records(events: &[Event]) -> Vec<Rec> {
    let roles: HashMap<u64, u64> =
        events.iter().filter(|e| e.kind == Kind::EmpThread as u8).map(|e| (e.thread, e.a)).collect();
    events
        .iter()
        .filter(|e| e.kind == Kind::EmpStep as u8)
        .filter_map(|e| {
            let r = StepRecord::unpack(e.extra)?;
            Some(Rec {
                row: row_of(r.stage, r.flags),
                start: e.a,
                end: e.ts_ns,
                role: roles.get(&e.thread).copied().unwrap_or(0),
                thread: e.thread,
                peer: e.b,
                seq: r.seq,
                flags: r.flags,
            })
        })
        .collect()
}

/// The sender of the flow a record belongs to: the peer for the data
/// receiver's steps, the other endpoint for the data sender's.
fn flow_of(r: &Rec, other: impl Fn(u64) -> u64) -> u64 {
    let senders_side = matches!(r.row, 0..=2 | ACK_FRAME_ROW);
    if senders_side {
        other(r.peer)
    } else {
        r.peer
    }
}

/// Joins the records of a run between two endpoints per message.
pub fn join(mut recs: Vec<Rec>) -> Result<Joined, String> {
    recs.sort_by_key(|r| r.start);
    let addrs: BTreeSet<u64> = recs.iter().map(|r| r.peer).collect();
    if addrs.len() != 2 {
        return Err(format!("step records name {} endpoints; a run has two", addrs.len()));
    }
    let pair: Vec<u64> = addrs.into_iter().collect();
    let other = |x: u64| if x == pair[0] { pair[1] } else { pair[0] };
    let mut flows: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, r) in recs.iter().enumerate() {
        flows.entry(flow_of(r, other)).or_default().push(i);
    }
    let mut out = Joined::default();
    for (flow, idx) in flows {
        let data = |r: &Rec| r.flags & (CONTROL | MESSAGE) == 0;
        // A message is its flow and its first frame's sequence number, as
        // on the wire: a repeat of a first frame is its message again. The
        // window's messages are the last as many of them as its sends
        // posted; the lower ones were sent before the window, and their
        // records here are late repeats or acknowledgments.
        let firsts: BTreeSet<u32> =
            idx.iter().map(|&i| &recs[i]).filter(|r| data(r) && r.flags & FIRST != 0).map(|r| r.seq).collect();
        let posted_here = idx.iter().filter(|&&i| recs[i].flags & MESSAGE != 0).count();
        let firsts: Vec<u32> = firsts.into_iter().collect();
        let firsts = firsts[firsts.len().saturating_sub(posted_here)..].to_vec();
        // Sequence numbers below this belong to messages before the window.
        let floor = firsts.first().copied().unwrap_or(u32::MAX);
        let high = idx.iter().map(|&i| &recs[i]).filter(|r| data(r)).map(|r| r.seq).max().unwrap_or(0);
        let base = out.messages.len();
        for (k, &f) in firsts.iter().enumerate() {
            let end = firsts.get(k + 1).copied().unwrap_or(high.wrapping_add(1));
            out.messages.push(Message { flow, first_seq: f, frames: end - f, steps: [None; ROWS] });
        }
        let n = firsts.len();
        let ends: Vec<u32> = out.messages[base..].iter().map(|m| m.first_seq.wrapping_add(m.frames)).collect();
        // The message holding sequence number `s`.
        let holding = |s: u32| firsts.partition_point(|&f| f <= s).checked_sub(1);
        let mut posted = 0usize;
        // Per acknowledgment row: messages already covered.
        let mut covered = [0usize; ROWS];
        for &i in &idx {
            let r = recs[i];
            let before_window = if r.flags & CONTROL != 0 { r.seq <= floor } else { r.seq < floor };
            if r.flags & MESSAGE == 0 && before_window {
                out.earlier += 1;
                continue;
            }
            let mut add = |m: usize, share: f64| {
                out.messages[base + m].steps[r.row].get_or_insert_with(Span::default).add(&r, share);
            };
            if r.flags & MESSAGE != 0 {
                // Sends are taken in their flow's order: the k-th is message k.
                if posted < n {
                    add(posted, 1.0);
                } else {
                    out.unplaced += 1;
                }
                posted += 1;
            } else if r.flags & CONTROL != 0 {
                // An acknowledgment covers every message whose frames all
                // lie below its `next`; one that completes none is charged
                // to the message it falls in.
                let upto = firsts.partition_point(|&f| f < r.seq);
                let newly: Vec<usize> = (covered[r.row]..upto).filter(|&m| ends[m] <= r.seq).collect();
                if let Some(&last) = newly.last() {
                    covered[r.row] = last + 1;
                    for &m in &newly {
                        add(m, 1.0 / newly.len() as f64);
                    }
                } else if let Some(m) = holding(r.seq.wrapping_sub(1)) {
                    add(m, 1.0);
                } else {
                    out.unplaced += 1;
                }
            } else if let Some(m) = holding(r.seq) {
                add(m, 1.0);
            } else {
                out.unplaced += 1;
            }
        }
    }
    out.recs = recs;
    Ok(out)
}

/// The causal order of a message's steps by their first start: send
/// bookkeeping, transmission, receive frame, receive bookkeeping,
/// receiving, send acknowledgment, receive acknowledgment.
pub const CAUSAL: [Stage; 7] = [
    Stage::SendBookkeeping,
    Stage::Transmission,
    Stage::ReceiveFrame,
    Stage::ReceiveBookkeeping,
    Stage::Receiving,
    Stage::SendAcknowledgment,
    Stage::ReceiveAcknowledgment,
];

/// What a run is checked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checks {
    /// Messages without one of the seven steps.
    pub missing_steps: usize,
    /// Records that end before they start.
    pub reversed: usize,
    /// Messages whose steps start out of [`CAUSAL`] order.
    pub out_of_order: usize,
    /// Records of an engine thread whose stage its scheme places elsewhere.
    pub misplaced: usize,
    /// The first problems, as text.
    pub notes: Vec<String>,
}

impl Checks {
    pub fn ok(&self) -> bool {
        self.missing_steps == 0 && self.reversed == 0 && self.out_of_order == 0 && self.misplaced == 0
    }
}

/// Checks a joined run of `scheme`.
pub fn check(j: &Joined, scheme: Scheme) -> Checks {
    let mut c = Checks::default();
    let note = |c: &mut Checks, s: String| {
        if c.notes.len() < 8 {
            c.notes.push(s);
        }
    };
    let placement = scheme.placement();
    for r in &j.recs {
        if r.end < r.start {
            c.reversed += 1;
        }
        let stage = Stage::ALL[if r.row == ACK_FRAME_ROW { Stage::ReceiveFrame as usize } else { r.row }];
        if r.role >= 1 && !placement.get(r.role as usize - 1).is_some_and(|t| t.contains(&stage)) {
            c.misplaced += 1;
            note(&mut c, format!("{} ran on engine thread {}", stage.name(), r.role - 1));
        }
    }
    for m in &j.messages {
        let missing: Vec<&str> =
            Stage::ALL.iter().filter(|s| m.steps[**s as usize].is_none()).map(|s| s.name()).collect();
        if !missing.is_empty() {
            c.missing_steps += 1;
            note(&mut c, format!("message {:#x}/{} lacks {}", m.flow, m.first_seq, missing.join(", ")));
            continue;
        }
        let starts: Vec<u64> = CAUSAL.iter().map(|s| m.steps[*s as usize].map_or(0, |x| x.first_start)).collect();
        if let Some(w) = starts.windows(2).position(|w| w[0] > w[1]) {
            c.out_of_order += 1;
            note(
                &mut c,
                format!(
                    "message {:#x}/{}: {} starts {} ns after {}",
                    m.flow,
                    m.first_seq,
                    CAUSAL[w].name(),
                    starts[w] - starts[w + 1],
                    CAUSAL[w + 1].name()
                ),
            );
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use eudp_engine::emp::steptrace::LAST;

    fn rec(stage: Stage, t: u64, peer: u64, seq: u32, flags: u8, role: u64) -> Rec {
        Rec { row: row_of(stage, flags), start: t, end: t + 1, role, thread: role, peer, seq, flags }
    }

    #[test]
    fn records_join_per_message_and_check() {
        // Endpoint 1 sends two one-frame messages (seq 0 and 1) to endpoint 2.
        let a = 1;
        let mut v = Vec::new();
        for (k, t) in [(0u32, 0u64), (1, 100)] {
            one_frame_message(&mut v, k, t);
        }
        let j = join(v.clone()).unwrap();
        assert_eq!(j.messages.len(), 2);
        assert_eq!(j.unplaced, 0);
        assert!(j.messages.iter().all(|m| m.flow == a && m.frames == 1 && m.steps.iter().all(|s| s.is_some())));
        let c = check(&j, Scheme::Base);
        assert!(c.ok(), "{c:?}");
        // Receive frame and receiving on engine thread A break RO's
        // placement (B runs them): four frames received, two taken.
        assert_eq!(check(&j, Scheme::ReceiveOnly).misplaced, 6);
        // Receiving before receive bookkeeping is out of order.
        let mut bad = v;
        bad[4].start = 5;
        bad[4].end = 6;
        assert_eq!(check(&join(bad).unwrap(), Scheme::Base).out_of_order, 1);
    }

    /// A message's records in the order the run makes them: endpoint 1
    /// sends a one-frame message `k` to endpoint 2 at time `t`.
    fn one_frame_message(v: &mut Vec<Rec>, k: u32, t: u64) {
        use Stage::*;
        let (a, b) = (1, 2);
        v.push(rec(SendBookkeeping, t, b, 10, MESSAGE, 1));
        v.push(rec(Transmission, t + 10, b, k, FIRST | LAST, 1));
        v.push(rec(ReceiveFrame, t + 20, a, k, FIRST | LAST, 1));
        v.push(rec(ReceiveBookkeeping, t + 30, a, k, FIRST | LAST, 1));
        v.push(rec(Receiving, t + 40, a, k, FIRST | LAST, 1));
        v.push(rec(SendAcknowledgment, t + 50, a, k + 1, CONTROL, 1));
        v.push(rec(ReceiveFrame, t + 60, b, k + 1, CONTROL, 1));
        v.push(rec(ReceiveAcknowledgment, t + 70, b, k + 1, CONTROL, 1));
    }

    /// What a loaded run recorded: the last message before the window
    /// (seq 4) retransmitted before the cut and received after it, so the
    /// window holds its receive-side steps and its acknowledgment but not
    /// its sending; and a window message's first frame repeated. The
    /// repeats are their messages again, not messages of their own.
    #[test]
    fn a_repeated_first_frame_is_its_message_again() {
        use Stage::*;
        let (a, b) = (1, 2);
        let mut v = vec![
            rec(ReceiveFrame, 1, a, 4, FIRST | LAST, 1),
            rec(ReceiveBookkeeping, 2, a, 4, FIRST | LAST, 1),
            rec(SendAcknowledgment, 3, a, 5, CONTROL, 1),
            rec(ReceiveFrame, 4, b, 5, CONTROL, 1),
            rec(ReceiveAcknowledgment, 5, b, 5, CONTROL, 1),
        ];
        one_frame_message(&mut v, 5, 100);
        one_frame_message(&mut v, 6, 200);
        // Message 5's frame again (a retransmission the receiver drops).
        v.push(rec(Transmission, 300, b, 5, FIRST | LAST, 1));
        v.push(rec(ReceiveFrame, 310, a, 5, FIRST | LAST, 1));
        let j = join(v).unwrap();
        let firsts: Vec<u32> = j.messages.iter().map(|m| m.first_seq).collect();
        assert_eq!(firsts, [5, 6]);
        assert_eq!(j.earlier, 5);
        assert_eq!(j.unplaced, 0);
        assert_eq!(j.messages[0].steps[Transmission as usize].unwrap().records, 2);
        assert_eq!(j.messages[0].steps[ReceiveFrame as usize].unwrap().records, 2);
        assert!(check(&j, Scheme::Base).ok());
    }
}
