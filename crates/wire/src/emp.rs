//! EMP frames: the data frames of a message and the acknowledgments of a
//! flow, each one UDP datagram.
//!
//! Every frame starts with a 16-byte common header (big-endian):
//!
//! | bytes | field                                              |
//! |-------|----------------------------------------------------|
//! | 0..2  | magic `"EM"`                                       |
//! | 2     | version ([`VERSION`])                              |
//! | 3     | kind: 1 DATA, 2 ACK, 3 NAK                         |
//! | 4     | flags: bit 0 FIRST, bit 1 LAST (DATA); bit 2 SACK; |
//! |       | bit 3 ACK (DATA carrying an acknowledgment)        |
//! | 5..8  | reserved, zero                                     |
//! | 8..12 | epoch of the flow                                  |
//! | 12..16| flow sequence number (DATA; zero in ACK/NAK)       |
//!
//! DATA adds the tag (u64), the message length (u32) and this frame's
//! offset in the message (u32); its payload is the rest of the datagram.
//! A DATA frame with the ACK flag carries an acknowledgment of the reverse
//! flow between its header and its payload: that flow's epoch, `next` and
//! window (u32 each), and with the SACK flag also its selective part (u64),
//! so that a reply takes the acknowledgment of the request with it instead
//! of a datagram of its own. DATA without the flag is unchanged.
//! ACK and NAK add `next` (u32, the first sequence number not accepted)
//! and the receiver's advertised window in frames (u32); with the SACK
//! flag a selective part follows: a u64 whose bit `k` says frame
//! `next + 1 + k` is held by the receiver (received out of order). An ACK
//! or NAK without held frames has no selective part and no flag, so a
//! frame names each state one way only. In DATA the epoch names the sender's flow incarnation; ACK and
//! NAK echo the epoch of the flow they acknowledge, so that a sender
//! ignores acknowledgments meant for an earlier incarnation.
//!
//! A parser never panics: every malformed input has an [`EmpError`].

/// Magic at the start of every frame.
pub const MAGIC: [u8; 2] = *b"EM";
/// The one version this code speaks.
pub const VERSION: u8 = 1;
/// Length of the header common to every kind.
pub const COMMON_LEN: usize = 16;
/// Length of a DATA header; the payload follows it.
pub const DATA_HEADER_LEN: usize = COMMON_LEN + 16;
/// Length of an ACK or NAK frame without a selective part.
pub const CONTROL_LEN: usize = COMMON_LEN + 8;
/// Length of an ACK or NAK frame with a selective part.
pub const SACK_CONTROL_LEN: usize = CONTROL_LEN + 8;
/// Bytes an acknowledgment adds to a DATA frame that carries one.
pub const PIGGYBACK_LEN: usize = 12;
/// Bytes an acknowledgment with a selective part adds to a DATA frame.
pub const PIGGYBACK_SACK_LEN: usize = PIGGYBACK_LEN + 8;
/// Largest message EMP carries: 16 MiB.
pub const MAX_MESSAGE: u32 = 16 << 20;

const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_NAK: u8 = 3;
const FLAG_FIRST: u8 = 1;
const FLAG_LAST: u8 = 2;
const FLAG_SACK: u8 = 4;
const FLAG_ACK: u8 = 8;

/// The header of a DATA frame; its payload length is the datagram's rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    pub epoch: u32,
    pub seq: u32,
    pub tag: u64,
    /// Length of the whole message, at most [`MAX_MESSAGE`].
    pub msg_len: u32,
    /// Where this frame's payload starts in the message.
    pub offset: u32,
}

/// A parsed DATA frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Data<'a> {
    pub header: DataHeader,
    /// The acknowledgment of the reverse flow the frame carries, if any.
    pub ack: Option<Control>,
    pub payload: &'a [u8],
}

impl Data<'_> {
    /// The message's first frame (offset 0).
    pub fn first(&self) -> bool {
        self.header.offset == 0
    }

    /// The message's last frame (its payload reaches the message's end).
    pub fn last(&self) -> bool {
        self.header.offset as usize + self.payload.len() == self.header.msg_len as usize
    }
}

