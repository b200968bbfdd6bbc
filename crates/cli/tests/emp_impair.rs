//! EMP under impairment on the a — r — b topology, through `eudp worker
//! emp` (client in a, server in b): loss from the nftables rule in b,
//! reordering and duplication from the relay, hostile datagrams from a
//! third socket. Every message arrives exactly once with intact bytes and
//! the counters agree with the impairment's own counts. Counts only, no
//! timings.

use eudp_cli::impair::{nft_dropped, nft_loss, ImpairBed, Summary, IMP_A, IMP_B};
use eudp_cli::testbed::{is_root, unique_name};
use eudp_wire::emp::{encode_control, encode_data_header, Control, DataHeader, DATA_HEADER_LEN};
use serde_json::Value;
use std::net::UdpSocket;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const EUDP: &str = env!("CARGO_BIN_EXE_eudp");
const SERVER_PORT: u16 = 41_000;
const CLIENT_PORT: u16 = 41_001;
/// Seconds each client drives its pattern.
const SECS: &str = "1.5";

/// One topology at a time: the host has two cores, and parallel runs
/// would turn socket-buffer overflow into a second, uncounted loss.
static SERIAL: Mutex<()> = Mutex::new(());

fn bed() -> Option<ImpairBed> {
    if !is_root() {
        eprintln!("skipped: network namespaces need root");
        return None;
    }
    match ImpairBed::up(&unique_name("emi")) {
        Ok(b) => Some(b),
        Err(e) if e.contains("netns add") => {
            eprintln!("skipped: network namespaces are unavailable: {e}");
            None
        }
        Err(e) => panic!("impairment topology: {e}"),
    }
}

fn worker_args(role: &str, pattern: &str, size: usize) -> Vec<String> {
    let (local, peer) = match role {
        "server" => (format!("{IMP_B}:{SERVER_PORT}"), format!("{IMP_A}:{CLIENT_PORT}")),
        _ => (format!("{IMP_A}:{CLIENT_PORT}"), format!("{IMP_B}:{SERVER_PORT}")),
    };
    ["worker", "emp", "--role", role, "--local", &local, "--peer", &peer, "--pattern", pattern]
        .iter()
        .map(|s| s.to_string())
        .chain(["--size".into(), size.to_string(), "--secs".into(), SECS.into()])
        .collect()
}

/// Starts the server in b and waits until its socket is bound (and a
/// moment more, for its peer entry).
fn start_server(bed: &ImpairBed, pattern: &str, size: usize) -> Child {
    let child = bed
        .command('b', EUDP)
        .args(worker_args("server", pattern, size))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    let t0 = Instant::now();
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", &bed.netns('b'), "ss", "-Hlun", &format!("sport = :{SERVER_PORT}")])
            .output()
            .expect("ss");
        if !out.stdout.is_empty() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the server never bound its port");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    child
}

fn one_line(what: &str, out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what} failed: {}; stdout {text}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: one JSON line: {lines:?}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{what} line {:?}: {e}", lines[0]))
}

