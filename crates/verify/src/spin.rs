//! Driving spin, cc and pan, and reading what they print.

use crate::emp_model::EmpConfig;
use crate::models::{self, Broken, Expect, Mode, Model};
use eudp_engine::machine::PromelaConfig;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// What to check.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Models to check (`firmware`, `engine`, `emp`); empty means all.
    pub models: Vec<String>,
    /// Properties to check; empty means all of the chosen models.
    pub only: Vec<String>,
    /// A deliberately broken variant (only its model is checked).
    pub broken: Option<String>,
    /// Size of the engine model.
    pub engine: PromelaConfig,
    /// Size and impairments of the EMP model.
    pub emp: EmpConfig,
    /// Work here (kept) instead of in a temporary directory (removed).
    pub keep: Option<PathBuf>,
    /// Depth bound for the depth-first (liveness) searches.
    pub depth: u32,
    /// Check liveness without weak fairness (`./pan -a` without `-f`).
    pub no_fairness: bool,
}

/// The outcome of one pan run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No error found in a complete search.
    NoError,
    /// pan reported an error (assertion, claim, invalid end state, cycle).
    Error,
    /// The search did not complete (depth or memory bound hit) without error.
    Incomplete,
}

/// One property's result.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub model: &'static str,
    pub property: &'static str,
    pub meaning: &'static str,
    pub expect: Expect,
    pub verdict: Verdict,
    /// The verdict is what the expectation asks for.
    pub ok: bool,
    pub states: f64,
    pub depth: u64,
    pub seconds: f64,
    /// The kind of error pan reported, if any.
    pub error: Option<String>,
    /// Condensed `spin -t -p` replay of pan's trail, when there was one.
    pub trail: Option<String>,
}

impl Outcome {
    /// The verdict in the property's own terms.
    pub fn verdict_text(&self) -> &'static str {
        match (self.expect, self.verdict) {
            (_, Verdict::Incomplete) => "incomplete",
            (Expect::Holds, Verdict::NoError) => "holds",
            (Expect::Holds, Verdict::Error) => "VIOLATED",
            (Expect::Reachable, Verdict::Error) => "reachable",
            (Expect::Reachable, Verdict::NoError) => "UNREACHABLE",
        }
    }
}

/// Everything one [`run`] found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub outcomes: Vec<Outcome>,
    /// The broken variant checked, if any.
    pub broken: Option<&'static Broken>,
}

impl Report {
    /// True when every verdict is the expected one.
    pub fn all_ok(&self) -> bool {
        self.outcomes.iter().all(|o| o.ok)
    }

    /// The outcome of `property`.
    pub fn get(&self, property: &str) -> Option<&Outcome> {
        self.outcomes.iter().find(|o| o.property == property)
    }

    /// The verdict table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<9} {:<22} {:<10} {:<11} {:>4} {:>10} {:>6} {:>8}",
            "model", "property", "expect", "verdict", "", "states", "depth", "time"
        );
        for o in &self.outcomes {
            let expect = match o.expect {
                Expect::Holds => "holds",
                Expect::Reachable => "reachable",
            };
            let _ = writeln!(
                s,
                "{:<9} {:<22} {:<10} {:<11} {:>4} {:>10} {:>6} {:>7.2}s",
                o.model,
                o.property,
                expect,
                o.verdict_text(),
                if o.ok { "ok" } else { "FAIL" },
                o.states as u64,
                o.depth,
                o.seconds
            );
        }
        s
    }
}

