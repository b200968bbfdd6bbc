//! Peer identities of an endpoint's address vector.

/// A peer in an endpoint's address vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);
