//! The tracer's tests and its cost measurements.

use super::clock::*;
use super::ep::*;
use super::record::*;
use crate::sys::{clock, timestamp};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::Mutex;

/// Tests that turn tracing on and off hold this: the switch is global, and
/// a test turning it off would cut another's recording short.
static TEST_SWITCH: Mutex<()> = Mutex::new(());

fn test_switch() -> std::sync::MutexGuard<'static, ()> {
    TEST_SWITCH.lock().unwrap_or_else(|e| e.into_inner())
}

mod recording {
    use super::*;

    #[test]
    fn refs_round_trip() {
        assert_eq!(unpack_msg_ref(msg_ref(12345, 64, true)), (12345, 64, true));
        assert_eq!(unpack_msg_ref(msg_ref(7, 1, false)), (7, 1, false));
        assert_eq!(unpack_send_ref(send_ref(123_456, 65_507, false)), (123_456, 65_507, false));
        assert_eq!(unpack_send_ref(send_ref(0, 64, true)), (0, 64, true));
    }

    #[test]
    fn tsc_maps_onto_the_raw_clock() {
        let _switch = test_switch();
        enable();
        let t = EpTrace::new();
        let tok = t.send_enter(100);
        t.direct();
        let before = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(3));
        t.send_return(tok);
        let after = now_ns();
        disable();
        let ev: Vec<Event> = events().into_iter().filter(|e| e.ep == t.id && e.kind == Kind::SendCall as u8).collect();
        assert_eq!(ev.len(), 1);
        let e = ev[0];
        // The call began before `before` and ended between the two reads.
        assert!(
            e.a <= before + 20_000 && e.ts_ns + 20_000 >= before + 3_000_000 && e.ts_ns <= after + 20_000,
            "{e:?} {before} {after}"
        );
        assert_eq!(unpack_send_ref(e.b), (0, 100, true));
    }

    /// A direct post that the kernel's full send buffer turned into a
    /// queued one is one datagram: one send seq, its L1 index joined to it,
    /// and the next send gets the next seq (no hole that would pair every
    /// later receive with the send before its own). A failed send syscall
    /// leaves no mark that would number the next call's message.
    #[test]
    fn a_direct_post_queued_instead_keeps_its_send_seq() {
        let _switch = test_switch();
        enable();
        let t = EpTrace::new();
        let tok = t.send_enter(64);
        let seq = t.direct();
        t.sys_enter(true);
        // EAGAIN: no return; the post goes to L1 instead.
        t.requeue_direct(seq);
        t.send_return(tok);
        t.sys_enter(false);
        t.sys_return_direct();
        let tok = t.send_enter(64);
        t.enqueue();
        t.send_return(tok);
        disable();
        let ev: Vec<Event> = events().into_iter().filter(|e| e.ep == t.id).collect();
        let calls: Vec<(u64, u64, bool)> = ev
            .iter()
            .filter(|e| e.kind == Kind::SendCall as u8)
            .map(|e| {
                let (q, _, direct) = unpack_send_ref(e.b);
                (e.extra, q, direct)
            })
            .collect();
        assert_eq!(seq, Some(0));
        assert_eq!(calls, [(0, 0, false), (1, 1, false)]);
        assert!(!ev.iter().any(|e| e.kind == Kind::KMsg as u8 || e.kind == Kind::SysReturn as u8), "{ev:?}");
    }

    /// A sending thread reads the stamps once STAMP_READ_MESSAGES kernel
    /// messages are waiting, and a read (by any thread) starts the count
    /// again.
    #[test]
    fn stamps_are_read_every_sixteen_kernel_messages() {
        let _switch = test_switch();
        enable();
        let t = EpTrace::new();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        for round in 0..2 {
            for i in 1..=STAMP_READ_MESSAGES {
                t.sys_enter(true);
                t.sys_return_direct();
                assert_eq!(t.drain_due(), i == STAMP_READ_MESSAGES, "round {round}, message {i}");
            }
            t.drain_tx(fd);
            assert!(!t.drain_due());
        }
        // A batched send counts each message it accepted.
        t.take(40);
        t.sys_enter(true);
        t.sys_return_batch(&mut (0..STAMP_READ_MESSAGES as usize).map(|i| (i * 2, 2, true)));
        assert!(t.drain_due());
        t.drain_tx(fd);
        // A small receive buffer holds the stamps of fewer messages: they
        // are read sooner, down to after every message.
        for (rcvbuf, every) in [(212_992, STAMP_READ_MESSAGES), (16_384, 4), (4_608, 1), (0, 1)] {
            t.fit_stamps_to(rcvbuf);
            for i in 1..=every {
                t.sys_enter(true);
                t.sys_return_direct();
                assert_eq!(t.drain_due(), i == every, "rcvbuf {rcvbuf}, message {i}");
            }
            t.drain_tx(fd);
        }
        disable();
    }

    #[test]
    fn kernel_messages_share_the_return_stamp() {
        let _switch = test_switch();
        enable();
        let t = EpTrace::new();
        t.take(10);
        t.sys_enter(true);
        t.sys_return_batch(&mut [(0usize, 4usize, true), (4, 4, true), (8, 2, true)].into_iter());
        disable();
        let ev: Vec<Event> = events().into_iter().filter(|e| e.ep == t.id).collect();
        let ret: Vec<&Event> = ev.iter().filter(|e| e.kind == Kind::SysReturn as u8).collect();
        let msgs: Vec<&Event> = ev.iter().filter(|e| e.kind == Kind::KMsg as u8).collect();
        assert_eq!((ret.len(), ret[0].a, ret[0].b), (1, 0, 3));
        assert_eq!(
            msgs.iter().map(|e| (e.a, unpack_msg_ref(e.b))).collect::<Vec<_>>(),
            [(0, (0, 4, false)), (1, (4, 4, false)), (2, (8, 2, false))]
        );
        // One clock read serves the return and its messages.
        assert!(msgs.iter().all(|e| e.ts_ns == ret[0].ts_ns), "{ev:?}");
        let enter = ev.iter().find(|e| e.kind == Kind::SysEnter as u8).unwrap();
        assert!(enter.ts_ns <= ret[0].ts_ns);
    }

    #[test]
    fn a_full_buffer_keeps_its_events_and_counts_drops() {
        // Smaller than the prefetch distance: no prefetch may reach past
        // the end, and the events written must be intact.
        let cap = PREFETCH_AHEAD / 2 + 1;
        let buf =
            ThreadBuf { thread: 0, words: (0..cap * 4).map(|_| AtomicU64::new(0)).collect(), len: AtomicUsize::new(0) };
        let d0 = dropped();
        for i in 0..cap as u64 + 3 {
            push_into(&buf, word1(Kind::Take, 7, false, 0), 100 + i, i, 2 * i);
        }
        assert_eq!(buf.len.load(Acquire), cap);
        assert!(dropped() >= d0 + 3);
        for i in 0..cap {
            let w: Vec<u64> = buf.words[i * 4..i * 4 + 4].iter().map(|w| w.load(Relaxed)).collect();
            assert_eq!(w, [100 + i as u64, word1(Kind::Take, 7, false, 0), i as u64, 2 * i as u64]);
        }
    }

    #[test]
    fn clocks_agree() {
        let off = realtime_to_raw_offset();
        let raw = now_ns() as i64;
        let real = clock::realtime_ns() as i64;
        assert!((real + off - raw).abs() < 1_000_000, "offset {off}");
    }
}

