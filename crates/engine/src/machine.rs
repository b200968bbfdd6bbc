//! The two-level send queue as a state machine: the single source of truth
//! shared by the engine (which records the events it performs) and
//! `eudp verify` (which emits the Promela model from the same table).
//!
//! Contract with `queue.rs`: the variants of [`QueueEvent`] and the fields of
//! [`QueueState`] are what the engine records; they may be extended, not
//! renamed or removed.

/// Abstract state of one endpoint's two-level send queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QueueState {
    /// Datagrams waiting in L1 (host memory).
    pub l1: u32,
    /// Descriptors (backend operations) in L2: posted and not yet reaped.
    pub l2: u32,
    /// Of those, descriptors whose backend operation has returned but whose
    /// completion the engine has not reaped yet.
    pub done_unreaped: u32,
    /// Shutdown requested: no new posts are accepted, the engine flushes.
    pub shutdown: bool,
}

/// One step the engine or an application thread takes on a send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueEvent {
    /// Caller found L1 empty and L2 below its bound and posted the datagram
    /// on its own thread: `l2 += 1`.
    DirectPost,
    /// Caller queued a datagram in L1: `l1 += 1`.
    Enqueue,
    /// Caller found L1 full (or the queue shut down) and was refused; no change.
    Refuse,
    /// A direct post's backend operation returned; its L2 slot stays taken
    /// until the engine reaps it (the self-clocking that turns a sender's
    /// next posts into queued batches): `done_unreaped += 1`.
    DirectDone,
    /// A direct post's backend operation returned with L1 empty and the
    /// caller frees its L2 slot at once — a request/response caller, where
    /// waking the engine only to reap would sit on the latency path:
    /// `l2 -= 1`.
    DirectRetire,
    /// The engine (completion handler) reaped `n` completions:
    /// `l2 -= n`, `done_unreaped -= n`. An application thread that drains a
    /// full L1 itself reaps first, the same way.
    Reap { n: u32 },
    /// The engine — or an application thread that found a full batch in L1
    /// — moved `datagrams` (≥ 1) from L1 into one backend descriptor:
    /// `l1 -= datagrams`, `l2 += 1`.
    TakeBatch { datagrams: u32 },
    /// The backend operation of a descriptor taken by `TakeBatch` returned;
    /// its sender reaps it at once: `l2 -= 1`.
    BatchDone,
    /// Shutdown requested.
    Shutdown,
}

// ---------------------------------------------------------------------------
// The transition table.
//
// Everything below is derived from one table, [`table`]: the guard and the
// effect of every event, written in a tiny expression language ([`Cond`],
// [`Term`], [`Effect`]). The same table is
//
// * interpreted by [`Machine::apply`] / [`step`] / [`check_trace`], which the
//   engine's tests run against traces recorded from the running engine, and
// * printed as Promela by [`emit_promela`], which `eudp verify` hands to Spin.
//
// A change to the engine's queue that the table does not allow fails the
// conformance tests; a change to the table that breaks a property fails the
// model check.
// ---------------------------------------------------------------------------

use std::fmt;
use std::fmt::Write as _;

/// A [`QueueEvent`] without its parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    DirectPost,
    Enqueue,
    Refuse,
    DirectDone,
    DirectRetire,
    Reap,
    TakeBatch,
    BatchDone,
    Shutdown,
}

impl EventKind {
    /// Every kind, in table order.
    pub const ALL: [EventKind; 9] = [
        EventKind::DirectPost,
        EventKind::Enqueue,
        EventKind::Refuse,
        EventKind::DirectDone,
        EventKind::DirectRetire,
        EventKind::Reap,
        EventKind::TakeBatch,
        EventKind::BatchDone,
        EventKind::Shutdown,
    ];

    /// The event with parameter `p` (ignored by kinds without one).
    pub fn with_param(self, p: u32) -> QueueEvent {
        match self {
            EventKind::DirectPost => QueueEvent::DirectPost,
            EventKind::Enqueue => QueueEvent::Enqueue,
            EventKind::Refuse => QueueEvent::Refuse,
            EventKind::DirectDone => QueueEvent::DirectDone,
            EventKind::DirectRetire => QueueEvent::DirectRetire,
            EventKind::Reap => QueueEvent::Reap { n: p },
            EventKind::TakeBatch => QueueEvent::TakeBatch { datagrams: p },
            EventKind::BatchDone => QueueEvent::BatchDone,
            EventKind::Shutdown => QueueEvent::Shutdown,
        }
    }
}

impl QueueEvent {
    /// The event's kind.
    pub fn kind(&self) -> EventKind {
        match self {
            QueueEvent::DirectPost => EventKind::DirectPost,
            QueueEvent::Enqueue => EventKind::Enqueue,
            QueueEvent::Refuse => EventKind::Refuse,
            QueueEvent::DirectDone => EventKind::DirectDone,
            QueueEvent::DirectRetire => EventKind::DirectRetire,
            QueueEvent::Reap { .. } => EventKind::Reap,
            QueueEvent::TakeBatch { .. } => EventKind::TakeBatch,
            QueueEvent::BatchDone => EventKind::BatchDone,
            QueueEvent::Shutdown => EventKind::Shutdown,
        }
    }

    /// The event's parameter (`n`, `datagrams`), if it has one.
    pub fn param(&self) -> Option<u32> {
        match *self {
            QueueEvent::Reap { n } => Some(n),
            QueueEvent::TakeBatch { datagrams } => Some(datagrams),
            _ => None,
        }
    }
}

