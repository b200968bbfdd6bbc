//! The selective-repeat flow of EMP as one transition table: the single
//! source of truth shared by the trace checker (which replays the events
//! the protocol code records) and `eudp verify` (which prints the same rows
//! as Promela).
//!
//! The state is abstract and small. The sender keeps `base` (oldest
//! unacknowledged sequence number), `ptr` (the next frame it transmits in
//! order: below `top` only while it sends again frames the socket did not
//! take, equal to `top` otherwise) and `top` (the next new sequence
//! number); a repair sends one frame of `[base, ptr)` again and moves none
//! of them. The receiver keeps `exp` (the next sequence number it
//! accepts), `since` (frames accepted since its last acknowledgment),
//! `gap_seen` (a frame above `exp` arrived since the last accept) and
//! `nak_sent` (the negative acknowledgment for that gap is out). Which
//! frames above `exp` the receiver holds is data, not state of the table:
//! a held frame is accepted, by the `Accept` row, once it is the expected
//! one.
//!
//! The receiver takes an acknowledgment in one of two rows: `AckOut` sends
//! it at once; `AckDelayed` (a message's last frame, nothing else owed)
//! keeps it to ride on a data frame of the reverse flow, or to leave alone
//! when the delay ends, unless a later acknowledgment replaces it first.
//! Both name the expected frame as of the moment they are taken, and the
//! sender takes either with its `AckIn` row.
//!
//! State variables are counters: wrapping `u32` in the checker, small
//! absolute numbers in the model. Guards compare only distances between
//! counters (`top - base`) and small numbers, never two counters, so the
//! same comparison holds on both across a wrap. Only
//! sequence numbers on the wire (event parameters) are read relative to a
//! state variable, through [`Term::Dist`]: `(b - a) mod M`, with `M` = 2^32 in
//! the checker and the model's small sequence space `S` in Promela. That is
//! exactly where a too-large window turns a stale frame into a new one.

use super::event::FlowEvent;
use std::fmt;

/// A [`FlowEvent`] without its parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    SendNew,
    Resend,
    AckIn,
    NakIn,
    Timeout,
    GoBack,
    GiveUp,
    Accept,
    Duplicate,
    Gap,
    Unmatched,
    AckOut,
    NakOut,
    Repair,
    Hold,
    AckDelayed,
}

impl Kind {
    /// Every kind, in table order.
    pub const ALL: [Kind; 16] = [
        Kind::SendNew,
        Kind::Resend,
        Kind::AckIn,
        Kind::NakIn,
        Kind::Timeout,
        Kind::GoBack,
        Kind::GiveUp,
        Kind::Accept,
        Kind::Duplicate,
        Kind::Gap,
        Kind::Unmatched,
        Kind::AckOut,
        Kind::NakOut,
        Kind::Repair,
        Kind::Hold,
        Kind::AckDelayed,
    ];

    /// The side that performs events of this kind.
    pub fn side(self) -> Side {
        match self {
            Kind::SendNew
            | Kind::Resend
            | Kind::Repair
            | Kind::AckIn
            | Kind::NakIn
            | Kind::Timeout
            | Kind::GoBack
            | Kind::GiveUp => Side::Sender,
            _ => Side::Receiver,
        }
    }

    /// The event with parameter `p` (ignored by kinds without one).
    pub fn with_param(self, p: u32) -> FlowEvent {
        match self {
            Kind::SendNew => FlowEvent::SendNew { seq: p },
            Kind::Resend => FlowEvent::Resend { seq: p },
            Kind::AckIn => FlowEvent::AckIn { next: p },
            Kind::NakIn => FlowEvent::NakIn { next: p },
            Kind::Timeout => FlowEvent::Timeout,
            Kind::GoBack => FlowEvent::GoBack { seq: p },
            Kind::GiveUp => FlowEvent::GiveUp,
            Kind::Accept => FlowEvent::Accept { seq: p },
            Kind::Duplicate => FlowEvent::Duplicate { seq: p },
            Kind::Gap => FlowEvent::Gap { seq: p },
            Kind::Unmatched => FlowEvent::Unmatched { seq: p },
            Kind::AckOut => FlowEvent::AckOut { next: p },
            Kind::NakOut => FlowEvent::NakOut { next: p },
            Kind::Repair => FlowEvent::Repair { seq: p },
            Kind::Hold => FlowEvent::Hold { seq: p },
            Kind::AckDelayed => FlowEvent::AckDelayed { next: p },
        }
    }
}

