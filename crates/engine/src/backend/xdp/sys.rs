#![allow(unsafe_code)] // The documented home of the xdp backend's unsafe code.
//! Every `unsafe` line and raw system call of the `xdp` backend: the
//! `bpf(2)` calls that load the redirect program and its maps and attach
//! it to an interface, the AF_XDP socket with its UMEM and four rings, and
//! the interface queries (index, MAC, MTU, IPv4 addresses).
//!
//! No libbpf: the XDP program is a handful of hand-assembled instructions
//! (see [`load_redirect_prog`]), so nothing has to be compiled at build
//! time and no BPF toolchain is needed on the host.

use crate::fdspace::{new_private, Private};
use crate::sys::cvt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Takes a fresh descriptor returned by a system call into the engine's
/// descriptor space.
fn own(make: impl FnOnce() -> io::Result<libc::c_long>) -> io::Result<Private<OwnedFd>> {
    new_private(|| {
        let fd = make()?;
        // SAFETY: the call just returned this descriptor; nobody else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    })
}

// --- bpf(2) ------------------------------------------------------------

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const XDP_PASS: i32 = 2;
/// Bytes the kernel leaves before a received frame in its UMEM frame
/// (`XDP_PACKET_HEADROOM`; the UMEM's own headroom is 0).
pub const RX_HEADROOM: usize = 256;
/// `XDP_FLAGS_SKB_MODE`: the generic hook, which every device has.
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: the driver's own hook (veth has one).
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// `union bpf_attr`, as the 144 bytes the kernel reads; each command's
/// fields are written at their offsets (checked against linux/bpf.h).
#[repr(C, align(8))]
struct BpfAttr([u8; 144]);

impl BpfAttr {
    fn new() -> Self {
        BpfAttr([0; 144])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(&mut self, off: usize, name: &str) -> &mut Self {
        let n = name.len().min(15);
        self.0[off..off + n].copy_from_slice(&name.as_bytes()[..n]);
        self
    }
}

fn bpf(cmd: libc::c_long, attr: &mut BpfAttr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, fully initialised 144-byte bpf_attr; the
    // pointers written into it (instructions, keys, values, log) point to
    // memory the caller keeps alive across this call.
    cvt(unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut BpfAttr, std::mem::size_of::<BpfAttr>()) })
}

/// A BPF map owned by this process.
#[derive(Debug)]
pub struct Map {
    fd: Private<OwnedFd>,
    key_size: usize,
    value_size: usize,
}

impl Map {
    fn create(kind: u32, key_size: u32, value_size: u32, max_entries: u32, name: &str) -> io::Result<Map> {
        let mut a = BpfAttr::new();
        a.u32(0, kind).u32(4, key_size).u32(8, value_size).u32(12, max_entries).name(28, name);
        let fd = own(|| bpf(BPF_MAP_CREATE, &mut a))?;
        Ok(Map { fd, key_size: key_size as usize, value_size: value_size as usize })
    }

    /// An XSKMAP with one slot per receive queue.
    pub fn xsk(queues: u32) -> io::Result<Map> {
        Map::create(BPF_MAP_TYPE_XSKMAP, 4, 4, queues, "eudp_xsks")
    }

    /// A hash of 8-byte keys to 4-byte values holding at most `entries`.
    pub fn hash8(entries: u32, name: &str) -> io::Result<Map> {
        Map::create(BPF_MAP_TYPE_HASH, 8, 4, entries, name)
    }

    /// Inserts or replaces `key` → `value`.
    pub fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        assert!(key.len() == self.key_size && value.len() == self.value_size, "bpf map: wrong key or value size");
        let mut a = BpfAttr::new();
        a.u32(0, self.fd.as_raw_fd() as u32).u64(8, key.as_ptr() as u64).u64(16, value.as_ptr() as u64).u64(24, 0);
        bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
    }

    /// Removes `key`; a missing key is not an error.
    pub fn delete(&self, key: &[u8]) -> io::Result<()> {
        assert!(key.len() == self.key_size, "bpf map: wrong key size");
        let mut a = BpfAttr::new();
        a.u32(0, self.fd.as_raw_fd() as u32).u64(8, key.as_ptr() as u64);
        match bpf(BPF_MAP_DELETE_ELEM, &mut a) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map(drop),
        }
    }

    fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy)]
