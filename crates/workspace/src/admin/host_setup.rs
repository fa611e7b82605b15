//! Setup, preview-then-confirm: everything a new host lacks to run
//! workspaces, in one plan: the Debian packages the builds need, the guest
//! kernel this host needs (built from source, [`crate::kernels::build`]), the
//! `minimal` image (busybox with the agent and init installed beside this
//! program), the `debian` image (mmdebstrap, as root) and, unless it is
//! there, our `passt`, built from Debian 13's source with our patch
//! ([`crate::network::passt_build`]). What is there already is left as it
//! is.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::host::confirm::Confirmer;
use crate::host::setup::Setup;
use crate::images::build::{debian, minimal, ImageBuildError};
use crate::kernels::{source_plan, SourceHost};
use crate::network::passt_build;
use crate::workspaces::services::HostSetup;
use base::host::kvm_group;
use base::host::plan::{Plan, Preview, ProgressFn};
use base::host::settings::now_ms;

/// What the `debian` image has beyond minbase (as `cargo xtask rootfs
/// debian` builds it).
pub const DEBIAN_PACKAGES: &[&str] = &["python3", "nodejs", "git", "openssh-client"];
/// The suite of the `debian` image.
pub const DEBIAN_SUITE: &str = "bookworm";

/// What setup would make.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Missing {
    kernel: bool,
    minimal: Option<(PathBuf, PathBuf)>,
    debian: bool,
    /// The passt in use (or to be installed) is not ours at this revision.
    passt: Option<passt_build::PasstInUse>,
    /// Root's VMMs have no account of their own yet.
    vmm_user: bool,
    /// The steps that let the `kvm` group use /dev/kvm, if it cannot.
    kvm_group: Option<Vec<base::host::plan::Step>>,
}

/// The host packages `missing` needs that are not installed.
fn host_packages(
    missing: &Missing,
    kernel: &SourceHost,
    installed: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut want: Vec<String> = Vec::new();
    if missing.kernel {
        want.extend(kernel.missing.iter().cloned());
    }
    // Workspaces' default network (rootless NAT) runs passt; a user's
    // Debian image build maps its owners with newuidmap (uidmap), and this
    // is the one step with root to install it.
    let mut more: Vec<&str> = vec!["passt", "uidmap"];
    if missing.minimal.is_some() {
        more.extend([minimal::BUSYBOX_PACKAGE, "e2fsprogs", "fakeroot"]);
    }
    if missing.debian {
        more.extend(debian::Mode::for_this_process().host_packages());
        more.push("e2fsprogs");
    }
    if missing.passt.is_some() {
        more.extend(passt_build::BUILD_PACKAGES);
    }
    for p in more {
        if !installed(p) && !want.iter().any(|w| w == p) {
            want.push(p.to_owned());
        }
    }
    want
}

