//! Synthetic records and dumps with known overlaps give known paths, charts
//! and tables.

use eudp_trace::resolve::{self, kind, Dump, RawEvent, Record};
use eudp_trace::{chart, table};

fn rec(stack: &str, host: &str, layer: &str, packet: u64, bytes: u64, s: f64, e: f64) -> Record {
    Record { stack: stack.into(), host: host.into(), layer: layer.into(), packet, bytes, t_start_ns: s, t_end_ns: e }
}

/// A pipeline in the style of paper 000 Fig. 2: the application takes 1 µs
/// per packet one after another; the kernel sends four packets as one GSO
/// message in 2 µs (shared, overlapping intervals); the receiver reads each in
/// 3 µs. The receiver (3 µs per packet) dominates; the batched kernel layer
/// costs 0.5 µs per packet.
fn pipeline(bytes: u64, app: f64, rx: f64) -> Vec<Record> {
    let mut v = Vec::new();
    for p in 0..4u64 {
        let pf = p as f64;
        v.push(rec("eudp", "sender", "app.send", p, bytes, pf * app, (pf + 1.0) * app));
        v.push(rec("eudp", "sender", "kernel.tx", p, bytes, 4.0 * app, 4.0 * app + 2000.0));
        v.push(rec("eudp", "receiver", "kernel.rx", p, bytes, 10_000.0 + pf * rx, 10_000.0 + (pf + 1.0) * rx));
    }
    v
}

#[test]
fn shares_split_overlaps_and_keep_sequences() {
    // Four identical intervals share; two disjoint ones keep their length;
    // touching intervals do not merge.
    let s = table::shares(&[(0.0, 8.0), (0.0, 8.0), (0.0, 8.0), (0.0, 8.0), (10.0, 13.0), (13.0, 14.0)]);
    assert_eq!(s, vec![2.0, 2.0, 2.0, 2.0, 3.0, 1.0]);
    // Staggered overlap: one merged group of length 6 for three packets.
    assert_eq!(table::shares(&[(0.0, 4.0), (1.0, 5.0), (2.0, 6.0)]), vec![2.0, 2.0, 2.0]);
    assert_eq!(table::union_ns(&mut [(0.0, 4.0), (1.0, 5.0), (10.0, 11.0)]), 6.0);
}

#[test]
fn known_table_dominant_and_throughput() {
    let recs = pipeline(1000, 1000.0, 3000.0);
    let row = table::run_row("eudp", 1000, &recs, 2.5);
    let by = |l: &str| row.layers.iter().find(|x| x.layer == l).unwrap().clone();
    assert_eq!(by("app.send").per_packet_ns, 1000.0);
    assert_eq!(by("kernel.tx").per_packet_ns, 500.0);
    assert_eq!(by("kernel.tx").mean_ns, 2000.0);
    assert_eq!(by("kernel.rx").per_packet_ns, 3000.0);
    assert_eq!(row.dominant, "kernel.rx");
    // 1000 B every 3000 ns = 2.667 Gbit/s.
    assert!((row.predicted_gbps - 8000.0 / 3000.0).abs() < 1e-9);
    assert_eq!(row.measured_gbps, 2.5);
    // Layers come out in chart order.
    let names: Vec<&str> = row.layers.iter().map(|l| l.layer.as_str()).collect();
    assert_eq!(names, ["app.send", "kernel.tx", "kernel.rx"]);
}

#[test]
fn queue_layers_never_dominate() {
    let mut recs = pipeline(100, 1000.0, 1000.0);
    for p in 0..4u64 {
        recs.push(rec("eudp", "sender", "l1", p, 100, 0.0, 50_000.0 + p as f64 * 50_000.0));
    }
    let row = table::run_row("eudp", 100, &recs, 0.0);
    assert_ne!(row.dominant, "l1");
    assert!(row.layers.iter().any(|l| l.layer == "l1" && !l.service));
}

#[test]
fn fits_recover_g_and_big_g_and_the_crossover() {
    // app.send: 1000 + 0.1·B; kernel.rx: 200 + 1.0·B. They cross at 888.9 B:
    // below it the application dominates, above it the receive path.
    let mut runs = Vec::new();
    for b in [64u64, 256, 512, 1024, 1472] {
        let app = 1000.0 + 0.1 * b as f64;
        let rx = 200.0 + 1.0 * b as f64;
        runs.push(table::run_row("eudp", b, &pipeline(b, app, rx), 0.0));
    }
    assert_eq!(runs[0].dominant, "app.send");
    assert_eq!(runs[4].dominant, "kernel.rx");
    let fits = table::fit_layers("eudp", &runs);
    let f = |l: &str| fits.iter().find(|x| x.layer == l).unwrap().clone();
    assert!((f("app.send").g_ns - 1000.0).abs() < 1e-6 && (f("app.send").big_g_ns_per_byte - 0.1).abs() < 1e-9);
    assert!((f("kernel.rx").g_ns - 200.0).abs() < 1e-6 && (f("kernel.rx").big_g_ns_per_byte - 1.0).abs() < 1e-9);
    let c = table::crossovers("eudp", &fits, 64.0, 1472.0);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].below.as_str(), c[0].above.as_str()), ("app.send", "kernel.rx"));
    assert!((c[0].bytes - 800.0 / 0.9).abs() < 1e-6);
    let text = table::render(&runs, &fits, &c);
    assert!(text.contains("app.send -> kernel.rx at 889 B"), "{text}");
}

