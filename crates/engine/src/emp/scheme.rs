//! EMP's schemes (paper 003, Table 2): where the seven steps of the
//! protocol run. The base scheme runs them all on one engine thread; the
//! others split them over two engine threads, A and B. The placement is
//! data ([`Scheme::placement`]) so that the runtime, the docs and a trace
//! read the same table.

use std::fmt;
use std::str::FromStr;

/// One of the seven steps of paper 003's Table 1, as [`crate::emp::stages`]
/// implements them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// 1: posted sends become transmission records; retransmission timers.
    SendBookkeeping,
    /// 2: frames the windows allow go to the socket.
    Transmission,
    /// 3: acknowledgments release transmission records.
    ReceiveAcknowledgment,
    /// 4: a data frame's verdict and its match against posted receives.
    ReceiveBookkeeping,
    /// 5: datagrams read from the socket and parsed.
    ReceiveFrame,
    /// 6: a frame's bytes into its message; completes receives.
    Receiving,
    /// 7: acknowledgments owed go to the socket.
    SendAcknowledgment,
}

impl Stage {
    /// The steps in Table 1's order.
    pub const ALL: [Stage; 7] = [
        Stage::SendBookkeeping,
        Stage::Transmission,
        Stage::ReceiveAcknowledgment,
        Stage::ReceiveBookkeeping,
        Stage::ReceiveFrame,
        Stage::Receiving,
        Stage::SendAcknowledgment,
    ];

    /// The step's name as the paper writes it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::SendBookkeeping => "send bookkeeping",
            Stage::Transmission => "transmission",
            Stage::ReceiveAcknowledgment => "receive acknowledgment",
            Stage::ReceiveBookkeeping => "receive bookkeeping",
            Stage::ReceiveFrame => "receive frame",
            Stage::Receiving => "receiving",
            Stage::SendAcknowledgment => "send acknowledgment",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of stages (the ones one engine thread runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StageSet(u8);

impl StageSet {
    /// Every stage (the base scheme's thread, and an application thread's round).
    pub const ALL: StageSet = StageSet(0x7f);

    pub fn of(stages: &[Stage]) -> Self {
        StageSet(stages.iter().fold(0, |b, s| b | s.bit()))
    }

    pub fn has(self, s: Stage) -> bool {
        self.0 & s.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The stages in Table 1's order.
    pub fn stages(self) -> impl Iterator<Item = Stage> {
        Stage::ALL.into_iter().filter(move |&s| self.has(s))
    }
}

/// Where an endpoint runs the protocol's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scheme {
    /// All steps on one engine thread.
    #[default]
    Base,
    /// SO: the send path split: transmission and send acknowledgment on B.
    SendOnly,
    /// RO: the receive path split: receive frame and receiving on B.
    ReceiveOnly,
    /// DSR: A for the send path, B for the receive path.
    DedicatedSendReceive,
    /// SR: both paths split (SO's send side with RO's receive side).
    SendReceive,
}

impl Scheme {
    pub const ALL: [Scheme; 5] =
        [Scheme::Base, Scheme::SendOnly, Scheme::ReceiveOnly, Scheme::DedicatedSendReceive, Scheme::SendReceive];

    /// The short name `FromStr` takes.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Base => "base",
            Scheme::SendOnly => "so",
            Scheme::ReceiveOnly => "ro",
            Scheme::DedicatedSendReceive => "dsr",
            Scheme::SendReceive => "sr",
        }
    }

    /// The stages of each engine thread: one set for base, two (A, B) for
    /// the others. An endpoint is a sending and a receiving side at once,
    /// so the sets join Table 2's sending-side rows (steps 1–3) and
    /// receiving-side rows (steps 4–7). DSR's receive acknowledgment is
    /// split in the paper: its frame arrives on B (receive frame) and
    /// updates the send records on A, which is where step 3 runs.
    pub fn placement(self) -> &'static [&'static [Stage]] {
        use Stage::*;
        match self {
            Scheme::Base => &[&Stage::ALL],
            Scheme::SendOnly => &[
                &[SendBookkeeping, ReceiveAcknowledgment, ReceiveBookkeeping, ReceiveFrame, Receiving],
                &[Transmission, SendAcknowledgment],
            ],
            Scheme::ReceiveOnly => &[
                &[SendBookkeeping, Transmission, ReceiveAcknowledgment, ReceiveBookkeeping, SendAcknowledgment],
                &[ReceiveFrame, Receiving],
            ],
            Scheme::DedicatedSendReceive => &[
                &[SendBookkeeping, Transmission, ReceiveAcknowledgment, SendAcknowledgment],
                &[ReceiveBookkeeping, ReceiveFrame, Receiving],
            ],
            Scheme::SendReceive => &[
                &[SendBookkeeping, ReceiveAcknowledgment, ReceiveBookkeeping, SendAcknowledgment],
                &[Transmission, ReceiveFrame, Receiving],
            ],
        }
    }

    /// The stage sets of the engine threads.
    pub fn threads(self) -> Vec<StageSet> {
        self.placement().iter().map(|s| StageSet::of(s)).collect()
    }

    /// The placement as a text table (thread, stages), for docs and tools.
    pub fn describe(self) -> String {
        let mut out = String::new();
        for (i, stages) in self.placement().iter().enumerate() {
            let names: Vec<&str> = stages.iter().map(|s| s.name()).collect();
            out.push_str(&format!("{} {}: {}\n", self.name(), (b'A' + i as u8) as char, names.join(", ")));
        }
        out
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheme {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Scheme::ALL
            .into_iter()
            .find(|x| x.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown EMP scheme {s:?} (base, so, ro, dsr, sr)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_places_every_stage_once() {
        for s in Scheme::ALL {
            let mut seen: Vec<Stage> = s.placement().iter().flat_map(|t| t.iter().copied()).collect();
            seen.sort();
            assert_eq!(seen, Stage::ALL.to_vec(), "{s}");
            assert_eq!(s.name().parse::<Scheme>(), Ok(s));
        }
        assert!("xx".parse::<Scheme>().is_err());
    }
}
