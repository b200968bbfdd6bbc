//! The EMP flow model: a sender and a receiver process around the rows of
//! `eudp_engine::emp::table`, joined by channels that lose, duplicate and
//! reorder within fixed budgets.
//!
//! Every protocol decision is a table row printed by the table's own
//! renderer; the processes add only what the table leaves to its caller:
//! which wire value to try (each of `0..S`, the guard picks), when the
//! receiver acknowledges (every `G` frames, on a message's last frame,
//! while it holds frames, in answer to a duplicate), whether the
//! acknowledgment of a message's last frame goes at once (`AckOut`) or is
//! parked (`AckDelayed`) to leave later, as it does on a data frame of the
//! reverse flow or when the delay ends (any later step, through the same
//! impairments, unless an acknowledgment sent first replaces it), which frame the
//! sender repairs (the one a NAK names, the oldest after a timeout), the
//! receiver's held frames (`held[s]`: the index of the frame held under
//! wire number `s`, plus one; the `Accept` row takes each once it is the
//! expected one), the impairments, and ghost bookkeeping (each frame
//! carries its true index beside its wire sequence number, so a stale frame
//! accepted or held as new is seen).
//!
//! The code also repairs frames that an acknowledgment's selective part
//! shows missing; the model's acknowledgments carry no selective part, so
//! those repairs are left out: each is a `Repair` row like the ones the
//! model takes, and repair by NAK and timer alone already delivers
//! everything.
//!
//! The table's `GoBack` row has no step in the model: it follows frames the
//! socket did not take, which the receiver never sees, and sends them again
//! from there, which the channel cannot tell from their first sending (a
//! frame the socket refuses is, to the model, a frame the channel loses).
//!
//! The retransmission timer fires in two ways. Spin's `timeout` (no process
//! can move: every frame in flight is gone) is the timer of a sender whose
//! timeout exceeds the round trip, and may fire any number of times. An early
//! timer, one that fires while frames and acknowledgments are still on
//! their way, fires at most `early` times: in reality it is rare (the timer
//! backs off), and an unbounded one would let the model resend forever
//! without any impairment, which no fairness assumption rules out.

use eudp_engine::emp::table::{self, render_cond, render_effects, Kind, Table};
use std::fmt::Write as _;

/// Size of the EMP model and its impairment budgets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmpConfig {
    /// Data frames the sender sends.
    pub frames: u32,
    /// Frames per message (the last frame of a message is acknowledged).
    pub per_message: u32,
    /// Flow-control window `W` in frames.
    pub window: u32,
    /// Acknowledgment group `G`.
    pub ack_group: u32,
    /// Sequence space `S`: wire sequence numbers are counters mod `S`.
    pub seq_space: u32,
    /// Capacity of each channel. A message sent to a full channel is
    /// dropped, as a full socket buffer drops a datagram; at the default
    /// size the correct model never fills one.
    pub capacity: u32,
    /// Frames or acknowledgments lost, in all.
    pub losses: u32,
    /// Frames or acknowledgments delivered twice, in all.
    pub duplicates: u32,
    /// Times a channel's two oldest messages swap places.
    pub reorders: u32,
    /// Times the timer fires while something is still in flight.
    pub early_timeouts: u32,
    /// Expected first frames dropped for want of a posted receive.
    pub unmatched: u32,
}

impl Default for EmpConfig {
    fn default() -> Self {
        EmpConfig {
            frames: 6,
            per_message: 1,
            window: 2,
            ack_group: 2,
            seq_space: 5,
            capacity: 8,
            losses: 1,
            duplicates: 1,
            reorders: 1,
            early_timeouts: 1,
            unmatched: 1,
        }
    }
}

/// One guarded step of `kind` with the parameter written as `param`:
/// `(guard) -> effects`.
fn row(t: &Table, kind: Kind, param: &str) -> (String, String) {
    let r = t.rule(kind);
    (render_cond(&r.guard, param), render_effects(r, param))
}

/// The sender's repair of the frame whose wire number is `param` (the
/// oldest unacknowledged one, absolute `base`), when the `Repair` row
/// allows it.
fn repair(t: &Table, param: &str) -> String {
    let (g, e) = row(t, Kind::Repair, param);
    format!(
        "if :: {g} ->{e} printf(\"@@ sender Repair %d (#%d)  base=%d\\n\", {param}, base, base); send_data({param}, base) :: else -> skip fi"
    )
}