/// Runs the client in a against a running server; `during` runs once the
/// client has started. Returns the client's line and the server's output.
fn exchange(bed: &ImpairBed, server: Child, pattern: &str, size: usize, during: impl FnOnce()) -> (Value, Output) {
    let client = bed
        .command('a', EUDP)
        .args(worker_args("client", pattern, size))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("client");
    during();
    let client = client.wait_with_output().expect("client output");
    let server = server.wait_with_output().expect("server output");
    assert!(
        client.status.success(),
        "client failed: {}\nserver: {}{}",
        String::from_utf8_lossy(&client.stderr),
        String::from_utf8_lossy(&server.stderr),
        String::from_utf8_lossy(&server.stdout)
    );
    (one_line("client", &client), server)
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

fn c(v: &Value, key: &str) -> u64 {
    v["counters"][key].as_u64().unwrap_or_else(|| panic!("no counters.{key} in {v}"))
}

/// UDP datagrams the kernel of `ns` received but could not deliver
/// (`InErrors` of /proc/net/snmp, socket-buffer overflow among them).
fn udp_in_errors(ns: &str) -> u64 {
    let out = Command::new("ip").args(["netns", "exec", ns, "cat", "/proc/net/snmp"]).output().expect("snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().expect("Udp header"), udp.next().expect("Udp values"));
    let i = names.split_whitespace().position(|w| w == "InErrors").expect("InErrors");
    values.split_whitespace().nth(i).and_then(|v| v.parse().ok()).expect("InErrors value")
}

/// The stream's delivery checks: the client saw every message acknowledged
/// (it fails otherwise) and the server received exactly those, intact.
fn delivered_exactly(client: &Value, server: &Value) {
    assert_eq!(n(client, "errors"), 0, "{client}");
    assert!(n(client, "messages") > 0, "{client}");
    assert_eq!(n(server, "messages_received"), n(client, "messages"), "client {client}\nserver {server}");
    assert_eq!(n(server, "bytes_received"), n(client, "bytes"), "client {client}\nserver {server}");
    assert_eq!((n(server, "corrupt"), n(server, "errors")), (0, 0), "{server}");
    assert_eq!(c(client, "give_ups"), 0, "{client}");
}

/// A 16 KiB stream with `pct` percent of b's incoming UDP dropped.
fn stream_under_loss(pct: u32) -> (Value, Value, u64) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut bed) = bed() else { return (Value::Null, Value::Null, 0) };
    bed.start_relay(EUDP, &[]).expect("relay");
    nft_loss(&bed.netns('b'), pct).expect("nft loss rule (scripts/deps.sh test installs nftables)");
    let server = start_server(&bed, "stream", 16_384);
    let (client, server) = exchange(&bed, server, "stream", 16_384, || {});
    let server = one_line("server", &server);
    let dropped = nft_dropped(&bed.netns('b')).expect("nft counter");
    let lost = dropped + udp_in_errors(&bed.netns('b'));
    let relay = bed.stop_relay().expect("relay summary");
    delivered_exactly(&client, &server);
    // Every datagram the relay passed to b reached the server's parser
    // unless the rule or b's kernel dropped it. The relay counts what
    // crossed it, not what the client sent: frames its own socket missed
    // under load are a further loss no counter sees. The client's last
    // acknowledgments may land after the server's snapshot, hence the slack.
    let (crossed, got) = (relay.left_to_right.udp, c(&server, "frames_received") + lost);
    assert!(got <= crossed && crossed - got <= 2, "relay passed {crossed}, server got+lost {got}\n{client}\n{server}");
    assert!(crossed <= c(&client, "frames_sent"), "{relay:?}\n{client}");
    // Acknowledgments travel b → a unimpaired.
    assert_eq!(c(&client, "naks_received"), c(&server, "naks_sent"), "{client}\n{server}");
    if dropped > 0 {
        assert!(c(&client, "retransmits") > 0, "nft dropped {dropped}: {client}");
    }
    (client, server, dropped)
}

#[test]
fn stream_delivers_exactly_under_one_percent_loss() {
    let (client, _, dropped) = stream_under_loss(1);
    if client.is_null() {
        return;
    }
    assert!(dropped > 0, "1% of a 1.5 s stream drops something");
}

#[test]
fn stream_delivers_exactly_under_ten_percent_loss() {
    let (client, server, dropped) = stream_under_loss(10);
    if client.is_null() {
        return;
    }
    assert!(dropped > 0);
    assert!(c(&server, "naks_sent") > 0, "{server}");
    assert!(c(&server, "held") > 0, "{server}");
}

