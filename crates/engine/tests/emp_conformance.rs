//! The traces that running EMP endpoints record conform to the transition
//! table: endpoints on 127.0.0.1 with event recording on, through a
//! ping-pong, a stream that fills a small window, a burst of one large
//! message, and a message that first finds no posted receive; every flow's
//! sender and receiver traces are replayed by the table's checker. The
//! go-back after frames the socket does not take is driven on the flows
//! directly, since loopback rarely refuses a datagram.

use eudp_engine::emp::event::FlowEvent;
use eudp_engine::emp::flow::recv::{RecvFlow, Verdict};
use eudp_engine::emp::flow::send::SendFlow;
use eudp_engine::emp::table::{check_receiver_trace, check_sender_trace, Params};
use eudp_engine::emp::{Completion, EmpConfig, EmpEndpoint, Op, PeerId, Status};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

fn cfg(window: u32, ack_group: u32) -> EmpConfig {
    EmpConfig { rto_initial: Duration::from_millis(5), window, ack_group, record_events: true, ..EmpConfig::default() }
}

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Two endpoints that know each other: (a, a's id of b, b, b's id of a).
fn pair(c: &EmpConfig) -> (EmpEndpoint, PeerId, EmpEndpoint, PeerId) {
    let a = EmpEndpoint::bind(any(), c.clone()).unwrap();
    let b = EmpEndpoint::bind(any(), c.clone()).unwrap();
    let ab = a.insert(b.local_addr());
    let ba = b.insert(a.local_addr());
    (a, ab, b, ba)
}

fn next(e: &EmpEndpoint) -> Completion {
    e.wait(Some(WAIT)).expect("a completion within the wait")
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(seed) as u8).collect()
}

/// Replays both traces of `e`'s flows with `peer`; panics with the first
/// violation. Returns the traces for further checks.
fn conforms(what: &str, e: &EmpEndpoint, peer: PeerId, c: &EmpConfig) -> (Vec<FlowEvent>, Vec<FlowEvent>) {
    let (send, recv) = e.take_flow_events(peer);
    let params = Params { window: c.window, ack_group: c.ack_group, first_seq: 0 };
    if let Err(v) = check_sender_trace(&send, &params) {
        panic!("{what}: sender trace leaves the table: {v}\n around: {:?}", around(&send, v.index));
    }
    if let Err(v) = check_receiver_trace(&recv, &params) {
        panic!("{what}: receiver trace leaves the table: {v}\n around: {:?}", around(&recv, v.index));
    }
    (send, recv)
}

fn around(t: &[FlowEvent], i: usize) -> &[FlowEvent] {
    &t[i.saturating_sub(8)..(i + 2).min(t.len())]
}

/// Waits for both ends to go quiet, so that the last acks are recorded.
fn settle(a: &EmpEndpoint, b: &EmpEndpoint) {
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        let _ = a.wait(Some(Duration::from_millis(20)));
        let _ = b.wait(Some(Duration::from_millis(20)));
    }
}

#[test]
fn ping_pong_traces_conform() {
    let c = cfg(64, 4);
    let (a, ab, b, ba) = pair(&c);
    for i in 0..200u64 {
        b.recv(Some(ba), 7, 0, 64, i).unwrap();
        a.recv(Some(ab), 8, 0, 64, i).unwrap();
        a.send(ab, 7, pattern(10, i), i).unwrap();
        let got = next(&b);
        assert_eq!((got.op, got.status), (Op::Recv, Status::Ok), "{got:?}");
        b.send(ba, 8, got.data, i).unwrap();
        for _ in 0..2 {
            assert_eq!(next(&a).status, Status::Ok);
        }
        assert_eq!(next(&b).op, Op::Send);
    }
    settle(&a, &b);
    let (s, r) = conforms("a", &a, ab, &c);
    assert_eq!(s.iter().filter(|e| matches!(e, FlowEvent::SendNew { .. })).count(), 200);
    assert_eq!(r.iter().filter(|e| matches!(e, FlowEvent::Accept { .. })).count(), 200);
    conforms("b", &b, ba, &c);
}

