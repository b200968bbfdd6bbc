//! The EMP transition table as a trace checker: hand-written traces of one
//! flow's sender and receiver, as the protocol code records them, are
//! accepted; traces that break the selective-repeat design are rejected at
//! the first event the table does not allow.

use eudp_engine::emp::event::FlowEvent::{self, *};
use eudp_engine::emp::table::{check_receiver_trace, check_sender_trace, check_trace, Params, Side};

const P: Params = Params { window: 4, ack_group: 2, first_seq: 0 };

fn sender_ok(trace: &[FlowEvent], p: &Params) -> eudp_engine::emp::table::FlowState {
    check_sender_trace(trace, p).unwrap_or_else(|v| panic!("{v}"))
}

fn receiver_ok(trace: &[FlowEvent], p: &Params) -> eudp_engine::emp::table::FlowState {
    check_receiver_trace(trace, p).unwrap_or_else(|v| panic!("{v}"))
}

/// The index of the first event the table rejects.
fn rejected_at(side: Side, trace: &[FlowEvent], p: &Params) -> usize {
    match check_trace(side, trace, p) {
        Ok(s) => panic!("accepted, ending in {s:?}"),
        Err(v) => {
            assert_eq!(v.event, trace[v.index]);
            assert!(v.to_string().starts_with(&format!("event #{}", v.index)), "{v}");
            v.index
        }
    }
}

#[test]
fn lossless_run() {
    // Two messages of two frames; an ack per group of two, which is also
    // each message's last frame.
    let s = sender_ok(
        &[
            SendNew { seq: 0 },
            SendNew { seq: 1 },
            AckIn { next: 2 },
            SendNew { seq: 2 },
            SendNew { seq: 3 },
            AckIn { next: 4 },
        ],
        &P,
    );
    assert_eq!((s.base, s.ptr, s.top), (4, 4, 4));
    let r = receiver_ok(
        &[
            Accept { seq: 0 },
            Accept { seq: 1 },
            AckOut { next: 2 },
            Accept { seq: 2 },
            Accept { seq: 3 },
            AckOut { next: 4 },
        ],
        &P,
    );
    assert_eq!((r.exp, r.since), (4, 0));
}

#[test]
fn loss_answered_by_nak_and_repair() {
    // Frame 1 is lost: frame 2 is held and shows the gap, the receiver NAKs
    // 1, the sender repairs 1 alone, and the receiver accepts 1 and then the
    // held 2.
    let s = sender_ok(
        &[
            SendNew { seq: 0 },
            SendNew { seq: 1 },
            SendNew { seq: 2 },
            NakIn { next: 1 },
            Repair { seq: 1 },
            SendNew { seq: 3 },
            AckIn { next: 4 },
        ],
        &P,
    );
    assert_eq!((s.base, s.top), (4, 4));
    receiver_ok(
        &[
            Accept { seq: 0 },
            Hold { seq: 2 },
            NakOut { next: 1 },
            Gap { seq: 2 }, // a copy of the held frame: dropped, one NAK per gap
            Accept { seq: 1 },
            Accept { seq: 2 },
            AckOut { next: 3 },
            Accept { seq: 3 },
            AckOut { next: 4 },
        ],
        &P,
    );
}

#[test]
fn timeout_repairs_the_oldest_and_give_up_ends_the_flow() {
    sender_ok(
        &[
            SendNew { seq: 0 },
            SendNew { seq: 1 },
            AckIn { next: 1 },
            Timeout,
            Repair { seq: 1 },
            AckIn { next: 2 },
            SendNew { seq: 2 },
        ],
        &P,
    );
    // Frames past the oldest are repaired as acknowledgments report them.
    let s = sender_ok(
        &[
            SendNew { seq: 0 },
            SendNew { seq: 1 },
            SendNew { seq: 2 },
            Timeout,
            Repair { seq: 0 },
            AckIn { next: 1 },
            Repair { seq: 1 },
            AckIn { next: 3 },
        ],
        &P,
    );
    assert_eq!((s.base, s.ptr, s.top), (3, 3, 3));
    let s = sender_ok(&[SendNew { seq: 0 }, Timeout, Repair { seq: 0 }, Timeout, Repair { seq: 0 }, GiveUp], &P);
    assert_eq!((s.base, s.ptr, s.top), (1, 1, 1));
}

#[test]
fn duplicate_is_acknowledged_again() {
    // The ack of frames 0-1 was lost; the sender's timer repairs 0, which is
    // now a duplicate: the receiver acks again.
    receiver_ok(
        &[Accept { seq: 0 }, Accept { seq: 1 }, AckOut { next: 2 }, Duplicate { seq: 0 }, AckOut { next: 2 }],
        &P,
    );
    sender_ok(&[SendNew { seq: 0 }, SendNew { seq: 1 }, Timeout, Repair { seq: 0 }, AckIn { next: 2 }], &P);
}

#[test]
fn unmatched_first_frame_is_dropped_unacknowledged() {
    // Frame 2 opens a message nobody has posted a receive for yet: it is
    // dropped and not acked; frame 3 is held and shows a gap, and the
    // repaired 2 finds the receive posted meanwhile.
    receiver_ok(
        &[
            Accept { seq: 0 },
            Accept { seq: 1 },
            AckOut { next: 2 },
            Unmatched { seq: 2 },
            Hold { seq: 3 },
            NakOut { next: 2 },
            Accept { seq: 2 },
            Accept { seq: 3 },
            AckOut { next: 4 },
        ],
        &P,
    );
}