/// The kind of `e`.
pub fn kind(e: &FlowEvent) -> Kind {
    match e {
        FlowEvent::SendNew { .. } => Kind::SendNew,
        FlowEvent::Resend { .. } => Kind::Resend,
        FlowEvent::AckIn { .. } => Kind::AckIn,
        FlowEvent::NakIn { .. } => Kind::NakIn,
        FlowEvent::Timeout => Kind::Timeout,
        FlowEvent::GoBack { .. } => Kind::GoBack,
        FlowEvent::GiveUp => Kind::GiveUp,
        FlowEvent::Accept { .. } => Kind::Accept,
        FlowEvent::Duplicate { .. } => Kind::Duplicate,
        FlowEvent::Gap { .. } => Kind::Gap,
        FlowEvent::Unmatched { .. } => Kind::Unmatched,
        FlowEvent::AckOut { .. } => Kind::AckOut,
        FlowEvent::NakOut { .. } => Kind::NakOut,
        FlowEvent::Repair { .. } => Kind::Repair,
        FlowEvent::Hold { .. } => Kind::Hold,
        FlowEvent::AckDelayed { .. } => Kind::AckDelayed,
    }
}

/// The sequence number an event carries (`seq` or `next`), if any.
pub fn param(e: &FlowEvent) -> Option<u32> {
    match *e {
        FlowEvent::SendNew { seq }
        | FlowEvent::Resend { seq }
        | FlowEvent::Accept { seq }
        | FlowEvent::Duplicate { seq }
        | FlowEvent::Gap { seq }
        | FlowEvent::Unmatched { seq }
        | FlowEvent::Repair { seq }
        | FlowEvent::Hold { seq }
        | FlowEvent::GoBack { seq } => Some(seq),
        FlowEvent::AckIn { next }
        | FlowEvent::NakIn { next }
        | FlowEvent::AckOut { next }
        | FlowEvent::AckDelayed { next }
        | FlowEvent::NakOut { next } => Some(next),
        FlowEvent::Timeout | FlowEvent::GiveUp => None,
    }
}

/// The two ends of a flow; each records its own trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Sender,
    Receiver,
}

/// A variable of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Var {
    Base,
    Ptr,
    Top,
    Exp,
    Since,
    /// 0 or 1.
    GapSeen,
    /// 0 or 1.
    NakSent,
}

impl Var {
    /// Every variable, sender's first.
    pub const ALL: [Var; 7] = [Var::Base, Var::Ptr, Var::Top, Var::Exp, Var::Since, Var::GapSeen, Var::NakSent];

    /// The variable's name in the Promela model.
    pub fn promela(self) -> &'static str {
        match self {
            Var::Base => "base",
            Var::Ptr => "ptr",
            Var::Top => "top",
            Var::Exp => "exp",
            Var::Since => "since",
            Var::GapSeen => "gap_seen",
            Var::NakSent => "nak_sent",
        }
    }

    /// The side that owns the variable.
    pub fn side(self) -> Side {
        match self {
            Var::Base | Var::Ptr | Var::Top => Side::Sender,
            _ => Side::Receiver,
        }
    }
}

/// A value in a guard or an effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Term {
    Var(Var),
    Const(u32),
    /// The event's sequence number (`seq` or `next`): a value from the wire.
    Param,
    /// The flow-control window in frames (`W`).
    Window,
    /// Frames accepted per acknowledgment (`G`).
    AckGroup,
    Add(Box<Term>, Box<Term>),
    /// `a - b` for counters (never below zero in a valid state).
    Sub(Box<Term>, Box<Term>),
    /// `Dist(a, b)`: how far sequence number `b` lies ahead of `a` in the
    /// sequence space, `(b - a) mod M`.
    Dist(Box<Term>, Box<Term>),
    /// The later of two counters.
    Max(Box<Term>, Box<Term>),
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Eq,
    Ge,
}

impl Op {
    fn symbol(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "==",
            Op::Ge => ">=",
        }
    }
}

/// A guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cond {
    Cmp(Term, Op, Term),
    All(Vec<Cond>),
}