/// The fields of an ACK or a NAK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Control {
    /// Epoch of the flow acknowledged.
    pub epoch: u32,
    /// First sequence number the receiver has not accepted.
    pub next: u32,
    /// Frames the receiver is willing to have in flight.
    pub window: u32,
    /// Selective part: bit `k` set when frame `next + 1 + k` is held by
    /// the receiver; 0 when it holds none of them.
    pub sack: u64,
}

/// One parsed frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Data(Data<'a>),
    Ack(Control),
    Nak(Control),
}

/// Why bytes are not an EMP frame (or a frame cannot be encoded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmpError {
    /// Shorter than the header its kind needs.
    Short,
    /// Not the EMP magic.
    BadMagic,
    /// A version this code does not speak.
    BadVersion,
    /// A kind byte this code does not know.
    UnknownKind,
    /// Reserved bits set, or flags that disagree with offset and length.
    BadFlags,
    /// ACK or NAK with bytes after its fields.
    TrailingBytes,
    /// Message length over [`MAX_MESSAGE`].
    MessageTooLong,
    /// Offset plus payload beyond the message length, or an empty payload
    /// in a non-empty message.
    BadOffset,
    /// The output buffer cannot hold the frame.
    NoRoom,
}

impl std::fmt::Display for EmpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            EmpError::Short => "EMP frame shorter than its header",
            EmpError::BadMagic => "not an EMP frame (bad magic)",
            EmpError::BadVersion => "unsupported EMP version",
            EmpError::UnknownKind => "unknown EMP frame kind",
            EmpError::BadFlags => "EMP flags inconsistent or reserved bits set",
            EmpError::TrailingBytes => "EMP control frame with trailing bytes",
            EmpError::MessageTooLong => "EMP message length over 16 MiB",
            EmpError::BadOffset => "EMP frame beyond its message's length",
            EmpError::NoRoom => "buffer too small for the EMP frame",
        };
        f.write_str(s)
    }
}

impl std::error::Error for EmpError {}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    (u64::from(u32_at(b, at)) << 32) | u64::from(u32_at(b, at + 4))
}

/// Parses one datagram as an EMP frame.
pub fn parse(buf: &[u8]) -> Result<Frame<'_>, EmpError> {
    if buf.len() < COMMON_LEN {
        return Err(EmpError::Short);
    }
    if buf[0..2] != MAGIC {
        return Err(EmpError::BadMagic);
    }
    if buf[2] != VERSION {
        return Err(EmpError::BadVersion);
    }
    let (kind, flags) = (buf[3], buf[4]);
    if buf[5..8] != [0, 0, 0] {
        return Err(EmpError::BadFlags);
    }
    let epoch = u32_at(buf, 8);
    let seq = u32_at(buf, 12);
    match kind {
        KIND_DATA => {
            if buf.len() < DATA_HEADER_LEN {
                return Err(EmpError::Short);
            }
            let header =
                DataHeader { epoch, seq, tag: u64_at(buf, 16), msg_len: u32_at(buf, 24), offset: u32_at(buf, 28) };
            let (ack, at) = parse_piggyback(buf, flags)?;
            let payload = &buf[at..];
            check_data(&header, payload.len())?;
            if flags & !(FLAG_ACK | FLAG_SACK) != data_flags(&header, payload.len()) {
                return Err(EmpError::BadFlags);
            }
            Ok(Frame::Data(Data { header, ack, payload }))
        }
        KIND_ACK | KIND_NAK => {
            if (flags != 0 && flags != FLAG_SACK) || seq != 0 {
                return Err(EmpError::BadFlags);
            }
            let len = if flags == FLAG_SACK { SACK_CONTROL_LEN } else { CONTROL_LEN };
            if buf.len() < len {
                return Err(EmpError::Short);
            }
            if buf.len() > len {
                return Err(EmpError::TrailingBytes);
            }
            let sack = if flags == FLAG_SACK { u64_at(buf, 24) } else { 0 };
            if flags == FLAG_SACK && sack == 0 {
                return Err(EmpError::BadFlags);
            }
            let c = Control { epoch, next: u32_at(buf, 16), window: u32_at(buf, 20), sack };
            Ok(if kind == KIND_ACK { Frame::Ack(c) } else { Frame::Nak(c) })
        }
        _ => Err(EmpError::UnknownKind),
    }
}