/// A variable of the model: the fields of [`QueueState`] plus ghost counters
/// the engine does not expose but the model (and [`check_trace`], which
/// derives them from the event history) keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Var {
    L1,
    L2,
    DoneUnreaped,
    /// 0 or 1.
    Shutdown,
    /// Ghost: direct posts whose backend operation has not returned.
    DirectInflight,
    /// Ghost: engine descriptors whose backend operation has not returned.
    BatchInflight,
}

impl Var {
    /// Every variable, in declaration order.
    pub const ALL: [Var; 6] =
        [Var::L1, Var::L2, Var::DoneUnreaped, Var::Shutdown, Var::DirectInflight, Var::BatchInflight];

    /// The variable's name in the Promela model.
    pub fn promela(self) -> &'static str {
        match self {
            Var::L1 => "l1",
            Var::L2 => "l2",
            Var::DoneUnreaped => "done_unreaped",
            Var::Shutdown => "shutdown",
            Var::DirectInflight => "direct_inflight",
            Var::BatchInflight => "batch_inflight",
        }
    }
}

/// A value in a guard or an effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Term {
    Var(Var),
    Const(u32),
    /// The event's parameter (`n` of `Reap`, `datagrams` of `TakeBatch`).
    Param,
    /// The L2 bound (descriptors).
    L2Bound,
    /// The L1 capacity in datagrams. The engine bounds L1 in bytes, so traces
    /// usually leave it unknown; the model fixes it.
    L1Cap,
    Sum(Vec<Term>),
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Eq,
    Ne,
    Ge,
    Gt,
}

impl Op {
    fn holds(self, a: u32, b: u32) -> bool {
        match self {
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Eq => a == b,
            Op::Ne => a != b,
            Op::Ge => a >= b,
            Op::Gt => a > b,
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Ge => ">=",
            Op::Gt => ">",
        }
    }
}

/// A guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cond {
    Cmp(Term, Op, Term),
    Not(Box<Cond>),
    All(Vec<Cond>),
    Any(Vec<Cond>),
}

/// An effect on one variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Add(Var, Term),
    Sub(Var, Term),
    Set(Var, Term),
}

/// Which thread performs an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Actor {
    /// An application thread calling send.
    App,
    /// The engine thread (completion handler, L1 drainer).
    Engine,
    /// Whoever closes the endpoint.
    Closer,
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub kind: EventKind,
    pub actor: Actor,
    /// Another thread that may take the same step: an application thread
    /// that finds a full batch queued drains L1 itself, as the engine would.
    pub also: Option<Actor>,
    /// For events with a parameter: the largest value the model enumerates
    /// (the guard still decides which values are allowed).
    pub param_max: Option<Term>,
    pub guard: Cond,
    pub effects: Vec<Effect>,
    /// One line for humans and for the generated Promela.
    pub doc: &'static str,
}

/// The whole machine: transitions, the engine's flush-complete condition
/// and the invariants every reachable state satisfies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub rules: Vec<Rule>,
    /// When the engine may consider the flush after shutdown complete and stop.
    pub flush_done: Cond,
    /// `(name, condition)` pairs checked after every step.
    pub invariants: Vec<(&'static str, Cond)>,
}

impl Table {
    /// The row for `kind`.
    pub fn rule(&self, kind: EventKind) -> &Rule {
        self.rules.iter().find(|r| r.kind == kind).expect("every event kind has a rule")
    }

    /// The row for `kind`, mutably (for deliberately broken variants).
    pub fn rule_mut(&mut self, kind: EventKind) -> &mut Rule {
        self.rules.iter_mut().find(|r| r.kind == kind).expect("every event kind has a rule")
    }
}

fn v(x: Var) -> Term {
    Term::Var(x)
}
fn c(k: u32) -> Term {
    Term::Const(k)
}
fn cmp(a: Term, op: Op, b: Term) -> Cond {
    Cond::Cmp(a, op, b)
}
fn running() -> Cond {
    cmp(v(Var::Shutdown), Op::Eq, c(0))
}
fn add(x: Var, t: Term) -> Effect {
    Effect::Add(x, t)
}
fn sub(x: Var, t: Term) -> Effect {
    Effect::Sub(x, t)
}

