//! Preset files: hardware resources and protocol stacks, every input cited.
//!
//! A preset is one JSON file (see `crates/model/presets/`). Resources are named
//! `tx.*` for the sending host/NIC, `rx.*` for the receiving one; a reversed
//! flow (bidirectional runs) swaps the two prefixes. Stacks are ordered lists
//! of stages a packet passes through; each stage is a small state machine run
//! by [`crate::sim`].

use crate::cited::{check, Cited};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A whole preset file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// Short id, e.g. `"000"`.
    pub name: String,
    /// One-line description.
    pub title: String,
    /// Free-form notes (how inputs were derived, what is modelled and what not).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Bits per "Mbit" used when reporting bandwidth (1e6, or 1048576 when the
    /// paper counts megabits in powers of two).
    pub mbit_bits: Cited,
    /// Named resources.
    pub resources: BTreeMap<String, ResourceSpec>,
    /// Named protocol stacks.
    pub stacks: BTreeMap<String, StackSpec>,
}

/// What a resource is; decides its capacity and, for buses and links, its rate.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResourceSpec {
    /// Processor(s): `capacity` = number of CPUs.
    Cpu { capacity: Cited },
    /// Memory: `capacity` = accesses (units) it serves at once.
    Memory { capacity: Cited },
    /// Shared I/O bus (PIO and DMA share it). Either a named parameter set
    /// (`"pci32/33"`, `"pci64/66"`, `"pcix133"`, `"pcie1x8"`, ...) or width and clock.
    Bus {
        #[serde(default)]
        bus: Option<String>,
        #[serde(default)]
        width_bits: Option<Cited>,
        #[serde(default)]
        clock_mhz: Option<Cited>,
        #[serde(default)]
        cite: Option<String>,
    },
    /// DMA engine (host, send or receive); one transfer at a time.
    Engine {},
    /// A semaphore / lock with one holder at a time. With `spin` (the
    /// citation that says so), a step waits for it by looping on the CPU it
    /// runs on: the CPU is taken first and stays busy until the lock is
    /// granted (003 §2's semaphore register), instead of being free for other
    /// work while the step waits.
    Lock {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spin: Option<String>,
    },
    /// A network link direction.
    Link { mbps: Cited },
}

/// Rate of a named bus parameter set, in bytes per ns, and its description.
pub fn bus_rate(name: &str) -> Option<(f64, &'static str)> {
    // Peak data rates: width x clock for parallel buses; lanes x line rate x
    // encoding efficiency for PCI Express.
    let r = match name {
        "pci32/33" => (4.0 * 33.0e6, "PCI 32 bit 33 MHz"),
        "pci64/33" => (8.0 * 33.0e6, "PCI 64 bit 33 MHz"),
        "pci64/66" => (8.0 * 66.0e6, "PCI 64 bit 66 MHz"),
        "pci64/133" | "pcix133" => (8.0 * 133.0e6, "PCI-X 64 bit 133 MHz"),
        "pcix266" => (8.0 * 266.0e6, "PCI-X 2.0 64 bit 266 MT/s"),
        "pcix533" => (8.0 * 533.0e6, "PCI-X 2.0 64 bit 533 MT/s"),
        "pcie1x8" => (8.0 * 2.5e9 * 0.8 / 8.0, "PCIe 1.x x8 (2.5 GT/s, 8b/10b)"),
        "pcie2x8" => (8.0 * 5.0e9 * 0.8 / 8.0, "PCIe 2.0 x8 (5 GT/s, 8b/10b)"),
        "pcie3x8" => (8.0 * 8.0e9 * 128.0 / 130.0 / 8.0, "PCIe 3.0 x8 (8 GT/s, 128b/130b)"),
        "pcie3x16" => (16.0 * 8.0e9 * 128.0 / 130.0 / 8.0, "PCIe 3.0 x16"),
        "pcie4x16" => (16.0 * 16.0e9 * 128.0 / 130.0 / 8.0, "PCIe 4.0 x16"),
        "pcie5x16" => (16.0 * 32.0e9 * 128.0 / 130.0 / 8.0, "PCIe 5.0 x16"),
        _ => return None,
    };
    Some((r.0 / 1e9, r.1))
}

/// Names accepted by [`bus_rate`].
pub const BUS_NAMES: &[&str] = &[
    "pci32/33",
    "pci64/33",
    "pci64/66",
    "pci64/133",
    "pcix133",
    "pcix266",
    "pcix533",
    "pcie1x8",
    "pcie2x8",
    "pcie3x8",
    "pcie3x16",
    "pcie4x16",
    "pcie5x16",
];

