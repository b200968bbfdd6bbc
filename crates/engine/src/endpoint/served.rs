//! The endpoint as the engine thread sees it ([`Served`]): each call goes
//! to the endpoint's own method of that name.

use super::EpInner;
use crate::queue::L1Queue;
use crate::serve::{RecvScratch, RxOutcome, Served};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Instant;

impl Served for EpInner {
    fn id(&self) -> u64 {
        self.id
    }

    fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    fn service_send(self: Arc<Self>, staging: &mut L1Queue) {
        EpInner::service_send(&self, staging)
    }

    fn resume_send(self: Arc<Self>, staging: &mut L1Queue) {
        EpInner::resume_send(&self, staging)
    }

    fn send_remainder_now(self: Arc<Self>) -> Option<bool> {
        EpInner::send_remainder_now(&self)
    }

    fn remainder_of(&self, token: u64) -> bool {
        EpInner::remainder_of(self, token)
    }

    fn flush(self: Arc<Self>, deadline: Instant) -> bool {
        EpInner::flush(&self, deadline)
    }

    fn engine_receive(&self, scratch: &mut RecvScratch) -> RxOutcome {
        EpInner::engine_receive(self, scratch)
    }

    fn rx_stamp_parked(&self) -> bool {
        EpInner::rx_stamp_parked(self)
    }

    fn rx_calls_seen(&self) -> u64 {
        EpInner::rx_calls_seen(self)
    }

    fn rx_idle_since_last_look(&self) -> bool {
        EpInner::rx_idle_since_last_look(self)
    }
}