#[repr(C)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (src << 4) | dst, off, imm }
}
// Opcode parts (linux/bpf_common.h, linux/bpf.h).
const LDX_MEM: u8 = 0x61; // BPF_LDX | BPF_MEM, with a size below
const W: u8 = 0x00;
const H: u8 = 0x08;
const B: u8 = 0x10;
const ALU64_MOV_K: u8 = 0xb7;
const ALU64_MOV_X: u8 = 0xbf;
const ALU64_ADD_K: u8 = 0x07;
const ALU64_AND_K: u8 = 0x57;
const STX_MEM_W: u8 = 0x63;
const ST_MEM_W: u8 = 0x62;
const JMP_JGT_X: u8 = 0x2d;
const JMP_JLT_X: u8 = 0xad;
const JMP_JNE_K: u8 = 0x55;
const JMP_JEQ_K: u8 = 0x15;
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;

/// Loads the redirect program: an IPv4 frame (header without options, not a
/// fragment) carrying UDP to an address in `ports` goes to the AF_XDP
/// socket of its receive queue in `xsks`; everything else (ARP, ICMP,
/// IPv6, broadcast, other ports, IP options, fragments) passes to the
/// kernel stack. So does a frame longer than `max_frame`, what one UMEM
/// frame holds after the kernel's headroom: the socket would drop it.
/// The key is `[dst IPv4 address, dst port, 0, 0]` as on the wire, looked
/// up first exactly and then, for a unicast frame only, with the address 0
/// (a wildcard bind). A broadcast or multicast frame is redirected only by
/// an exact key: a `{group, port}` the transport holds alone
/// (`group.rs`); the kernel decides who gets every other one.
///
/// In C terms:
/// ```text
/// if (data + 42 > data_end || data + max_frame < data_end
///     || eth.type != htons(0x0800) || ip.ver_ihl != 0x45
///     || ip.proto != 17 || (ip.frag_off & htons(0x3fff))) return XDP_PASS;
/// group = eth.dst[0] & 1;
/// key = { ip.daddr, udp.dest, 0 };
/// if (!lookup(ports, &key)) {
///     if (group) return XDP_PASS;
///     key.addr = 0; if (!lookup(ports, &key)) return XDP_PASS;
/// }
/// return bpf_redirect_map(xsks, ctx->rx_queue_index, XDP_PASS);
/// ```
pub fn load_redirect_prog(xsks: &Map, ports: &Map, max_frame: u32) -> io::Result<Private<OwnedFd>> {
    let be16 = |v: u16| i32::from(u16::from_ne_bytes(v.to_be_bytes()));
    let (xsks, ports) = (xsks.raw(), ports.raw());
    const PASS: i16 = 45;
    const REDIRECT: i16 = 39;
    // A jump at `pc` to `to`: offsets count from the next instruction.
    let j = |pc: i16, to: i16| to - pc - 1;
    let max_frame = max_frame as i32;
    #[rustfmt::skip]
    let prog = [
        /*  0 */ insn(ALU64_MOV_X, 6, 1, 0, 0),              // r6 = ctx (kept across calls)
        /*  1 */ insn(LDX_MEM | W, 2, 1, 0, 0),              // r2 = data
        /*  2 */ insn(LDX_MEM | W, 3, 1, 4, 0),              // r3 = data_end
        /*  3 */ insn(ALU64_MOV_X, 4, 2, 0, 0),
        /*  4 */ insn(ALU64_ADD_K, 4, 0, 0, 42),
        /*  5 */ insn(JMP_JGT_X, 4, 3, j(5, PASS), 0),       // shorter than eth+ip+udp
        /*  6 */ insn(ALU64_MOV_X, 4, 2, 0, 0),
        /*  7 */ insn(ALU64_ADD_K, 4, 0, 0, max_frame),
        /*  8 */ insn(JMP_JLT_X, 4, 3, j(8, PASS), 0),       // longer than a UMEM frame holds
        /*  9 */ insn(LDX_MEM | B, 5, 2, 0, 0),
        /* 10 */ insn(ALU64_AND_K, 5, 0, 0, 1),
        /* 11 */ insn(ALU64_MOV_X, 7, 5, 0, 0),             // r7 = broadcast or multicast (kept across calls)
        /* 12 */ insn(LDX_MEM | H, 5, 2, 12, 0),
        /* 13 */ insn(JMP_JNE_K, 5, 0, j(13, PASS), be16(0x0800)),
        /* 14 */ insn(LDX_MEM | B, 5, 2, 14, 0),
        /* 15 */ insn(JMP_JNE_K, 5, 0, j(15, PASS), 0x45),   // IPv4, no options
        /* 16 */ insn(LDX_MEM | B, 5, 2, 23, 0),
        /* 17 */ insn(JMP_JNE_K, 5, 0, j(17, PASS), 17),     // UDP
        /* 18 */ insn(LDX_MEM | H, 5, 2, 20, 0),
        /* 19 */ insn(ALU64_AND_K, 5, 0, 0, be16(0x3fff)),
        /* 20 */ insn(JMP_JNE_K, 5, 0, j(20, PASS), 0),      // a fragment
        /* 21 */ insn(LDX_MEM | W, 5, 2, 30, 0),             // key.addr = daddr
        /* 22 */ insn(STX_MEM_W, 10, 5, -8, 0),
        /* 23 */ insn(LDX_MEM | H, 5, 2, 36, 0),             // key.port = dest
        /* 24 */ insn(STX_MEM_W, 10, 5, -4, 0),
        /* 25 */ insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, ports),
        /* 26 */ insn(0, 0, 0, 0, 0),
        /* 27 */ insn(ALU64_MOV_X, 2, 10, 0, 0),
        /* 28 */ insn(ALU64_ADD_K, 2, 0, 0, -8),
        /* 29 */ insn(CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM),
        /* 30 */ insn(JMP_JNE_K, 0, 0, j(30, REDIRECT), 0),
        /* 31 */ insn(JMP_JNE_K, 7, 0, j(31, PASS), 0),      // a group: its exact key only
        /* 32 */ insn(ST_MEM_W, 10, 0, -8, 0),               // key.addr = 0 (wildcard)
        /* 33 */ insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, ports),
        /* 34 */ insn(0, 0, 0, 0, 0),
        /* 35 */ insn(ALU64_MOV_X, 2, 10, 0, 0),
        /* 36 */ insn(ALU64_ADD_K, 2, 0, 0, -8),
        /* 37 */ insn(CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM),
        /* 38 */ insn(JMP_JEQ_K, 0, 0, j(38, PASS), 0),
        /* 39 */ insn(LDX_MEM | W, 2, 6, 16, 0),             // redirect: r2 = rx_queue_index
        /* 40 */ insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, xsks),
        /* 41 */ insn(0, 0, 0, 0, 0),
        /* 42 */ insn(ALU64_MOV_K, 3, 0, 0, XDP_PASS),       // no socket on that queue: pass
        /* 43 */ insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        /* 44 */ insn(EXIT, 0, 0, 0, 0),
        /* 45 */ insn(ALU64_MOV_K, 0, 0, 0, XDP_PASS),       // pass
        /* 46 */ insn(EXIT, 0, 0, 0, 0),
    ];
    load_xdp(&prog, "eudp_xdp")
}