impl ResourceSpec {
    /// Units the resource serves at once.
    pub fn capacity(&self) -> u32 {
        match self {
            ResourceSpec::Cpu { capacity } | ResourceSpec::Memory { capacity } => capacity.v.max(1.0).round() as u32,
            _ => 1,
        }
    }

    /// Bytes per ns for buses and links.
    pub fn rate(&self) -> Option<f64> {
        match self {
            ResourceSpec::Bus { bus: Some(b), .. } => bus_rate(b).map(|x| x.0),
            ResourceSpec::Bus { width_bits: Some(w), clock_mhz: Some(c), .. } => Some(w.v / 8.0 * c.v * 1e6 / 1e9),
            ResourceSpec::Link { mbps } => Some(mbps.v * 1e6 / 8.0 / 1e9),
            _ => None,
        }
    }
}

/// A protocol stack: packetisation, credits and stages.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StackSpec {
    /// What this stack stands for.
    pub description: String,
    /// Largest packet the host hands to the NIC (bytes).
    pub mtu_bytes: Cited,
    /// Optional fixed segmentation below the MTU (e.g. GM's 4 KB).
    #[serde(default)]
    pub segment_bytes: Option<Cited>,
    /// Credit pools (e.g. the L2 descriptor queue of 000 §4.2).
    #[serde(default)]
    pub credits: Vec<CreditSpec>,
    /// Stages in the order a packet passes them.
    pub stages: Vec<StageSpec>,
    /// Stage whose end completes a message for latency/bandwidth (default:
    /// the last stage; later stages, e.g. acknowledgements, still run).
    #[serde(default)]
    pub complete_at: Option<String>,
}

/// A pool of `count` credits taken before stage `acquire_at` and returned after
/// stage `release_at` finishes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreditSpec {
    pub name: String,
    pub count: Cited,
    pub acquire_at: String,
    pub release_at: String,
    /// Count messages instead of packets (taken on a message's first packet,
    /// returned on its last).
    #[serde(default)]
    pub per_message: bool,
}

/// When a stage may start on a packet relative to the previous stage.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum StartRule {
    /// After the previous stage finished the whole packet (coarse-grained).
    #[default]
    Coarse,
    /// As soon as `threshold_bytes` have arrived (fine-grained, 000 §4.3).
    Fine,
    /// After the previous stage finished every segment of the message: a
    /// layer that works on whole messages above one that segments them (a
    /// host that posts one IP packet the NIC firmware cuts into segments,
    /// or that is told of it once all segments are in).
    Message,
}

/// A resource used by every chunk of a stage's per-byte work.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Use {
    /// One unit of the named resource.
    Name(String),
    /// Several units, and/or a transfer direction on a bus.
    Units {
        res: String,
        #[serde(default = "one")]
        units: u32,
        /// `to_nic` or `to_host`: on a full-duplex bus (PCI Express) the two
        /// directions are separate resources; on PCI/PCI-X they share one.
        #[serde(default)]
        dir: Option<String>,
    },
}

fn one() -> u32 {
    1
}

impl Use {
    pub fn res(&self) -> &str {
        match self {
            Use::Name(n) => n,
            Use::Units { res, .. } => res,
        }
    }
    pub fn units(&self) -> u32 {
        match self {
            Use::Name(_) => 1,
            Use::Units { units, .. } => *units,
        }
    }
    pub fn dir(&self) -> Option<&str> {
        match self {
            Use::Units { dir, .. } => dir.as_deref(),
            _ => None,
        }
    }
}

/// True for full-duplex bus parameter sets (PCI Express).
pub fn bus_duplex(name: &str) -> bool {
    name.starts_with("pcie")
}

impl ResourceSpec {
    /// A lock whose waiters spin on their CPU.
    pub fn spins(&self) -> bool {
        matches!(self, ResourceSpec::Lock { spin: Some(_) })
    }

    /// True when this is a full-duplex bus.
    pub fn duplex(&self) -> bool {
        matches!(self, ResourceSpec::Bus { bus: Some(b), .. } if bus_duplex(b))
    }
}

/// Per-byte cost of a stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PerByte {
    /// Explicit cost in ns per byte.
    Ns(Cited),
    /// Time at the rate of a bus or link resource.
    RateOf { rate_of: String },
    /// Cost in µs looked up by packet size (linear interpolation, extrapolated
    /// linearly from the last two points), e.g. 001 Tables 1 and 2.
    Table { table_us: Vec<(f64, f64)>, cite: String },
}