/// The engine's two-level send queue (see `queue.rs`), as a table.
pub fn table() -> Table {
    use Var::*;
    // No batch in the backend: a post or a batch begun beside one could
    // leave before datagrams queued ahead of it (one backend call at a time
    // keeps each flow's order; L2 still counts posts not yet reaped).
    let no_batch = cmp(v(BatchInflight), Op::Eq, c(0));
    let l1_empty_l2_room =
        Cond::All(vec![cmp(v(L1), Op::Eq, c(0)), cmp(v(L2), Op::Lt, Term::L2Bound), no_batch.clone()]);
    // An empty L1 always accepts one datagram, so "full" implies l1 >= 1.
    let l1_full = Cond::All(vec![cmp(v(L1), Op::Ge, c(1)), cmp(v(L1), Op::Ge, Term::L1Cap)]);
    let rules = vec![
        Rule {
            kind: EventKind::DirectPost,
            actor: Actor::App,
            also: None,
            param_max: None,
            guard: Cond::All(vec![running(), l1_empty_l2_room]),
            effects: vec![add(L2, c(1)), add(DirectInflight, c(1))],
            doc: "caller: L1 empty, L2 below its bound and no batch in the backend -> post on the caller's thread",
        },
        Rule {
            kind: EventKind::Enqueue,
            actor: Actor::App,
            also: None,
            param_max: None,
            // With L1 empty and L2 below its bound a caller may still queue:
            // a streaming caller does (see `EpInner::streaming`), so the
            // model lets either choice happen there.
            guard: Cond::All(vec![running(), Cond::Not(Box::new(l1_full.clone()))]),
            effects: vec![add(L1, c(1))],
            doc: "caller: L1 has room -> queue in L1 (always when L1 is busy or L2 full; by choice when streaming)",
        },
        Rule {
            kind: EventKind::Refuse,
            actor: Actor::App,
            also: None,
            param_max: None,
            guard: Cond::Any(vec![cmp(v(Shutdown), Op::Eq, c(1)), l1_full]),
            effects: vec![],
            doc: "caller: shut down, or L1 full -> refused",
        },
        Rule {
            kind: EventKind::DirectDone,
            actor: Actor::App,
            also: None,
            param_max: None,
            guard: Cond::All(vec![
                cmp(v(DirectInflight), Op::Gt, c(0)),
                cmp(v(DoneUnreaped), Op::Lt, v(L2)),
            ]),
            effects: vec![sub(DirectInflight, c(1)), add(DoneUnreaped, c(1))],
            doc: "caller: its backend operation returned; the L2 slot stays taken until the engine reaps it",
        },
        Rule {
            kind: EventKind::DirectRetire,
            actor: Actor::App,
            also: None,
            param_max: None,
            guard: Cond::All(vec![
                cmp(v(DirectInflight), Op::Gt, c(0)),
                cmp(v(DoneUnreaped), Op::Lt, v(L2)),
                cmp(v(L1), Op::Eq, c(0)),
            ]),
            effects: vec![sub(DirectInflight, c(1)), sub(L2, c(1))],
            doc: "caller: its backend operation returned, L1 empty; nobody waits for the slot, the caller may free it",
        },
        Rule {
            kind: EventKind::Reap,
            actor: Actor::Engine,
            also: Some(Actor::App),
            param_max: Some(Term::L2Bound),
            guard: Cond::All(vec![cmp(Term::Param, Op::Ge, c(1)), cmp(Term::Param, Op::Le, v(DoneUnreaped))]),
            effects: vec![sub(L2, Term::Param), sub(DoneUnreaped, Term::Param)],
            doc: "engine (or a draining caller): reap n completed direct posts, freeing their L2 slots (self-clocking)",
        },
        Rule {
            kind: EventKind::TakeBatch,
            actor: Actor::Engine,
            also: Some(Actor::App),
            param_max: Some(Term::L1Cap),
            guard: Cond::All(vec![
                cmp(Term::Param, Op::Ge, c(1)),
                cmp(Term::Param, Op::Le, v(L1)),
                cmp(v(L2), Op::Lt, Term::L2Bound),
                no_batch,
            ]),
            effects: vec![sub(L1, Term::Param), add(L2, c(1)), add(BatchInflight, c(1))],
            doc: "engine (or a caller that found a batch queued): L2 has room and no batch in the backend -> move 1..l1 datagrams from L1 into one descriptor",
        },
        Rule {
            kind: EventKind::BatchDone,
            actor: Actor::Engine,
            also: Some(Actor::App),
            param_max: None,
            guard: Cond::All(vec![
                cmp(v(BatchInflight), Op::Gt, c(0)),
                cmp(v(DoneUnreaped), Op::Lt, v(L2)),
            ]),
            effects: vec![sub(BatchInflight, c(1)), sub(L2, c(1))],
            doc: "whoever took the batch: its backend operation returned; reaped at once",
        },
        Rule {
            kind: EventKind::Shutdown,
            actor: Actor::Closer,
            also: None,
            param_max: None,
            guard: Cond::All(vec![]),
            effects: vec![Effect::Set(Shutdown, c(1))],
            doc: "closer: no new posts; the engine flushes",
        },
    ];
    Table {
        rules,
        flush_done: Cond::All(vec![cmp(v(Shutdown), Op::Eq, c(1)), cmp(v(L1), Op::Eq, c(0)), cmp(v(L2), Op::Eq, c(0))]),
        invariants: vec![
            ("l2_bound", cmp(v(L2), Op::Le, Term::L2Bound)),
            ("l1_cap", cmp(v(L1), Op::Le, Term::L1Cap)),
            ("done_le_l2", cmp(v(DoneUnreaped), Op::Le, v(L2))),
            (
                "l2_accounting",
                cmp(v(L2), Op::Eq, Term::Sum(vec![v(DirectInflight), v(BatchInflight), v(DoneUnreaped)])),
            ),
        ],
    }
}

// ---------------------------------------------------------------------------
// Interpreter.
// ---------------------------------------------------------------------------

/// The bounds a machine runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub l2_bound: u32,
    /// L1 capacity in datagrams; `None` when unknown (the engine bounds L1 in
    /// bytes): comparisons against it are then not checked.
    pub l1_cap: Option<u32>,
}

/// An event the table does not allow, or a broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub event: QueueEvent,
    pub before: QueueState,
    pub reason: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} from {:?}: {}", self.event, self.before, self.reason)
    }
}

impl std::error::Error for Violation {}

/// The table's state: the observable [`QueueState`] plus the ghost counters
/// (unknown, `None`, when the machine starts from an arbitrary state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Machine {
    pub queue: QueueState,
    pub direct_inflight: Option<u32>,
    pub batch_inflight: Option<u32>,
    pub limits: Limits,
}