fn load_xdp(prog: &[Insn], name: &str) -> io::Result<Private<OwnedFd>> {
    let license = c"GPL";
    let mut a = BpfAttr::new();
    a.u32(0, BPF_PROG_TYPE_XDP)
        .u32(4, prog.len() as u32)
        .u64(8, prog.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .name(48, name)
        .u32(68, BPF_XDP);
    match own(|| bpf(BPF_PROG_LOAD, &mut a)) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            // Once more with the verifier's log, for the error message.
            let mut log = vec![0u8; 16 * 1024];
            a.u32(24, 1).u32(28, log.len() as u32).u64(32, log.as_mut_ptr() as u64);
            let _ = own(|| bpf(BPF_PROG_LOAD, &mut a));
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: String =
                text.lines().rev().take(6).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
            Err(io::Error::new(e.kind(), format!("loading the XDP program: {e}; verifier: {tail}")))
        }
    }
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs `prog` once in the kernel over `frame` (`BPF_PROG_TEST_RUN`, as if it
/// arrived on queue 0 of this namespace's loopback device) and returns its
/// verdict (`XDP_PASS` = 2, `XDP_REDIRECT` = 4, ...). Nothing is sent: a
/// redirect is only decided. `frame` must hold at least an Ethernet header.
pub fn test_run_xdp(prog: &Private<OwnedFd>, frame: &[u8]) -> io::Result<u32> {
    let mut out = vec![0u8; frame.len() + 256];
    let mut a = BpfAttr::new();
    a.u32(0, prog.as_raw_fd() as u32)
        .u32(8, frame.len() as u32)
        .u32(12, out.len() as u32)
        .u64(16, frame.as_ptr() as u64)
        .u64(24, out.as_mut_ptr() as u64)
        .u32(32, 1);
    bpf(BPF_PROG_TEST_RUN, &mut a)?;
    Ok(u32::from_ne_bytes(a.0[4..8].try_into().expect("four bytes")))
}

/// Attaches `prog` to interface `ifindex` with a bpf_link (`flags`:
/// [`XDP_FLAGS_DRV_MODE`] or [`XDP_FLAGS_SKB_MODE`]). The program stays
/// attached while the returned descriptor is open, and no longer: a
/// process that ends, however it ends, leaves the interface as it was.
pub fn attach_xdp(prog: &Private<OwnedFd>, ifindex: u32, flags: u32) -> io::Result<Private<OwnedFd>> {
    let mut a = BpfAttr::new();
    a.u32(0, prog.as_raw_fd() as u32).u32(4, ifindex).u32(8, BPF_XDP).u32(12, flags);
    own(|| bpf(BPF_LINK_CREATE, &mut a))
}

// --- AF_XDP socket ------------------------------------------------------

/// One mmapped AF_XDP ring: producer and consumer indices shared with the
/// kernel, and `size` descriptors of type `T` (`u64` frame addresses for
/// the fill and completion rings, `xdp_desc` for RX and TX).
pub struct Ring<T: Copy> {
    map: NonNull<u8>,
    map_len: usize,
    prod: NonNull<AtomicU32>,
    cons: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    desc: NonNull<T>,
    mask: u32,
    /// Our cached copy of the index we own (producer or consumer).
    mine: u32,
}

// SAFETY: the mapping is owned by the ring and only touched through
// `&mut self` or atomics; callers serialise access with a lock.
unsafe impl<T: Copy> Send for Ring<T> {}

impl<T: Copy> std::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("size", &(self.mask + 1)).finish()
    }
}