/// One stage of the per-packet pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// Unique stage name.
    pub name: String,
    /// Layer label for timelines (several stages may share one).
    pub layer: String,
    /// `"tx"` or `"rx"` (host side for the timeline).
    pub side: String,
    /// Per-packet overhead (µs), run on the `on` resources.
    #[serde(default)]
    pub per_packet_us: Option<Cited>,
    /// Resources the per-packet overhead occupies (e.g. a CPU, or CPU and bus for PIO).
    #[serde(default)]
    pub on: Vec<Use>,
    /// Overhead paid once per message (on its first packet, or its last when
    /// `per_message_at_end`), µs.
    #[serde(default)]
    pub per_message_us: Option<Cited>,
    /// Pay `per_message_us` on the message's last packet (e.g. acknowledgements).
    #[serde(default)]
    pub per_message_at_end: bool,
    /// Per-byte cost (absent: the stage moves no data).
    #[serde(default)]
    pub per_byte: Option<PerByte>,
    /// Resources each chunk of per-byte work occupies.
    #[serde(default, rename = "use")]
    pub uses: Vec<Use>,
    /// Chunk size (bytes) for the per-byte work; contention is resolved per chunk.
    #[serde(default)]
    pub chunk_bytes: Option<Cited>,
    /// Resources held for the whole stage (e.g. a lock serialising DMA engines).
    #[serde(default)]
    pub hold: Vec<String>,
    /// Coarse or fine start.
    #[serde(default)]
    pub start: StartRule,
    /// Fine-grained threshold t (bytes).
    #[serde(default)]
    pub threshold_bytes: Option<Cited>,
    /// Start-up overhead S of each per-byte operation (µs).
    #[serde(default)]
    pub startup_us: Option<Cited>,
    /// Extra bytes sent per packet (e.g. link headers).
    #[serde(default)]
    pub header_bytes: Option<Cited>,
    /// Scheduling priority on shared resources (higher first).
    #[serde(default)]
    pub priority: i32,
    /// Overhead runs after the per-byte work instead of before.
    #[serde(default)]
    pub overhead_after: bool,
    /// Pay `per_packet_us` only on every n-th segment of a message and on its
    /// last one (interrupt coalescing: a lone or final segment still interrupts).
    #[serde(default)]
    pub every_packets: Option<Cited>,
    /// The earlier stage whose progress gates this one (default: the stage
    /// just before it). Lets work that needs only part of the path run beside
    /// the rest, e.g. 003's send ack once a frame is classified.
    #[serde(default)]
    pub after: Option<After>,
}

/// A stage gated by an earlier stage than the one before it, with the
/// paper passage that places it there.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct After {
    pub stage: String,
    pub cite: String,
}

impl StageSpec {
    /// Per-byte time in ns for a packet of `b` bytes, using the preset's rates.
    pub fn per_byte_ns(&self, p: &Preset, b: f64) -> f64 {
        match &self.per_byte {
            None => 0.0,
            Some(PerByte::Ns(c)) => c.v,
            Some(PerByte::RateOf { rate_of }) => {
                p.resources.get(rate_of).and_then(|r| r.rate()).map(|r| 1.0 / r).unwrap_or(0.0)
            }
            Some(PerByte::Table { table_us, .. }) => {
                if b <= 0.0 {
                    0.0
                } else {
                    interp(table_us, b) * 1000.0 / b
                }
            }
        }
    }
    /// Per-packet overhead in ns.
    pub fn g_ns(&self) -> f64 {
        self.per_packet_us.as_ref().map(|c| c.v * 1000.0).unwrap_or(0.0)
    }
    /// Start-up overhead in ns.
    pub fn s_ns(&self) -> f64 {
        self.startup_us.as_ref().map(|c| c.v * 1000.0).unwrap_or(0.0)
    }
    /// Threshold in bytes (fine-grained).
    pub fn threshold(&self) -> f64 {
        self.threshold_bytes.as_ref().map(|c| c.v).unwrap_or(0.0)
    }
}

/// Piecewise-linear interpolation over (x, y) points sorted by x; linear
/// extrapolation beyond both ends.
pub fn interp(pts: &[(f64, f64)], x: f64) -> f64 {
    match pts.len() {
        0 => 0.0,
        1 => pts[0].1 * x / pts[0].0.max(1.0),
        _ => {
            let i = match pts.iter().position(|p| p.0 >= x) {
                Some(0) => 1,
                Some(i) => i,
                None => pts.len() - 1,
            };
            let (x0, y0) = pts[i - 1];
            let (x1, y1) = pts[i];
            let y = y0 + (y1 - y0) * (x - x0) / (x1 - x0);
            y.max(0.0)
        }
    }
}