mod cost {
    use super::*;

    /// Cost of one traced application call (enter + return event) and of
    /// one clock read, printed; run with `--release --nocapture` to
    /// measure. Each figure is the best of 20 rounds (the machine may be
    /// shared: a round that was preempted says nothing about the code).
    #[test]
    fn traced_call_cost() {
        let _switch = test_switch();
        enable();
        // Room for all 400 000 events (a full buffer's drop path is another cost).
        set_capacity(1 << 20);
        prepare_thread();
        let t = EpTrace::new();
        let best = |f: &mut dyn FnMut()| {
            let n = 10_000u64;
            (0..20)
                .map(|_| {
                    let t0 = now_ns();
                    for _ in 0..n {
                        f();
                    }
                    (now_ns() - t0) as f64 / n as f64
                })
                .fold(f64::MAX, f64::min)
        };
        let per = best(&mut || {
            let tok = t.send_enter(64);
            t.enqueue();
            t.send_return(tok);
        });
        let per_rx = best(&mut || {
            let e = t.recv_enter();
            t.pop();
            t.recv_return(e);
        });
        let mut x = 0u64;
        let per_clock = best(&mut || x = x.wrapping_add(stamp().0));
        eprintln!(
            "traced send call {per:.1} ns, traced recv call {per_rx:.1} ns, one clock read {per_clock:.1} ns ({x:x})"
        );
        assert!(per < 10_000.0);
    }

