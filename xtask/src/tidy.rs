//! Repository rules checked as a test (`cargo test -p xtask`).

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::cache::repo_root;

    const MAX_LINES: usize = 800;

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    rust_files(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn source_files_stay_small() {
        let mut files = Vec::new();
        for dir in ["crates", "xtask"] {
            rust_files(&repo_root().join(dir), &mut files);
        }
        assert!(files.len() > 10);
        let long: Vec<String> = files
            .iter()
            .filter_map(|f| {
                let n = std::fs::read_to_string(f).unwrap().lines().count();
                (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.display()))
            })
            .collect();
        assert!(
            long.is_empty(),
            "split these into modules of one concern each: {long:?}"
        );
    }

    #[test]
    fn every_crate_uses_the_workspace_lints() {
        let mut manifests = vec![repo_root().join("xtask/Cargo.toml")];
        for entry in std::fs::read_dir(repo_root().join("crates"))
            .unwrap()
            .flatten()
        {
            manifests.push(entry.path().join("Cargo.toml"));
        }
        for m in manifests {
            let text = std::fs::read_to_string(&m).unwrap();
            assert!(
                text.contains("[lints]\nworkspace = true"),
                "{} must inherit [workspace.lints]",
                m.display()
            );
        }
    }

    #[test]
    fn guest_physical_addresses_live_in_layout() {
        // A literal address handed to GuestAddress outside layout.rs (and
        // outside tests and harnesses) should be a named layout constant.
        let mut files = Vec::new();
        rust_files(&repo_root().join("crates/vmm-core/src"), &mut files);
        for f in files {
            let harness = f.ends_with("fuzz.rs")
                || f.to_string_lossy().ends_with("_tests.rs")
                || f.components().any(|c| c.as_os_str() == "tests");
            if harness || f.ends_with("layout.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (i, line) in code.lines().enumerate() {
                let literal = line.split("GuestAddress(").skip(1).any(|rest| {
                    rest.trim_start().starts_with(|c: char| c.is_ascii_digit())
                        && !rest.starts_with("0)")
                });
                assert!(
                    !literal,
                    "{}:{}: literal guest address; name it in layout.rs",
                    f.display(),
                    i + 1
                );
            }
        }
    }
}