#[test]
fn sequence_numbers_wrap() {
    let p = Params { first_seq: u32::MAX - 1, ..P };
    let s = sender_ok(
        &[
            SendNew { seq: u32::MAX - 1 },
            SendNew { seq: u32::MAX },
            SendNew { seq: 0 },
            AckIn { next: u32::MAX },
            Timeout,
            Repair { seq: u32::MAX },
            Repair { seq: 0 },
            AckIn { next: 1 },
        ],
        &p,
    );
    assert_eq!((s.base, s.top), (1, 1));
    receiver_ok(
        &[
            Accept { seq: u32::MAX - 1 },
            Hold { seq: 0 },
            Accept { seq: u32::MAX },
            Accept { seq: 0 },
            AckOut { next: 1 },
            Duplicate { seq: u32::MAX },
            AckOut { next: 1 },
        ],
        &p,
    );
}

#[test]
fn rejects_what_the_design_forbids() {
    use Side::{Receiver, Sender};
    // Accepting out of order.
    assert_eq!(rejected_at(Receiver, &[Accept { seq: 0 }, Accept { seq: 2 }], &P), 1);
    // Acknowledging beyond what was accepted.
    assert_eq!(rejected_at(Receiver, &[Accept { seq: 0 }, AckOut { next: 2 }], &P), 1);
    // More than a window accepted without an ack: no sender within its
    // window sends that many past the last ack.
    let five: Vec<FlowEvent> = (0..5).map(|seq| Accept { seq }).collect();
    assert_eq!(rejected_at(Receiver, &five, &P), 4);
    // Going back to a frame not yet transmitted, or already acknowledged.
    assert_eq!(rejected_at(Sender, &[SendNew { seq: 0 }, GoBack { seq: 1 }], &P), 1);
    assert_eq!(
        rejected_at(Sender, &[SendNew { seq: 0 }, SendNew { seq: 1 }, AckIn { next: 1 }, GoBack { seq: 0 }], &P),
        3
    );
    // A second NAK for the same gap.
    let t = [Hold { seq: 1 }, NakOut { next: 0 }, Hold { seq: 2 }, NakOut { next: 0 }];
    assert_eq!(rejected_at(Receiver, &t, &P), 3);
    // Calling the expected frame a duplicate, a gap or a held one; holding
    // a frame beyond the window.
    assert_eq!(rejected_at(Receiver, &[Duplicate { seq: 0 }], &P), 0);
    assert_eq!(rejected_at(Receiver, &[Gap { seq: 0 }], &P), 0);
    assert_eq!(rejected_at(Receiver, &[Hold { seq: 0 }], &P), 0);
    assert_eq!(rejected_at(Receiver, &[Hold { seq: 3 }, Hold { seq: 4 }], &P), 1);

    // Sending beyond the window.
    let w2 = Params { window: 2, ..P };
    assert_eq!(rejected_at(Sender, &[SendNew { seq: 0 }, SendNew { seq: 1 }, SendNew { seq: 2 }], &w2), 2);
    // Repairing a frame never sent.
    assert_eq!(rejected_at(Sender, &[SendNew { seq: 0 }, Timeout, Repair { seq: 0 }, Repair { seq: 1 }], &P), 3);
    // Skipping a sequence number; a new frame while going back.
    assert_eq!(rejected_at(Sender, &[SendNew { seq: 0 }, SendNew { seq: 2 }], &P), 1);
    assert_eq!(
        rejected_at(Sender, &[SendNew { seq: 0 }, SendNew { seq: 1 }, GoBack { seq: 0 }, SendNew { seq: 2 }], &P),
        3
    );
    // Repairing an acknowledged frame; a timeout goes back no more.
    let t = [SendNew { seq: 0 }, SendNew { seq: 1 }, Timeout, AckIn { next: 1 }, Repair { seq: 0 }];
    assert_eq!(rejected_at(Sender, &t, &P), 4);
    assert_eq!(rejected_at(Sender, &[SendNew { seq: 0 }, Timeout, Resend { seq: 0 }], &P), 2);
    // An ack of a frame never sent; a timeout with nothing outstanding.
    assert_eq!(rejected_at(Sender, &[SendNew { seq: 0 }, AckIn { next: 2 }], &P), 1);
    assert_eq!(rejected_at(Sender, &[SendNew { seq: 0 }, AckIn { next: 1 }, Timeout], &P), 2);
    // An event of the other side.
    assert_eq!(rejected_at(Sender, &[SendNew { seq: 0 }, Accept { seq: 0 }], &P), 1);
}

#[test]
fn violation_names_the_state_before_the_event() {
    let v = check_receiver_trace(&[Accept { seq: 0 }, AckOut { next: 3 }], &P).unwrap_err();
    assert_eq!(v.index, 1);
    assert_eq!(v.event, AckOut { next: 3 });
    assert_eq!((v.state.exp, v.state.since), (1, 1));
    assert!(v.reason.contains("guard"), "{}", v.reason);
}

#[test]
fn an_ack_owed_in_a_batch_names_the_frames_accepted_by_the_time_it_is_sent() {
    // The group fills at frame 1, but the ack goes out after the batch's
    // frame 2 and names 3.
    let r = receiver_ok(&[Accept { seq: 0 }, Accept { seq: 1 }, Accept { seq: 2 }, AckOut { next: 3 }], &P);
    assert_eq!((r.exp, r.since), (3, 0));
}

#[test]
fn frames_the_socket_refused_go_back() {
    // Frames 2 and 3 did not reach the wire: the sender goes back to 2.
    let s = sender_ok(
        &[
            SendNew { seq: 0 },
            SendNew { seq: 1 },
            SendNew { seq: 2 },
            SendNew { seq: 3 },
            GoBack { seq: 2 },
            AckIn { next: 2 },
            Resend { seq: 2 },
            Resend { seq: 3 },
            AckIn { next: 4 },
        ],
        &P,
    );
    assert_eq!((s.base, s.ptr, s.top), (4, 4, 4));
}
