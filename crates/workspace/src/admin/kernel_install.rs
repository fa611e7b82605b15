//! `kernel install` as the collection runs it: preview-then-confirm of the
//! plans `host::kernel_install` makes, the build or the file's boot check
//! (in a throwaway workspace), and the install.

use std::path::{Path, PathBuf};

use vmm_core::KernelVariant;

use crate::error::{Error, Result};
use crate::host::assets;
use crate::host::kernel_build;
use crate::host::kernel_install::{
    file_dir, file_plan, source_plan, KernelInstall, KernelInstallError, KernelSource, SourceHost,
    CHECK_BOOT_TIMEOUT, CHECK_IMAGE,
};
use crate::host::plan::ProgressFn;
use crate::host::plan::{Confirmer, Preview};
use crate::host::settings::{now_ms, unique_id};
use crate::workspaces::manager::Workspaces;

impl Workspaces {
    /// The kernel variant this host needs, by a short KVM probe (the
    /// registry's when KVM cannot be probed).
    pub fn host_kernel_variant(&self) -> KernelVariant {
        vmm_core::host::probe()
            .map(|p| p.kernel_variant())
            .unwrap_or_else(|_| self.images().kernel_variant())
    }

    /// The asset cache whose `current/` these workspaces boot from.
    pub(crate) fn asset_root(&self) -> Result<PathBuf> {
        match self.assets().and_then(Path::parent) {
            Some(root) => Ok(root.to_owned()),
            None => Ok(assets::cache_root().map_err(KernelInstallError::from)?),
        }
    }

    /// Previews (without `confirm`) or applies (with the preview's token)
    /// a kernel install for `variant` (default: this host's). `progress`
    /// hears the steps of a long install.
    pub async fn kernel_install(
        &self,
        source: &KernelSource,
        variant: Option<KernelVariant>,
        confirm: Option<&str>,
        progress: ProgressFn,
    ) -> Result<KernelInstall> {
        if let Some(token) = confirm {
            Confirmer::expect_issued(self.state_dir().root(), token)?;
        }
        let variant = variant.unwrap_or_else(|| self.host_kernel_variant());
        let root = self.asset_root()?;
        let (plan, file) = match source {
            KernelSource::FromSource => (source_plan(&root, variant, &SourceHost::probe()), None),
            KernelSource::File(path) => {
                let bytes = crate::images::registry::check_kernel(path).map_err(|e| {
                    KernelInstallError::NotAKernel {
                        path: path.clone(),
                        problem: crate::error_chain::error_chain(&e),
                    }
                })?;
                // The check boot needs it: say so before any token.
                self.images().get(CHECK_IMAGE)?;
                let sha = crate::images::oci::layout::file_digest(path)
                    .map_err(|e| KernelInstallError::NotAKernel {
                        path: path.clone(),
                        problem: crate::error_chain::error_chain(&e),
                    })?
                    .trim_start_matches("sha256:")
                    .to_owned();
                let plan = file_plan(&root, variant, path, &sha, bytes);
                (plan, Some((path.clone(), sha)))
            }
        };
        let confirmer = Confirmer::open(self.state_dir().root())?;
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
        let kernel = match file {
            None => {
                let steps = plan.clone();
                let progress = progress.clone();
                self.blocking(move |_| {
                    if !steps.steps.is_empty() {
                        progress("installing the build packages");
                    }
                    steps.run()?;
                    kernel_build::build(variant, &mut |s| progress(s))
                        .map_err(|e| Error::from(KernelInstallError::from(e)))
                })
                .await?
            }
            Some((path, sha)) => {
                progress(&format!(
                    "booting {} with the {CHECK_IMAGE} image",
                    path.display()
                ));
                self.boot_check(&path).await?;
                progress("installing into the cache");
                let dir = file_dir(&root, &sha);
                install_file(&path, &dir)?;
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
            version: crate::images::kernels::version_of(&kernel),
            kernel: Some(kernel),
        })
    }

    /// Boots `kernel` with the check image in a throwaway workspace and
    /// runs `uname -r` through the agent.
    async fn boot_check(&self, kernel: &Path) -> Result<()> {
        let check = self.images().get(CHECK_IMAGE)?;
        let image = format!("kernel-check-{}", unique_id());
        self.images()
            .import_files(&image, kernel, &check.rootfs, None)?;
        let spec = crate::WorkspaceSpec {
            image: image.clone(),
            ..crate::WorkspaceSpec::default()
        };
        let run = crate::OneShot::new("kernel-check", spec);
        let ended = self
            .run_once(
                &run,
                |name| async move {
                    self.at(&name)
                        .start_cold(CHECK_BOOT_TIMEOUT, |_| {})
                        .await
                        .map(|_| true)
                },
                |name| async move {
                    self.at(&name)
                        .exec_collect(
                            crate::ExecRequest::argv(["uname", "-r"]),
                            crate::ExecInput::None,
                        )
                        .await
                },
            )
            .await;
        let _ = self.images().remove(&image, Vec::new());
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

/// Copies `file` into `dir/vmlinux` through a staging directory.
fn install_file(file: &Path, dir: &Path) -> Result<()> {
    if dir.join("vmlinux").is_file() {
        return Ok(());
    }
    let staging = dir.with_extension(format!("partial-{}", unique_id()));
    let io = |what: String| Error::host_io(what);
    let done = (|| {
        std::fs::create_dir_all(&staging).map_err(io(format!("creating {}", staging.display())))?;
        std::fs::copy(file, staging.join("vmlinux"))
            .map_err(io(format!("copying {}", file.display())))?;
        match std::fs::rename(&staging, dir) {
            Err(_) if dir.join("vmlinux").is_file() => Ok(()),
            other => other.map_err(io(format!("installing {}", dir.display()))),
        }
    })();
    let _ = std::fs::remove_dir_all(&staging);
    done
}
