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
}

impl Row {
    /// Relative error (Within10 rows).
    pub fn error(&self) -> f64 {
        (self.simulated - self.published) / self.published
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
    Row { id, source, what: what.to_string(), published, simulated, unit, check: Check::Within10 }
}

/// A row for a qualitative statement.
pub fn holds(id: &'static str, source: &'static str, what: String, ok: bool) -> Row {
    Row { id, source, what, published: 1.0, simulated: if ok { 1.0 } else { 0.0 }, unit: "", check: Check::Holds }
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
            "{:<20} {:<22} {:>10} {:>10} {:>8} {:<5} {} [{}]\n",
            r.id,
            r.source,
            p,
            m,
            e,
            if r.pass() { "PASS" } else { "MISS" },
            r.what,
            r.unit
        ));
    }
    let pass = rows.iter().filter(|r| r.pass()).count();
    s.push_str(&format!("{pass}/{} within tolerance\n", rows.len()));
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
        "| id | source | figure | published | simulated | error | ±10% |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (p, m, e) = fmt_row(r);
        let unit = if r.unit.is_empty() { String::new() } else { format!(" ({})", r.unit) };
        s.push_str(&format!(
            "| {} | {} | {}{} | {} | {} | {} | {} |\n",
            r.id,
            r.source,
            r.what,
            unit,
            p,
            m,
            e,
            if r.pass() { "pass" } else { "**miss**" }
        ));
    }
    s
}