/// The acknowledgment a DATA frame with `flags` carries after its header,
/// and where its payload starts.
fn parse_piggyback(buf: &[u8], flags: u8) -> Result<(Option<Control>, usize), EmpError> {
    match (flags & FLAG_ACK != 0, flags & FLAG_SACK != 0) {
        (false, false) => Ok((None, DATA_HEADER_LEN)),
        (false, true) => Err(EmpError::BadFlags),
        (true, sacked) => {
            let len = if sacked { PIGGYBACK_SACK_LEN } else { PIGGYBACK_LEN };
            if buf.len() < DATA_HEADER_LEN + len {
                return Err(EmpError::Short);
            }
            let at = DATA_HEADER_LEN;
            let sack = if sacked { u64_at(buf, at + PIGGYBACK_LEN) } else { 0 };
            if sacked && sack == 0 {
                return Err(EmpError::BadFlags);
            }
            let c = Control { epoch: u32_at(buf, at), next: u32_at(buf, at + 4), window: u32_at(buf, at + 8), sack };
            Ok((Some(c), at + len))
        }
    }
}

/// Bytes a carried acknowledgment adds to a DATA frame.
pub fn piggyback_len(ack: Option<&Control>) -> usize {
    match ack {
        None => 0,
        Some(c) if c.sack == 0 => PIGGYBACK_LEN,
        Some(_) => PIGGYBACK_SACK_LEN,
    }
}

/// The limits a DATA frame of `payload_len` bytes must meet.
fn check_data(h: &DataHeader, payload_len: usize) -> Result<(), EmpError> {
    if h.msg_len > MAX_MESSAGE {
        return Err(EmpError::MessageTooLong);
    }
    let end = h.offset as u64 + payload_len as u64;
    if end > u64::from(h.msg_len) || (payload_len == 0 && h.msg_len != 0) {
        return Err(EmpError::BadOffset);
    }
    Ok(())
}

fn data_flags(h: &DataHeader, payload_len: usize) -> u8 {
    let mut f = 0;
    if h.offset == 0 {
        f |= FLAG_FIRST;
    }
    if h.offset as usize + payload_len == h.msg_len as usize {
        f |= FLAG_LAST;
    }
    f
}

fn common(out: &mut [u8], kind: u8, flags: u8, epoch: u32, seq: u32) {
    out[0..2].copy_from_slice(&MAGIC);
    out[2] = VERSION;
    out[3] = kind;
    out[4] = flags;
    out[5..8].fill(0);
    out[8..12].copy_from_slice(&epoch.to_be_bytes());
    out[12..16].copy_from_slice(&seq.to_be_bytes());
}

/// Writes the header of a DATA frame whose payload of `payload_len` bytes
/// the caller places at `out[DATA_HEADER_LEN..]`. Returns the header length.
pub fn encode_data_header(h: &DataHeader, payload_len: usize, out: &mut [u8]) -> Result<usize, EmpError> {
    encode_data_header_with(h, None, payload_len, out)
}

