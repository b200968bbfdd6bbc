//! Library side of the `eudp` command: the testbed, the bench and its
//! workers, usable from integration tests.

pub mod bench;
pub mod profiles;
pub mod rss;
pub mod run;
pub mod run_check;
pub mod sockbench;
pub mod stat_view;
pub mod tcpbench;
pub mod testbed;
pub mod trace_cmd;
pub mod worker;
