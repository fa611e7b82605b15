//! `kernel install` as `ws.kernels()` runs it: preview-then-confirm of the
//! plans `kernels` makes, the build or the file's boot check
//! (in a throwaway workspace), and the install.

use std::path::{Path, PathBuf};

use vmm_core::KernelVariant;

use crate::error::{Error, Result};
use crate::host::assets;
use crate::host::confirm::Confirmer;
use crate::kernels::build as kernel_build;
use crate::kernels::{
    file_dir, file_plan, source_plan, KernelInstall, KernelInstallError, KernelSource, SourceHost,
    CHECK_BOOT_TIMEOUT, CHECK_IMAGE,
};
use crate::workspaces::services::Kernels;
use base::host::plan::Preview;
use base::host::plan::ProgressFn;
use base::host::settings::{now_ms, unique_id};

impl Kernels<'_> {
    /// The kernel variant this host needs, by a short KVM probe (the
    /// registry's when KVM cannot be probed).
    pub fn host_variant(&self) -> KernelVariant {
        vmm_core::host::probe()
            .map(|p| p.kernel_variant())
            .unwrap_or_else(|_| self.all.image_registry().kernel_variant())
    }

    /// The asset cache whose `current/` these workspaces boot from.
    pub(crate) fn asset_root(&self) -> Result<PathBuf> {
        match self.all.assets().and_then(Path::parent) {
            Some(root) => Ok(root.to_owned()),
            None => Ok(assets::cache_root().map_err(KernelInstallError::from)?),
        }
    }

    /// Previews (without `confirm`) or applies (with the preview's token)
    /// a kernel install for `variant` (default: this host's). `progress`
    /// hears the steps of a long install.
    pub async fn install(
        &self,
        source: &KernelSource,
        variant: Option<KernelVariant>,
        confirm: Option<&str>,
        progress: ProgressFn,
    ) -> Result<KernelInstall> {
        if let Some(token) = confirm {
            Confirmer::expect_issued(self.all.state_dir().root(), token)?;
        }
        let variant = variant.unwrap_or_else(|| self.host_variant());
        let root = self.asset_root()?;
        let (plan, file) = match source {
            KernelSource::FromSource => (source_plan(&root, variant, &SourceHost::probe()), None),
            KernelSource::File(path) => {
                // Every step after this one reads the staged copy: what was
                // checked, booted and installed are the same bytes.
                let staged = StagedKernel::copy(path, &root)?;
                // The check boot needs it: say so before any token.
                self.all.image_registry().get(CHECK_IMAGE)?;
                let plan = file_plan(&root, variant, path, &staged.sha, staged.bytes);
                (plan, Some((path.clone(), staged)))
            }
        };
        let confirmer = Confirmer::open(self.all.state_dir().root())?;
        let Some(token) = confirm else {
            return Ok(KernelInstall {
                preview: confirmer.preview(plan, now_ms()),
                applied: false,
                kernel: None,
                version: None,
            });
        };
        confirmer.check(&plan, token, now_ms())?;
        plan.check_privilege(token)?;
        confirmer.spend(token, now_ms())?;
        let kernel = match file {
            None => {
                let steps = plan.clone();
                let progress = progress.clone();
                self.all
                    .blocking(move |_| {
                        if !steps.steps.is_empty() {
                            progress("installing the build packages");
                        }
                        steps.run()?;
                        kernel_build::build(variant, &mut |s| progress(s))
                            .map_err(|e| Error::from(KernelInstallError::from(e)))
                    })
                    .await?
            }
            Some((path, staged)) => {
                progress(&format!(
                    "booting {} with the {CHECK_IMAGE} image",
                    path.display()
                ));
                self.boot_check(&staged.file).await.map_err(|e| {
                    let reason = match &e {
                        Error::KernelInstall(f) => match f.downcast_ref() {
                            Some(KernelInstallError::BootCheck { reason, .. }) => reason.clone(),
                            _ => return e,
                        },
                        _ => return e,
                    };
                    Error::from(KernelInstallError::BootCheck { path, reason })
                })?;
                progress("installing into the cache");
                let dir = file_dir(&root, &staged.sha);
                staged.install(&dir)?;
                let vmlinux = dir.join("vmlinux");
                assets::link_current(&root, &variant.vmlinux_file(), &vmlinux)
                    .map_err(KernelInstallError::from)?;
                vmlinux
            }
        };
        Ok(KernelInstall {
            preview: Preview {
                plan,
                token: None,
                expires_at_ms: None,
            },
            applied: true,
            version: base::images::kernels::version_of(&kernel),
            kernel: Some(kernel),
        })
    }

    /// Boots `kernel` with the check image in a throwaway workspace and
    /// runs `uname -r` through the agent.
    async fn boot_check(&self, kernel: &Path) -> Result<()> {
        let check = self.all.image_registry().get(CHECK_IMAGE)?;
        let image = format!("kernel-check-{}", unique_id());
        self.all
            .image_registry()
            .import_files(&image, kernel, &check.rootfs, None)?;
        let spec = base::store::spec::WorkspaceSpec {
            image: image.clone(),
            ..base::store::spec::WorkspaceSpec::default()
        };
        let run = crate::workspaces::one_shot::OneShot::new("kernel-check", spec);
        let ended = self
            .all
            .run_once(
                &run,
                |name| async move {
                    self.all
                        .at(&name)
                        .start_cold(CHECK_BOOT_TIMEOUT, |_| {})
                        .await
                        .map(|_| true)
                },
                |name| async move {
                    self.all
                        .at(&name)
                        .exec_collect(
                            crate::guest::request::ExecRequest::argv(["uname", "-r"]),
                            crate::guest::stream::ExecInput::None,
                        )
                        .await
                },
            )
            .await;
        let _ = self.all.image_registry().remove(&image, Vec::new());
        let failed = |reason: String| {
            Error::from(KernelInstallError::BootCheck {
                path: kernel.to_owned(),
                reason,
            })
        };
        match ended?.outcome {
            Ok(Some(r)) if r.exit_code == Some(0) => Ok(()),
            Ok(Some(r)) => Err(failed(format!(
                "`uname -r` ended with {:?}: {}",
                r.exit_code, r.stderr
            ))),
            Ok(None) => Err(failed("the boot was cancelled".into())),
            Err(e) => Err(failed(e.full_message())),
        }
    }
}