impl Machine {
    /// A fresh queue: everything zero, ghosts known.
    pub fn new(limits: Limits) -> Self {
        Machine { queue: QueueState::default(), direct_inflight: Some(0), batch_inflight: Some(0), limits }
    }

    /// A machine observed from the middle of its life: ghosts unknown.
    pub fn from_state(queue: QueueState, limits: Limits) -> Self {
        Machine { queue, direct_inflight: None, batch_inflight: None, limits }
    }

    fn get(&self, x: Var) -> Option<u32> {
        match x {
            Var::L1 => Some(self.queue.l1),
            Var::L2 => Some(self.queue.l2),
            Var::DoneUnreaped => Some(self.queue.done_unreaped),
            Var::Shutdown => Some(self.queue.shutdown as u32),
            Var::DirectInflight => self.direct_inflight,
            Var::BatchInflight => self.batch_inflight,
        }
    }

    fn set(&mut self, x: Var, val: Option<u32>) {
        match x {
            Var::L1 => self.queue.l1 = val.unwrap_or(0),
            Var::L2 => self.queue.l2 = val.unwrap_or(0),
            Var::DoneUnreaped => self.queue.done_unreaped = val.unwrap_or(0),
            Var::Shutdown => self.queue.shutdown = val.unwrap_or(0) != 0,
            Var::DirectInflight => self.direct_inflight = val,
            Var::BatchInflight => self.batch_inflight = val,
        }
    }

    fn term(&self, t: &Term, param: Option<u32>) -> Option<u32> {
        match t {
            Term::Var(x) => self.get(*x),
            Term::Const(k) => Some(*k),
            Term::Param => param,
            Term::L2Bound => Some(self.limits.l2_bound),
            Term::L1Cap => self.limits.l1_cap,
            Term::Sum(ts) => ts.iter().try_fold(0u32, |acc, t| acc.checked_add(self.term(t, param)?)),
        }
    }

    /// Three-valued: `None` when the condition depends on an unknown value.
    fn cond(&self, g: &Cond, param: Option<u32>) -> Option<bool> {
        match g {
            Cond::Cmp(a, op, b) => Some(op.holds(self.term(a, param)?, self.term(b, param)?)),
            Cond::Not(x) => self.cond(x, param).map(|b| !b),
            Cond::All(xs) => {
                let vals: Vec<_> = xs.iter().map(|x| self.cond(x, param)).collect();
                if vals.contains(&Some(false)) {
                    Some(false)
                } else if vals.contains(&None) {
                    None
                } else {
                    Some(true)
                }
            }
            Cond::Any(xs) => {
                let vals: Vec<_> = xs.iter().map(|x| self.cond(x, param)).collect();
                if vals.contains(&Some(true)) {
                    Some(true)
                } else if vals.contains(&None) {
                    None
                } else {
                    Some(false)
                }
            }
        }
    }

    /// Applies `event` under `table`: checks its guard, applies its effects,
    /// then checks the invariants.
    pub fn apply_with(&mut self, table: &Table, event: QueueEvent) -> Result<(), Violation> {
        let before = self.queue;
        let fail = |reason: String| Violation { event, before, reason };
        let rule = table.rule(event.kind());
        let param = event.param();
        if self.cond(&rule.guard, param) == Some(false) {
            return Err(fail(format!("guard {} does not hold", render_cond(&rule.guard, param))));
        }
        for e in &rule.effects {
            let (x, val) = match e {
                Effect::Add(x, t) => (*x, self.get(*x).zip(self.term(t, param)).map(|(a, b)| a.checked_add(b))),
                Effect::Sub(x, t) => (*x, self.get(*x).zip(self.term(t, param)).map(|(a, b)| a.checked_sub(b))),
                Effect::Set(x, t) => (*x, self.term(t, param).map(Some)),
            };
            match val {
                Some(None) => return Err(fail(format!("{} would leave its range", x.promela()))),
                Some(Some(n)) => self.set(x, Some(n)),
                None => self.set(x, None),
            }
        }
        for (name, inv) in &table.invariants {
            if self.cond(inv, None) == Some(false) {
                return Err(fail(format!(
                    "invariant {name} ({}) broken, state after {:?}",
                    render_cond(inv, None),
                    self.queue
                )));
            }
        }
        Ok(())
    }

    /// [`Machine::apply_with`] under the engine's [`table`].
    pub fn apply(&mut self, event: QueueEvent) -> Result<(), Violation> {
        self.apply_with(shared_table(), event)
    }
}

fn shared_table() -> &'static Table {
    static TABLE: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
    TABLE.get_or_init(table)
}

/// One step of the observable machine: the state after `event`, or why the
/// table does not allow it. Ghost counters are unknown here, so guards on
/// them are not checked; [`check_trace`] checks them.
pub fn step(state: QueueState, event: QueueEvent, l2_bound: u32) -> Result<QueueState, Violation> {
    let mut m = Machine::from_state(state, Limits { l2_bound, l1_cap: None });
    m.apply(event)?;
    Ok(m.queue)
}

/// Replays a trace recorded by the engine (each event with the state after
/// it) from a fresh queue, checking every guard, effect and invariant of the
/// table and that each recorded state is the one the table predicts.
pub fn check_trace(events: &[(QueueEvent, QueueState)], l2_bound: u32) -> Result<(), String> {
    check_trace_with(events, Limits { l2_bound, l1_cap: None })
}

