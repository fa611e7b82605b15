//! `cargo xtask guest-kernel`: the product's kernel build
//! (`workspace::kernels::build`: Debian's linux-source-6.1, our config
//! fragment over tinyconfig, the compat patches), called the way a
//! developer wants it: packages installed when root, progress on stderr,
//! the vmlinux path on stdout.

use std::path::PathBuf;

use anyhow::Context;
use workspace::kernels::build as kernel_build;

use crate::sh;

/// Which kernel: the VMM's own type, so xtask builds what the VMM boots.
pub type Variant = vmm_core::KernelVariant;

/// Parses `host`, `standard` or `compat`.
pub fn parse_variant(s: &str) -> anyhow::Result<Variant> {
    match s {
        "host" => variant_for_host(),
        other => Variant::from_name(other).with_context(|| {
            format!("unknown kernel variant `{other}` (host, standard or compat)")
        }),
    }
}

/// The variant this host needs, from the VMM's own probe.
pub fn variant_for_host() -> anyhow::Result<Variant> {
    let profile = vmm_core::host::probe()
        .context("probing KVM to pick the kernel variant (is /dev/kvm usable?)")?;
    eprintln!(
        "xtask: KVM here is {} ({:.1} ns per ring-0 loop iteration): {} kernel",
        profile.mode.name(),
        profile.ring0_ns_per_iteration,
        profile.kernel_variant()
    );
    Ok(profile.kernel_variant())
}

/// Builds (or finds in the cache) the kernel with the product's own recipe
/// (`workspace::kernels::build`), installing the build packages first when
/// root; returns the vmlinux path (said on stderr).
pub fn build(variant: Variant) -> anyhow::Result<PathBuf> {
    sh::ensure_debs(kernel_build::BUILD_PACKAGES)?;
    let vmlinux = kernel_build::build(variant, &mut |step| {
        eprintln!("xtask: {} kernel: {step}", variant.name())
    })
    .with_context(|| format!("building the {} kernel", variant.name()))?;
    eprintln!("xtask: {} kernel: {}", variant.name(), vmlinux.display());
    Ok(vmlinux)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse() {
        assert_eq!(parse_variant("compat").unwrap(), Variant::Compat);
        assert_eq!(parse_variant("standard").unwrap(), Variant::Standard);
        assert!(parse_variant("other").is_err());
    }
}
