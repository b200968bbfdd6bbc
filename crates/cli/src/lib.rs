//! Library side of the `eudp` command: the testbed, the bench and its
//! workers, usable from integration tests.

pub mod bench;
pub mod testbed;
pub mod worker;
