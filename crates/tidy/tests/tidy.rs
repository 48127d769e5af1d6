//! The house's rules, on this workspace (ARCHITECTURE.md): each failure names the file,
//! the circle or the dependency, and the rule.

use std::path::PathBuf;

fn crates() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn no_source_file_passes_800_lines_before_its_tests() {
    let long = settle_tidy::long_files(&crates(), settle_tidy::MAX_LINES);
    assert!(long.is_empty(), "split these by concept:\n{}", long.join("\n"));
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(crates()).unwrap().flatten() {
        let src = entry.path().join("src");
        if src.is_dir() {
            for circle in settle_tidy::module_circles(&src) {
                found.push(format!("{}: {}", entry.file_name().to_string_lossy(), circle.join(" ⇄ ")));
            }
        }
    }
    found.sort();
    assert!(found.is_empty(), "module circles (break each at its cause):\n{}", found.join("\n"));
}

#[test]
fn crates_depend_only_on_the_layers_below_them() {
    let wrong = settle_tidy::layering(&crates(), settle_tidy::LAYERS);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