impl<T: Copy> Ring<T> {
    fn map(fd: RawFd, off: &libc::xdp_ring_offset, pgoff: u64, size: u32, producer: bool) -> io::Result<Ring<T>> {
        let map_len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: maps the ring the kernel created for this socket at the
        // documented page offset; checked for failure below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p as *mut u8;
        // SAFETY: the kernel's offsets lie within the mapping it sized.
        let at = |o: u64| unsafe { NonNull::new_unchecked(base.add(o as usize)) };
        let mut r = Ring {
            map: at(0),
            map_len,
            prod: at(off.producer).cast(),
            cons: at(off.consumer).cast(),
            flags: at(off.flags).cast(),
            desc: at(off.desc).cast(),
            mask: size - 1,
            mine: 0,
        };
        r.mine = if producer { r.prod().load(Ordering::Relaxed) } else { r.cons().load(Ordering::Relaxed) };
        Ok(r)
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping, 4-byte aligned by the kernel.
        unsafe { self.prod.as_ref() }
    }
    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as for `prod`.
        unsafe { self.cons.as_ref() }
    }

    /// Whether the kernel asks to be woken for this ring
    /// (`XDP_RING_NEED_WAKEUP`).
    pub fn needs_wakeup(&self) -> bool {
        // SAFETY: as for `prod`.
        unsafe { self.flags.as_ref() }.load(Ordering::Acquire) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Entries the ring holds.
    pub fn size(&self) -> u32 {
        self.mask + 1
    }

    /// Producer side: free slots.
    pub fn free(&self) -> u32 {
        (self.mask + 1) - self.mine.wrapping_sub(self.cons().load(Ordering::Acquire))
    }

    /// Producer side: writes `v` into the next slot (the caller checked
    /// [`Ring::free`]); visible to the kernel after [`Ring::publish`].
    pub fn push(&mut self, v: T) {
        // SAFETY: index masked into the ring's `size` descriptors.
        unsafe { self.desc.as_ptr().add((self.mine & self.mask) as usize).write(v) };
        self.mine = self.mine.wrapping_add(1);
    }

    /// Producer side: hands the pushed slots to the kernel.
    pub fn publish(&self) {
        self.prod().store(self.mine, Ordering::Release);
    }

    /// Consumer side: entries ready to read.
    pub fn ready(&self) -> u32 {
        self.prod().load(Ordering::Acquire).wrapping_sub(self.mine)
    }

    /// Consumer side: the next entry (the caller checked [`Ring::ready`]).
    pub fn take(&mut self) -> T {
        // SAFETY: index masked into the ring; the kernel published it.
        let v = unsafe { self.desc.as_ptr().add((self.mine & self.mask) as usize).read() };
        self.mine = self.mine.wrapping_add(1);
        v
    }

    /// Consumer side: gives the taken slots back to the kernel.
    pub fn release(&self) {
        self.cons().store(self.mine, Ordering::Release);
    }
}

