//! Analytical model and discrete-event simulator (issue 5).
//!
//! * [`analytic`]: paper 000 §4.4 equations (1)-(4), Ratemax (000 §4.2) and the
//!   dominant-latency throughput of paper 001 §5.1.
//! * [`fit`]: least-squares fit of per-layer `g + B·G` from a trace JSON.
//! * [`des`]: a binary-heap discrete-event core.
//! * [`sim`]: resources (CPUs with priorities, memories, buses, DMA engines,
//!   links, semaphores) and protocol stacks as per-packet stage state machines.
//! * [`preset`]: the preset file format; every numeric input carries a citation.
//! * [`svg`]: hand-written SVG line plots and time-flow charts.
//! * [`perfetto`]: time-flow records as Chrome Trace Event JSON (ui.perfetto.dev).
//! * [`step_costs`]: measured EMP step costs in the 003 preset and the
//!   order of the schemes the simulator predicts from them.
//! * [`measure`]: simulated latency, bandwidth, sweeps; [`validation`]: the
//!   published figures beside the simulated ones.
pub mod analytic;
pub mod cited;
pub mod cli;
pub mod des;
pub mod fit;
pub mod measure;
pub mod perfetto;
pub mod preset;
pub mod sim;
pub mod step_costs;
pub mod svg;
pub mod timeline;
pub mod validation;
