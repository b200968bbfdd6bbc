//! The models, their properties and their deliberately broken variants.

use crate::emp_model::{self, EmpConfig};
use eudp_engine::emp::table as emp_table;
use eudp_engine::machine::{self, Cond, Effect, EventKind, Op, PromelaConfig, Term, Var};

/// How a property is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A safety `ltl` claim; breadth-first (`-DSAFETY -DBFS`) for short trails.
    Safety,
    /// No claim: invalid end states (deadlocks) only (`-DSAFETY -DBFS -DNOCLAIM`).
    EndState,
    /// An `ltl` claim with liveness: acceptance cycles under weak fairness
    /// (`-DNFAIR=3`, `./pan -a -f`).
    Liveness,
}

/// What a correct model must give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// No error: the property holds.
    Holds,
    /// The claim is `[] !p` and must be violated: `p` is reachable, and the
    /// trail is a witness.
    Reachable,
}

/// One property of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Property {
    /// The `ltl` claim's name (or a name for the end-state check).
    pub name: &'static str,
    pub mode: Mode,
    pub expect: Expect,
    pub meaning: &'static str,
}

/// A model ready to be written and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    /// `firmware` or `engine`.
    pub name: &'static str,
    /// The Promela text.
    pub text: String,
    pub properties: Vec<Property>,
}

impl Model {
    /// File name of the model (`firmware.pml`, `engine.pml`).
    pub fn file_name(&self) -> String {
        format!("{}.pml", self.name)
    }
}

/// The firmware model as written (without broken-variant defines).
pub const FIRMWARE_PML: &str = include_str!("../promela/firmware.pml");

const fn prop(name: &'static str, mode: Mode, expect: Expect, meaning: &'static str) -> Property {
    Property { name, mode, expect, meaning }
}

/// Properties of the firmware model.
pub const FIRMWARE_PROPERTIES: [Property; 9] = [
    prop("f1_sdma_send", Mode::Safety, Expect::Reachable, "Table 1 (1): SEND transmits while SDMA performs a host DMA"),
    prop("f2_rdma_recv", Mode::Safety, Expect::Reachable, "Table 1 (2): RDMA performs a host DMA while RECV receives"),
    prop(
        "f3_send_recv",
        Mode::Safety,
        Expect::Reachable,
        "Table 1 (3): SEND and RECV use the link at once (full duplex)",
    ),
    prop(
        "f4_host_dma_exclusive",
        Mode::Safety,
        Expect::Holds,
        "Table 1 (4): SDMA and RDMA never hold the host DMA engine together",
    ),
    prop(
        "fine_tx_same_packet",
        Mode::Safety,
        Expect::Reachable,
        "a fragment goes out while SDMA still moves the same packet",
    ),
    prop(
        "fine_rx_same_packet",
        Mode::Safety,
        Expect::Reachable,
        "a fragment goes to the host while RECV still receives the same packet",
    ),
    prop("fw_no_deadlock", Mode::EndState, Expect::Holds, "the four threads never all block"),
    prop(
        "tx_progress",
        Mode::Liveness,
        Expect::Holds,
        "a posted send eventually gets the host DMA engine (weak fairness)",
    ),
    prop("rx_progress", Mode::Liveness, Expect::Holds, "an arriving packet is eventually received (weak fairness)"),
];

/// Properties of the engine model.
pub const ENGINE_PROPERTIES: [Property; 5] = [
    prop("l2_bound", Mode::Safety, Expect::Holds, "L2 never holds more descriptors than its bound"),
    prop(
        "conservation",
        Mode::Safety,
        Expect::Holds,
        "no datagram lost or duplicated between application, L1, L2 and backend; counters match",
    ),
    prop(
        "no_invalid_end_state",
        Mode::EndState,
        Expect::Holds,
        "every run ends with all threads finished (no deadlock)",
    ),
    prop(
        "eventually_handed",
        Mode::Liveness,
        Expect::Holds,
        "every accepted datagram is eventually handed to the backend (weak fairness)",
    ),
    prop(
        "flush_completes",
        Mode::Liveness,
        Expect::Holds,
        "after shutdown the engine stops with L1 and L2 empty and everything handed",
    ),
];

