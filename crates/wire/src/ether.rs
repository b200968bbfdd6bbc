//! The Ethernet II header and MAC addresses.
//!
//! A kernel-bypass backend (AF_XDP) sees whole frames, so the link header the
//! kernel normally adds and strips is built and parsed here. Only Ethernet II
//! framing is handled; 802.1Q VLAN tags are not parsed (their TPID 0x8100 is
//! reported as the ethertype).

use std::fmt;
use std::str::FromStr;

/// Length of the Ethernet II header (two addresses and the ethertype).
pub const HEADER_LEN: usize = 14;
/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

/// A 48-bit MAC address, in wire order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// True for `ff:ff:ff:ff:ff:ff`.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// True when the group bit (low bit of the first octet) is set; this
    /// includes broadcast.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a string is not a MAC address of the form `aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacAddrParseError {
    /// Not exactly six `:`-separated groups.
    GroupCount,
    /// The group at this index (0-based) is not exactly two hex digits.
    BadGroup(usize),
}

impl fmt::Display for MacAddrParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MacAddrParseError::GroupCount => {
                write!(f, "MAC address must be six ':'-separated hex pairs")
            }
            MacAddrParseError::BadGroup(i) => {
                write!(f, "MAC address group {i} is not two hex digits")
            }
        }
    }
}

impl std::error::Error for MacAddrParseError {}

impl FromStr for MacAddr {
    type Err = MacAddrParseError;

    /// Parses six `:`-separated pairs of hex digits (either case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut octets = [0u8; 6];
        let mut groups = s.split(':');
        for (i, octet) in octets.iter_mut().enumerate() {
            let g = groups.next().ok_or(MacAddrParseError::GroupCount)?.as_bytes();
            *octet = match g {
                [hi, lo] => match (hex_digit(*hi), hex_digit(*lo)) {
                    (Some(hi), Some(lo)) => hi << 4 | lo,
                    _ => return Err(MacAddrParseError::BadGroup(i)),
                },
                _ => return Err(MacAddrParseError::BadGroup(i)),
            };
        }
        if groups.next().is_some() {
            return Err(MacAddrParseError::GroupCount);
        }
        Ok(MacAddr(octets))
    }
}

/// Value of one ASCII hex digit.
fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Why a buffer does not hold an Ethernet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtherError {
    /// Fewer than 14 bytes.
    Truncated,
}

impl fmt::Display for EtherError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtherError::Truncated => write!(f, "frame shorter than the 14-byte Ethernet header"),
        }
    }
}

impl std::error::Error for EtherError {}

/// An Ethernet II header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthernetHeader {
    pub dst: MacAddr,
    pub src: MacAddr,
    /// The type of the payload (e.g. [`ETHERTYPE_IPV4`]); 0x8100 for a
    /// VLAN-tagged frame, whose tag is not parsed.
    pub ethertype: u16,
}

impl EthernetHeader {
    /// Parses the header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, EtherError> {
        if buf.len() < HEADER_LEN {
            return Err(EtherError::Truncated);
        }
        let mac = |at: usize| {
            let mut m = [0u8; 6];
            m.copy_from_slice(&buf[at..at + 6]);
            MacAddr(m)
        };
        Ok(EthernetHeader { dst: mac(0), src: mac(6), ethertype: u16::from_be_bytes([buf[12], buf[13]]) })
    }

    /// Writes the header into `buf[..14]`.
    ///
    /// # Panics
    /// If `buf` is shorter than 14 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0..6].copy_from_slice(&self.dst.0);
        buf[6..12].copy_from_slice(&self.src.0);
        buf[12..14].copy_from_slice(&self.ethertype.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn mac_display_and_parse() {
        let m = MacAddr([0x02, 0x00, 0x5e, 0xab, 0xcd, 0xef]);
        assert_eq!(m.to_string(), "02:00:5e:ab:cd:ef");
        assert_eq!(format!("{m:?}"), "02:00:5e:ab:cd:ef");
        assert_eq!("02:00:5e:ab:cd:ef".parse::<MacAddr>(), Ok(m));
        assert_eq!("02:00:5E:AB:CD:EF".parse::<MacAddr>(), Ok(m));
        assert_eq!(MacAddr::default().to_string(), "00:00:00:00:00:00");
    }

    #[test]
    fn mac_parse_errors() {
        use MacAddrParseError::*;
        assert_eq!("".parse::<MacAddr>(), Err(BadGroup(0)));
        assert_eq!("02:00:5e:ab:cd".parse::<MacAddr>(), Err(GroupCount));
        assert_eq!("02:00:5e:ab:cd:ef:01".parse::<MacAddr>(), Err(GroupCount));
        assert_eq!("02:00:5e:ab:cd:ef:".parse::<MacAddr>(), Err(GroupCount));
        assert_eq!("02:00:5e:ab:cd:e".parse::<MacAddr>(), Err(BadGroup(5)));
        assert_eq!("02:00:5e:ab:cd:eff".parse::<MacAddr>(), Err(BadGroup(5)));
        assert_eq!("02:0g:5e:ab:cd:ef".parse::<MacAddr>(), Err(BadGroup(1)));
        // `from_str_radix` would accept a sign; a MAC group must not.
        assert_eq!("+2:00:5e:ab:cd:ef".parse::<MacAddr>(), Err(BadGroup(0)));
        assert_eq!("02-00-5e-ab-cd-ef".parse::<MacAddr>(), Err(BadGroup(0)));
        assert_eq!("02:00:5e:ab:cd:é".parse::<MacAddr>(), Err(BadGroup(5)));
        assert!(!GroupCount.to_string().is_empty());
    }

    #[test]
    fn broadcast_and_multicast() {
        assert!(MacAddr::BROADCAST.is_broadcast());
        assert!(MacAddr::BROADCAST.is_multicast());
        let mcast = MacAddr([0x01, 0x00, 0x5e, 0x00, 0x00, 0x01]);
        assert!(mcast.is_multicast() && !mcast.is_broadcast());
        let unicast = MacAddr([0x02, 0, 0, 0, 0, 1]);
        assert!(!unicast.is_multicast() && !unicast.is_broadcast());
    }

    #[test]
    fn header_round_trip_and_truncation() {
        let h =
            EthernetHeader { dst: MacAddr::BROADCAST, src: MacAddr([0x02, 0, 0, 0, 0, 1]), ethertype: ETHERTYPE_ARP };
        let mut b = [0u8; HEADER_LEN];
        h.emit(&mut b);
        assert_eq!(b, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        assert_eq!(EthernetHeader::parse(&b), Ok(h));
        for n in 0..HEADER_LEN {
            assert_eq!(EthernetHeader::parse(&b[..n]), Err(EtherError::Truncated));
        }
    }

    #[test]
    fn vlan_tag_reported_as_ethertype() {
        let mut b = [0u8; 18];
        b[12..18].copy_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x08, 0x00]);
        assert_eq!(EthernetHeader::parse(&b).unwrap().ethertype, 0x8100);
    }

    proptest! {
        #[test]
        fn mac_round_trip(octets: [u8; 6]) {
            let m = MacAddr(octets);
            prop_assert_eq!(m.to_string().parse::<MacAddr>(), Ok(m));
        }

        #[test]
        fn mac_parse_never_panics(s in ".{0,24}") {
            let _ = s.parse::<MacAddr>();
        }
    }
}