/// Errors that stop a run before any verdict.
#[derive(Debug)]
pub enum Error {
    /// A tool is missing (spin, cc).
    Missing(String),
    /// A tool failed (model does not parse, pan.c does not compile, ...).
    Tool(String),
    /// Bad options.
    Usage(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Missing(s) | Error::Tool(s) | Error::Usage(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for Error {}

/// True when `spin` can be run.
pub fn spin_available() -> bool {
    Command::new("spin").arg("-V").output().map(|o| o.status.success()).unwrap_or(false)
}

/// The models `opts` asks for.
pub fn selected_models(opts: &Options) -> Result<Vec<Model>, Error> {
    let broken = match &opts.broken {
        Some(n) => {
            Some(models::broken(n).ok_or_else(|| Error::Usage(format!("unknown broken variant `{n}` (see --list)")))?)
        }
        None => None,
    };
    let want = |m: &str| {
        !matches!(broken, Some(b) if b.model != m) && (opts.models.is_empty() || opts.models.iter().any(|x| x == m))
    };
    for m in &opts.models {
        if m != "firmware" && m != "engine" && m != "emp" {
            return Err(Error::Usage(format!("unknown model `{m}` (firmware, engine, emp)")));
        }
    }
    let mut out = Vec::new();
    if want("firmware") {
        out.push(models::firmware(broken));
    }
    if want("engine") {
        out.push(models::engine(broken, &opts.engine));
    }
    if want("emp") {
        out.push(models::emp(broken, &opts.emp));
    }
    for p in &opts.only {
        if !out.iter().any(|m| m.properties.iter().any(|q| q.name == p)) {
            return Err(Error::Usage(format!("unknown property `{p}` (see --list)")));
        }
    }
    Ok(out)
}

/// Writes the models' Promela into `dir`; returns the paths written.
pub fn emit(opts: &Options, dir: &Path) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Tool(format!("{}: {e}", dir.display())))?;
    let mut paths = Vec::new();
    for m in selected_models(opts)? {
        let p = dir.join(m.file_name());
        std::fs::write(&p, &m.text).map_err(|e| Error::Tool(format!("{}: {e}", p.display())))?;
        paths.push(p);
    }
    Ok(paths)
}

fn tool(dir: &Path, prog: &str, args: &[&str]) -> Result<String, Error> {
    let out = Command::new(prog).args(args).current_dir(dir).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::Missing(format!("`{prog}` not found: install it (Debian: apt-get install spin gcc)"))
        } else {
            Error::Tool(format!("{prog}: {e}"))
        }
    })?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() && !prog.starts_with("./pan") {
        return Err(Error::Tool(format!("{prog} {} failed:\n{text}", args.join(" "))));
    }
    Ok(text)
}

/// The C compiler: `$CC` or `cc`.
fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

/// Compile-time flags for pan per mode.
pub fn cc_flags(mode: Mode) -> &'static [&'static str] {
    match mode {
        Mode::Safety => &["-DSAFETY", "-DBFS", "-DVECTORSZ=1024", "-DMEMLIM=2048"],
        Mode::EndState => &["-DSAFETY", "-DBFS", "-DNOCLAIM", "-DVECTORSZ=1024", "-DMEMLIM=2048"],
        Mode::Liveness => &["-DNFAIR=3", "-DVECTORSZ=1024", "-DMEMLIM=2048"],
    }
}

fn pan_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Safety => "pan_safety",
        Mode::EndState => "pan_endstate",
        Mode::Liveness => "pan_liveness",
    }
}

/// Numbers pan printed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PanStats {
    pub errors: u64,
    pub states: f64,
    pub depth: u64,
    pub seconds: f64,
    pub incomplete: bool,
    pub error: Option<String>,
}

fn number_before(text: &str, marker: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.contains(marker))?;
    line.split(marker).next()?.split_whitespace().last()?.parse().ok()
}

fn number_after(text: &str, marker: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.contains(marker))?;
    let rest = line.split(marker).nth(1)?;
    rest.split(|c: char| c == ',' || c.is_whitespace()).find(|w| !w.is_empty())?.parse().ok()
}

/// Reads pan's report.
pub fn parse_pan(text: &str) -> PanStats {
    let errors = number_after(text, "errors:").unwrap_or(0.0) as u64;
    let error = [
        "assertion violated",
        "invalid end state",
        "acceptance cycle",
        "non-progress cycle",
        "claim violated",
        "out of memory",
    ]
    .iter()
    .find_map(|k| {
        let line = text.lines().find(|l| l.starts_with("pan:") && l.contains(*k))?;
        let at = line.rfind("(at depth").map_or("", |i| &line[i..]);
        Some(format!("{k} {at}").trim_end().to_string())
    });
    PanStats {
        errors,
        states: number_before(text, "states, stored").unwrap_or(0.0),
        depth: number_after(text, "depth reached").unwrap_or(0.0) as u64,
        seconds: number_after(text, "elapsed time").unwrap_or(0.0),
        incomplete: text.contains("max search depth too small") || text.contains("out of memory"),
        error: if errors > 0 { error } else { None },
    }
}