/// Properties of the EMP flow model.
pub const EMP_PROPERTIES: [Property; 6] = [
    prop(
        "in_order_once",
        Mode::Safety,
        Expect::Holds,
        "every accepted frame is the flow's next: each delivered exactly once, in order",
    ),
    prop(
        "released_after_accept",
        Mode::Safety,
        Expect::Holds,
        "the sender releases only frames the receiver has accepted",
    ),
    prop("table_invariants_hold", Mode::Safety, Expect::Holds, "base <= ptr <= top, top - base <= W, since <= W"),
    prop(
        "gap_repaired_by_nak",
        Mode::Safety,
        Expect::Holds,
        "with one frame dropped and no ack lost, a gap is repaired by a NAK, never left to the timer",
    ),
    prop("emp_no_deadlock", Mode::EndState, Expect::Holds, "every run ends with the sender done (no deadlock)"),
    prop(
        "all_delivered",
        Mode::Liveness,
        Expect::Holds,
        "every frame is eventually accepted and acknowledged (weak fairness)",
    ),
];

/// A deliberately broken variant and the properties it must break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Broken {
    pub name: &'static str,
    /// `firmware` or `engine`.
    pub model: &'static str,
    /// Properties that must come out unexpected (others may too).
    pub breaks: &'static [&'static str],
    pub what: &'static str,
}

/// Every broken variant.
pub const BROKEN: &[Broken] = &[
    Broken {
        name: "no-dma-lock",
        model: "firmware",
        breaks: &["f4_host_dma_exclusive"],
        what: "RDMA starts a host DMA without owning the host DMA engine",
    },
    Broken {
        name: "serialized",
        model: "firmware",
        breaks: &["f1_sdma_send", "f2_rdma_recv", "f3_send_recv"],
        what: "one DMA at a time in the whole NIC: no overlap at all",
    },
    Broken {
        name: "coarse-only",
        model: "firmware",
        breaks: &["fine_tx_same_packet", "fine_rx_same_packet"],
        what: "fine-grained states disabled: only packet-to-packet (coarse) pipelining",
    },
    Broken {
        name: "no-arbitration",
        model: "firmware",
        breaks: &["tx_progress", "rx_progress"],
        what: "the host DMA engine goes to whichever thread asks first: one direction can starve the other",
    },
    Broken {
        name: "l2-off-by-one",
        model: "engine",
        breaks: &["l2_bound"],
        what: "a direct post is allowed while l2 == L2_BOUND (guard `<=` instead of `<`)",
    },
    Broken {
        name: "missing-lock",
        model: "engine",
        breaks: &["conservation"],
        what: "Enqueue updates the L1 counter outside the queue lock (read, then write back)",
    },
    Broken {
        name: "lost-completion",
        model: "engine",
        breaks: &["no_invalid_end_state"],
        what: "a direct post's completion is never made visible, so its L2 slot is never reaped",
    },
    Broken {
        name: "batch-needs-two",
        model: "engine",
        breaks: &["eventually_handed"],
        what: "the engine only takes batches of two or more, stranding a lone datagram in L1",
    },
    Broken {
        name: "exit-without-flush",
        model: "engine",
        breaks: &["flush_completes"],
        what: "the engine stops as soon as shutdown is requested, without draining L1 and L2",
    },
    Broken {
        name: "no-nak",
        model: "emp",
        breaks: &["gap_repaired_by_nak"],
        what: "the receiver never sends a NAK: a gap waits for the sender's timer",
    },
    Broken {
        name: "ack-before-receipt",
        model: "emp",
        breaks: &["released_after_accept"],
        what: "the receiver may acknowledge the frame after the expected one before it has accepted it",
    },
    Broken {
        name: "window-off-by-one",
        model: "emp",
        breaks: &["in_order_once"],
        what: "window W = S/2 + 1, one past half the sequence space: an old frame's copy is held as a new one",
    },
];

/// The broken variant called `name`.
pub fn broken(name: &str) -> Option<&'static Broken> {
    BROKEN.iter().find(|b| b.name == name)
}

/// The firmware model, possibly broken.
pub fn firmware(broken: Option<&Broken>) -> Model {
    let mut text = String::new();
    if let Some(b) = broken {
        let def = format!("BROKEN_{}", b.name.to_uppercase().replace('-', "_"));
        text.push_str(&format!("/* deliberately broken variant `{}`: {} */\n#define {def} 1\n", b.name, b.what));
    }
    text.push_str(FIRMWARE_PML);
    Model { name: "firmware", text, properties: FIRMWARE_PROPERTIES.to_vec() }
}

