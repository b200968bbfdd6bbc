//! The impairment testbed: a three-host topology whose middle host relays
//! frames with seeded loss, duplication and reordering, and an nftables
//! loss rule. Tests and `eudp bench --emp` run protocols over it.

pub mod relay;
mod sys;
pub mod topology;

pub use relay::{RelayArgs, Summary};
pub use topology::{nft_clear, nft_dropped, nft_loss, ImpairBed, IMP_A, IMP_B};