#[test]
fn chart_has_one_rectangle_per_packet_per_layer_and_shared_axis() {
    let mut recs = pipeline(1000, 1000.0, 3000.0);
    // A second stack twice as slow, drawn beside it on the same time scale.
    recs.extend(pipeline(1000, 2000.0, 6000.0).into_iter().map(|mut r| {
        r.stack = "kernel".into();
        r.t_start_ns *= 2.0;
        r.t_end_ns *= 2.0;
        r
    }));
    let svg = chart::side_by_side("t", &["kernel", "eudp"], &recs);
    assert_eq!(svg.matches("<rect x=").count(), recs.len());
    assert!(svg.contains("sender: app.send") && svg.contains("receiver: kernel.rx"));
    // Alternating shades for even and odd packets.
    assert!(svg.contains("#2f5d9a") && svg.contains("#9dbbe3"));
    // The same 1 µs spans the same width in both panels: eudp's packet 0 on
    // app.send (0-1 µs) and kernel's (0-4 µs) are 1:4 wide.
    let width = |stack: &str| -> f64 {
        let tag = format!("<title>{stack} app.send packet 0:");
        let line = svg.lines().find(|l| l.contains(&tag)).unwrap();
        let w = line.split("width=\"").nth(1).unwrap().split('"').next().unwrap();
        w.parse().unwrap()
    };
    assert!((width("kernel") / width("eudp") - 4.0).abs() < 0.01);
    // The model's renderer reads the same records (schema compatibility).
    let json = serde_json::json!({ "records": recs }).to_string();
    let parsed = eudp_model::timeline::parse(&json).unwrap();
    assert_eq!(parsed.len(), recs.len());
    assert!(eudp_model::svg::time_flow("m", &parsed).contains("<rect x="));
}

fn ev(ts: u64, k: u8, thread: u64, a: u64, b: u64) -> RawEvent {
    RawEvent(ts, k, 7, thread, a, b, 0)
}

fn msg(first: u64, count: u64, direct: bool) -> u64 {
    first | (u64::from(direct) << 47) | (count << 48)
}

/// An application send call: entered at `enter`, returned at `ret`.
fn send(enter: u64, ret: u64, seq: u64, q: Option<u64>) -> RawEvent {
    let b = match q {
        Some(q) => q | (500 << 40),
        None => (500 << 40) | (1 << 63),
    };
    RawEvent(ret, kind::SEND_CALL, 7, 1, enter, b, seq)
}

/// Three sends: the first posted directly, two queued and sent by the engine
/// as one GSO message; the receiver reads the first alone and the other two
/// as one GRO message.
fn dumps() -> (Dump, Dump) {
    let app = 1;
    let eng = 2;
    let tx = Dump {
        clock: "CLOCK_MONOTONIC_RAW".into(),
        dropped: 0,
        pid: 0,
        events: vec![
            ev(120, kind::SYS_ENTER, app, 0, 0),
            ev(200, kind::SYS_RETURN, app, 0, 1),
            ev(200, kind::KMSG, app, 0, msg(0, 1, true)),
            send(100, 210, 0, None),
            send(220, 240, 1, Some(0)),
            send(250, 270, 2, Some(1)),
            ev(300, kind::TAKE, eng, 0, 2),
            ev(310, kind::BATCH, eng, 0, 2),
            ev(320, kind::SYS_ENTER, eng, 1, 0),
            ev(400, kind::KMSG, eng, 1, msg(0, 2, false)),
            ev(400, kind::SYS_RETURN, eng, 1, 1),
            ev(150, kind::TX_SCHED, eng, 0, 0),
            ev(160, kind::TX_SOFT, eng, 0, 0),
            ev(350, kind::TX_SCHED, eng, 1, 0),
            ev(360, kind::TX_SOFT, eng, 1, 0),
        ],
    };
    let rx = Dump {
        clock: "CLOCK_MONOTONIC_RAW".into(),
        dropped: 0,
        pid: 0,
        events: vec![
            ev(380, kind::RX_ENTER, 1, 0, 0),
            ev(170, kind::RX_SOFT, 1, 0, 1),
            ev(390, kind::RX_PUSH, 1, 0, 1),
            ev(410, kind::RECV_CALL, 1, 50, 0),
            ev(500, kind::RX_ENTER, 1, 1, 0),
            ev(370, kind::RX_SOFT, 1, 1, 2),
            ev(520, kind::RX_PUSH, 1, 1, 2),
            ev(540, kind::RECV_CALL, 1, 420, 1),
            ev(570, kind::RECV_CALL, 1, 550, 2),
        ],
    };
    (tx, rx)
}