/// The plan that makes what is missing.
fn setup_plan(
    missing: &Missing,
    kernel_plan: &Plan,
    packages: &[String],
    images_dir: &Path,
    cache_root: &Path,
) -> Plan {
    let mut plan = Plan::new("setup");
    plan.install_packages(packages);
    if let Some(in_use) = missing.passt {
        plan.needs_root = true;
        plan.steps.extend(passt_build::steps(cache_root));
        plan.notes.push(passt_build::note(in_use));
        for binary in ["passt", "passt.avx2"] {
            plan.writes.push(
                Path::new(passt_build::INSTALL_DIR)
                    .join(binary)
                    .display()
                    .to_string(),
            );
        }
        plan.estimate_seconds += passt_build::SECONDS;
    }
    if missing.vmm_user {
        plan.needs_root = true;
        plan.steps.push(base::vmm::user::account_step());
        plan.writes.push("/etc/passwd".into());
    }
    if let Some(steps) = &missing.kvm_group {
        plan.needs_root = true;
        plan.steps.extend(steps.iter().cloned());
        plan.writes.push(kvm_group::KVM_DEVICE.into());
        plan.notes.push(format!(
            "gives {} to the group {} (no udev rule did; not kept across a reboot without one): its members run workspaces as themselves",
            kvm_group::KVM_DEVICE,
            kvm_group::KVM_GROUP
        ));
    }
    if missing.kernel {
        plan.notes.extend(kernel_plan.notes.iter().cloned());
        plan.writes.extend(kernel_plan.writes.iter().cloned());
        plan.disk_bytes = plan.disk_bytes.max(kernel_plan.disk_bytes);
        plan.estimate_seconds += kernel_plan.estimate_seconds;
    }
    if let Some((agent, init)) = &missing.minimal {
        plan.notes.push(format!(
            "builds the `minimal` image: {} with the agent {} and init {}",
            minimal::BUSYBOX,
            agent.display(),
            init.display()
        ));
        plan.writes
            .push(images_dir.join("minimal").display().to_string());
        plan.estimate_seconds += 10;
    }
    if missing.debian {
        plan.notes.push(format!(
            "builds the `debian` image: mmdebstrap {DEBIAN_SUITE} minbase {} with {} (downloads from deb.debian.org)",
            debian::Mode::for_this_process().describe(),
            debian::include(&owned(DEBIAN_PACKAGES)).join(",")
        ));
        plan.writes
            .push(images_dir.join(debian::IMAGE).display().to_string());
        plan.disk_bytes = plan.disk_bytes.max(debian::DISK_BYTES * 2);
        plan.estimate_seconds += debian::SECONDS;
    }
    if plan.is_empty() {
        plan.notes
            .push("this host has the kernel, the `minimal` and `debian` images, our passt and, for root, the VMMs' account".into());
    }
    plan
}

/// The steps that give /dev/kvm to the `kvm` group, planned for root, or
/// for a user who cannot open it (for whom the plan then needs root).
fn kvm_group_steps() -> Option<Vec<base::host::plan::Step>> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    kvm_group::missing_steps().filter(|_| root || kvm_group::open_device().is_err())
}