    /// What prefetching the event buffer buys on a send-like hot path:
    /// per iteration one 32-byte event, a 1472-byte copy into one of 64
    /// slots and a lock/unlock (a locked instruction waits for the
    /// event's store). The buffers (32 MB each) stream through memory as a
    /// long trace does. Best of 7 rounds each, alternated; printed with
    /// `--release --nocapture`.
    #[test]
    fn event_prefetch_cost() {
        let cap = 1 << 20;
        let words = || -> Box<[AtomicU64]> { (0..cap * 4).map(|_| AtomicU64::new(0)).collect() };
        let bufs = [
            ThreadBuf { thread: 0, words: words(), len: AtomicUsize::new(0) },
            ThreadBuf { thread: 0, words: words(), len: AtomicUsize::new(0) },
        ];
        let slots = Mutex::new(vec![[0u8; 1472]; 64]);
        let data = [7u8; 1472];
        let n = cap / 8;
        let round = |buf: &ThreadBuf, prefetch: bool| {
            let t0 = now_ns();
            for i in 0..n {
                if prefetch {
                    push_into(buf, 1, i as u64, 2, 3);
                } else {
                    // push_into's stores without its prefetch.
                    let k = buf.len.load(Relaxed);
                    let w = &buf.words[k * 4..k * 4 + 4];
                    for (x, v) in w.iter().zip([i as u64, 1, 2, 3]) {
                        x.store(v, Relaxed);
                    }
                    buf.len.store(k + 1, Release);
                }
                slots.lock().unwrap()[i % 64].copy_from_slice(&data);
            }
            (now_ns() - t0) as f64 / n as f64
        };
        let (mut with, mut without) = (f64::MAX, f64::MAX);
        for r in 0..7 {
            // Each round writes a fresh stretch of each buffer.
            with = with.min(round(&bufs[0], true));
            without = without.min(round(&bufs[1], false));
            assert_eq!(bufs[0].len.load(Relaxed), (r + 1) * n);
        }
        eprintln!("event + 1472 B copy + lock: {with:.1} ns with prefetch, {without:.1} ns without");
        assert!(bufs[0].words[4 * (7 * n - 1)].load(Relaxed) == (n - 1) as u64);
    }

    fn thread_cpu_ns() -> u64 {
        clock::thread_cpu_time().as_nanos() as u64
    }

    #[test]
    fn rx_stamping_is_on_once_held() {
        // The kernel turns RX stamping on asynchronously; once this returns
        // true, a fresh stamped socket gets a stamp on its first datagram.
        assert!(timestamp::hold_rx_timestamps(std::time::Duration::from_secs(5)));
        assert!(timestamp::hold_rx_timestamps(std::time::Duration::ZERO));
    }