#[test]
fn join_builds_complete_ordered_paths() {
    let (tx, rx) = dumps();
    let paths = resolve::join(&tx, &rx);
    assert_eq!(paths.len(), 3);
    let p0 = &paths[0];
    assert_eq!(
        p0.points,
        [
            Some(100),
            Some(100),
            Some(100),
            Some(100),
            Some(120),
            Some(150),
            Some(160),
            Some(170),
            Some(390),
            Some(410),
            Some(410)
        ]
    );
    let p2 = &paths[2];
    assert_eq!(
        p2.points,
        [
            Some(250),
            Some(270),
            Some(300),
            Some(310),
            Some(320),
            Some(350),
            Some(360),
            Some(370),
            Some(520),
            Some(570),
            Some(570)
        ]
    );
    assert_eq!(p2.msg_datagrams, 2);
    assert!(resolve::order_violations(&paths, 0).is_empty());
    let (recs, missing) = resolve::records("eudp", &paths);
    assert!(missing.is_empty(), "{missing:?}");
    assert_eq!(recs.len(), 3 * resolve::LAYERS.len());
    // Times are relative to the first send; spot-check intervals.
    let find = |l: &str, p: u64| {
        recs.iter().find(|r| r.layer == l && r.packet == p).map(|r| (r.t_start_ns, r.t_end_ns)).unwrap()
    };
    assert_eq!(find("l1", 2), (170.0, 200.0));
    assert_eq!(find("engine", 2), (200.0, 220.0));
    assert_eq!(find("socket", 2), (270.0, 400.0));
    assert_eq!(find("kernel.rx", 2), (400.0, 420.0));
    // Entered at 450, after the datagram reached the ring (420).
    assert_eq!(find("app.recv", 2), (450.0, 470.0));
    // The first receive was entered (at -50) before its datagram arrived: the
    // layer starts at the ring push.
    assert_eq!(find("app.recv", 0), (290.0, 310.0));
    // The plain-kernel stack has fewer layers.
    assert_eq!(resolve::layers_of("kernel").len(), 7);
}

#[test]
fn holes_and_order_violations_are_reported() {
    let (mut tx, rx) = dumps();
    // Lose packet 1's TX_SOFTWARE stamp and move packet 0's RX_SOFTWARE
    // before its TX_SOFTWARE.
    tx.events.retain(|e| !(e.1 == kind::TX_SOFT && e.4 == 1));
    let mut rx = rx;
    rx.events[1].0 = 155;
    let paths = resolve::join(&tx, &rx);
    let (_, missing) = resolve::records("eudp", &paths);
    assert!(missing.contains(&(1, "qdisc")) && missing.contains(&(2, "veth")));
    let v = resolve::order_violations(&paths, 0);
    assert_eq!(v, vec![(0, "tx_software", "rx_software", 5)]);
    assert!(resolve::order_violations(&paths, 5).is_empty());
}

#[test]
fn application_tags_keep_packets_matched_across_a_loss() {
    // Packet 1 is lost: the receiver's second arrival is packet 2, which the
    // application tagged with its payload sequence number.
    let (tx, _) = dumps();
    let rx = Dump {
        clock: String::new(),
        dropped: 0,
        pid: 0,
        events: vec![
            ev(380, kind::RX_ENTER, 1, 0, 0),
            ev(170, kind::RX_SOFT, 1, 0, 1),
            ev(390, kind::RX_PUSH, 1, 0, 1),
            ev(410, kind::RECV_CALL, 1, 50, 0),
            ev(411, kind::APP_SEQ, 1, 0, 0),
            ev(500, kind::RX_ENTER, 1, 1, 0),
            ev(370, kind::RX_SOFT, 1, 1, 1),
            ev(520, kind::RX_PUSH, 1, 1, 1),
            ev(540, kind::RECV_CALL, 1, 420, 1),
            ev(541, kind::APP_SEQ, 1, 1, 2),
        ],
    };
    let paths = resolve::join(&tx, &rx);
    assert_eq!(paths[2].points[10], Some(540));
    assert_eq!(paths[1].points[10], None);
    let (_, missing) = resolve::records("eudp", &paths);
    assert!(missing.iter().all(|m| m.0 == 1), "{missing:?}");
}