/// The alternatives of an `if` that sends `kind` (AckOut or NakOut) with
/// every wire value the guard allows (an acknowledgment sent replaces a
/// parked one), or parks it (AckDelayed).
fn ack_alternatives(t: &Table, kind: Kind, cfg: &EmpConfig, flag: u32, indent: &str) -> String {
    let mut o = String::new();
    for p in 0..cfg.seq_space {
        let (g, e) = row(t, kind, &p.to_string());
        let act = if kind == Kind::AckDelayed {
            format!("parked = 1; parked_v = {p}")
        } else {
            format!("parked = 0; parked_v = 0; unacked = 0; send_ack({flag}, {p})")
        };
        let _ = writeln!(
            o,
            "{indent}:: {g} ->{e} printf(\"@@ receiver {kind:?} {p}  exp=%d since=%d\\n\", exp, since); {act}"
        );
    }
    o
}

/// The Promela model of one EMP flow generated from `t`.
pub fn emit(t: &Table, cfg: &EmpConfig) -> String {
    let mut o = String::new();
    o.push_str("/* eudp EMP flow: selective repeat with cumulative acks and NAKs. GENERATED from\n");
    o.push_str(" * crates/engine/src/emp/table.rs by `eudp verify --emit-promela`; edit the table there.\n *\n");
    for r in &t.rules {
        let _ = writeln!(o, " *   {:<10} {}", format!("{:?}", r.kind), r.doc);
    }
    o.push_str(" */\n");
    let _ = writeln!(
        o,
        "#define N {}\n#define FPM {}\n#define W {}\n#define G {}\n#define S {}\n#define C {}\n\
         #define LOSS {}\n#define DUPS {}\n#define REORD {}\n#define EARLY {}\n#define UNM {}\n",
        cfg.frames,
        cfg.per_message,
        cfg.window,
        cfg.ack_group,
        cfg.seq_space,
        cfg.capacity,
        cfg.losses,
        cfg.duplicates,
        cfg.reorders,
        cfg.early_timeouts,
        cfg.unmatched
    );
    o.push_str(
        "/* the table's variables: sender, then receiver */\n\
         byte base, ptr, top;\n\
         byte exp, since;\n\
         bit gap_seen, nak_sent;\n\
         bit parked; byte parked_v;   /* an acknowledgment parked to leave later, and its wire value */\n\
         byte unacked;                /* frames accepted since an acknowledgment left at once (the group's count) */\n\
         byte held[S];   /* the receiver's held frames: index + 1 per wire number, 0 when none */\n\n\
         chan data = [C] of { byte, byte };  /* wire sequence number (mod S), ghost: the frame's index */\n\
         chan acks = [C] of { bit, byte };   /* 0 ack / 1 NAK, wire sequence number (mod S) */\n\n\
         /* impairments spent, and ghosts */\n\
         byte lost, duped, reordered, early, unmatched;\n\
         byte data_drops, ack_drops;   /* frames lost or unmatched; acks or NAKs lost */\n\
         bool misdelivered;            /* a frame accepted that is not the flow's next */\n\
         bool stall_with_gap;          /* a gap left for the timer to repair */\n\n",
    );
    let invs: Vec<String> = t.invariants.iter().map(|(_, g)| render_cond(g, "0")).collect();
    let _ = writeln!(o, "#define table_invariants ({})\n", invs.join(" && "));
    o.push_str(
        "inline send_data(s, id) {\n  if\n\
         \x20 :: lost < LOSS -> lost++; data_drops++; printf(\"@@   frame %d (#%d) lost\\n\", s, id)\n\
         \x20 :: duped < DUPS && len(data) + 2 <= C -> data!s,id; data!s,id; duped++; printf(\"@@   frame %d (#%d) doubled\\n\", s, id)\n\
         \x20 :: nfull(data) -> data!s,id\n\
         \x20 :: full(data) -> data_drops++; printf(\"@@   frame %d (#%d) dropped: channel full\\n\", s, id)\n  fi\n}\n\n\
         inline send_ack(k, v) {\n  if\n\
         \x20 :: lost < LOSS -> lost++; ack_drops++; printf(\"@@   ack/nak %d lost\\n\", v)\n\
         \x20 :: duped < DUPS && len(acks) + 2 <= C -> acks!k,v; acks!k,v; duped++; printf(\"@@   ack/nak %d doubled\\n\", v)\n\
         \x20 :: nfull(acks) -> acks!k,v\n\
         \x20 :: full(acks) -> ack_drops++; printf(\"@@   ack/nak %d dropped: channel full\\n\", v)\n  fi\n}\n\n\
         /* the two oldest messages of ch swap places; the others keep their order */\n\
         inline swap_head(ch) {\n\
         \x20 n = len(ch); ch?a1,b1; ch?a2,b2; ch!a2,b2; ch!a1,b1;\n\
         \x20 do :: n > 2 -> ch?a1,b1; ch!a1,b1; n-- :: else -> break od;\n\
         \x20 a1 = 0; b1 = 0; a2 = 0; b2 = 0; n = 0; reordered++\n}\n\n",
    );

    // Sender: new frames and resends (every wire value tried, the guard
    // picks), acknowledgments in, the timer.
    o.push_str("proctype sender() {\n  byte id, k, v, n, a1, b1, a2, b2;\n  do\n  :: base == N -> break\n");
    for p in 0..cfg.seq_space {
        for kind in [Kind::SendNew, Kind::Resend] {
            let (g, e) = row(t, kind, &p.to_string());
            let bound = if kind == Kind::SendNew { "top < N && " } else { "" };
            let _ = writeln!(
                o,
                "  :: atomic {{ {bound}{g} -> id = ptr;{e} printf(\"@@ sender {kind:?} {p} (#%d)  base=%d top=%d\\n\", id, base, top); send_data({p}, id); id = 0 }}"
            );
        }
    }
    let (ack_g, ack_e) = row(t, Kind::AckIn, "v");
    let (nak_g, nak_e) = row(t, Kind::NakIn, "v");
    let nak_repair = repair(t, "v");
    let _ = write!(
        o,
        "  :: acks?k,v ->\n     atomic {{\n       if\n\
         \x20      :: k == 0 && {ack_g} ->{ack_e} printf(\"@@ sender AckIn %d  base=%d ptr=%d\\n\", v, base, ptr)\n\
         \x20      :: k == 1 && {nak_g} ->{nak_e} printf(\"@@ sender NakIn %d  base=%d ptr=%d\\n\", v, base, ptr);\n\
         \x20         {nak_repair}\n\
         \x20      :: else -> printf(\"@@ sender ignores stale %d\\n\", v)\n\
         \x20      fi;\n       k = 0; v = 0\n     }}\n\
         \x20 :: atomic {{ reordered < REORD && len(acks) >= 2 -> swap_head(acks); printf(\"@@   acks reordered\\n\") }}\n",
    );
    let (to_g, to_e) = row(t, Kind::Timeout, "0");
    let oldest = repair(t, "(base % S)");
    let _ = write!(
        o,
        "  :: atomic {{ timeout && {to_g} ->\n\
         \x20      if :: gap_seen && data_drops <= 1 && ack_drops == 0 -> stall_with_gap = true :: else -> skip fi;{to_e}\n\
         \x20      printf(\"@@ sender Timeout (all quiet)  base=%d\\n\", base);\n\
         \x20      {oldest} }}\n\
         \x20 :: atomic {{ early < EARLY && {to_g} -> early++;{to_e} printf(\"@@ sender Timeout (early)  base=%d\\n\", base);\n\
         \x20      {oldest} }}\n\
         \x20 od\n}}\n\n",
    );

    // Receiver: one of Accept / Unmatched / Duplicate / Gap per frame, then
    // the acknowledgment the design calls for.
    let (acc_g, acc_e) = row(t, Kind::Accept, "f");
    let (unm_g, _) = row(t, Kind::Unmatched, "f");
    let (dup_g, dup_e) = row(t, Kind::Duplicate, "f");
    let (gap_g, gap_e) = row(t, Kind::Gap, "f");
    let (hold_g, hold_e) = row(t, Kind::Hold, "f");
    let (drain_g, drain_e) = row(t, Kind::Accept, "(exp % S)");
    let holding = (0..cfg.seq_space).map(|s| format!("held[{s}] != 0")).collect::<Vec<_>>().join(" || ");
    let acks_deep = ack_alternatives(t, Kind::AckOut, cfg, 0, "           ");
    let last_acks = ack_alternatives(t, Kind::AckOut, cfg, 0, "              ");
    let parks = ack_alternatives(t, Kind::AckDelayed, cfg, 0, "              ");
    let acks = ack_alternatives(t, Kind::AckOut, cfg, 0, "        ");
    let naks = ack_alternatives(t, Kind::NakOut, cfg, 1, "        ");
    let _ = write!(
        o,
        "proctype receiver() {{\n  byte f, id, k, v, n, a1, b1, a2, b2;\nend:\n  do\n  :: data?f,id ->\n     atomic {{\n     if\n\
         \x20    :: {acc_g} ->\n        if :: id != exp -> misdelivered = true :: else -> skip fi;{acc_e} unacked++;\n\
         \x20       printf(\"@@ receiver Accept %d (#%d)  exp=%d\\n\", f, id, exp);\n\
         \x20       do\n\
         \x20       :: held[exp % S] != 0 && {drain_g} ->\n\
         \x20          f = exp % S; id = held[f] - 1; held[f] = 0;\n\
         \x20          if :: id != exp -> misdelivered = true :: else -> skip fi;{drain_e} unacked++;\n\
         \x20          printf(\"@@ receiver Accept %d (#%d, held)  exp=%d\\n\", f, id, exp)\n\
         \x20       :: else -> break\n        od;\n\
         \x20       if\n        :: unacked >= G || {holding} ->\n           if\n{acks_deep}           fi\n\
         \x20       :: else ->\n           if\n           :: id % FPM == FPM - 1 ->\n              if\n{last_acks}{parks}              fi\n\
         \x20          :: else -> skip\n           fi\n        fi\n\
         \x20    :: unmatched < UNM && id % FPM == 0 && {unm_g} ->\n\
         \x20       unmatched++; data_drops++; printf(\"@@ receiver Unmatched %d (#%d): no posted receive\\n\", f, id)\n\
         \x20    :: {dup_g} ->{dup_e} printf(\"@@ receiver Duplicate %d (#%d)\\n\", f, id);\n        if\n{acks}        fi\n\
         \x20    :: held[f] == 0 && {hold_g} ->{hold_e} held[f] = id + 1; printf(\"@@ receiver Hold %d (#%d)\\n\", f, id);\n        if\n{naks}        :: else -> skip\n        fi\n\
         \x20    :: held[f] != 0 && {gap_g} ->{gap_e} printf(\"@@ receiver Gap %d (#%d): held already\\n\", f, id);\n        if\n{acks}        fi\n\
         \x20    fi;\n     f = 0; id = 0\n     }}\n\
         \x20 :: atomic {{ parked -> printf(\"@@ receiver parked ack %d leaves\\n\", parked_v); send_ack(0, parked_v); parked = 0; parked_v = 0 }}\n\
         \x20 :: atomic {{ reordered < REORD && len(data) >= 2 -> swap_head(data); printf(\"@@   frames reordered\\n\") }}\n\
         \x20 od\n}}\n\n",
    );
    o.push_str("init {\n  atomic { run sender(); run receiver() }\n}\n\n");
    o.push_str(
        "/* every accepted frame is the flow's next one: each delivered once, in order */\n\
         ltl in_order_once { [] !misdelivered }\n\
         /* the sender releases only frames the receiver has accepted */\n\
         ltl released_after_accept { [] (base <= exp) }\n\
         /* the table's invariants hold in every state */\n\
         ltl table_invariants_hold { [] table_invariants }\n\
         /* with one frame dropped and no acknowledgment lost, a gap is repaired by a NAK, not the timer */\n\
         ltl gap_repaired_by_nak { [] !stall_with_gap }\n\
         /* every frame is eventually accepted and acknowledged (-a -f) */\n\
         ltl all_delivered { <> (exp == N && base == N) }\n",
    );
    o
}

/// The EMP table (possibly broken by the caller) at the given size.
pub fn emp_table() -> Table {
    table::table()
}
