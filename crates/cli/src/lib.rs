//! Library side of the `eudp` command: the testbed, the bench and its
//! workers, usable from integration tests.

pub mod bench;
pub mod command;
pub mod profiles;
pub mod rss;
pub mod run;
pub mod sockbench;
pub mod tcpbench;
pub mod testbed;
pub mod trace;
pub mod worker;
