//! One line of the published-vs-simulated table and its text and Markdown
//! renderings.

/// How a row is judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    /// |simulated − published| ≤ 10 % of published.
    Within10,
    /// A qualitative statement of the paper; `simulated` is 1 when it holds.
    Holds,
}

/// What a row shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Basis {
    /// The simulation reproduces a published result from per-operation
    /// inputs that do not contain it.
    Reproduction,
    /// The compared value is (or follows directly from) the preset's own
    /// inputs, so the row checks the inputs, not the model; the reason says
    /// which inputs. Counted apart from reproductions.
    InputCheck(&'static str),
}

/// One line of the published-vs-simulated table.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: &'static str,
    pub source: &'static str,
    pub what: String,
    pub published: f64,
    pub simulated: f64,
    pub unit: &'static str,
    pub check: Check,
    pub basis: Basis,
}

impl Row {
    /// Relative error (Within10 rows).
    pub fn error(&self) -> f64 {
        (self.simulated - self.published) / self.published
    }
    /// Marks the row as a check of inputs (`why`: which inputs it compares
    /// with themselves).
    pub fn of_inputs(mut self, why: &'static str) -> Row {
        self.basis = Basis::InputCheck(why);
        self
    }
    /// Whether the row reproduces a result rather than checking inputs.
    pub fn reproduces(&self) -> bool {
        self.basis == Basis::Reproduction
    }
    /// Whether the row meets its check.
    pub fn pass(&self) -> bool {
        match self.check {
            Check::Within10 => self.simulated.is_finite() && self.error().abs() <= 0.10,
            Check::Holds => self.simulated == 1.0,
        }
    }
}
/// A row judged within ±10 %.
pub fn row(
    id: &'static str,
    source: &'static str,
    what: &str,
    published: f64,
    simulated: f64,
    unit: &'static str,
) -> Row {
    Row {
        id,
        source,
        what: what.to_string(),
        published,
        simulated,
        unit,
        check: Check::Within10,
        basis: Basis::Reproduction,
    }
}

/// A row for a qualitative statement.
pub fn holds(id: &'static str, source: &'static str, what: String, ok: bool) -> Row {
    let simulated = if ok { 1.0 } else { 0.0 };
    Row { id, source, what, published: 1.0, simulated, unit: "", check: Check::Holds, basis: Basis::Reproduction }
}

/// The count line: reproductions that pass, and checks of inputs apart.
pub fn summary(rows: &[Row]) -> String {
    let count = |repro: bool| {
        let of: Vec<&Row> = rows.iter().filter(|r| r.reproduces() == repro).collect();
        (of.iter().filter(|r| r.pass()).count(), of.len())
    };
    let ((rp, rn), (ip, inp)) = (count(true), count(false));
    format!(
        "{rp}/{rn} reproductions within tolerance; {ip}/{inp} checks of inputs hold (not reproductions, counted apart)"
    )
}
/// Plain-text table.
pub fn text(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<20} {:<22} {:>10} {:>10} {:>8} {:<5} {}\n",
        "id", "source", "published", "simulated", "error", "ok", "what"
    );
    for r in rows {
        let (p, m, e) = fmt_row(r);
        s.push_str(&format!(
            "{:<20} {:<22} {:>10} {:>10} {:>8} {:<5} {} [{}]{}\n",
            r.id,
            r.source,
            p,
            m,
            e,
            if r.pass() { "PASS" } else { "MISS" },
            r.what,
            r.unit,
            match r.basis {
                Basis::Reproduction => String::new(),
                Basis::InputCheck(why) => format!(" (check of inputs: {why})"),
            }
        ));
    }
    s.push_str(&summary(rows));
    s.push('\n');
    s
}

fn fmt_row(r: &Row) -> (String, String, String) {
    match r.check {
        Check::Within10 => (
            format!("{:.3}", r.published).trim_end_matches('0').trim_end_matches('.').to_string(),
            format!("{:.2}", r.simulated),
            format!("{:+.1}%", r.error() * 100.0),
        ),
        Check::Holds => ("holds".into(), if r.pass() { "holds".into() } else { "fails".into() }, "".into()),
    }
}

/// Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| id | source | figure | published | simulated | error | ±10% | kind |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (p, m, e) = fmt_row(r);
        let unit = if r.unit.is_empty() { String::new() } else { format!(" ({})", r.unit) };
        s.push_str(&format!(
            "| {} | {} | {}{} | {} | {} | {} | {} | {} |\n",
            r.id,
            r.source,
            r.what,
            unit,
            p,
            m,
            e,
            if r.pass() { "pass" } else { "**miss**" },
            match r.basis {
                Basis::Reproduction => "reproduction".to_string(),
                Basis::InputCheck(why) => format!("check of inputs: {why}"),
            }
        ));
    }
    s.push('\n');
    s.push_str(&summary(rows));
    s.push('\n');
    s
}
