//! The retransmission timeout from measured round trips: a smoothed round
//! trip time and its mean deviation (the estimator of RFC 6298), timeout =
//! SRTT + 4 × RTTVAR within `[rto_min, rto_max]`, doubled per timeout up to
//! the maximum. One frame at a time is timed; a frame sent more than once
//! gives no sample (Karn's rule: its acknowledgment may answer either
//! copy).

use std::time::{Duration, Instant};

/// Round-trip estimate and the current timeout of one flow.
#[derive(Debug, Clone)]
pub struct Rtt {
    min: Duration,
    max: Duration,
    initial: Duration,
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    /// The frame being timed and when it went out.
    probe: Option<(u32, Instant)>,
}

impl Rtt {
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        Rtt { min, max, initial, srtt: None, rttvar: Duration::ZERO, rto: initial.clamp(min, max), probe: None }
    }

    /// The timeout to arm now.
    pub fn rto(&self) -> Duration {
        self.rto
    }

    /// The smoothed round trip, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// Frame `seq` went out for the first time at `now`: timed when no
    /// other frame is.
    pub fn sent_new(&mut self, seq: u32, now: Instant) {
        if self.probe.is_none() {
            self.probe = Some((seq, now));
        }
    }

    /// Frame `seq` went out again: if it is the timed one, its sample is void.
    pub fn sent_again(&mut self, seq: u32) {
        if self.probe.is_some_and(|(s, _)| s == seq) {
            self.probe = None;
        }
    }

    /// Frames below `next` are acknowledged at `now`: a sample from the
    /// timed frame if it is among them, and the timeout from the estimate
    /// (undoing any backoff).
    pub fn acked(&mut self, next: u32, now: Instant) {
        if let Some((seq, at)) = self.probe {
            if super::seq::before(seq, next) {
                self.probe = None;
                self.sample(now.saturating_duration_since(at));
            }
        }
        self.rto = self.computed();
    }

    fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let dev = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + dev) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }

    fn computed(&self) -> Duration {
        match self.srtt {
            None => self.initial,
            Some(s) => s + self.rttvar * 4,
        }
        .clamp(self.min, self.max)
    }

    /// A timeout: nothing in flight is timed any more, and the timeout doubles.
    pub fn backoff(&mut self) {
        self.probe = None;
        self.rto = (self.rto * 2).min(self.max);
    }

    /// A new incarnation of the flow keeps the estimate (same path) and
    /// drops the probe and the backoff.
    pub fn restart(&mut self) {
        self.probe = None;
        self.rto = self.computed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn rtt() -> Rtt {
        Rtt::new(20 * MS, MS, 500 * MS)
    }

    #[test]
    fn converges_on_a_steady_round_trip() {
        let t0 = Instant::now();
        let mut r = rtt();
        assert_eq!(r.rto(), 20 * MS);
        for k in 0..40u32 {
            let at = t0 + 10 * MS * k;
            r.sent_new(k, at);
            r.acked(k + 1, at + 2 * MS);
        }
        assert_eq!(r.srtt(), Some(2 * MS));
        // The deviation decays towards zero: the timeout nears the minimum.
        assert!(r.rto() < 3 * MS, "{:?}", r.rto());
        assert!(r.rto() >= MS);
    }

    #[test]
    fn first_sample_sets_srtt_and_half_of_it_as_deviation() {
        let t0 = Instant::now();
        let mut r = rtt();
        r.sent_new(0, t0);
        r.sent_new(1, t0 + MS); // one probe at a time: not timed
        r.acked(2, t0 + 4 * MS);
        assert_eq!(r.srtt(), Some(4 * MS));
        assert_eq!(r.rto(), 4 * MS + 8 * MS);
    }

    #[test]
    fn karn_no_sample_from_a_frame_sent_twice() {
        let t0 = Instant::now();
        let mut r = rtt();
        r.sent_new(0, t0);
        r.sent_again(0);
        r.acked(1, t0 + 300 * MS);
        assert_eq!(r.srtt(), None);
        assert_eq!(r.rto(), 20 * MS);
    }

    #[test]
    fn backoff_doubles_to_the_maximum_and_an_ack_undoes_it() {
        let t0 = Instant::now();
        let mut r = rtt();
        r.sent_new(0, t0);
        for _ in 0..10 {
            r.backoff();
        }
        assert_eq!(r.rto(), 500 * MS);
        r.acked(1, t0 + 900 * MS);
        assert_eq!(r.srtt(), None, "the timeout voided the probe");
        assert_eq!(r.rto(), 20 * MS);
    }

    #[test]
    fn the_minimum_bounds_a_tiny_round_trip() {
        let t0 = Instant::now();
        let mut r = Rtt::new(20 * MS, 5 * MS, 500 * MS);
        r.sent_new(0, t0);
        r.acked(1, t0 + Duration::from_micros(30));
        assert_eq!(r.rto(), 5 * MS);
    }
}