/// A 16 KiB stream through the relay with `impair` options.
fn stream_through_relay(impair: &[&str]) -> Option<(Value, Value, Summary, u64)> {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut bed = bed()?;
    bed.start_relay(EUDP, impair).expect("relay");
    let server = start_server(&bed, "stream", 16_384);
    let (client, server) = exchange(&bed, server, "stream", 16_384, || {});
    let server = one_line("server", &server);
    let relay = bed.stop_relay().expect("relay summary");
    let in_errors = udp_in_errors(&bed.netns('b'));
    delivered_exactly(&client, &server);
    assert_eq!((relay.left_to_right.dropped, relay.left_to_right.send_errors), (0, 0), "{relay:?}");
    Some((client, server, relay, in_errors))
}

#[test]
fn stream_delivers_exactly_under_reordering() {
    let Some((client, server, relay, _)) = stream_through_relay(&["--reorder", "5", "--seed", "11"]) else {
        return;
    };
    assert!(relay.left_to_right.reordered > 0, "{relay:?}");
    // A delayed data frame lets later ones arrive first: they are held, a
    // NAK names the delayed one, and its repair or late arrival fills the gap.
    assert!(c(&server, "held") > 0, "{server}");
    assert!(c(&server, "naks_sent") > 0, "{server}");
    assert!(c(&client, "retransmits") > 0, "{client}");
}

#[test]
fn stream_delivers_exactly_under_duplication() {
    let Some((client, server, relay, in_errors)) = stream_through_relay(&["--dup", "5", "--seed", "12"]) else {
        return;
    };
    let dup = relay.left_to_right.duplicated;
    assert!(dup > 0, "{relay:?}");
    // The relay sends a copy right behind its original and nothing is
    // reordered, so the server classifies the copy after the original: an
    // accepted original makes the copy a duplicate; an original that was a
    // gap, stale or unmatched makes the copy the same again; a copy the
    // kernel could not deliver is an InError. The frames a → b that are not
    // data are the client's acknowledgments and NAKs, whose copies count
    // nowhere. Hence the bound below; retransmissions only add duplicates.
    let classified = c(&server, "duplicates") + c(&server, "gaps") + c(&server, "stale") + c(&server, "unmatched");
    let control = c(&client, "acks_sent") + c(&client, "naks_sent");
    assert!(classified + in_errors + control >= dup, "relay duplicated {dup}: {client}\n{server}\n{relay:?}");
    assert!(c(&server, "duplicates") > 0, "{server}");
}

#[test]
fn ping_pong_completes_under_ten_percent_loss() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut bed) = bed() else { return };
    bed.start_relay(EUDP, &[]).expect("relay");
    nft_loss(&bed.netns('b'), 10).expect("nft loss rule");
    let server = start_server(&bed, "pingpong", 10);
    let (client, server) = exchange(&bed, server, "pingpong", 10, || {});
    assert!(server.status.success(), "server: {}", String::from_utf8_lossy(&server.stderr));
    let messages = n(&client, "messages");
    assert!(messages > 0, "{client}");
    assert_eq!(n(&client, "errors"), 0, "{client}");
    // Each ping waits for its reply, so replies equal pings, each intact.
    assert_eq!((n(&client, "messages_received"), n(&client, "corrupt")), (messages, 0), "{client}");
    if nft_dropped(&bed.netns('b')).expect("nft counter") > 0 {
        assert!(c(&client, "retransmits") > 0, "{client}");
    }
}

/// Hostile datagrams: garbage (the empty datagram among them) and EMP
/// headers cut short, which the parser rejects.
fn malformed() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![Vec::new(), b"hello".to_vec(), vec![0xff; 700], b"EM".to_vec()];
    let mut data = vec![0u8; DATA_HEADER_LEN + 8];
    let h = DataHeader { epoch: 0xdead, seq: 3, tag: 1, msg_len: 8, offset: 0 };
    encode_data_header(&h, 8, &mut data).expect("header");
    v.extend([data[..10].to_vec(), data[..20].to_vec(), data[..DATA_HEADER_LEN - 1].to_vec()]);
    v
}