#[test]
fn a_stream_through_a_small_window_conforms() {
    // Three frames a message, a window of eight: the window fills at once.
    let c = EmpConfig { send_queue_bytes: 64 << 10, ..cfg(8, 4) };
    let (a, ab, b, ba) = pair(&c);
    let n = 600u64;
    let len = 3 * c.frame_payload - 7;
    for i in 0..n {
        b.recv(Some(ba), 1, 0, len, i).unwrap();
    }
    let (mut sent, mut acked, mut received) = (0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    while (acked < n || received < n) && Instant::now() < deadline {
        while sent < n {
            match a.send(ab, 1, pattern(len, sent), sent) {
                Ok(()) => sent += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        while let Some(d) = a.poll() {
            assert_eq!((d.op, d.status), (Op::Send, Status::Ok), "{d:?}");
            acked += 1;
        }
        while let Some(got) = b.poll().or_else(|| b.wait(Some(Duration::from_millis(2)))) {
            assert_eq!((got.op, got.status), (Op::Recv, Status::Ok), "{got:?}");
            assert!(got.data == pattern(len, got.context), "message {} corrupt", got.context);
            received += 1;
        }
        if let Some(d) = a.wait(Some(Duration::from_millis(2))) {
            assert_eq!((d.op, d.status), (Op::Send, Status::Ok), "{d:?}");
            acked += 1;
        }
    }
    assert_eq!((acked, received), (n, n), "stream incomplete");
    settle(&a, &b);
    let (s, _) = conforms("sender a", &a, ab, &c);
    let (_, r) = conforms("receiver b", &b, ba, &c);
    assert!(s.iter().filter(|e| matches!(e, FlowEvent::SendNew { .. })).count() >= 3 * n as usize);
    assert!(r.iter().any(|e| matches!(e, FlowEvent::AckOut { .. })));
}

#[test]
fn a_burst_of_one_large_message_conforms() {
    let c = cfg(512, 16);
    let (a, ab, b, ba) = pair(&c);
    let msg = pattern(8 << 20, 9);
    b.recv(Some(ba), 2, 0, msg.len(), 1).unwrap();
    a.send(ab, 2, msg.clone(), 2).unwrap();
    let got = next(&b);
    assert_eq!((got.status, got.len), (Status::Ok, msg.len()));
    assert!(got.data == msg, "bytes differ");
    assert_eq!(next(&a).status, Status::Ok);
    settle(&a, &b);
    conforms("sender a", &a, ab, &c);
    conforms("receiver b", &b, ba, &c);
}

#[test]
fn an_unmatched_message_conforms() {
    let c = cfg(16, 4);
    let (a, ab, b, ba) = pair(&c);
    a.send(ab, 5, pattern(100, 1), 1).unwrap();
    // No receive is posted yet: the first frame is dropped until there is.
    let deadline = Instant::now() + WAIT;
    while b.counters().unmatched == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(b.counters().unmatched > 0, "no unmatched drop");
    b.recv(Some(ba), 5, 0, 100, 9).unwrap();
    let got = next(&b);
    assert_eq!((got.status, got.data), (Status::Ok, pattern(100, 1)));
    assert_eq!(next(&a).status, Status::Ok);
    settle(&a, &b);
    let (s, _) = conforms("sender a", &a, ab, &c);
    let (_, r) = conforms("receiver b", &b, ba, &c);
    assert!(s.iter().any(|e| matches!(e, FlowEvent::Timeout)));
    assert!(r.iter().any(|e| matches!(e, FlowEvent::Unmatched { .. })));
}

/// Frames handed to a socket that does not take them go back: the sender
/// records `GoBack` and sends them again, and its trace still conforms.
#[test]
fn frames_the_socket_refuses_go_back_and_conform() {
    let c = EmpConfig { frame_payload: 100, ..cfg(8, 3) };
    let now = Instant::now();
    let mut s = SendFlow::new(&c, 0, now);
    let mut r = RecvFlow::new(&c);
    for m in 0..4u64 {
        s.queue(3, pattern(450, m), m).unwrap();
    }
    let mut refusals = 0;
    for round in 0..100 {
        // Each round, the "socket" takes the first three frames of the
        // batch and refuses the rest, until three refusals have happened.
        let mut batch = Vec::new();
        while let Some(f) = s.next_frame(now) {
            let last = f.header.offset as usize + f.payload.len() == f.header.msg_len as usize;
            batch.push((f.header, last));
        }
        if batch.is_empty() {
            break;
        }
        let taken = if refusals < 3 && batch.len() > 3 { 3 } else { batch.len() };
        if taken < batch.len() {
            s.unsend(batch[taken].0.seq);
            refusals += 1;
        }
        for (h, last) in &batch[..taken] {
            if let Verdict::Expected { .. } = r.classify(h, &[]) {
                r.accept(h, *last);
            }
        }
        while let Some((ctl, nak)) = r.take_control() {
            s.on_control(ctl, nak, now);
        }
        assert!(round < 99, "the flow does not finish");
    }
    assert!(s.is_idle(), "messages left unacknowledged");
    assert_eq!(s.counters().go_backs, 3);
    let params = Params { window: c.window, ack_group: c.ack_group, first_seq: 0 };
    let st = s.take_events();
    assert_eq!(st.iter().filter(|e| matches!(e, FlowEvent::GoBack { .. })).count(), 3);
    if let Err(v) = check_sender_trace(&st, &params) {
        panic!("sender trace leaves the table: {v}");
    }
    if let Err(v) = check_receiver_trace(&r.take_events(), &params) {
        panic!("receiver trace leaves the table: {v}");
    }
}