/// Writes the header of a DATA frame and the acknowledgment it carries
/// (if any); the caller places the payload right after. Returns the
/// header's length with the acknowledgment.
pub fn encode_data_header_with(
    h: &DataHeader,
    ack: Option<&Control>,
    payload_len: usize,
    out: &mut [u8],
) -> Result<usize, EmpError> {
    check_data(h, payload_len)?;
    let len = DATA_HEADER_LEN + piggyback_len(ack);
    if out.len() < len {
        return Err(EmpError::NoRoom);
    }
    let extra = match ack {
        None => 0,
        Some(c) if c.sack == 0 => FLAG_ACK,
        Some(_) => FLAG_ACK | FLAG_SACK,
    };
    common(out, KIND_DATA, data_flags(h, payload_len) | extra, h.epoch, h.seq);
    out[16..24].copy_from_slice(&h.tag.to_be_bytes());
    out[24..28].copy_from_slice(&h.msg_len.to_be_bytes());
    out[28..32].copy_from_slice(&h.offset.to_be_bytes());
    if let Some(c) = ack {
        let at = DATA_HEADER_LEN;
        out[at..at + 4].copy_from_slice(&c.epoch.to_be_bytes());
        out[at + 4..at + 8].copy_from_slice(&c.next.to_be_bytes());
        out[at + 8..at + 12].copy_from_slice(&c.window.to_be_bytes());
        if c.sack != 0 {
            out[at + 12..at + 20].copy_from_slice(&c.sack.to_be_bytes());
        }
    }
    Ok(len)
}

/// The encoded length of an ACK or NAK with these fields.
pub fn control_len(c: &Control) -> usize {
    if c.sack == 0 {
        CONTROL_LEN
    } else {
        SACK_CONTROL_LEN
    }
}

/// Writes an ACK (`nak` false) or a NAK. Returns [`control_len`].
pub fn encode_control(c: &Control, nak: bool, out: &mut [u8]) -> Result<usize, EmpError> {
    let len = control_len(c);
    if out.len() < len {
        return Err(EmpError::NoRoom);
    }
    let flags = if c.sack == 0 { 0 } else { FLAG_SACK };
    common(out, if nak { KIND_NAK } else { KIND_ACK }, flags, c.epoch, 0);
    out[16..20].copy_from_slice(&c.next.to_be_bytes());
    out[20..24].copy_from_slice(&c.window.to_be_bytes());
    if c.sack != 0 {
        out[24..32].copy_from_slice(&c.sack.to_be_bytes());
    }
    Ok(len)
}