/// Reads and validates a preset file.
pub fn load(path: &str) -> Result<Preset, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read preset {path}: {e}"))?;
    parse(&text).map_err(|e| format!("preset {path}: {e}"))
}

/// Parses and validates preset JSON text.
pub fn parse(text: &str) -> Result<Preset, String> {
    let p: Preset = serde_json::from_str(text).map_err(|e| format!("invalid preset JSON: {e}"))?;
    validate(&p)?;
    Ok(p)
}

/// Every cited value in the preset, with a dotted field path.
pub fn cited_values(p: &Preset) -> Vec<(String, Cited)> {
    let mut out = vec![("mbit_bits".to_string(), p.mbit_bits.clone())];
    for (n, r) in &p.resources {
        match r {
            ResourceSpec::Cpu { capacity } | ResourceSpec::Memory { capacity } => {
                out.push((format!("resources.{n}.capacity"), capacity.clone()))
            }
            ResourceSpec::Bus { width_bits, clock_mhz, bus, cite } => {
                if let Some(w) = width_bits {
                    out.push((format!("resources.{n}.width_bits"), w.clone()));
                }
                if let Some(c) = clock_mhz {
                    out.push((format!("resources.{n}.clock_mhz"), c.clone()));
                }
                if let Some(b) = bus {
                    let rate = bus_rate(b).map(|x| x.0).unwrap_or(f64::NAN);
                    out.push((
                        format!("resources.{n}.bus({b}) bytes/ns"),
                        Cited::new(rate, cite.as_deref().unwrap_or("")),
                    ));
                }
            }
            ResourceSpec::Link { mbps } => out.push((format!("resources.{n}.mbps"), mbps.clone())),
            ResourceSpec::Lock { spin: Some(c) } => out.push((format!("resources.{n}.spin"), Cited::new(1.0, c))),
            _ => {}
        }
    }
    for (sn, s) in &p.stacks {
        out.push((format!("stacks.{sn}.mtu_bytes"), s.mtu_bytes.clone()));
        if let Some(c) = &s.segment_bytes {
            out.push((format!("stacks.{sn}.segment_bytes"), c.clone()));
        }
        for c in &s.credits {
            out.push((format!("stacks.{sn}.credits.{}.count", c.name), c.count.clone()));
        }
        for st in &s.stages {
            let base = format!("stacks.{sn}.{}", st.name);
            let opt = [
                ("per_packet_us", &st.per_packet_us),
                ("per_message_us", &st.per_message_us),
                ("chunk_bytes", &st.chunk_bytes),
                ("threshold_bytes", &st.threshold_bytes),
                ("startup_us", &st.startup_us),
                ("header_bytes", &st.header_bytes),
                ("every_packets", &st.every_packets),
            ];
            for (f, c) in opt {
                if let Some(c) = c {
                    out.push((format!("{base}.{f}"), c.clone()));
                }
            }
            match &st.per_byte {
                Some(PerByte::Ns(c)) => out.push((format!("{base}.per_byte_ns"), c.clone())),
                Some(PerByte::Table { cite, table_us }) => out
                    .push((format!("{base}.per_byte.table_us[{} points]", table_us.len()), Cited::new(f64::NAN, cite))),
                _ => {}
            }
        }
    }
    out
}