/// An effect: `var = term`, evaluated after the effects before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect(pub Var, pub Term);

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub kind: Kind,
    pub guard: Cond,
    pub effects: Vec<Effect>,
    /// One line for humans and for the generated Promela.
    pub doc: &'static str,
}

/// The whole flow: one row per event kind and the invariants every
/// reachable state satisfies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub rules: Vec<Rule>,
    /// `(name, condition)` pairs checked after every step.
    pub invariants: Vec<(&'static str, Cond)>,
}

impl Table {
    /// The row for `kind`.
    pub fn rule(&self, kind: Kind) -> &Rule {
        self.rules.iter().find(|r| r.kind == kind).expect("every event kind has a rule")
    }

    /// The row for `kind`, mutably (for deliberately broken variants).
    pub fn rule_mut(&mut self, kind: Kind) -> &mut Rule {
        self.rules.iter_mut().find(|r| r.kind == kind).expect("every event kind has a rule")
    }
}

fn v(x: Var) -> Term {
    Term::Var(x)
}
fn c(k: u32) -> Term {
    Term::Const(k)
}
fn plus1(x: Var) -> Term {
    Term::Add(Box::new(v(x)), Box::new(c(1)))
}
fn sub(a: Term, b: Term) -> Term {
    Term::Sub(Box::new(a), Box::new(b))
}
fn dist(a: Term, b: Term) -> Term {
    Term::Dist(Box::new(a), Box::new(b))
}
fn cmp(a: Term, op: Op, b: Term) -> Cond {
    Cond::Cmp(a, op, b)
}
/// The wire value is the one `x` names.
fn at(x: Var) -> Cond {
    cmp(dist(v(x), Term::Param), Op::Eq, c(0))
}
fn set(x: Var, t: Term) -> Effect {
    Effect(x, t)
}