/// Writes a whole frame. Returns its length.
pub fn encode(frame: &Frame<'_>, out: &mut [u8]) -> Result<usize, EmpError> {
    match frame {
        Frame::Data(d) => {
            let head = DATA_HEADER_LEN + piggyback_len(d.ack.as_ref());
            let total = head + d.payload.len();
            if out.len() < total {
                return Err(EmpError::NoRoom);
            }
            encode_data_header_with(&d.header, d.ack.as_ref(), d.payload.len(), out)?;
            out[head..total].copy_from_slice(d.payload);
            Ok(total)
        }
        Frame::Ack(c) => encode_control(c, false, out),
        Frame::Nak(c) => encode_control(c, true, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_round_trip_and_flags() {
        let h = DataHeader { epoch: 7, seq: 9, tag: 0x0102_0304_0506_0708, msg_len: 10, offset: 4 };
        let mut buf = [0u8; 64];
        let n = encode(&Frame::Data(Data { header: h, ack: None, payload: b"abcdef" }), &mut buf).unwrap();
        let Ok(Frame::Data(d)) = parse(&buf[..n]) else { panic!("not data") };
        assert_eq!((d.header, d.payload, d.first(), d.last()), (h, &b"abcdef"[..], false, true));
        buf[4] = FLAG_FIRST | FLAG_LAST;
        assert_eq!(parse(&buf[..n]), Err(EmpError::BadFlags));
    }

    #[test]
    fn malformed_inputs_have_their_errors() {
        let mut buf = [0u8; 64];
        let c = Control { epoch: 1, next: 2, window: 3, sack: 0 };
        let n = encode_control(&c, true, &mut buf).unwrap();
        assert_eq!(parse(&buf[..n]), Ok(Frame::Nak(c)));
        assert_eq!(parse(&buf[..n - 1]), Err(EmpError::Short));
        assert_eq!(parse(&buf[..n + 1]), Err(EmpError::TrailingBytes));
        let mut bad = buf;
        bad[0] = b'X';
        assert_eq!(parse(&bad[..n]), Err(EmpError::BadMagic));
        let mut bad = buf;
        bad[2] = 9;
        assert_eq!(parse(&bad[..n]), Err(EmpError::BadVersion));
        let mut bad = buf;
        bad[3] = 77;
        assert_eq!(parse(&bad[..n]), Err(EmpError::UnknownKind));
        let big = DataHeader { epoch: 0, seq: 0, tag: 0, msg_len: MAX_MESSAGE + 1, offset: 0 };
        assert_eq!(encode_data_header(&big, 1, &mut buf), Err(EmpError::MessageTooLong));
        let beyond = DataHeader { msg_len: 4, offset: 2, ..big };
        assert_eq!(encode_data_header(&beyond, 3, &mut buf), Err(EmpError::BadOffset));
        let empty = DataHeader { msg_len: 4, offset: 0, ..big };
        assert_eq!(encode_data_header(&empty, 0, &mut buf), Err(EmpError::BadOffset));
    }

    #[test]
    fn selective_part_round_trips_and_is_checked() {
        let mut buf = [0u8; 64];
        let c = Control { epoch: 1, next: 2, window: 3, sack: 0x8000_0000_0000_0005 };
        let n = encode_control(&c, false, &mut buf).unwrap();
        assert_eq!(n, SACK_CONTROL_LEN);
        assert_eq!(parse(&buf[..n]), Ok(Frame::Ack(c)));
        assert_eq!(parse(&buf[..n - 1]), Err(EmpError::Short));
        assert_eq!(parse(&buf[..n + 1]), Err(EmpError::TrailingBytes));
        // The flag with an empty selective part names no held frame: refused,
        // since the same state encodes without the flag.
        let mut bad = buf;
        bad[24..32].fill(0);
        assert_eq!(parse(&bad[..n]), Err(EmpError::BadFlags));
        let mut bad = buf;
        bad[4] = FLAG_SACK | FLAG_FIRST;
        assert_eq!(parse(&bad[..n]), Err(EmpError::BadFlags));
    }

    #[test]
    fn data_carries_an_acknowledgment() {
        let h = DataHeader { epoch: 7, seq: 9, tag: 3, msg_len: 4, offset: 0 };
        let mut buf = [0u8; 64];
        for sack in [0, 0x10] {
            let ack = Control { epoch: 5, next: 6, window: 8, sack };
            let n = encode(&Frame::Data(Data { header: h, ack: Some(ack), payload: b"wxyz" }), &mut buf).unwrap();
            let extra = if sack == 0 { PIGGYBACK_LEN } else { PIGGYBACK_SACK_LEN };
            assert_eq!(n, DATA_HEADER_LEN + extra + 4);
            let Ok(Frame::Data(d)) = parse(&buf[..n]) else { panic!("not data") };
            assert_eq!((d.ack, d.payload, d.first(), d.last()), (Some(ack), &b"wxyz"[..], true, true));
            assert_eq!(parse(&buf[..DATA_HEADER_LEN + extra - 1]), Err(EmpError::Short));
        }
        // SACK without ACK on DATA, and an empty selective part, are refused.
        let n = encode(&Frame::Data(Data { header: h, ack: None, payload: b"wxyz" }), &mut buf).unwrap();
        let mut bad = buf;
        bad[4] |= FLAG_SACK;
        assert_eq!(parse(&bad[..n]), Err(EmpError::BadFlags));
        let ack = Control { epoch: 5, next: 6, window: 8, sack: 1 };
        let n = encode(&Frame::Data(Data { header: h, ack: Some(ack), payload: b"wxyz" }), &mut buf).unwrap();
        let mut bad = buf;
        bad[DATA_HEADER_LEN + PIGGYBACK_LEN..DATA_HEADER_LEN + PIGGYBACK_SACK_LEN].fill(0);
        assert_eq!(parse(&bad[..n]), Err(EmpError::BadFlags));
    }
}
