//! The workspace's shape, checked on every test run: no import loops among
//! the modules of a crate, `unsafe` only where raw calls are the module's
//! job, and no source file past ~1,000 lines without a stated reason.
//!
//! The module graph is read from the source text (no compiler needed): a
//! module depends on every module that a `use` or an inline `crate::`,
//! `super::` or `self::` path names. A path resolves to the longest module
//! prefix it names, so `use crate::sys::epoll::Epoll` is an edge to
//! `sys::epoll`. `pub use` lines are a facade, not a dependency, and are
//! skipped; so is the crate root, which only declares and re-exports.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// `(crate dir name, src dir)` for every workspace crate.
fn crates() -> Vec<(String, PathBuf)> {
    let mut v: Vec<_> = fs::read_dir(workspace().join("crates"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("src").is_dir())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p.join("src")))
        .collect();
    v.sort();
    v
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap().filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Module path of a file below `src` (`a/b.rs` and `a/b/mod.rs` → `a::b`; the crate root → "").
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") || !parts.is_empty() && stem != "mod" {
        parts.push(stem.to_string());
    }
    if parts.first().is_some_and(|p| p == "bin") {
        return format!("bin::{}", parts[1..].join("::"));
    }
    parts.join("::")
}

/// Source without comments and string literals, so that paths in prose or text do not count.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' && (i == 0 || b[i - 1] != b'\'') {
            // A raw string's hashes are not tracked: the project's raw strings hold no quotes.
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Expands a use tree (`a::{b, c::{self, d}}`) into full paths.
fn expand_use(tree: &str) -> Vec<String> {
    // `a as b` names `a`: mark the rename before white space goes.
    let tree = tree.split_whitespace().collect::<Vec<_>>().join(" ").replace(" as ", "@");
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    fn go(prefix: &str, t: &str, out: &mut Vec<String>) {
        if let Some(open) = t.find('{') {
            let head = &t[..open];
            let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&format!("{prefix}{head}"), &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&format!("{prefix}{head}"), &inner[start..], out);
        } else if !t.is_empty() {
            let t = t.split('@').next().unwrap_or(t);
            let t = t.strip_suffix("::self").unwrap_or(t);
            let t = if t == "self" { prefix.trim_end_matches("::") } else { t };
            if t.starts_with(prefix) || prefix.is_empty() {
                out.push(t.to_string());
            } else {
                out.push(format!("{prefix}{t}"));
            }
        }
    }
    let mut out = Vec::new();
    go("", &tree, &mut out);
    out
}

/// A path as written in `module`, made absolute (`crate::…`), or None when it leaves the crate.
/// Inside `a/b.rs` and `a/b/mod.rs` alike, `self` is `a::b` and `super` is `a`.
fn absolute(module: &str, path: &str) -> Option<Vec<String>> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut here: Vec<String> = module.split("::").filter(|s| !s.is_empty()).map(String::from).collect();
    let mut i = 0;
    match *segs.first()? {
        "crate" => {
            here.clear();
            i = 1;
        }
        "self" => i = 1,
        "super" => {
            while segs.get(i) == Some(&"super") {
                here.pop()?;
                i += 1;
            }
        }
        _ => return None,
    }
    here.extend(segs[i..].iter().map(|s| s.to_string()));
    Some(here)
}

fn resolve(modules: &BTreeSet<String>, path: &[String]) -> Option<String> {
    (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|p| modules.contains(p))
}

/// Module → the modules it uses (crate root and facades left out).
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> =
        files.iter().map(|f| module_of(src, f)).filter(|m| !m.is_empty() && !m.starts_with("bin::")).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = module_of(src, f);
        if m.is_empty() || m.starts_with("bin::") {
            continue;
        }
        let text = fs::read_to_string(f).unwrap();
        // A `mod tests` inside the file has its own `super`: leave it out.
        let code = code_only(text.split("\n#[cfg(test)]\nmod ").next().unwrap_or(&text));
        let mut paths = Vec::new();
        // `use` items (not `pub use`: a re-export is a facade).
        for stmt in code.split(';') {
            let found = stmt.match_indices("use ").map(|(pos, _)| pos).find(|&pos| {
                let before = &stmt[..pos];
                let start = before.rsplit(['\n', '{', '}', ']']).next().unwrap_or("");
                start.trim().is_empty() && !before.ends_with(|c: char| c.is_alphanumeric() || c == '_')
            });
            if let Some(pos) = found {
                paths.extend(expand_use(&stmt[pos + 4..]));
            }
        }
        // Inline paths.
        for start in ["crate::", "super::", "self::"] {
            for (i, _) in code.match_indices(start) {
                if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let end = code[i..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .map(|e| i + e)
                    .unwrap_or(code.len());
                paths.push(code[i..end].trim_end_matches(':').to_string());
            }
        }
        let deps = g.entry(m.clone()).or_default();
        for p in paths {
            if let Some(abs) = absolute(&m, &p) {
                if let Some(t) = resolve(&modules, &abs) {
                    // A module may always name its own descendants: that is declaration, not a loop.
                    if t != m && !t.starts_with(&format!("{m}::")) {
                        deps.insert(t);
                    }
                }
            }
        }
    }
    g
}