fn validate(p: &Preset) -> Result<(), String> {
    for (field, c) in cited_values(p) {
        if c.v.is_nan() && !field.contains("table_us") {
            return Err(format!("{field}: unknown bus name (known: {})", BUS_NAMES.join(", ")));
        }
        if field.contains("table_us") {
            if c.cite.trim().is_empty() {
                return Err(format!("{field}: empty citation"));
            }
            continue;
        }
        check(&c, &field)?;
        if c.v < 0.0 {
            return Err(format!("{field}: negative value {}", c.v));
        }
    }
    if p.mbit_bits.v <= 0.0 {
        return Err("mbit_bits must be positive".into());
    }
    for (n, r) in &p.resources {
        if let ResourceSpec::Bus { .. } | ResourceSpec::Link { .. } = r {
            match r.rate() {
                Some(x) if x > 0.0 => {}
                _ => return Err(format!("resource {n}: bus needs a known `bus` name or width_bits and clock_mhz")),
            }
        }
    }
    if p.stacks.is_empty() {
        return Err("no stacks".into());
    }
    for (sn, s) in &p.stacks {
        if s.stages.is_empty() {
            return Err(format!("stack {sn}: no stages"));
        }
        if s.mtu_bytes.v < 1.0 {
            return Err(format!("stack {sn}: mtu_bytes must be >= 1"));
        }
        let mut names = std::collections::HashSet::new();
        for (i, st) in s.stages.iter().enumerate() {
            if !names.insert(st.name.as_str()) {
                return Err(format!("stack {sn}: duplicate stage name {}", st.name));
            }
            if let Some(a) = &st.after {
                if i == 0 || !s.stages[..i].iter().any(|x| x.name == a.stage) {
                    return Err(format!(
                        "stack {sn} stage {}: after must name an earlier stage, not {:?}",
                        st.name, a.stage
                    ));
                }
                if a.cite.trim().is_empty() {
                    return Err(format!("stack {sn} stage {}: after needs a citation", st.name));
                }
            }
            let all = st
                .on
                .iter()
                .map(|u| u.res().to_string())
                .chain(st.uses.iter().map(|u| u.res().to_string()))
                .chain(st.hold.iter().cloned());
            for r in all {
                if !p.resources.contains_key(&r) {
                    return Err(format!("stack {sn} stage {}: unknown resource {r}", st.name));
                }
            }
            for u in st.on.iter().chain(st.uses.iter()) {
                if let Some(d) = u.dir() {
                    if d != "to_nic" && d != "to_host" {
                        return Err(format!("stack {sn} stage {}: dir must be to_nic or to_host, not {d:?}", st.name));
                    }
                }
            }
            if let Some(PerByte::RateOf { rate_of }) = &st.per_byte {
                match p.resources.get(rate_of).and_then(|r| r.rate()) {
                    Some(_) => {}
                    None => {
                        return Err(format!("stack {sn} stage {}: rate_of {rate_of} is not a bus or link", st.name))
                    }
                }
            }
            if let Some(PerByte::Table { table_us, .. }) = &st.per_byte {
                if table_us.len() < 2 || table_us.windows(2).any(|w| w[0].0 >= w[1].0) {
                    return Err(format!("stack {sn} stage {}: table_us needs >= 2 points sorted by size", st.name));
                }
            }
            if st.side != "tx" && st.side != "rx" {
                return Err(format!("stack {sn} stage {}: side must be tx or rx", st.name));
            }
            if st.start == StartRule::Fine && st.threshold_bytes.is_none() {
                return Err(format!("stack {sn} stage {}: fine start needs threshold_bytes", st.name));
            }
        }
        if let Some(c) = &s.complete_at {
            if !names.contains(c.as_str()) {
                return Err(format!("stack {sn}: complete_at names unknown stage {c}"));
            }
        }
        for c in &s.credits {
            for at in [&c.acquire_at, &c.release_at] {
                if !names.contains(at.as_str()) {
                    return Err(format!("stack {sn} credit {}: unknown stage {at}", c.name));
                }
            }
            if c.count.v < 1.0 {
                return Err(format!("stack {sn} credit {}: count must be >= 1", c.name));
            }
        }
    }
    Ok(())
}

/// Directory holding the shipped presets (compile-time path of this crate).
pub fn presets_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets")
}

/// Resolves `000` / `000-myrinet` / a path to a preset file path.
pub fn resolve(name: &str) -> Result<String, String> {
    let p = std::path::Path::new(name);
    if p.exists() {
        return Ok(name.to_string());
    }
    let dir = presets_dir();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            if f.extension().and_then(|e| e.to_str()) == Some("json")
                && (stem == name || stem.starts_with(&format!("{name}-")))
            {
                return Ok(f.to_string_lossy().into_owned());
            }
        }
    }
    Err(format!("no preset file or shipped preset named {name:?} (see {})", dir.display()))
}

/// Replaces every bus by a named parameter set and/or every link rate.
pub fn apply_overrides(p: &mut Preset, bus: Option<&str>, link_mbps: Option<f64>) -> Result<(), String> {
    if let Some(b) = bus {
        if bus_rate(b).is_none() {
            return Err(format!("unknown bus {b:?} (known: {})", BUS_NAMES.join(", ")));
        }
        for r in p.resources.values_mut() {
            if let ResourceSpec::Bus { .. } = r {
                *r = ResourceSpec::Bus {
                    bus: Some(b.to_string()),
                    width_bits: None,
                    clock_mhz: None,
                    cite: Some("override".into()),
                };
            }
        }
    }
    if let Some(l) = link_mbps {
        if l.is_nan() || l <= 0.0 {
            return Err("--link-mbps must be positive".into());
        }
        for r in p.resources.values_mut() {
            if let ResourceSpec::Link { mbps } = r {
                mbps.v = l;
                mbps.cite = "override".into();
            }
        }
    }
    Ok(())
}