/// [`check_trace`] with explicit limits (e.g. a known L1 capacity).
pub fn check_trace_with(events: &[(QueueEvent, QueueState)], limits: Limits) -> Result<(), String> {
    let mut m = Machine::new(limits);
    for (i, (ev, recorded)) in events.iter().enumerate() {
        m.apply(*ev).map_err(|e| format!("event #{i}: {e}"))?;
        if m.queue != *recorded {
            return Err(format!(
                "event #{i}: {ev:?} should lead to {:?} but the engine recorded {:?}",
                m.queue, recorded
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Promela emitter.
// ---------------------------------------------------------------------------

/// Size of the generated model and deliberate deviations from the table's
/// locking discipline (used by `eudp verify --broken`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromelaConfig {
    /// Application threads sending concurrently (≥ 1).
    pub apps: u32,
    /// Datagrams each application thread sends.
    pub per_app: u32,
    pub l2_bound: u32,
    /// L1 capacity in datagrams (≥ 1).
    pub l1_cap: u32,
    /// Events whose counter updates are emitted as a read-modify-write
    /// outside the atomic step that checks their guard (a missing lock).
    pub unlocked: Vec<EventKind>,
    /// The engine polls when idle instead of blocking (`EUDP_BUSY_POLL`):
    /// it then never blocks, so only weak fairness lets the other threads run.
    pub busy_poll: bool,
}

impl Default for PromelaConfig {
    fn default() -> Self {
        PromelaConfig { apps: 3, per_app: 2, l2_bound: 2, l1_cap: 2, unlocked: vec![], busy_poll: false }
    }
}

fn render_term(t: &Term, param: Option<u32>) -> String {
    match t {
        Term::Var(x) => x.promela().to_string(),
        Term::Const(k) => k.to_string(),
        Term::Param => param.map_or_else(|| "PARAM".to_string(), |p| p.to_string()),
        Term::L2Bound => "L2_BOUND".to_string(),
        Term::L1Cap => "L1_CAP".to_string(),
        Term::Sum(ts) => {
            format!("({})", ts.iter().map(|t| render_term(t, param)).collect::<Vec<_>>().join(" + "))
        }
    }
}

/// A guard as a Promela (and C-like) expression, with the parameter
/// substituted when given.
pub fn render_cond(g: &Cond, param: Option<u32>) -> String {
    let join = |xs: &[Cond], op: &str, empty: &str| {
        if xs.is_empty() {
            empty.to_string()
        } else {
            format!("({})", xs.iter().map(|x| render_cond(x, param)).collect::<Vec<_>>().join(op))
        }
    };
    match g {
        Cond::Cmp(a, op, b) => format!("({} {} {})", render_term(a, param), op.symbol(), render_term(b, param)),
        Cond::Not(x) => format!("!{}", render_cond(x, param)),
        Cond::All(xs) => join(xs, " && ", "true"),
        Cond::Any(xs) => join(xs, " || ", "false"),
    }
}

/// The new value of an effect's variable, given the name holding its old value.
fn effect_value(e: &Effect, old: &str, param: Option<u32>) -> (Var, String) {
    match e {
        Effect::Add(x, t) => (*x, format!("{old} + {}", render_term(t, param))),
        Effect::Sub(x, t) => (*x, format!("{old} - {}", render_term(t, param))),
        Effect::Set(x, t) => (*x, render_term(t, param)),
    }
}

/// One guarded atomic step for `kind` (parameter substituted), with the
/// model's own bookkeeping `extra` in the same atomic step. For an event in
/// `cfg.unlocked` the counter updates become a read inside the step and a
/// write after it, so another thread can interleave (a missing lock).
fn emit_step(table: &Table, cfg: &PromelaConfig, kind: EventKind, param: Option<u32>, extra: &str) -> String {
    emit_step_by(table, cfg, kind, param, extra, table.rule(kind).actor)
}

/// [`emit_step`] taken by `by` (the rule's actor or its `also`).
fn emit_step_by(
    table: &Table,
    cfg: &PromelaConfig,
    kind: EventKind,
    param: Option<u32>,
    extra: &str,
    by: Actor,
) -> String {
    let rule = table.rule(kind);
    debug_assert!(by == rule.actor || Some(by) == rule.also);
    let (who, who_args) = match by {
        Actor::App => ("app%d", ", me"),
        Actor::Engine => ("engine", ""),
        Actor::Closer => ("closer", ""),
    };
    let what = match (param, by) {
        (Some(p), _) => format!("{kind:?}({p})"),
        (None, Actor::App) if rule.actor == Actor::App => format!("{kind:?} #%d"),
        (None, _) => format!("{kind:?}"),
    };
    let id_arg = if param.is_none() && by == Actor::App && rule.actor == Actor::App { ", id" } else { "" };
    let trace = format!("printf(\"@@ {who} {what}{STATE_FMT}\\n\"{who_args}{id_arg}{STATE_ARGS})");
    emit_guarded(rule, cfg.unlocked.contains(&kind), param, extra, &trace)
}

/// Format and arguments that print the table's state in trails.
const STATE_FMT: &str = "  -> l1=%d l2=%d done=%d shutdown=%d";
const STATE_ARGS: &str = ", l1, l2, done_unreaped, shutdown";

fn emit_guarded(rule: &Rule, unlocked: bool, param: Option<u32>, extra: &str, trace: &str) -> String {
    let mut inside = String::new();
    let mut after = String::new();
    for (i, e) in rule.effects.iter().enumerate() {
        if unlocked {
            let (x, val) = effect_value(e, &format!("tmp{i}"), param);
            let _ = write!(inside, " tmp{i} = {};", x.promela());
            let _ = write!(after, "; {} = {val}", x.promela());
        } else {
            let x = match e {
                Effect::Add(x, _) | Effect::Sub(x, _) | Effect::Set(x, _) => x.promela(),
            };
            let (_, val) = effect_value(e, x, param);
            let _ = write!(inside, " {x} = {val};");
        }
    }
    let extra = extra.trim_end_matches(';');
    let extra = if extra.is_empty() { String::new() } else { format!("{extra};") };
    let late = if after.is_empty() {
        String::new()
    } else {
        format!("{after}; printf(\"@@   (counters written back without the lock){STATE_FMT}\\n\"{STATE_ARGS})")
    };
    format!("atomic {{ {} ->{inside}{extra} {trace} }}{late}", render_cond(&rule.guard, param))
}

fn param_values(rule: &Rule, cfg: &PromelaConfig) -> Vec<u32> {
    let max = match &rule.param_max {
        Some(Term::Const(k)) => *k,
        Some(Term::L2Bound) => cfg.l2_bound,
        Some(Term::L1Cap) => cfg.l1_cap,
        Some(_) | None => return vec![],
    };
    (1..=max).collect()
}

/// The Promela model of the engine's send path generated from `table`:
/// `cfg.apps` application threads each sending `cfg.per_app` datagrams, one
/// engine thread, and a closer that shuts the queue down at any moment.
/// Properties (as `ltl` claims): `l2_bound`, `conservation`,
/// `eventually_handed`, `flush_completes`; invalid end states are checked
/// with no claim (`-DNOCLAIM`).
pub fn emit_promela(table: &Table, cfg: &PromelaConfig) -> String {
    let ndg = cfg.apps * cfg.per_app;
    let mut o = String::new();
    o.push_str("/* eudp engine: two-level send queue. GENERATED from crates/engine/src/machine.rs\n");
    o.push_str(" * by `eudp verify --emit-promela`; edit the table there, not this file.\n *\n");
    for r in &table.rules {
        let who = match r.also {
            Some(a) => format!("{:?}/{:?}", r.actor, a),
            None => format!("{:?}", r.actor),
        };
        let _ = writeln!(o, " *   {:<11} {:<10} {}", format!("{:?}", r.kind), who, r.doc);
    }
    if !cfg.unlocked.is_empty() {
        let _ =
            writeln!(o, " *\n * BROKEN: the counter updates of {:?} are not atomic with their guard.", cfg.unlocked);
    }
    o.push_str(" */\n");
    let _ = writeln!(
        o,
        "#define NAPPS {}\n#define PER_APP {}\n#define NDG {ndg}\n#define L2_BOUND {}\n#define L1_CAP {}\n",
        cfg.apps, cfg.per_app, cfg.l2_bound, cfg.l1_cap
    );
    o.push_str("/* the table's variables: QueueState plus ghost counters */\n");
    for x in Var::ALL {
        let ty = if x == Var::Shutdown { "bool" } else { "byte" };
        let _ = writeln!(o, "{ty} {};", x.promela());
    }
    o.push_str(
        "\n/* where every datagram is: the model's own bookkeeping, checked against the table */\n\
         chan l1q = [NDG] of { byte };  /* ids queued in L1, FIFO */\n\
         bit acc[NDG];        /* accepted (direct post or L1) */\n\
         bit hnd[NDG];        /* handed to the backend */\n\
         byte accepted, refused, in_desc, handed;\n\
         bool dup;            /* some datagram handed twice */\n\
         bool engine_done;\n\
         byte watch;          /* the datagram the liveness claim follows */\n\n",
    );
    let _ = writeln!(o, "#define flush_done {}", render_cond(&table.flush_done, None));
    o.push_str(
        "#define flushed (engine_done && l1 == 0 && l2 == 0 && handed == accepted)\n\
         #define conserved (!dup && accepted + refused <= NDG && accepted == len(l1q) + in_desc + handed && l1 == len(l1q))\n",
    );
    let invs: Vec<String> =
        table.invariants.iter().filter(|(n, _)| *n != "l2_bound").map(|(_, g)| render_cond(g, None)).collect();
    let invs = if invs.is_empty() { "true".to_string() } else { invs.join(" && ") };
    let _ = writeln!(o, "#define table_invariants ({invs})\n");
    o.push_str(
        "inline hand(id) {\n  if\n  :: hnd[id] -> dup = true; printf(\"@@   backend gets #%d AGAIN\\n\", id)\n  :: else -> hnd[id] = 1; printf(\"@@   backend gets #%d\\n\", id)\n  fi;\n  handed++;\n  in_desc--\n}\n\n",
    );

    // Application thread: the decision under the queue lock, then for a
    // direct post its own backend operation and completion.
    // After queueing, a caller may drain L1 itself (the steps the table
    // shares between the engine and the application: reap, take a batch,
    // its completion); the model lets it choose freely, a superset of the
    // engine's "a full batch is queued" rule.
    let mut drain = String::from("        if   /* the caller drains L1 itself, as the engine would */\n");
    for n in param_values(table.rule(EventKind::Reap), cfg) {
        let _ = writeln!(drain, "        :: {}", emit_step_by(table, cfg, EventKind::Reap, Some(n), "", Actor::App));
    }
    drain.push_str("        :: skip\n        fi;\n        if\n");
    for d in param_values(table.rule(EventKind::TakeBatch), cfg) {
        let extra =
            format!(" nb = {d}; in_desc = in_desc + {d}; do :: i < nb -> l1q?b[i]; i++ :: else -> break od; i = 0");
        let _ = writeln!(
            drain,
            "        :: {}",
            emit_step_by(table, cfg, EventKind::TakeBatch, Some(d), &extra, Actor::App)
        );
    }
    let _ = write!(
        drain,
        "        :: skip\n        fi;\n        if\n        :: nb > 0 ->\n           atomic {{ do :: i < nb -> hand(b[i]); b[i] = 0; i++ :: else -> break od; i = 0; nb = 0 }};\n           {}\n        :: else -> skip\n        fi",
        emit_step_by(table, cfg, EventKind::BatchDone, None, "", Actor::App)
    );
    let _ = write!(
        o,
        "proctype app(byte me) {{\n  byte k, id, b[NDG], nb, i, tmp0, tmp1, tmp2;\n  do\n  :: k < PER_APP ->\n     id = me * PER_APP + k; k++;\n     if\n\
         \x20    :: {};\n        atomic {{ hand(id) }};   /* the caller's own backend operation */\n        if\n        :: {}\n        :: {}\n        fi\n\
         \x20    :: {};\n{drain}\n     :: {}\n     fi;\n     tmp0 = 0; tmp1 = 0; tmp2 = 0; id = 0\n  :: else -> break\n  od\n}}\n\n",
        emit_step(table, cfg, EventKind::DirectPost, None, " acc[id] = 1; accepted++; in_desc++"),
        emit_step(table, cfg, EventKind::DirectDone, None, ""),
        emit_step(table, cfg, EventKind::DirectRetire, None, ""),
        emit_step(table, cfg, EventKind::Enqueue, None, " l1q!id; acc[id] = 1; accepted++"),
        emit_step(table, cfg, EventKind::Refuse, None, " refused++"),
    );

    // Engine thread: reap completions, drain L1 in batches, stop when flushed.
    o.push_str("proctype engine() {\n  byte b[NDG], nb, i, tmp0, tmp1, tmp2;\nloop:\n  do\n");
    for n in param_values(table.rule(EventKind::Reap), cfg) {
        let _ = writeln!(o, "  :: {}", emit_step(table, cfg, EventKind::Reap, Some(n), ""));
    }
    for d in param_values(table.rule(EventKind::TakeBatch), cfg) {
        let extra =
            format!(" nb = {d}; in_desc = in_desc + {d}; do :: i < nb -> l1q?b[i]; i++ :: else -> break od; i = 0");
        let _ = writeln!(o, "  :: {};\n     goto batch", emit_step(table, cfg, EventKind::TakeBatch, Some(d), &extra));
    }
    if cfg.busy_poll {
        o.push_str("  :: else -> printf(\"@@ engine polls: nothing to do\\n\")   /* idle: poll again */\n");
    }
    let _ = write!(
        o,
        "  :: atomic {{ flush_done -> engine_done = true; printf(\"@@ engine stops{STATE_FMT}\\n\"{STATE_ARGS}) }}; break\n  od;\n  goto fin;\n\
         batch:   /* the engine's backend operation: one descriptor of nb datagrams */\n\
         \x20 atomic {{ do :: i < nb -> hand(b[i]); b[i] = 0; i++ :: else -> break od; i = 0; nb = 0 }};\n\
         \x20 {};\n  tmp0 = 0; tmp1 = 0; tmp2 = 0;\n  goto loop;\nfin:\n  skip\n}}\n\n",
        emit_step(table, cfg, EventKind::BatchDone, None, "")
    );

    let _ = write!(
        o,
        "proctype closer() {{\n  byte tmp0;\n  {}\n}}\n\n",
        emit_step(table, cfg, EventKind::Shutdown, None, "")
    );

    o.push_str("init {\n  atomic {\n    select(watch : 0 .. NDG - 1);\n    run engine();\n    run closer();\n");
    for a in 0..cfg.apps {
        let _ = writeln!(o, "    run app({a});");
    }
    o.push_str("  }\n}\n\n");
    o.push_str(
        "/* L2 never holds more descriptors than its bound */\n\
         ltl l2_bound { [] (l2 <= L2_BOUND) }\n\
         /* every datagram is in exactly one place (L1, a descriptor, handed) and\n\
         \x20  the table's counters agree with where the datagrams are */\n\
         ltl conservation { [] (conserved && table_invariants) }\n\
         /* every accepted datagram is eventually handed to the backend (-a -f) */\n\
         ltl eventually_handed { [] (acc[watch] -> <> hnd[watch]) }\n\
         /* after shutdown the engine eventually stops with L1 and L2 empty (-a -f) */\n\
         ltl flush_completes { [] (shutdown -> <> flushed) }\n",
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use QueueEvent::*;

    fn st(l1: u32, l2: u32, done_unreaped: u32, shutdown: bool) -> QueueState {
        QueueState { l1, l2, done_unreaped, shutdown }
    }

    /// A hand-written trace of an engine with L2 bound 2: two direct posts
    /// fill L2, the next sends queue, completions are reaped, the engine
    /// drains L1 in two descriptors, shutdown flushes.
    fn good_trace() -> Vec<(QueueEvent, QueueState)> {
        vec![
            (DirectPost, st(0, 1, 0, false)),
            (DirectPost, st(0, 2, 0, false)),
            (Enqueue, st(1, 2, 0, false)),
            (DirectDone, st(1, 2, 1, false)),
            (Enqueue, st(2, 2, 1, false)),
            (Reap { n: 1 }, st(2, 1, 0, false)),
            (Enqueue, st(3, 1, 0, false)),
            (TakeBatch { datagrams: 2 }, st(1, 2, 0, false)),
            (Refuse, st(1, 2, 0, false)),
            (DirectDone, st(1, 2, 1, false)),
            (BatchDone, st(1, 1, 1, false)),
            (Shutdown, st(1, 1, 1, true)),
            (Refuse, st(1, 1, 1, true)),
            (TakeBatch { datagrams: 1 }, st(0, 2, 1, true)),
            (Reap { n: 1 }, st(0, 1, 0, true)),
            (BatchDone, st(0, 0, 0, true)),
        ]
    }

    #[test]
    fn machine_replays_hand_written_trace() {
        let t = good_trace();
        check_trace(&t, 2).unwrap();
        let last = t.last().unwrap().1;
        let m = Machine {
            queue: last,
            direct_inflight: Some(0),
            batch_inflight: Some(0),
            limits: Limits { l2_bound: 2, l1_cap: None },
        };
        assert_eq!(m.cond(&table().flush_done, None), Some(true));
    }

    #[test]
    fn machine_rejects_what_the_table_forbids() {
        let mut t = good_trace();
        // A direct post overtaking a queued datagram.
        t.insert(3, (DirectPost, st(1, 3, 0, false)));
        let e = check_trace(&t, 2).unwrap_err();
        assert!(e.starts_with("event #3"), "{e}");

        // L2 bound off by one.
        let t = vec![(DirectPost, st(0, 1, 0, false)), (DirectPost, st(0, 2, 0, false))];
        assert!(check_trace(&t, 1).is_err());

        // A completion reaped twice.
        let t = vec![
            (DirectPost, st(0, 1, 0, false)),
            (Enqueue, st(1, 1, 0, false)),
            (DirectDone, st(1, 1, 1, false)),
            (Reap { n: 1 }, st(1, 0, 0, false)),
            (Reap { n: 1 }, st(1, 0, 0, false)),
        ];
        assert!(check_trace(&t, 1).unwrap_err().contains("event #4"));

        // A caller retiring its slot while L1 holds datagrams.
        let t =
            vec![(DirectPost, st(0, 1, 0, false)), (Enqueue, st(1, 1, 0, false)), (DirectRetire, st(1, 0, 0, false))];
        assert!(check_trace(&t, 1).unwrap_err().contains("event #2"));

        // A batch completion with no batch in flight (ghost counter).
        let t = vec![(DirectPost, st(0, 1, 0, false)), (BatchDone, st(0, 0, 0, false))];
        assert!(check_trace(&t, 2).unwrap_err().contains("batch_inflight"));

        // The recorded state disagrees with the effect.
        let t = vec![(Enqueue, st(0, 0, 0, false))];
        assert!(check_trace(&t, 2).is_err()); // L1 empty, L2 room: must post directly
        let t = vec![(DirectPost, st(0, 0, 0, false))];
        assert!(check_trace(&t, 2).unwrap_err().contains("recorded"));

        // Posting after shutdown; refusing with room.
        let t = vec![(Shutdown, st(0, 0, 0, true)), (DirectPost, st(0, 1, 0, true))];
        assert!(check_trace(&t, 2).is_err());
        let t = vec![(Refuse, st(0, 0, 0, false))];
        assert!(check_trace(&t, 2).is_err());
    }

    #[test]
    fn step_checks_observable_guards() {
        assert_eq!(step(st(0, 0, 0, false), DirectPost, 1), Ok(st(0, 1, 0, false)));
        assert!(step(st(0, 1, 0, false), DirectPost, 1).is_err());
        assert_eq!(step(st(0, 1, 0, false), Enqueue, 1), Ok(st(1, 1, 0, false)));
        assert!(step(st(2, 1, 0, false), TakeBatch { datagrams: 3 }, 2).is_err());
        assert!(step(st(2, 1, 0, false), TakeBatch { datagrams: 0 }, 2).is_err());
        assert_eq!(step(st(2, 1, 1, false), Reap { n: 1 }, 2), Ok(st(2, 0, 0, false)));
        assert!(step(st(0, 1, 1, false), BatchDone, 2).is_err());
    }

    #[test]
    fn known_l1_capacity_is_checked() {
        let lim = Limits { l2_bound: 1, l1_cap: Some(1) };
        let t = vec![(DirectPost, st(0, 1, 0, false)), (Enqueue, st(1, 1, 0, false)), (Refuse, st(1, 1, 0, false))];
        check_trace_with(&t, lim).unwrap();
        let t = vec![(DirectPost, st(0, 1, 0, false)), (Enqueue, st(1, 1, 0, false)), (Enqueue, st(2, 1, 0, false))];
        assert!(check_trace_with(&t, lim).is_err());
    }

    #[test]
    fn promela_is_generated_from_the_table() {
        let mut t = table();
        let p = emit_promela(&t, &PromelaConfig::default());
        assert!(
            p.contains(
                "atomic { ((shutdown == 0) && ((l1 == 0) && (l2 < L2_BOUND) && (batch_inflight == 0))) -> l2 = l2 + 1;"
            ),
            "{p}"
        );
        assert!(p.contains("ltl l2_bound"));
        assert_eq!(p.matches("goto batch").count(), 2);
        t.rule_mut(EventKind::DirectPost).guard = Cond::All(vec![]);
        assert!(emit_promela(&t, &PromelaConfig::default()).contains("atomic { true -> l2 = l2 + 1;"));
        let cfg = PromelaConfig { unlocked: vec![EventKind::Enqueue], ..PromelaConfig::default() };
        assert!(emit_promela(&table(), &cfg).contains(" }; l1 = tmp0 + 1; printf("));
    }
}
