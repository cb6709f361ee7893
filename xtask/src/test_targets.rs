//! With `autotests = false` (the crates whose integration tests link as one
//! `tests/integration.rs` binary), a new `tests/*.rs` file that no target names would silently
//! not be built. The check: every such file is a module of `tests/integration.rs` or the path
//! of a `[[test]]` of its own.

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// `tests/` files of `crate_dir` that are in no test target.
    fn unbuilt_test_files(crate_dir: &Path) -> Vec<String> {
        let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
        if !manifest.contains("autotests = false") {
            return Vec::new();
        }
        let root =
            std::fs::read_to_string(crate_dir.join("tests/integration.rs")).unwrap_or_default();
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(crate_dir.join("tests")).unwrap() {
            let path = entry.unwrap().path();
            let (Some(stem), Some("rs")) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            let module = format!("\nmod {stem};");
            let target = format!("path = \"tests/{stem}.rs\"");
            if !root.contains(&module) && !manifest.contains(&target) {
                missing.push(format!("{}/tests/{stem}.rs", crate_dir.display()));
            }
        }
        missing
    }

    #[test]
    fn every_test_file_is_built() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut missing = Vec::new();
        let mut checked = 0;
        for entry in std::fs::read_dir(workspace).unwrap() {
            let dir = entry.unwrap().path();
            if dir.join("Cargo.toml").is_file() && dir.join("tests").is_dir() {
                checked += 1;
                missing.extend(unbuilt_test_files(&dir));
            }
        }
        assert!(checked >= 4, "found only {checked} crates with tests/");
        assert!(
            missing.is_empty(),
            "built by no target (add `mod NAME;` to the crate's tests/integration.rs, or a \
             [[test]] of its own): {missing:?}"
        );
    }
}