/// Condenses `spin -t -p` output. The models print one `@@ ` line per step
/// (`printf`); when there are such lines only they are kept, else one line
/// per step of `spin -t -p` (atomic sequences joined). Then the cycle marker,
/// the failed assertion and the final values of the globals. Only the last
/// `max` steps are shown.
pub fn condense_trail(text: &str, max: usize) -> String {
    let printed = text.lines().any(|l| l.trim_start().starts_with("@@ "));
    let mut steps: Vec<String> = Vec::new();
    let mut last_step = String::new();
    let mut tail: Vec<String> = Vec::new();
    let mut finals: Vec<String> = Vec::new();
    let mut in_final = false;
    for line in text.lines() {
        let t = line.trim();
        if t.contains("START OF CYCLE") {
            steps.push("---- start of cycle: what follows repeats forever ----".to_string());
            continue;
        }
        if t.starts_with("spin: text of failed assertion") {
            tail.push(t.to_string());
            continue;
        }
        if t.starts_with("#processes") {
            in_final = true;
            continue;
        }
        if in_final {
            if t.contains(" = ") && !t.contains("proc ") {
                finals.push(t.replace(" = ", "="));
            }
            continue;
        }
        if printed {
            if let Some(rest) = t.strip_prefix("@@ ") {
                steps.push(rest.to_string());
            }
            continue;
        }
        // "  12:\tproc  2 (SDMA:1) firmware.pml:92 (state 5)\t[hdma = 1]"
        let Some((num, rest)) = t.split_once(":\tproc").or_else(|| t.split_once(": proc")) else { continue };
        let Some(who) = rest.split_whitespace().next().zip(rest.split('(').nth(1).and_then(|s| s.split(':').next()))
        else {
            continue;
        };
        let stmt = match (rest.find('['), rest.rfind(']')) {
            (Some(a), Some(b)) if b > a => &rest[a + 1..b],
            _ => continue,
        };
        if stmt.starts_with("goto ") || stmt == "(1)" || stmt == "else" || stmt == "break" {
            continue;
        }
        let key = format!("{num}/{}", who.0);
        if key == last_step {
            if let Some(l) = steps.last_mut() {
                l.push_str("; ");
                l.push_str(stmt);
                continue;
            }
        }
        last_step = key;
        steps.push(format!("{:<10} {stmt}", format!("{}:{}", who.1, who.0)));
    }
    let skipped = steps.len().saturating_sub(max);
    let mut out = String::new();
    if skipped > 0 {
        let _ = writeln!(out, "    ... {skipped} earlier steps ...");
    }
    for s in steps.iter().skip(skipped) {
        let _ = writeln!(out, "    {s}");
    }
    for t in tail {
        let _ = writeln!(out, "    {t}");
    }
    if !finals.is_empty() {
        let mut line = String::from("    final:");
        for f in finals {
            if line.len() + f.len() > 100 {
                let _ = writeln!(out, "{line}");
                line = String::from("          ");
            }
            line.push(' ');
            line.push_str(&f);
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

fn work_dir(opts: &Options) -> Result<(PathBuf, bool), Error> {
    if let Some(k) = &opts.keep {
        std::fs::create_dir_all(k).map_err(|e| Error::Tool(format!("{}: {e}", k.display())))?;
        return Ok((k.clone(), false));
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let d = std::env::temp_dir().join(format!("eudp-verify-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(|e| Error::Tool(format!("{}: {e}", d.display())))?;
    Ok((d, true))
}

/// Checks the selected properties; `progress` is called after each one.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&Outcome)) -> Result<Report, Error> {
    let models = selected_models(opts)?;
    if !spin_available() {
        return Err(Error::Missing("`spin` not found: install it (Debian: apt-get install spin)".into()));
    }
    let (root, remove) = work_dir(opts)?;
    let result = run_in(&root, opts, &models, progress);
    if remove {
        let _ = std::fs::remove_dir_all(&root);
    }
    let mut report = result?;
    report.broken = opts.broken.as_deref().and_then(models::broken);
    Ok(report)
}

fn run_in(root: &Path, opts: &Options, models: &[Model], progress: &mut dyn FnMut(&Outcome)) -> Result<Report, Error> {
    let mut report = Report::default();
    let depth = if opts.depth == 0 { 1_000_000 } else { opts.depth };
    for m in models {
        let dir = root.join(m.name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::Tool(format!("{}: {e}", dir.display())))?;
        let file = m.file_name();
        std::fs::write(dir.join(&file), &m.text).map_err(|e| Error::Tool(format!("{file}: {e}")))?;
        let props: Vec<_> =
            m.properties.iter().filter(|p| opts.only.is_empty() || opts.only.iter().any(|o| o == p.name)).collect();
        if props.is_empty() {
            continue;
        }
        tool(&dir, "spin", &["-a", &file])?;
        let mut built: Vec<Mode> = Vec::new();
        for p in props {
            let pan = pan_name(p.mode);
            if !built.contains(&p.mode) {
                let mut args: Vec<&str> = vec!["-O1", "-w", "-o", pan];
                args.extend_from_slice(cc_flags(p.mode));
                args.push("pan.c");
                tool(&dir, &cc(), &args)?;
                built.push(p.mode);
            }
            let depth_arg = format!("-m{depth}");
            let mut args: Vec<&str> = vec!["-w22"];
            if p.mode == Mode::Liveness {
                args.extend_from_slice(&["-a", &depth_arg]);
                if !opts.no_fairness {
                    args.push("-f");
                }
            }
            if p.mode != Mode::EndState {
                args.extend_from_slice(&["-N", p.name]);
            }
            let trail_file = dir.join(format!("{file}.trail"));
            let _ = std::fs::remove_file(&trail_file);
            let started = Instant::now();
            let text = tool(&dir, &format!("./{pan}"), &args)?;
            let wall = started.elapsed().as_secs_f64();
            std::fs::write(dir.join(format!("{}.out", p.name)), &text).map_err(|e| Error::Tool(e.to_string()))?;
            let st = parse_pan(&text);
            if !text.contains("errors:") {
                return Err(Error::Tool(format!("./{pan} {} printed no verdict:\n{text}", args.join(" "))));
            }
            let verdict = if st.errors > 0 {
                Verdict::Error
            } else if st.incomplete {
                Verdict::Incomplete
            } else {
                Verdict::NoError
            };
            let ok =
                matches!((p.expect, verdict), (Expect::Holds, Verdict::NoError) | (Expect::Reachable, Verdict::Error));
            let trail = if trail_file.exists() {
                let replay = tool(&dir, "spin", &["-t", "-p", &file])?;
                std::fs::rename(&trail_file, dir.join(format!("{}.trail", p.name))).ok();
                Some(condense_trail(&replay, 60))
            } else {
                None
            };
            let o = Outcome {
                model: m.name,
                property: p.name,
                meaning: p.meaning,
                expect: p.expect,
                verdict,
                ok,
                states: st.states,
                depth: st.depth,
                seconds: if st.seconds > 0.0 { st.seconds } else { wall },
                error: st.error,
                trail,
            };
            progress(&o);
            report.outcomes.push(o);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pan_report() {
        let text = "pan:1: assertion violated  !( !( !((x==2)))) (at depth 14)\n\
                    State-vector 36 byte, depth reached 14, errors: 1\n\
                    \x20  1.23457e+06 states, stored\npan: elapsed time 0.43 seconds\n";
        let st = parse_pan(text);
        assert_eq!(st.errors, 1);
        assert_eq!(st.depth, 14);
        assert_eq!(st.states, 1.23457e+06);
        assert_eq!(st.seconds, 0.43);
        assert_eq!(st.error.as_deref(), Some("assertion violated (at depth 14)"));
        assert!(!st.incomplete);
    }

    #[test]
    fn condenses_trail() {
        let text = "starting claim 2\n  2:\tproc  0 (p:1) t.pml:3 (state 1)\t[w = 0]\n\
                    \x20 4:\tproc  0 (p:1) t.pml:3 (state 4)\t[goto :b0]\n\
                    \x20 6:\tproc  1 (q:1) t.pml:3 (state 8)\t[((x<3))]\n\
                    \x20 8:\tproc  1 (q:1) t.pml:3 (state 9)\t[x = (x+1)]\n\
                    spin: text of failed assertion: assert(!(x==2))\n#processes: 1\n\t\tx = 2\n";
        let c = condense_trail(text, 10);
        assert_eq!(
            c,
            "    p:0        w = 0\n    q:1        ((x<3))\n    q:1        x = (x+1)\n    \
             spin: text of failed assertion: assert(!(x==2))\n    final: x=2\n"
        );
        let printed = "  1:\tproc  0 (p:1) t.pml:3 (state 1)\t[w = 0]\n      @@ app0 DirectPost #0\n\
                       <<<<<START OF CYCLE>>>>>\n      @@ engine stops\n";
        assert_eq!(condense_trail(printed, 1), "    ... 2 earlier steps ...\n    engine stops\n");
    }
}