fn owned(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

impl HostSetup<'_> {
    /// Previews (without `confirm`) or applies (with the preview's token)
    /// what this host lacks to run workspaces, and with `debian` the
    /// `debian` image too (minutes, root and Debian's mirrors; a first run
    /// needs only `minimal`). `progress` hears each step.
    pub async fn setup(
        &self,
        debian: bool,
        confirm: Option<&str>,
        progress: ProgressFn,
    ) -> Result<Setup> {
        if let Some(token) = confirm {
            Confirmer::expect_issued(self.all.state_dir().root(), token)?;
        }
        let root = self.all.kernels().asset_root()?;
        let variant = self.all.kernels().host_variant();
        let kernel_host = SourceHost::probe();
        let kernel_plan = source_plan(&root, variant, &kernel_host);
        let images = self.all.image_registry();
        let minimal_binaries = if images.get("minimal").is_ok() {
            None
        } else {
            Some((
                minimal::installed_binary(minimal::AGENT_BINARY)?,
                minimal::installed_binary(minimal::INIT_BINARY)?,
            ))
        };
        let missing = Missing {
            kernel: !kernel_plan.is_empty(),
            minimal: minimal_binaries,
            debian: debian && images.get(debian::IMAGE).is_err(),
            passt: Some(passt_build::in_use()).filter(|p| passt_build::needed(*p)),
            vmm_user: base::vmm::user::account_missing(self.all.state_dir().root()),
            kvm_group: kvm_group_steps(),
        };
        let packages = host_packages(&missing, &kernel_host, &|p| {
            base::host::settings::deb_version(p).is_some()
        });
        let plan = setup_plan(&missing, &kernel_plan, &packages, images.root(), &root);
        let confirmer = Confirmer::open(self.all.state_dir().root())?;
        let Some(token) = confirm else {
            return Ok(Setup {
                preview: confirmer.preview(plan, now_ms()),
                applied: false,
                made: Vec::new(),
            });
        };
        confirmer.check(&plan, token, now_ms())?;
        plan.check_privilege(token)?;
        confirmer.spend(token, now_ms())?;
        let made = self.apply_setup(&plan, &missing, variant, progress).await?;
        Ok(Setup {
            preview: Preview {
                plan,
                token: None,
                expires_at_ms: None,
            },
            applied: true,
            made,
        })
    }

    async fn apply_setup(
        &self,
        plan: &Plan,
        missing: &Missing,
        variant: vmm_core::KernelVariant,
        progress: ProgressFn,
    ) -> Result<Vec<String>> {
        let mut made = Vec::new();
        let (steps, kernel, variant) = (plan.clone(), missing.kernel, variant);
        let report = progress.clone();
        let kernel_file = self
            .all
            .blocking(move |ws| {
                if !steps.steps.is_empty() {
                    report("installing Debian packages (and passt, where the plan builds it)");
                    steps.run()?;
                }
                if kernel {
                    crate::kernels::build::build(variant, &mut |s| report(&format!("kernel: {s}")))
                        .map_err(crate::kernels::KernelInstallError::from)?;
                }
                // The kernel workspaces of the built images boot.
                let link = ws
                    .kernels()
                    .asset_root()?
                    .join("current")
                    .join(variant.vmlinux_file());
                std::fs::canonicalize(&link).map_err(crate::error::Error::host_io(format!(
                    "finding the {variant} kernel at {}",
                    link.display()
                )))
            })
            .await?;
        if kernel {
            made.push("kernel".to_owned());
        }
        if let Some((agent, init)) = missing.minimal.clone() {
            let (report, kernel) = (progress.clone(), kernel_file.clone());
            self.all
                .blocking(move |ws| {
                    report("building the minimal image");
                    let work = ws.image_registry().scratch_dir("setup-minimal")?;
                    let built = (|| -> Result<()> {
                        let tree = work.join("tree");
                        minimal::populate(&tree, &agent, &init)?;
                        let rootfs = work.join(base::images::registry::ROOTFS_FILE);
                        base::images::oci::rootfs::mkfs_root_owned(&tree, &rootfs)
                            .map_err(ImageBuildError::from)?;
                        minimal::own_user_home(&rootfs)?;
                        ws.image_registry()
                            .import_files("minimal", &kernel, &rootfs, None)?;
                        Ok(())
                    })();
                    let _ = std::fs::remove_dir_all(&work);
                    built
                })
                .await?;
            made.push("minimal".to_owned());
        }
        if missing.debian {
            let (report, kernel) = (progress.clone(), kernel_file.clone());
            self.all
                .blocking(move |ws| {
                    report(&format!(
                        "building the debian image (mmdebstrap {DEBIAN_SUITE})"
                    ));
                    let base = ws.image_registry().get("minimal")?;
                    let work = ws.image_registry().scratch_dir("setup-debian")?;
                    let built = (|| -> Result<()> {
                        let rootfs = debian::bootstrap_rootfs(
                            DEBIAN_SUITE,
                            &owned(DEBIAN_PACKAGES),
                            &work,
                            &base.rootfs,
                            ws.image_registry().budget(),
                        )?;
                        ws.image_registry().register_converted(
                            debian::IMAGE,
                            &kernel,
                            &rootfs,
                            Default::default(),
                            PathBuf::from(format!("debian:{DEBIAN_SUITE}")),
                            None,
                        )?;
                        Ok(())
                    })();
                    let _ = std::fs::remove_dir_all(&work);
                    built
                })
                .await?;
            made.push(debian::IMAGE.to_owned());
        }
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel_host(missing: &[&str]) -> SourceHost {
        SourceHost {
            source: Some("6.1.1".into()),
            missing: owned(missing),
            jobs: 2,
        }
    }

    #[test]
    fn a_complete_host_needs_nothing() {
        let missing = Missing::default();
        let packages = host_packages(&missing, &kernel_host(&["flex"]), &|_| true);
        assert!(packages.is_empty(), "{packages:?}");
        let packages = host_packages(&missing, &kernel_host(&["flex"]), &|p| p != "passt");
        assert_eq!(packages, ["passt"], "the default network needs it");
        let packages: Vec<String> = Vec::new();
        let plan = setup_plan(
            &missing,
            &Plan::new("kernel install"),
            &packages,
            Path::new("/s/images"),
            Path::new("/c"),
        );
        assert!(plan.is_empty(), "{plan:?}");
        assert!(plan.notes[0].contains("has the kernel"));
    }

    #[test]
    fn a_bare_host_gets_one_package_install_then_everything() {
        let missing = Missing {
            kernel: true,
            minimal: Some(("/d/microagent-agent".into(), "/d/microagent-init".into())),
            debian: true,
            passt: None,
            vmm_user: false,
            kvm_group: None,
        };
        let host = kernel_host(&["flex", "e2fsprogs"]);
        let packages = host_packages(&missing, &host, &|p| p == "fakeroot");
        assert_eq!(
            packages,
            [
                "flex",
                "e2fsprogs",
                "passt",
                "uidmap",
                "busybox-static",
                "mmdebstrap",
                "debian-archive-keyring"
            ]
        );
        let kernel_plan = source_plan(Path::new("/c"), vmm_core::KernelVariant::Compat, &host);
        let plan = setup_plan(
            &missing,
            &kernel_plan,
            &packages,
            Path::new("/s/images"),
            Path::new("/c"),
        );
        assert_eq!(plan.steps.len(), 2, "one update, one install: {plan:?}");
        assert!(plan.needs_root);
        assert!(plan
            .writes
            .iter()
            .any(|w| w.ends_with("current/vmlinux-compat")));
        assert!(plan.writes.contains(&"/s/images/minimal".to_owned()));
        assert!(plan.writes.contains(&"/s/images/debian".to_owned()));
        let notes = plan.notes.join("\n");
        assert!(notes.contains("/d/microagent-agent"), "{notes}");
        assert!(notes.contains("python3,nodejs"), "{notes}");
        // The kernel (its packages too), minimal, debian.
        let kernel = crate::kernels::build::CPU_SECONDS / 2 + 60;
        assert_eq!(plan.estimate_seconds, kernel + 10 + debian::SECONDS);
    }

    /// The plan of `missing` with no kernel plan and no packages.
    fn plan_for(missing: &Missing) -> Plan {
        setup_plan(
            missing,
            &Plan::new("kernel install"),
            &[],
            Path::new("/s/images"),
            Path::new("/c"),
        )
    }

    #[test]
    fn root_without_the_vmm_account_gets_it_made() {
        let missing = Missing {
            vmm_user: true,
            ..Missing::default()
        };
        let plan = plan_for(&missing);
        assert!(plan.needs_root);
        let step = &plan.steps[0];
        assert_eq!(step.program, "useradd");
        assert_eq!(
            step.args.last().map(String::as_str),
            Some(base::vmm::user::DEFAULT_VMM_USER)
        );
        assert!(step.args.contains(&"--system".to_owned()));
    }

    #[test]
    fn a_device_no_group_may_use_is_given_to_kvm() {
        let steps = vec![base::host::plan::Step::new(
            "chgrp",
            "chgrp",
            &["kvm", "/dev/kvm"],
        )];
        let missing = Missing {
            kvm_group: Some(steps.clone()),
            ..Missing::default()
        };
        let plan = plan_for(&missing);
        assert!(plan.needs_root);
        assert_eq!(plan.steps, steps);
        assert!(plan.writes.iter().any(|w| w == "/dev/kvm"));
    }

    #[test]
    fn an_old_passt_is_built_and_installed() {
        let missing = Missing {
            passt: Some(passt_build::PasstInUse {
                snapshot: Some(20230309),
                ours: false,
            }),
            ..Missing::default()
        };
        let packages = host_packages(&missing, &kernel_host(&[]), &|p| p != "gcc");
        assert_eq!(packages, ["gcc"]);
        let cache = std::env::temp_dir().join(format!("ma-setup-passt-{}", std::process::id()));
        let plan = setup_plan(
            &missing,
            &Plan::new("kernel install"),
            &packages,
            Path::new("/s/images"),
            &cache,
        );
        assert!(plan.needs_root);
        assert!(plan.steps.iter().any(|s| s.program == "make"), "{plan:?}");
        assert!(plan.writes.contains(&"/usr/local/bin/passt".to_owned()));
        assert!(
            plan.notes.iter().any(|n| n.contains("20230309")),
            "{plan:?}"
        );
    }
}