/// Well-formed EMP frames of a flow incarnation that never existed: data
/// above sequence 0 and control frames.
fn wrong_epoch() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let data = (1..4u32)
        .map(|seq| {
            let mut f = vec![0u8; DATA_HEADER_LEN + 8];
            let h = DataHeader { epoch: 0xbad0 + seq, seq, tag: 7, msg_len: 8, offset: 0 };
            encode_data_header(&h, 8, &mut f).expect("header");
            f
        })
        .collect();
    let control = [false, true]
        .iter()
        .map(|&nak| {
            let mut f = vec![0u8; 64];
            let len =
                encode_control(&Control { epoch: 0xbad9, next: 5, window: 64, sack: 0 }, nak, &mut f).expect("control");
            f.truncate(len);
            f
        })
        .collect();
    (data, control)
}

/// Runs this test binary's [`hostile_sender`] inside namespace `ns`: it
/// binds `src` and sends `which` (`malformed`, or `all` for the
/// wrong-epoch frames too) to the server.
fn send_hostile(ns: &str, src: &str, which: &str) {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args(["--exact", "hostile_sender", "--nocapture", "--test-threads", "1"])
        .env("EUDP_HOSTILE_SRC", src)
        .env("EUDP_HOSTILE_DST", format!("{IMP_B}:{SERVER_PORT}"))
        .env("EUDP_HOSTILE_WHICH", which)
        .output()
        .expect("hostile sender");
    assert!(out.status.success(), "hostile sender: {}", String::from_utf8_lossy(&out.stdout));
}

/// Not a test of its own: the hostile sender [`send_hostile`] runs in a
/// namespace, doing nothing unless its environment names a source.
#[test]
fn hostile_sender() {
    let Ok(src) = std::env::var("EUDP_HOSTILE_SRC") else { return };
    let dst = std::env::var("EUDP_HOSTILE_DST").expect("destination");
    let all = std::env::var("EUDP_HOSTILE_WHICH").as_deref() == Ok("all");
    let sock = UdpSocket::bind(&src).expect("bind hostile source");
    let mut frames = malformed();
    if all {
        let (data, control) = wrong_epoch();
        frames.extend(data.into_iter().chain(control));
    }
    for f in &frames {
        sock.send_to(f, &dst).expect("hostile send");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn hostile_datagrams_are_dropped_and_counted() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut bed) = bed() else { return };
    bed.start_relay(EUDP, &[]).expect("relay");
    let server = start_server(&bed, "stream", 16_384);
    let na = bed.netns('a');
    // From the client's own address before the client binds it: the server
    // knows the peer, so the parser judges them (malformed) and the flow
    // judges the wrong-epoch data (stale: an incarnation starts only at
    // sequence 0).
    send_hostile(&na, &format!("{IMP_A}:{CLIENT_PORT}"), "all");
    // While the stream runs, from an address the server does not know:
    // everything is charged to unknown peers before it is parsed.
    let (client, server) = exchange(&bed, server, "stream", 16_384, || {
        std::thread::sleep(Duration::from_millis(200));
        send_hostile(&na, &format!("{IMP_A}:0"), "all");
    });
    let server = one_line("server", &server);
    let in_errors = udp_in_errors(&bed.netns('b'));
    delivered_exactly(&client, &server);
    let (data, control) = wrong_epoch();
    assert_eq!(in_errors, 0, "the kernel dropped datagrams: counts below would not add up");
    assert_eq!(c(&server, "malformed"), malformed().len() as u64, "{server}");
    assert_eq!(c(&server, "unknown_peer"), (malformed().len() + data.len() + control.len()) as u64, "{server}");
    assert!(c(&server, "stale") >= data.len() as u64, "{server}");
    let relay = bed.stop_relay().expect("relay summary");
    assert_eq!(relay.left_to_right.dropped, 0);
}