/// Applies `f` to every comparison in `g`.
fn each_cmp(g: &mut Cond, f: &mut dyn FnMut(&mut Term, &mut Op, &mut Term)) {
    match g {
        Cond::Cmp(a, op, b) => f(a, op, b),
        Cond::Not(x) => each_cmp(x, f),
        Cond::All(xs) | Cond::Any(xs) => xs.iter_mut().for_each(|x| each_cmp(x, f)),
    }
}

/// The engine's table, possibly broken, and the emitter's configuration.
pub fn engine_table(broken: Option<&Broken>, cfg: &mut PromelaConfig) -> machine::Table {
    let mut t = machine::table();
    match broken.map(|b| b.name) {
        Some("l2-off-by-one") => each_cmp(&mut t.rule_mut(EventKind::DirectPost).guard, &mut |a, op, b| {
            if *a == Term::Var(Var::L2) && *op == Op::Lt && *b == Term::L2Bound {
                *op = Op::Le;
            }
        }),
        Some("missing-lock") => cfg.unlocked.push(EventKind::Enqueue),
        Some("lost-completion") => {
            t.rule_mut(EventKind::DirectDone).effects.retain(|e| !matches!(e, Effect::Add(Var::DoneUnreaped, _)))
        }
        Some("batch-needs-two") => each_cmp(&mut t.rule_mut(EventKind::TakeBatch).guard, &mut |a, op, b| {
            if *a == Term::Param && *op == Op::Ge && *b == Term::Const(1) {
                *b = Term::Const(2);
            }
        }),
        Some("exit-without-flush") => t.flush_done = Cond::Cmp(Term::Var(Var::Shutdown), Op::Eq, Term::Const(1)),
        _ => {}
    }
    t
}

/// The engine model generated from the table, possibly broken.
pub fn engine(broken: Option<&Broken>, cfg: &PromelaConfig) -> Model {
    let mut cfg = cfg.clone();
    let table = engine_table(broken, &mut cfg);
    let mut text = String::new();
    if let Some(b) = broken {
        text.push_str(&format!("/* deliberately broken variant `{}`: {} */\n", b.name, b.what));
    }
    text.push_str(&machine::emit_promela(&table, &cfg));
    Model { name: "engine", text, properties: ENGINE_PROPERTIES.to_vec() }
}

/// The EMP table, possibly broken, and the model's size.
pub fn emp_parts(broken: Option<&Broken>, cfg: &EmpConfig) -> (emp_table::Table, EmpConfig) {
    use emp_table::{Kind, Term as T};
    let mut t = emp_model::emp_table();
    let mut cfg = cfg.clone();
    match broken.map(|b| b.name) {
        Some("no-nak") => {
            t.rule_mut(Kind::NakOut).guard = emp_table::Cond::Cmp(T::Const(1), emp_table::Op::Eq, T::Const(0))
        }
        Some("ack-before-receipt") => {
            let ahead = T::Dist(Box::new(T::Var(emp_table::Var::Exp)), Box::new(T::Param));
            t.rule_mut(Kind::AckOut).guard = emp_table::Cond::Cmp(ahead, emp_table::Op::Le, T::Const(1));
        }
        Some("window-off-by-one") => cfg.window = cfg.seq_space / 2 + 1,
        _ => {}
    }
    (t, cfg)
}

/// The EMP flow model generated from its table, possibly broken.
pub fn emp(broken: Option<&Broken>, cfg: &EmpConfig) -> Model {
    let (table, cfg) = emp_parts(broken, cfg);
    let mut text = String::new();
    if let Some(b) = broken {
        text.push_str(&format!("/* deliberately broken variant `{}`: {} */\n", b.name, b.what));
    }
    text.push_str(&emp_model::emit(&table, &cfg));
    Model { name: "emp", text, properties: EMP_PROPERTIES.to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_broken_variant_changes_its_model() {
        let cfg = PromelaConfig::default();
        for b in BROKEN {
            let (good, bad) = match b.model {
                "firmware" => (firmware(None), firmware(Some(b))),
                "emp" => (emp(None, &EmpConfig::default()), emp(Some(b), &EmpConfig::default())),
                _ => (engine(None, &cfg), engine(Some(b), &cfg)),
            };
            let strip =
                |m: &Model| m.text.lines().filter(|l| !l.starts_with("/* deliberately")).collect::<Vec<_>>().join("\n");
            assert_ne!(strip(&good), strip(&bad), "{}", b.name);
            for p in b.breaks {
                assert!(good.properties.iter().any(|q| q.name == *p), "{} names unknown property {p}", b.name);
            }
        }
    }
}