/// The flow of the shared design (see the module header), as a table.
pub fn table() -> Table {
    use Var::*;
    // An acknowledgment is meaningful when it names a frame in
    // [base, top]: below is stale (reordered), above was never sent.
    let ack_in_range = cmp(dist(v(Base), Term::Param), Op::Le, sub(v(Top), v(Base)));
    let release = set(Base, Term::Add(Box::new(v(Base)), Box::new(dist(v(Base), Term::Param))));
    let ahead = dist(v(Exp), Term::Param);
    let rules = vec![
        Rule {
            kind: Kind::SendNew,
            guard: Cond::All(vec![
                cmp(v(Ptr), Op::Eq, v(Top)),
                at(Top),
                cmp(sub(v(Top), v(Base)), Op::Lt, Term::Window),
            ]),
            effects: vec![set(Top, plus1(Top)), set(Ptr, plus1(Ptr))],
            doc: "sender: not going back and the window has room -> transmit the next new frame",
        },
        Rule {
            kind: Kind::Resend,
            guard: Cond::All(vec![cmp(sub(v(Top), v(Ptr)), Op::Ge, c(1)), at(Ptr)]),
            effects: vec![set(Ptr, plus1(Ptr))],
            doc: "sender: going back -> transmit again the frame ptr names, sent before and not acknowledged",
        },
        Rule {
            kind: Kind::Repair,
            guard: cmp(dist(v(Base), Term::Param), Op::Lt, sub(v(Ptr), v(Base))),
            effects: vec![],
            doc: "sender: a frame in [base, ptr) reported missing, or the oldest after a timeout -> transmit it again alone",
        },
        Rule {
            kind: Kind::AckIn,
            guard: ack_in_range.clone(),
            effects: vec![release.clone(), set(Ptr, Term::Max(Box::new(v(Ptr)), Box::new(v(Base))))],
            doc: "sender: cumulative ack in [base, top] -> release the frames below it; no resend of released frames",
        },
        Rule {
            kind: Kind::NakIn,
            guard: ack_in_range,
            effects: vec![release, set(Ptr, Term::Max(Box::new(v(Ptr)), Box::new(v(Base))))],
            doc: "sender: NAK in [base, top] -> release the frames below it; the frame it names is repaired",
        },
        Rule {
            kind: Kind::Timeout,
            guard: cmp(sub(v(Top), v(Base)), Op::Ge, c(1)),
            effects: vec![],
            doc: "sender: timer fired with frames unacknowledged -> the oldest is repaired",
        },
        Rule {
            kind: Kind::GoBack,
            guard: cmp(dist(v(Base), Term::Param), Op::Lt, sub(v(Ptr), v(Base))),
            effects: vec![set(Ptr, Term::Add(Box::new(v(Base)), Box::new(dist(v(Base), Term::Param))))],
            doc: "sender: frames from one in [base, ptr) on never reached the wire -> send them again from there",
        },
        Rule {
            kind: Kind::GiveUp,
            guard: cmp(sub(v(Top), v(Base)), Op::Ge, c(1)),
            effects: vec![set(Base, v(Top)), set(Ptr, v(Top))],
            doc: "sender: deadline passed without progress -> the unacknowledged frames complete with an error",
        },
        Rule {
            kind: Kind::Accept,
            // An owed ack goes out once per batch of received frames, so
            // more than G frames may be accepted before it; the sender's
            // window bounds them: it sent frame `exp` below `base + W`, and
            // `base` is at most the `next` of the last ack sent.
            guard: Cond::All(vec![at(Exp), cmp(v(Since), Op::Lt, Term::Window)]),
            effects: vec![set(Exp, plus1(Exp)), set(Since, plus1(Since)), set(GapSeen, c(0)), set(NakSent, c(0))],
            doc: "receiver: the expected frame, fewer than W accepted since the last ack or NAK -> accept it",
        },
        Rule {
            kind: Kind::Duplicate,
            guard: cmp(ahead.clone(), Op::Ge, Term::Window),
            effects: vec![],
            doc: "receiver: a frame no sender within the window can send as new -> duplicate, dropped (and acked)",
        },
        Rule {
            kind: Kind::Gap,
            guard: Cond::All(vec![cmp(ahead.clone(), Op::Ge, c(1)), cmp(ahead.clone(), Op::Lt, Term::Window)]),
            effects: vec![set(GapSeen, c(1))],
            doc: "receiver: a frame above the expected one, within the window, held already -> dropped",
        },
        Rule {
            kind: Kind::Hold,
            guard: Cond::All(vec![cmp(ahead.clone(), Op::Ge, c(1)), cmp(ahead.clone(), Op::Lt, Term::Window)]),
            effects: vec![set(GapSeen, c(1))],
            doc: "receiver: a frame above the expected one, within the window -> held until it is the expected one",
        },
        Rule {
            kind: Kind::Unmatched,
            guard: at(Exp),
            effects: vec![],
            doc: "receiver: the expected first frame of a message matches no posted receive -> dropped, not acked",
        },
        Rule {
            kind: Kind::AckOut,
            guard: at(Exp),
            effects: vec![set(Since, c(0))],
            doc: "receiver: acknowledge every frame below the expected one, as of the moment the ack is sent",
        },
        Rule {
            kind: Kind::AckDelayed,
            guard: at(Exp),
            effects: vec![set(Since, c(0))],
            doc: "receiver: acknowledge every frame below the expected one later: on a reverse data frame or alone",
        },
        Rule {
            kind: Kind::NakOut,
            guard: Cond::All(vec![at(Exp), cmp(v(GapSeen), Op::Eq, c(1)), cmp(v(NakSent), Op::Eq, c(0))]),
            effects: vec![set(NakSent, c(1)), set(Since, c(0))],
            doc: "receiver: a gap and no NAK out for it yet -> NAK naming the expected frame (once per gap)",
        },
    ];
    Table {
        rules,
        invariants: vec![
            // `base <= ptr <= top` as distances: a counter outside the range
            // makes one of them exceed `top - base` (wrapping on u32,
            // negative in Promela).
            ("base_le_ptr", cmp(sub(v(Ptr), v(Base)), Op::Le, sub(v(Top), v(Base)))),
            ("ptr_le_top", cmp(sub(v(Top), v(Ptr)), Op::Le, sub(v(Top), v(Base)))),
            ("window", cmp(sub(v(Top), v(Base)), Op::Le, Term::Window)),
            ("ack_window", cmp(v(Since), Op::Le, Term::Window)),
        ],
    }
}

// ---------------------------------------------------------------------------
// Interpreter: replays recorded traces.
// ---------------------------------------------------------------------------

/// The parameters of a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Frames the sender may have unacknowledged.
    pub window: u32,
    /// Frames the receiver accepts per acknowledgment.
    pub ack_group: u32,
    /// The flow's first sequence number.
    pub first_seq: u32,
}

