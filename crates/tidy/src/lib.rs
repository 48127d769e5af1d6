//! settle-tidy: the rules of ARCHITECTURE.md that a reader cannot check at a glance, as
//! functions over the source tree (no dependency, no build), run by `tests/tidy.rs` on the
//! workspace like every other test:
//!
//! - [`long_files`]: no non-test source file passes [`MAX_LINES`] lines before its unit
//!   tests (the first `#[cfg(test)]` line);
//! - [`module_circles`]: no two modules of one crate import each other, directly or in a
//!   loop (a module's ancestors and descendants do not count: a child uses its parent,
//!   a parent declares its children);
//! - [`layering`]: a crate depends only on the crates its row of [`LAYERS`] allows.
//!
//! Imports are read from the text: paths starting `crate::` or `super::` (in `use`
//! trees, braces expanded, and inline), with comments, strings and the code after
//! `#[cfg(test)]` left out, resolved to the longest prefix that names a module of the
//! crate.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The most lines a source file may have before its unit tests.
pub const MAX_LINES: usize = 800;

/// Which `settle-*` crates each crate may depend on (`[dependencies]`, not dev): the
/// layering ARCHITECTURE.md states. A crate missing from the table may depend on none.
pub const LAYERS: &[(&str, &[&str])] = &[
    ("settle-core", &[]),
    ("settle-store", &["settle-core"]),
    ("settle-api", &["settle-core", "settle-store"]),
    ("settle-engine", &["settle-core", "settle-store"]),
    ("settle-client", &["settle-api"]),
    ("settle-builtin", &["settle-core", "settle-store", "settle-engine"]),
    ("settle-sim", &["settle-core", "settle-store", "settle-engine", "settle-builtin"]),
    ("settle-server", &["settle-core", "settle-store", "settle-engine", "settle-api"]),
    (
        "settle-cli",
        &[
            "settle-core",
            "settle-store",
            "settle-engine",
            "settle-api",
            "settle-client",
            "settle-server",
            "settle-builtin",
            "settle-sim",
        ],
    ),
    ("settle", &["settle-core", "settle-store", "settle-engine", "settle-client", "settle-server"]),
    ("settle-fuzz", &["settle-core", "settle-store", "settle-engine", "settle-server"]),
    ("settle-tidy", &[]),
];

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The lines of `text` before its first `#[cfg(test)]` line.
fn before_tests(text: &str) -> impl Iterator<Item = &str> {
    text.lines().take_while(|l| l.trim() != "#[cfg(test)]")
}

/// Source files of the crates under `crates` (each crate's `src/`) with more than `limit`
/// lines before their unit tests, as `path: N lines`. Test files (`tests.rs`, and those a
/// parent declares under `#[cfg(test)]`) are left out.
pub fn long_files(crates: &Path, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    for krate in crate_dirs(crates) {
        let src = krate.join("src");
        let tests = test_modules(&src);
        for file in rust_files(&src) {
            if tests.iter().any(|t| file.starts_with(t) || *t == file) || file.ends_with("tests.rs") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&file) else { continue };
            let n = before_tests(&text).count();
            if n > limit {
                out.push(format!("{}: {n} lines before its tests (at most {limit})", rel(crates, &file)));
            }
        }
    }
    out
}

fn rel(base: &Path, p: &Path) -> String {
    p.strip_prefix(base).unwrap_or(p).display().to_string()
}

/// The crate directories under `crates` (those with a `Cargo.toml`), sorted.
fn crate_dirs(crates: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(crates)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// The files and directories of modules declared under `#[cfg(test)]` in `src`.
fn test_modules(src: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for file in rust_files(src) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let dir = module_dir(&file);
        let mut lines = text.lines().map(str::trim).peekable();
        while let Some(line) = lines.next() {
            if line != "#[cfg(test)]" {
                continue;
            }
            let Some(next) = lines.peek() else { break };
            let decl = next.strip_prefix("pub(crate) ").or_else(|| next.strip_prefix("pub ")).unwrap_or(next);
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.push(dir.join(format!("{name}.rs")));
                out.push(dir.join(name));
            }
        }
    }
    out
}

/// The directory a file's child modules live in: `a/` for `a/mod.rs`, `lib.rs` and
/// `main.rs` (their own directory), `a/b/` for `a/b.rs`.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new("")).to_path_buf();
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") => parent,
        Some(stem) => parent.join(stem),
        None => parent,
    }
}

/// A crate's modules by path (`a::b`; the root is ``), each with its file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let tests = test_modules(src);
    let mut out = BTreeMap::new();
    for file in rust_files(src) {
        if tests.iter().any(|t| file.starts_with(t) || *t == file) {
            continue;
        }
        let rel = file.strip_prefix(src).unwrap_or(&file);
        let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        let last = parts.pop().unwrap_or_default();
        let stem = last.trim_end_matches(".rs");
        if !(parts.is_empty() && (stem == "lib" || stem == "main")) && stem != "mod" {
            parts.push(stem.to_string());
        }
        // A binary's other roots (`src/bin/x.rs`) are crates of their own: left out.
        if parts.first().is_some_and(|p| p == "bin") {
            continue;
        }
        out.insert(parts.join("::"), file);
    }
    out
}