impl<T: Copy> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `Ring::map`.
        unsafe { libc::munmap(self.map.as_ptr() as *mut libc::c_void, self.map_len) };
    }
}

/// The UMEM: one anonymous mapping of `frames` frames of `frame_size`
/// bytes, registered with the socket; frames are named by their offset.
pub struct Umem {
    base: NonNull<u8>,
    len: usize,
    pub frame_size: usize,
}

// SAFETY: plain memory; which thread may touch which frame is decided by
// the rings' ownership protocol (a frame is ours while it is in no ring).
unsafe impl Send for Umem {}
unsafe impl Sync for Umem {}

impl std::fmt::Debug for Umem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Umem").field("len", &self.len).field("frame_size", &self.frame_size).finish()
    }
}

impl Umem {
    fn new(frames: usize, frame_size: usize) -> io::Result<Umem> {
        let len = frames * frame_size;
        // SAFETY: a fresh private anonymous mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: mmap succeeded, so `p` is non-null.
        Ok(Umem { base: unsafe { NonNull::new_unchecked(p as *mut u8) }, len, frame_size })
    }

    /// The bytes `addr .. addr + len` of the UMEM. The caller owns that
    /// frame (it is in none of the rings).
    pub fn frame(&self, addr: u64, len: usize) -> &[u8] {
        assert!(addr as usize + len <= self.len, "umem: frame out of range");
        // SAFETY: in bounds (checked); the frame is not being written by
        // the kernel while it is out of the rings.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(addr as usize), len) }
    }