/// The table's state. On `u32`, counters wrap; guards compare distances
/// between them, and [`Term::Max`] uses serial-number arithmetic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowState {
    pub base: u32,
    pub ptr: u32,
    pub top: u32,
    pub exp: u32,
    pub since: u32,
    pub gap_seen: u32,
    pub nak_sent: u32,
}

impl FlowState {
    /// A fresh flow whose first frame is `first_seq`.
    pub fn starting_at(first_seq: u32) -> Self {
        FlowState { base: first_seq, ptr: first_seq, top: first_seq, exp: first_seq, ..FlowState::default() }
    }

    fn get(&self, x: Var) -> u32 {
        match x {
            Var::Base => self.base,
            Var::Ptr => self.ptr,
            Var::Top => self.top,
            Var::Exp => self.exp,
            Var::Since => self.since,
            Var::GapSeen => self.gap_seen,
            Var::NakSent => self.nak_sent,
        }
    }

    fn set(&mut self, x: Var, val: u32) {
        match x {
            Var::Base => self.base = val,
            Var::Ptr => self.ptr = val,
            Var::Top => self.top = val,
            Var::Exp => self.exp = val,
            Var::Since => self.since = val,
            Var::GapSeen => self.gap_seen = val,
            Var::NakSent => self.nak_sent = val,
        }
    }
}

/// `a` before `b` in serial-number arithmetic (RFC 1982 style on `u32`).
fn serial_lt(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

impl Op {
    fn holds(self, a: u32, b: u32) -> bool {
        match self {
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Eq => a == b,
            Op::Ge => a >= b,
        }
    }
}

struct Env<'a> {
    s: &'a FlowState,
    p: &'a Params,
    param: Option<u32>,
}

impl Env<'_> {
    fn term(&self, t: &Term) -> u32 {
        match t {
            Term::Var(x) => self.s.get(*x),
            Term::Const(k) => *k,
            Term::Param => self.param.unwrap_or(0),
            Term::Window => self.p.window,
            Term::AckGroup => self.p.ack_group,
            Term::Add(a, b) => self.term(a).wrapping_add(self.term(b)),
            Term::Sub(a, b) | Term::Dist(b, a) => self.term(a).wrapping_sub(self.term(b)),
            Term::Max(a, b) => {
                let (a, b) = (self.term(a), self.term(b));
                if serial_lt(a, b) {
                    b
                } else {
                    a
                }
            }
        }
    }

    fn cond(&self, g: &Cond) -> bool {
        match g {
            Cond::Cmp(a, op, b) => op.holds(self.term(a), self.term(b)),
            Cond::All(xs) => xs.iter().all(|x| self.cond(x)),
        }
    }
}

/// The first event of a trace that the table does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Position of the event in the trace.
    pub index: usize,
    pub event: FlowEvent,
    /// The state before the event.
    pub state: FlowState,
    pub reason: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event #{} {:?} from {:?}: {}", self.index, self.event, self.state, self.reason)
    }
}

impl std::error::Error for Violation {}

/// One step: the state after `event`, or why the table does not allow it
/// (the [`Violation::index`] is 0; [`check_trace`] fills it in).
pub fn step(table: &Table, state: FlowState, event: FlowEvent, params: &Params) -> Result<FlowState, Violation> {
    let fail = |reason: String| Violation { index: 0, event, state, reason };
    let rule = table.rule(kind(&event));
    let param = param(&event);
    let env = Env { s: &state, p: params, param };
    if !env.cond(&rule.guard) {
        return Err(fail(format!("guard {} does not hold", render_cond(&rule.guard, "PARAM"))));
    }
    let mut next = state;
    for Effect(x, t) in &rule.effects {
        let val = Env { s: &next, p: params, param }.term(t);
        next.set(*x, val);
    }
    for (name, inv) in &table.invariants {
        if !(Env { s: &next, p: params, param }).cond(inv) {
            return Err(fail(format!("invariant {name} ({}) broken: state after {next:?}", render_cond(inv, "PARAM"))));
        }
    }
    Ok(next)
}