/// `text` without comments, string and character literals (replaced by spaces).
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && !ident_byte(b.get(i.wrapping_sub(1))) {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push(' ');
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3;
            out.push(' ');
        } else if c == b'\'' && b.get(i + 1) == Some(&b'\\') {
            while i < b.len() && !(b[i] == b'\'' && i > 0 && b[i - 1] != b'\\' && b[i - 1] != b'\'') {
                i += 1;
            }
            i += 1;
            out.push(' ');
        } else {
            // Keep non-ASCII text whole (it cannot start a path).
            let ch = text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn ident_byte(b: Option<&u8>) -> bool {
    b.is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// The paths `text` names from `crate::` or `super::` (`super::super::x` keeps its
/// supers), brace groups expanded: each as its segments, `super` kept as a segment.
fn paths(text: &str) -> Vec<Vec<String>> {
    let code = strip(text);
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = |w: &str| code[i..].starts_with(w) && !ident_byte(b.get(i.wrapping_sub(1)));
        if (starts("crate::") || starts("super::")) && (i == 0 || b[i - 1] != b':') {
            let (found, end) = path_tree(&code, i);
            out.extend(found);
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads the path (tree) at `start`: its expanded paths and where it ends.
fn path_tree(code: &str, start: usize) -> (Vec<Vec<String>>, usize) {
    let b = code.as_bytes();
    let mut i = start;
    let mut prefix = Vec::new();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b.get(i) == Some(&b'{') {
            // A group: `{a::b, c, d::{e, f}}`.
            let mut all = Vec::new();
            i += 1;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    i += 1;
                    break;
                }
                let (inner, end) = path_tree(code, i);
                for p in inner {
                    let mut full = prefix.clone();
                    full.extend(p);
                    all.push(full);
                }
                if end <= i {
                    i += 1;
                } else {
                    i = end;
                }
            }
            return (all, i);
        }
        let s = i;
        while i < b.len() && ident_byte(b.get(i)) {
            i += 1;
        }
        if i == s {
            // `*` or something else: the path ends before it.
            if b.get(i) == Some(&b'*') {
                i += 1;
            }
            return (vec![prefix], i);
        }
        prefix.push(code[s..i].to_string());
        if code[i..].starts_with("::") {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// Resolves `path` named in module `from` to the module it reaches: the longest prefix
/// (after `crate` or `super`s) that is a module of `known`.
fn resolve(from: &str, path: &[String], known: &BTreeMap<String, PathBuf>) -> Option<String> {
    let mut base: Vec<&str> = if from.is_empty() { Vec::new() } else { from.split("::").collect() };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let mut best = base.join("::");
    let mut cur: Vec<&str> = base.clone();
    for seg in rest {
        cur.push(seg);
        let name = cur.join("::");
        if known.contains_key(&name) {
            best = name;
        } else {
            break;
        }
    }
    Some(best)
}

/// Whether `a` is `b`, or an ancestor or descendant of it.
fn related(a: &str, b: &str) -> bool {
    let within =
        |inner: &str, outer: &str| outer.is_empty() || inner == outer || inner.starts_with(&format!("{outer}::"));
    within(a, b) || within(b, a)
}

/// The import edges between the modules of the crate whose sources are in `src`.
pub fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let known = modules(src);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &known {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        let code: Vec<&str> = before_tests(&text).collect();
        for path in paths(&code.join("\n")) {
            if let Some(to) = resolve(module, &path, &known)
                && !related(module, &to)
            {
                edges.entry(module.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// The circles among the modules of the crate whose sources are in `src`: each as the
/// modules of one strongly connected set, sorted.
pub fn module_circles(src: &Path) -> Vec<Vec<String>> {
    let edges = imports(src);
    let nodes: BTreeSet<&String> = edges.keys().chain(edges.values().flatten()).collect();
    let nodes: Vec<&String> = nodes.into_iter().collect();
    let index: HashMap<&String, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let adj: Vec<Vec<usize>> =
        nodes.iter().map(|n| edges.get(*n).into_iter().flatten().map(|t| index[t]).collect()).collect();
    // Tarjan's strongly connected components.
    struct State {
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(v: usize, adj: &[Vec<usize>], s: &mut State) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in &adj[v] {
            match s.index[w] {
                None => {
                    visit(w, adj, s);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(i) if s.on[w] => s.low[v] = s.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                set.push(w);
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                s.out.push(set);
            }
        }
    }
    let n = nodes.len();
    let mut s = State {
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(v, &adj, &mut s);
        }
    }
    let mut circles: Vec<Vec<String>> = s
        .out
        .into_iter()
        .map(|set| {
            let mut names: Vec<String> = set.into_iter().map(|i| nodes[i].clone()).collect();
            names.sort();
            names
        })
        .collect();
    circles.sort();
    circles
}

/// The `settle-*` crates `Cargo.toml` (its `[dependencies]`) depends on, and the crate's
/// name.
fn dependencies(manifest: &str) -> (String, Vec<String>) {
    let mut name = String::new();
    let mut deps = Vec::new();
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = if line == "[package]" {
                "package"
            } else if line == "[dependencies]" {
                "dependencies"
            } else {
                ""
            };
            continue;
        }
        let key = line.split(['=', ' ', '.']).next().unwrap_or("");
        match section {
            "package" if key == "name" => {
                name = line.split('"').nth(1).unwrap_or("").to_string();
            }
            "dependencies" if key.starts_with("settle") => deps.push(key.to_string()),
            _ => {}
        }
    }
    (name, deps)
}

/// Dependencies of the crates under `crates` that `layers` does not allow, as
/// `crate depends on dep`.
pub fn layering(crates: &Path, layers: &[(&str, &[&str])]) -> Vec<String> {
    let mut out = Vec::new();
    for krate in crate_dirs(crates) {
        let Ok(manifest) = std::fs::read_to_string(krate.join("Cargo.toml")) else { continue };
        let (name, deps) = dependencies(&manifest);
        let allowed: &[&str] = layers.iter().find(|(n, _)| *n == name).map_or(&[], |(_, a)| *a);
        for d in deps {
            if !allowed.contains(&d.as_str()) {
                out.push(format!("{name} depends on {d}, which its layer does not allow ({allowed:?})"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, files: &[(&str, &str)]) {
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }

    #[test]
    fn paths_are_read_from_use_trees_and_code_but_not_comments_or_strings() {
        let text = "use crate::{a::{X, Y}, b};\nuse super::c::*;\n// crate::not_this\nlet s = \"crate::nor_this\";\n\
                    let r = r#\"super::nor\"#; fn f() { crate::d::e(); } let c = '{';";
        let got: Vec<String> = paths(text).iter().map(|p| p.join("::")).collect();
        assert_eq!(got, ["crate::a::X", "crate::a::Y", "crate::b", "super::c", "crate::d::e"]);
    }

    #[test]
    fn a_circle_is_found_and_parents_and_children_are_not_one() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        write(
            &src,
            &[
                ("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n#[cfg(test)]\nmod tests;\n"),
                // a ⇄ b (b through super::), c → a only.
                ("a.rs", "use crate::b::thing;\n"),
                ("b.rs", "pub fn thing() { super::a::other(); }\n"),
                ("c.rs", "use crate::a;\n"),
                // d and its child use each other: not a circle.
                ("d/mod.rs", "mod e;\nuse self::e::x;\nfn f() { e::x(); }\n"),
                ("d/e.rs", "use super::helper;\nuse crate::d::helper2;\n"),
                // Test modules do not count.
                ("tests.rs", "use crate::c::*;\n"),
            ],
        );
        assert_eq!(module_circles(&src), vec![vec!["a".to_string(), "b".to_string()]]);
        // A loop of three.
        write(&src, &[("b.rs", "pub fn thing() {}\nuse crate::c::z;\n")]);
        assert_eq!(module_circles(&src), vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]);
        // Broken: no circle.
        write(&src, &[("c.rs", "fn c() {}\n")]);
        assert!(module_circles(&src).is_empty());
        // Code after `#[cfg(test)]` in a file does not count.
        write(&src, &[("c.rs", "fn c() {}\n#[cfg(test)]\nmod tests { use crate::a::x; }\n")]);
        assert!(module_circles(&src).is_empty());
    }

    #[test]
    fn long_files_are_found_and_tests_are_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let crates = dir.path();
        let body = "fn f() {}\n".repeat(10);
        let tests = "#[cfg(test)]\nmod tests {\n".to_string() + &"// x\n".repeat(50) + "}\n";
        write(
            crates,
            &[
                ("x/Cargo.toml", "[package]\nname = \"x\"\n"),
                ("x/src/lib.rs", "mod long;\nmod short;\n#[cfg(test)]\nmod tests;\n"),
                ("x/src/long.rs", &"fn f() {}\n".repeat(12)),
                ("x/src/short.rs", &(body + &tests)),
                ("x/src/tests.rs", &"// t\n".repeat(100)),
            ],
        );
        assert_eq!(long_files(crates, 11), ["x/src/long.rs: 12 lines before its tests (at most 11)"]);
        assert!(long_files(crates, 12).is_empty());
    }

    #[test]
    fn a_dependency_against_the_layers_is_found() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("core/Cargo.toml", "[package]\nname = \"settle-core\"\n[dependencies]\nserde = \"1\"\n"),
                (
                    "store/Cargo.toml",
                    "[package]\nname = \"settle-store\"\n[dependencies]\nsettle-core = { path = \"../core\" }\n\
                     settle-engine = { path = \"../engine\" }\n[dev-dependencies]\nsettle-engine = { path = \"../engine\" }\n",
                ),
            ],
        );
        assert_eq!(
            layering(dir.path(), LAYERS),
            ["settle-store depends on settle-engine, which its layer does not allow ([\"settle-core\"])"]
        );
    }
}