    /// A frame to write, `frame_size` bytes from `addr`.
    #[allow(clippy::mut_from_ref)] // frames are disjoint; ownership follows the rings
    pub fn frame_mut(&self, addr: u64) -> &mut [u8] {
        assert!(addr as usize + self.frame_size <= self.len, "umem: frame out of range");
        // SAFETY: in bounds; the caller holds this frame exclusively (taken
        // from the free list, not in any ring), so no other reference exists.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(addr as usize), self.frame_size) }
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `Umem::new`. The kernel
        // pins the registered pages, so this is safe even before the socket
        // that registered them closes (`Xsk` closes it first anyway).
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// An AF_XDP socket bound to one queue of one interface, and its UMEM.
/// Its four rings are handed out separately ([`XskRings`]) so that the
/// receive and transmit sides can be locked apart.
#[derive(Debug)]
pub struct Xsk {
    fd: Private<OwnedFd>,
    umem: Umem,
}

/// The rings of an [`Xsk`]: fill and RX (receive), TX and completion
/// (transmit).
#[derive(Debug)]
pub struct XskRings {
    pub fill: Ring<u64>,
    pub completion: Ring<u64>,
    pub rx: Ring<libc::xdp_desc>,
    pub tx: Ring<libc::xdp_desc>,
}

fn setsockopt<T>(fd: RawFd, name: i32, v: &T) -> io::Result<()> {
    // SAFETY: passes a live `T` of its own size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            name,
            v as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    cvt(r as libc::c_long).map(drop)
}

impl Xsk {
    /// Creates the socket, its UMEM of `frames` frames and four rings of
    /// `ring` entries each (a power of two), and binds it to queue `queue`
    /// of `ifindex` in copy mode.
    pub fn open(ifindex: u32, queue: u32, frames: usize, frame_size: usize, ring: u32) -> io::Result<(Xsk, XskRings)> {
        assert!(ring.is_power_of_two(), "xsk: ring size must be a power of two");
        // SAFETY: plain syscall; the descriptor is owned at once.
        let fd =
            own(|| cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) } as libc::c_long))?;
        let raw = fd.as_raw_fd();
        let umem = Umem::new(frames, frame_size)?;
        let reg = libc::xdp_umem_reg {
            addr: umem.base.as_ptr() as u64,
            len: umem.len as u64,
            chunk_size: frame_size as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(raw, libc::XDP_UMEM_REG, &reg)?;
        for name in [libc::XDP_UMEM_FILL_RING, libc::XDP_UMEM_COMPLETION_RING, libc::XDP_RX_RING, libc::XDP_TX_RING] {
            setsockopt(raw, name, &(ring as i32))?;
        }
        // SAFETY: all-zero is a valid xdp_mmap_offsets.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `off`.
        let r = unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                &mut off as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        cvt(r as libc::c_long)?;
        if len as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "AF_XDP: kernel too old (no ring flags)"));
        }
        let fill = Ring::map(raw, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING, ring, true)?;
        let completion = Ring::map(raw, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING, ring, false)?;
        let rx = Ring::map(raw, &off.rx, libc::XDP_PGOFF_RX_RING as u64, ring, false)?;
        let tx = Ring::map(raw, &off.tx, libc::XDP_PGOFF_TX_RING as u64, ring, true)?;
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            // With need_wakeup the kernel says (in the rings' flags) when a
            // ring needs a system call to move; a driver that processes TX
            // on its own then takes frames without a kick.
            sxdp_flags: libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // A socket that just closed on this queue is released asynchronously:
        // retry EBUSY briefly.
        let mut tries = 0;
        loop {
            // SAFETY: binds to a live sockaddr_xdp of its own size.
            let r = unsafe {
                libc::bind(
                    raw,
                    &addr as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            match cvt(r as libc::c_long) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 20 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(25));
                }
                Err(e) => return Err(e),
            }
        }
        Ok((Xsk { fd, umem }, XskRings { fill, completion, rx, tx }))
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn umem(&self) -> &Umem {
        &self.umem
    }

    /// Asks the kernel to transmit what the TX ring holds (copy mode sends
    /// synchronously, a bounded batch per call). `Ok(false)`: it stopped
    /// early (`EAGAIN`/`EBUSY`/`ENOBUFS`) and more may be left.
    pub fn kick_tx(&self) -> io::Result<bool> {
        // SAFETY: a zero-length send with no buffer or address.
        let r =
            unsafe { libc::sendto(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
        if r >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => Ok(false),
            _ => Err(e),
        }
    }

    /// Wakes the receive side when the fill ring asks for it
    /// (`XDP_RING_NEED_WAKEUP`): a zero-length nonblocking `recvfrom`.
    pub fn wake_rx(&self) {
        // SAFETY: a zero-length receive with no buffer or address.
        unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }

    /// Kernel drop counters (`XDP_STATISTICS`): frames dropped for want of
    /// RX ring room or fill-ring frames, and invalid descriptors.
    pub fn statistics(&self) -> io::Result<libc::xdp_statistics> {
        // SAFETY: all-zero is a valid xdp_statistics.
        let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `st`.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                &mut st as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        cvt(r as libc::c_long).map(|_| st)
    }
}

/// Inserts the socket into slot `queue` of an XSKMAP.
pub fn xskmap_set(map: &Map, queue: u32, xsk: &Xsk) -> io::Result<()> {
    map.update(&queue.to_ne_bytes(), &(xsk.raw_fd() as u32).to_ne_bytes())
}

// --- interfaces ---------------------------------------------------------

/// What the backend needs to know of an interface.
#[derive(Debug, Clone)]
pub struct IfaceInfo {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// IPv4 addresses with their prefix lengths.
    pub v4: Vec<(Ipv4Addr, u8)>,
}

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: all-zero is a valid ifreq.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= r.ifr_name.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name {name:?}")));
    }
    for (d, s) in r.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(r)
}