/// Replays one side's trace of one flow from a fresh flow under [`table`];
/// returns the final state or the first event the table does not allow
/// (an event of the other side is not allowed either).
pub fn check_trace(side: Side, events: &[FlowEvent], params: &Params) -> Result<FlowState, Violation> {
    let t = shared_table();
    let mut s = FlowState::starting_at(params.first_seq);
    for (i, e) in events.iter().enumerate() {
        if kind(e).side() != side {
            return Err(Violation {
                index: i,
                event: *e,
                state: s,
                reason: format!("a {:?} event in a {side:?} trace", kind(e).side()),
            });
        }
        s = step(t, s, *e, params).map_err(|v| Violation { index: i, ..v })?;
    }
    Ok(s)
}

/// [`check_trace`] for the sender's side.
pub fn check_sender_trace(events: &[FlowEvent], params: &Params) -> Result<FlowState, Violation> {
    check_trace(Side::Sender, events, params)
}

/// [`check_trace`] for the receiver's side.
pub fn check_receiver_trace(events: &[FlowEvent], params: &Params) -> Result<FlowState, Violation> {
    check_trace(Side::Receiver, events, params)
}

fn shared_table() -> &'static Table {
    static TABLE: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
    TABLE.get_or_init(table)
}

// ---------------------------------------------------------------------------
// Promela rendering: `eudp verify` builds the model's processes around these.
// ---------------------------------------------------------------------------

/// A term as a Promela expression over the model's absolute counters, with
/// the event's parameter written as `param`. `W`, `G` and `S` (the sequence
/// space) are the model's `#define`s.
pub fn render_term(t: &Term, param: &str) -> String {
    let r = |t: &Term| render_term(t, param);
    match t {
        Term::Var(x) => x.promela().to_string(),
        Term::Const(k) => k.to_string(),
        Term::Param => param.to_string(),
        Term::Window => "W".to_string(),
        Term::AckGroup => "G".to_string(),
        Term::Add(a, b) => format!("({} + {})", r(a), r(b)),
        Term::Sub(a, b) => format!("({} - {})", r(a), r(b)),
        Term::Dist(a, b) => format!("((({}) % S + S - ({}) % S) % S)", r(b), r(a)),
        Term::Max(a, b) => format!("({0} > {1} -> {0} : {1})", r(a), r(b)),
    }
}

/// A guard as a Promela expression (see [`render_term`]).
pub fn render_cond(g: &Cond, param: &str) -> String {
    match g {
        Cond::Cmp(a, op, b) => format!("({} {} {})", render_term(a, param), op.symbol(), render_term(b, param)),
        Cond::All(xs) if xs.is_empty() => "true".to_string(),
        Cond::All(xs) => format!("({})", xs.iter().map(|x| render_cond(x, param)).collect::<Vec<_>>().join(" && ")),
    }
}

/// A rule's effects as Promela statements, each ending in `;`.
pub fn render_effects(rule: &Rule, param: &str) -> String {
    rule.effects.iter().map(|Effect(x, t)| format!(" {} = {};", x.promela(), render_term(t, param))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_row_on_its_side() {
        let t = table();
        for k in Kind::ALL {
            assert_eq!(t.rules.iter().filter(|r| r.kind == k).count(), 1, "{k:?}");
            assert_eq!(kind(&k.with_param(7)), k);
            for Effect(x, _) in &t.rule(k).effects {
                assert_eq!(x.side(), k.side(), "{k:?} writes the other side's {x:?}");
            }
        }
    }

    #[test]
    fn serial_arithmetic_wraps() {
        assert!(serial_lt(u32::MAX, 0));
        assert!(!serial_lt(1, u32::MAX));
        let s = FlowState { ptr: u32::MAX, base: 1, ..FlowState::default() };
        let p = Params { window: 4, ack_group: 2, first_seq: 0 };
        let env = Env { s: &s, p: &p, param: None };
        assert_eq!(env.term(&Term::Max(Box::new(v(Var::Ptr)), Box::new(v(Var::Base)))), 1);
    }

    #[test]
    fn promela_rendering() {
        let t = table();
        let g = render_cond(&t.rule(Kind::Accept).guard, "f");
        assert_eq!(g, "(((((f) % S + S - (exp) % S) % S) == 0) && (since < W))");
        assert_eq!(render_effects(t.rule(Kind::Timeout), "f"), "");
        assert_eq!(render_effects(t.rule(Kind::GoBack), "f"), " ptr = (base + (((f) % S + S - (base) % S) % S));");
        let e = render_effects(t.rule(Kind::AckIn), "v");
        assert!(e.contains("ptr = (ptr > base -> ptr : base);"), "{e}");
    }
}