/// A dump of one process: `sends` send calls and `recvs` receive calls on
/// one endpoint.
fn process(pid: u32, sends: u64, recvs: u64) -> Dump {
    let mut events = Vec::new();
    for i in 0..sends {
        events.push(send(100 + i * 10, 105 + i * 10, i, None));
    }
    for i in 0..recvs {
        events.push(ev(1000 + i * 10, kind::RECV_CALL, 2, 990 + i * 10, i));
    }
    Dump { clock: "CLOCK_MONOTONIC_RAW".into(), dropped: 0, pid, events }
}

/// A process's endpoint 7 recorded its addresses: `side` 1 (send: local,
/// destination) or 2 (receive: local, first source), IPv4 loopback ports.
fn addrs(d: &mut Dump, side: u64, local: u16, remote: u16) {
    let lo = |p: u16| (0x7f00_0001u64 << 16) | u64::from(p);
    d.events.push(RawEvent(1, kind::EP_ADDR, 7, 1, lo(local), lo(remote), side));
}

fn flow(tx: usize, rx: usize) -> Option<resolve::Flow> {
    Some(resolve::Flow { tx, tx_ep: 7, rx, rx_ep: 7 })
}

#[test]
fn a_programs_flow_is_its_busiest_sender_and_another_processs_receiver() {
    // Without addresses: a client that sends 5 and a server that receives
    // them, in whichever order the dumps come.
    assert_eq!(resolve::pick_flow(&[process(10, 0, 5), process(11, 5, 0)]), flow(1, 0));
    assert_eq!(resolve::pick_flow(&[process(11, 5, 0), process(10, 0, 5)]), flow(0, 1));
    // A process that sends to itself, beside one that did nothing.
    assert_eq!(resolve::pick_flow(&[process(10, 0, 0), process(11, 4, 4)]), flow(1, 1));
    // Ping-pong: both send and receive as much; the earlier dump sends.
    assert_eq!(resolve::pick_flow(&[process(10, 3, 3), process(11, 3, 3)]), flow(0, 1));
    // Nothing received, or nothing sent: no flow.
    assert_eq!(resolve::pick_flow(&[process(10, 3, 0), process(11, 2, 0)]), None);
    assert_eq!(resolve::pick_flow(&[process(10, 0, 3)]), None);
    assert_eq!(resolve::pick_flow(&[]), None);
}

#[test]
fn addresses_decide_which_process_received_what_was_sent() {
    // A parent that sends 6 to itself (port 1000) and a fork child that
    // received 2 on its own socket (port 2000) from elsewhere: without
    // addresses the other process would be taken as the receiver.
    let (mut parent, mut child) = (process(10, 6, 6), process(11, 0, 2));
    assert_eq!(resolve::pick_flow(&[parent.clone(), child.clone()]), flow(0, 1));
    addrs(&mut parent, 1, 1000, 1000);
    addrs(&mut parent, 2, 1000, 1000);
    addrs(&mut child, 2, 2000, 3000);
    assert_eq!(resolve::pick_flow(&[parent.clone(), child.clone()]), flow(0, 0));
    // A client (port 3000) sending to a server (port 2000) that also reads
    // its own replies: the server's endpoint is the receiver.
    let (mut client, mut server) = (process(10, 4, 4), process(11, 4, 4));
    addrs(&mut client, 1, 3000, 2000);
    addrs(&mut client, 2, 3000, 2000);
    addrs(&mut server, 1, 2000, 3000);
    addrs(&mut server, 2, 2000, 3000);
    assert_eq!(resolve::pick_flow(&[client, server]), flow(0, 1));
    // A ping-pong client whose server left no dump: its own receive
    // endpoint took the replies, another flow, so there is none to chart.
    let mut lone = process(10, 4, 4);
    addrs(&mut lone, 1, 3000, 2000);
    addrs(&mut lone, 2, 3000, 2000);
    assert_eq!(resolve::pick_flow(&[lone]), None);
    // A wildcard-bound receiver (0.0.0.0) matches by port.
    let (mut tx, mut rx) = (process(10, 3, 0), process(11, 0, 3));
    addrs(&mut tx, 1, 4000, 5000);
    rx.events.push(RawEvent(1, kind::EP_ADDR, 7, 1, 5000, (0x7f00_0001u64 << 16) | 4000, 2));
    assert_eq!(resolve::pick_flow(&[rx, tx]), flow(1, 0));
}