/// Strongly connected components with more than one module (Tarjan).
fn loops(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[w].min(t.low[v]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.index[w].min(t.low[v]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_import_loops_among_a_crates_modules() {
    let mut found = Vec::new();
    for (name, src) in crates() {
        for comp in loops(&graph(&src)) {
            found.push(format!("{name}: {}", comp.join(" ↔ ")));
        }
    }
    assert!(found.is_empty(), "import loops (modules that use each other):\n{}", found.join("\n"));
}

/// Files whose job is raw calls, besides `sys` modules. Each entry says why.
const UNSAFE_HOMES: &[(&str, &str)] = &[
    ("preload/src/hooks/", "the shim's extern \"C\" entry points, called by the host program with raw pointers"),
    ("preload/src/real.rs", "the libc functions the shim wraps, found with dlsym"),
    ("capi/src/", "the C ABI: every function takes raw pointers from C callers"),
];

fn allowed_unsafe(rel: &str) -> bool {
    rel.contains("/sys/") || rel.ends_with("/sys.rs") || UNSAFE_HOMES.iter().any(|(p, _)| rel.starts_with(p))
}

#[test]
fn unsafe_lives_in_sys_modules_and_entry_points() {
    let mut found = Vec::new();
    for (name, src) in crates() {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let rel = format!("{name}/src/{}", f.strip_prefix(&src).unwrap().display());
            let code = code_only(&fs::read_to_string(&f).unwrap());
            let uses = code.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|w| w == "unsafe");
            if uses && !allowed_unsafe(&rel) {
                found.push(rel);
            }
        }
    }
    assert!(found.is_empty(), "`unsafe` outside sys modules and entry points:\n{}", found.join("\n"));
}

/// Longest a non-test source file may grow before it must state why it is one file.
const MAX_LINES: usize = 1_000;

#[test]
fn source_files_stay_small_or_say_why() {
    let mut found = Vec::new();
    for (name, src) in crates() {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let text = fs::read_to_string(&f).unwrap();
            // Unit tests at the end of a file do not count against its size.
            let body = text.split("\n#[cfg(test)]").next().unwrap_or(&text);
            let n = body.lines().count();
            let reason = text.lines().take(40).any(|l| l.contains("one file because"));
            if n > MAX_LINES && !reason {
                found.push(format!("{name}/src/{} ({n} lines)", f.strip_prefix(&src).unwrap().display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "files over {MAX_LINES} lines with no \"one file because …\" in their header:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_a_loop() {
    let dir = std::env::temp_dir().join(format!("eudp-arch-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub use a::X;\n").unwrap();
    fs::write(src.join("a/mod.rs"), "pub mod inner;\nuse crate::b::{self, Y};\npub struct X;\n").unwrap();
    fs::write(src.join("a/inner.rs"), "use super::X as Renamed; // a child naming its parent\n").unwrap();
    fs::write(src.join("b.rs"), "pub struct Y;\nfn f() { let _ = crate::a::inner::g; }\n// crate::c::d\n").unwrap();
    let g = graph(&src);
    let l = loops(&g);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(g["a::inner"], BTreeSet::from(["a".to_string()]));
    assert_eq!(l, vec![vec!["a".to_string(), "a::inner".to_string(), "b".to_string()]]);
    assert!(!allowed_unsafe("engine/src/endpoint.rs"));
    assert!(allowed_unsafe("engine/src/sys/epoll.rs") && allowed_unsafe("engine/src/backend/xdp/sys.rs"));
}