/// Index, MAC, MTU and IPv4 addresses of interface `name` in this thread's
/// network namespace.
pub fn iface_info(name: &str) -> io::Result<IfaceInfo> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name with NUL"))?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface {name:?}: {}", io::Error::last_os_error()),
        ));
    }
    // SAFETY: plain syscall; closed by OwnedFd.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) } as libc::c_long)?;
    // SAFETY: fresh descriptor.
    let s = unsafe { OwnedFd::from_raw_fd(s as RawFd) };
    let mut r = ifreq(name)?;
    // SAFETY: SIOCGIFHWADDR fills the ifreq's union.
    cvt(unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFHWADDR, &mut r) } as libc::c_long)?;
    let mut mac = [0u8; 6];
    // SAFETY: the union holds a sockaddr after SIOCGIFHWADDR.
    let hw = unsafe { r.ifr_ifru.ifru_hwaddr };
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    let mut r = ifreq(name)?;
    // SAFETY: SIOCGIFMTU fills the union's int.
    cvt(unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFMTU, &mut r) } as libc::c_long)?;
    // SAFETY: the union holds the MTU after SIOCGIFMTU.
    let mtu = unsafe { r.ifr_ifru.ifru_mtu } as u32;
    Ok(IfaceInfo { name: name.to_string(), index, mac, mtu, v4: ipv4_addrs(name)? })
}

/// Calls `f` with (name, flags, IPv4 address, prefix length) for every
/// IPv4 address of every interface.
fn each_ipv4_addr(mut f: impl FnMut(&str, u32, Ipv4Addr, u8)) -> io::Result<()> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list freed below.
    cvt(unsafe { libc::getifaddrs(&mut head) } as libc::c_long)?;
    let mut p = head;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freed.
        let a = unsafe { &*p };
        p = a.ifa_next;
        if a.ifa_addr.is_null() || a.ifa_netmask.is_null() || a.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a sockaddr from getifaddrs; read as sockaddr_in only for AF_INET.
        if i32::from(unsafe { (*a.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: both are sockaddr_in (family checked; the netmask matches it).
        let (addr, mask) =
            unsafe { (*(a.ifa_addr as *const libc::sockaddr_in), *(a.ifa_netmask as *const libc::sockaddr_in)) };
        // SAFETY: a NUL-terminated name from getifaddrs.
        let name = unsafe { std::ffi::CStr::from_ptr(a.ifa_name) }.to_string_lossy();
        f(
            &name,
            a.ifa_flags,
            Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
            u32::from_be(mask.sin_addr.s_addr).count_ones() as u8,
        );
    }
    // SAFETY: frees the list getifaddrs returned, once.
    unsafe { libc::freeifaddrs(head) };
    Ok(())
}

fn ipv4_addrs(name: &str) -> io::Result<Vec<(Ipv4Addr, u8)>> {
    let mut out = Vec::new();
    each_ipv4_addr(|n, _, ip, prefix| {
        if n == name {
            out.push((ip, prefix));
        }
    })?;
    Ok(out)
}

/// Moves the calling thread (only) into the network namespace `ip netns`
/// calls `name`; what it creates afterwards (sockets, threads) lives there.
/// For tests and workers that play several testbed hosts in one process.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{name}"))?;
    // SAFETY: plain syscall on a descriptor that `f` keeps open.
    cvt(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } as libc::c_long).map(drop)
}

/// The one interface that is up, not loopback, and has an IPv4 address.
pub fn default_interface() -> io::Result<String> {
    let mut names: Vec<String> = Vec::new();
    each_ipv4_addr(|n, flags, _, _| {
        let up = flags & libc::IFF_UP as u32 != 0 && flags & libc::IFF_LOOPBACK as u32 == 0;
        if up && !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    })?;
    match names.len() {
        1 => Ok(names.remove(0)),
        0 => {
            Err(io::Error::new(io::ErrorKind::NotFound, "no interface is up with an IPv4 address (set EUDP_XDP_IFACE)"))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("several interfaces ({}): set EUDP_XDP_IFACE", names.join(", ")),
        )),
    }
}

/// Closes a descriptor inherited across fork that the parent still owns
/// (async-signal-safe: a plain close).
pub fn close_inherited(fd: RawFd) {
    // SAFETY: closes this process's copy only; the value that owns the
    // number is never dropped in the child (it lives in a static).
    unsafe { libc::close(fd) };
}
