//! The asset cache: `$MICROAGENT_CACHE` or `~/.cache/microagent`, one
//! directory per asset and input hash, plus `current/` links to the newest.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The cache root (shared with the tests, which look assets up there).
pub fn root() -> anyhow::Result<PathBuf> {
    testkit::cache_root().context("neither MICROAGENT_CACHE nor HOME is set")
}

/// The repository root (xtask lives one level below it).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the repository")
        .to_path_buf()
}

/// Builds the `microagent` binary and the `microagent-vmm` beside it
/// (debug); returns the first one's path.
pub fn build_microagent() -> anyhow::Result<PathBuf> {
    build_microagent_as(false)
}

/// [`build_microagent`], as users run it with `release`.
pub fn build_microagent_as(release: bool) -> anyhow::Result<PathBuf> {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    // The CLI runs each workspace's VM as the `microagent-vmm` beside it:
    // both, or a fresh checkout's first start fails.
    cargo.args([
        "build",
        "--quiet",
        "-p",
        "microagent",
        "-p",
        "microagent-vmm",
    ]);
    if release {
        cargo.arg("--release");
    }
    crate::sh::run(cargo.current_dir(repo_root()))?;
    let profile = if release { "release" } else { "debug" };
    Ok(target_dir().join(profile).join("microagent"))
}

/// Where cargo puts what it builds here: $CARGO_TARGET_DIR when set
/// (relative to the checkout, where cargo runs), else target/.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map_or_else(|| repo_root().join("target"), |t| repo_root().join(t))
}

/// The target static builds name. crt-static cannot apply to proc-macros:
/// naming the target keeps host crates (build scripts, proc-macros) out of
/// it.
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// A static build of a binary we ship linked static (the guest agent, the
/// VMM process): `cargo build --release` with crt-static for
/// [`STATIC_TARGET`], in the cache's `build/<name>-<checkout>` target
/// directory so the main target directory (built without crt-static) stays
/// valid. One per checkout: cargo names a workspace crate's artifacts the
/// same whatever its path, so two checkouts sharing a target directory
/// could take each other's stale library for fresh.
pub struct StaticBuild {
    target_dir: PathBuf,
}

impl StaticBuild {
    /// The build whose target directory is the cache's
    /// `build/<name>-<hash of this checkout's path>`.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let mut checkout = InputHash::default();
        checkout.add("checkout", repo_root().as_os_str().as_encoded_bytes());
        Ok(Self {
            target_dir: root()?
                .join("build")
                .join(format!("{name}-{}", &checkout.short()[..8])),
        })
    }

    /// `cargo build --release -p PACKAGE`, static; the caller may add
    /// arguments and environment, then runs it.
    pub fn command(&self, package: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "--release",
            "-p",
            package,
            "--target",
            STATIC_TARGET,
        ])
        .arg("--target-dir")
        .arg(&self.target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(repo_root());
        cmd
    }

    /// Where the build leaves `binary`.
    pub fn binary(&self, binary: &str) -> PathBuf {
        self.target_dir
            .join(STATIC_TARGET)
            .join("release")
            .join(binary)
    }
}

/// The product's input hash (one hashing for the product and xtask, so
/// both find each other's builds).
pub use workspace::host::assets::InputHash;

/// Adding a checked-in file to an [`InputHash`].
pub trait AddRepoFile {
    /// Adds a file's contents, labelled with its path relative to the repo.
    fn add_file(&mut self, path: &Path) -> anyhow::Result<&mut Self>;
}

impl AddRepoFile for InputHash {
    fn add_file(&mut self, path: &Path) -> anyhow::Result<&mut Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let label = path
            .strip_prefix(repo_root())
            .unwrap_or(path)
            .display()
            .to_string();
        Ok(self.add(&label, &bytes))
    }
}

/// The cached file `<cache>/<kind>/<key>/<file>`, built first when missing:
/// `build(work, partial)` gets an empty scratch directory (removed after)
/// and writes the result to `partial`, which is renamed into place only on
/// success, so an interrupted build never leaves a file that looks done.
pub fn cached_file(
    kind: &str,
    key: &str,
    file: &str,
    build: impl FnOnce(&Path, &Path) -> anyhow::Result<()>,
) -> anyhow::Result<PathBuf> {
    let out_dir = root()?.join(kind).join(key);
    let target = out_dir.join(file);
    if target.is_file() {
        return Ok(target);
    }
    let work = root()?.join("build").join(format!("{kind}-{key}"));
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    std::fs::create_dir_all(&out_dir)?;
    let partial = out_dir.join(format!("{file}.partial"));
    build(&work, &partial)?;
    std::fs::rename(&partial, &target)
        .with_context(|| format!("installing {}", target.display()))?;
    std::fs::remove_dir_all(&work)?;
    Ok(target)
}

/// Points `<cache>/current/<name>` at `target` (replacing an older link).
pub fn link_current(name: &str, target: &Path) -> anyhow::Result<PathBuf> {
    Ok(workspace::host::assets::link_current(
        &root()?,
        name,
        target,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_binary_location() {
        let build = StaticBuild {
            target_dir: PathBuf::from("/c/build/agent-target"),
        };
        assert_eq!(
            build.binary("microagent-agent"),
            Path::new("/c/build/agent-target/x86_64-unknown-linux-gnu/release/microagent-agent")
        );
    }
}