    /// What reading the error queue less often saves the sending thread:
    /// one-datagram stamped loopback sends, the stamps read back after
    /// every `k` sends, for several `k`, alternated, best of 7 rounds;
    /// printed with `--release --nocapture`.
    #[test]
    fn stamp_read_batching_cost() {
        use crate::backend::kernel::UdpSocket;
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = UdpSocket::new(false).unwrap();
        s.set_option(libc::SOL_SOCKET, timestamp::SO_TIMESTAMPING, TX_STAMP_FLAGS).unwrap();
        s.connect(&sink.local_addr().unwrap()).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
        let n = 4096u64;
        let ks = [1u64, 2, 8, 32];
        let mut best = [f64::MAX; 4];
        let mut read = 0usize;
        for _ in 0..7 {
            for (j, &k) in ks.iter().enumerate() {
                let c0 = thread_cpu_ns();
                for i in 0..n {
                    s.send_to(&[1u8; 64], None).unwrap();
                    if i % k == k - 1 {
                        read += timestamp::read_tx_timestamps(fd, &mut |_, _, _| {});
                    }
                }
                best[j] = best[j].min((thread_cpu_ns() - c0) as f64 / n as f64);
            }
        }
        eprintln!(
            "stamped one-datagram send + reads after every k sends: {:?} ns for k = {ks:?}",
            best.map(|x| x.round())
        );
        assert_eq!(read as u64, 2 * 7 * n * ks.len() as u64);
    }

    /// What one kernel TX timestamp costs the sending thread: one-datagram
    /// sends on loopback with and without `SO_TIMESTAMPING` (TX_SCHED and
    /// TX_SOFTWARE, two stamps per send, read back 64 at a time as the
    /// engine does), alternated, best of 7 rounds each; printed with
    /// `--release --nocapture`.
    #[test]
    fn kernel_stamp_cost() {
        use crate::backend::kernel::UdpSocket;
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = sink.local_addr().unwrap();
        let socket = |stamped: bool| {
            let s = UdpSocket::new(false).unwrap();
            if stamped {
                s.set_option(libc::SOL_SOCKET, timestamp::SO_TIMESTAMPING, TX_STAMP_FLAGS).unwrap();
            }
            s.connect(&dst).unwrap();
            s
        };
        let (plain, stamped) = (socket(false), socket(true));
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stamped);
        let n = 4096u64;
        let mut read = 0;
        let mut sent = 0u64;
        let mut round = |s: &UdpSocket, drain: bool, read: &mut usize| {
            let c0 = thread_cpu_ns();
            for i in 0..n {
                sent += u64::from(s.send_to(&[1u8; 64], None).is_ok());
                if drain && i % 64 == 63 {
                    *read += timestamp::read_tx_timestamps(fd, &mut |_, _, _| {});
                }
            }
            if drain {
                *read += timestamp::read_tx_timestamps(fd, &mut |_, _, _| {});
            }
            (thread_cpu_ns() - c0) as f64 / n as f64
        };
        let (mut a, mut b) = (f64::MAX, f64::MAX);
        for _ in 0..7 {
            a = a.min(round(&plain, false, &mut read));
            b = b.min(round(&stamped, true, &mut read));
        }
        eprintln!(
            "one-datagram send: {a:.0} ns plain, {b:.0} ns with TX stamps read back: {:.0} ns per stamp",
            (b - a) / 2.0
        );
        // Every send went out and was stamped twice (else this measured nothing).
        assert_eq!(sent, 2 * 7 * n);
        assert_eq!(read as u64, 2 * 7 * n);
    }
}

mod sampling {
    use super::*;

    /// One datagram in n, in runs of SAMPLE_RUN: the hot path's rule (mask
    /// or division) and the readers' agree, and the share is 1/n.
    #[test]
    fn runs_of_sample_run_one_in_n_and_both_rules_agree() {
        let _g = test_switch();
        for n in [1u64, 2, 3, 16, 64, 100, 256] {
            set_sample(n);
            let span = SAMPLE_RUN * n * 4;
            let picked: Vec<u64> = (0..span).filter(|&i| sampled(i)).collect();
            assert!(picked.iter().all(|&i| is_sampled(i, n)), "n {n}");
            assert_eq!(picked.len() as u64, span / n, "n {n}");
            assert!(picked.iter().enumerate().all(|(k, &i)| nth_sampled(k as u64, n) == i), "n {n}");
            if n > 1 {
                assert_eq!(&picked[..SAMPLE_RUN as usize], (0..SAMPLE_RUN).collect::<Vec<_>>(), "n {n}");
                assert!(!sampled(SAMPLE_RUN) && sampled(SAMPLE_RUN * n));
            }
        }
        set_sample(1);
    }
}