/// A kernel file copied once, from one descriptor, into a private
/// staging directory of the cache, with the digest of exactly those bytes;
/// removed when dropped unless installed.
#[derive(Debug)]
struct StagedKernel {
    dir: PathBuf,
    file: PathBuf,
    sha: String,
    bytes: u64,
}

impl StagedKernel {
    /// Copies `path` (a regular file, checked to be a kernel) into the
    /// cache at `root`.
    fn copy(path: &Path, root: &Path) -> Result<Self> {
        use sha2::{Digest, Sha256};
        use std::io::{Read, Write};
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let not_a_kernel = |problem: String| {
            Error::from(KernelInstallError::NotAKernel {
                path: path.to_owned(),
                problem,
            })
        };
        let mut source = std::fs::File::open(path).map_err(|e| not_a_kernel(format!("{e}")))?;
        let meta = source
            .metadata()
            .map_err(|e| not_a_kernel(format!("{e}")))?;
        if !meta.is_file() {
            return Err(not_a_kernel("not a regular file".into()));
        }
        let kernels = root.join("kernel");
        std::fs::create_dir_all(&kernels)
            .map_err(Error::host_io(format!("creating {}", kernels.display())))?;
        let dir = kernels.join(format!(".staging-{}", unique_id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(Error::host_io(format!("creating {}", dir.display())))?;
        let mut staged = Self {
            file: dir.join("vmlinux"),
            dir,
            sha: String::new(),
            bytes: 0,
        };
        let io = |what: &str| Error::host_io(format!("{what} {}", staged.file.display()));
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&staged.file)
            .map_err(io("creating"))?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match source.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(not_a_kernel(format!("reading it: {e}"))),
            };
            hash.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io("writing"))?;
            staged.bytes += n as u64;
        }
        out.sync_all().map_err(io("syncing"))?;
        staged.sha = format!("{:x}", hash.finalize());
        base::images::registry::check_kernel(&staged.file).map_err(|e| match e {
            base::images::registry::ImageError::BadSource { problem, .. } => not_a_kernel(problem),
            other => not_a_kernel(base::error_chain::error_chain(&other)),
        })?;
        Ok(staged)
    }

    /// Moves the staged file to `dir/vmlinux` (kept when that digest is
    /// installed already).
    fn install(self, dir: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if dir.join("vmlinux").is_file() {
            return Ok(());
        }
        let done = std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o755))
            .and_then(|()| std::fs::rename(&self.dir, dir));
        match done {
            Err(_) if dir.join("vmlinux").is_file() => Ok(()),
            other => other.map_err(Error::host_io(format!("installing {}", dir.display()))),
        }
    }
}

impl Drop for StagedKernel {
    fn drop(&mut self) {
        // Gone already when installed.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_kernel_is_the_bytes_read_once() {
        let dir = std::env::temp_dir().join(format!("ma-kstage-{}", unique_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("vmlinux");
        let mut elf = b"\x7fELF".to_vec();
        elf.resize(4096, 1);
        std::fs::write(&file, &elf).unwrap();
        let root = dir.join("cache");
        let staged = StagedKernel::copy(&file, &root).unwrap();
        // The file changes after the check: the staged copy does not.
        std::fs::write(&file, b"#!/bin/sh\nrm -rf ~\n").unwrap();
        assert_eq!(std::fs::read(&staged.file).unwrap(), elf);
        use sha2::Digest;
        assert_eq!(staged.sha, format!("{:x}", sha2::Sha256::digest(&elf)));
        assert_eq!(staged.bytes, 4096);
        let to = file_dir(&root, &staged.sha);
        staged.install(&to).unwrap();
        assert_eq!(std::fs::read(to.join("vmlinux")).unwrap(), elf);
        let left: Vec<_> = std::fs::read_dir(root.join("kernel")).unwrap().collect();
        assert_eq!(left.len(), 1, "only the installed kernel: {left:?}");
        // Not a kernel: refused, nothing staged is left.
        let err = StagedKernel::copy(&file, &root).unwrap_err();
        assert_eq!(err.code(), base::code::ErrorCode::InvalidInput, "{err}");
        let left: Vec<_> = std::fs::read_dir(root.join("kernel")).unwrap().collect();
        assert_eq!(left.len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}
