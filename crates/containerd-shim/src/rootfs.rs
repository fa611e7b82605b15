//! The container's root filesystem as a workspace image: the mounts
//! containerd's snapshotter prepared are mounted at the bundle's `rootfs`,
//! registered as an image by the library's conversion (the one `image
//! import` uses), and unmounted. The image is named after the snapshot's
//! chain (the mounts less the container's own writable layer), so a
//! second container of the same image converts nothing. A container that
//! joins a running pod workspace has its root filesystem copied into the
//! guest instead (`copy_into_guest`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim::protos::types::mount::Mount;
use sha2::{Digest, Sha256};
use workspace::images::ImageError;
use workspace::Workspaces;

use crate::error::ShimError;

/// The prefix of the images the shim registers.
pub const IMAGE_PREFIX: &str = "ctr-rootfs-";

/// Mount options that name the container's own layer, not its image.
const OWN_LAYER_OPTIONS: [&str; 2] = ["upperdir=", "workdir="];

/// The image name for `mounts`: the same for every container whose
/// snapshot has the same parents.
pub fn image_name(mounts: &[Mount]) -> String {
    let mut hash = Sha256::new();
    for m in mounts {
        hash.update(m.type_.as_bytes());
        hash.update([0]);
        // A bind mount's source is the container's own snapshot: it keys
        // that container alone (the native snapshotter copies every
        // image, so there is nothing to share).
        hash.update(m.source.as_bytes());
        hash.update([0]);
        for option in &m.options {
            if !OWN_LAYER_OPTIONS.iter().any(|o| option.starts_with(o)) {
                hash.update(option.as_bytes());
                hash.update([0]);
            }
        }
        hash.update([1]);
    }
    let digest = format!("{:x}", hash.finalize());
    format!("{IMAGE_PREFIX}{}", &digest[..16])
}

/// The image of the container whose bundle is `bundle` and whose root
/// filesystem is `mounts`: converted unless already registered. Blocking.
pub fn image_for(all: &Workspaces, bundle: &Path, mounts: &[Mount]) -> Result<String, ShimError> {
    if mounts.is_empty() {
        return Err(ShimError::BadSpec(
            "containerd gave no root filesystem mounts; give the container an image, or the annotation io.microagent.image".into(),
        ));
    }
    let name = image_name(mounts);
    match all.image_registry().get(&name) {
        Ok(_) => return Ok(name),
        Err(ImageError::NotFound(_)) => {}
        Err(source) => {
            return Err(ShimError::workspace(format!("read image {name}"))(
                source.into(),
            ))
        }
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target).map_err(|source| ShimError::MountPoint {
        path: target.clone(),
        source,
    })?;
    mount_all(mounts, &target)?;
    let source = format!(
        "containerd snapshot ({})",
        mounts
            .iter()
            .map(|m| m.type_.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let imported = all
        .image_registry()
        .import_root_dir(&name, &target, &source);
    let unmounted = unmount(&target);
    match imported {
        Ok(_) => {}
        // Another shim converted the same chain meanwhile.
        Err(ImageError::Exists(_)) => {}
        Err(source) => {
            return Err(ShimError::workspace(format!(
                "convert the container's root filesystem into image {name}"
            ))(source.into()))
        }
    }
    unmounted?;
    Ok(name)
}

fn mount_all(mounts: &[Mount], target: &Path) -> Result<(), ShimError> {
    for m in mounts {
        let fs_type = Some(m.type_.as_str()).filter(|s| !s.is_empty());
        let source = Some(m.source.as_str()).filter(|s| !s.is_empty());
        if let Err(source) =
            containerd_shim::mount::mount_rootfs(fs_type, source, &m.options, target)
        {
            let _ = unmount(target);
            return Err(ShimError::Mount {
                what: "mount",
                target: target.to_owned(),
                source,
            });
        }
    }
    Ok(())
}

/// Copies the container's root filesystem (`mounts`, mounted at the
/// bundle's `rootfs` for the copy) into workspace `workspace` as guest
/// directory `guest_dir`: for a container that joins a pod whose workspace
/// already runs, booted from another root. Returns the entries copied.
pub async fn copy_into_guest(
    all: &Arc<Workspaces>,
    workspace: &str,
    bundle: &Path,
    mounts: &[Mount],
    guest_dir: &str,
) -> Result<u64, ShimError> {
    if mounts.is_empty() {
        return Err(ShimError::BadSpec(
            "containerd gave no root filesystem mounts; give the container an image".into(),
        ));
    }
    let target = bundle.join("rootfs");
    let (at, mounts_owned) = (target.clone(), mounts.to_vec());
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&at).map_err(|source| ShimError::MountPoint {
            path: at.clone(),
            source,
        })?;
        mount_all(&mounts_owned, &at)
    })
    .await
    .map_err(|_| ShimError::WrongState {
        process: "mounting the root filesystem".into(),
        why: "was cancelled",
    })??;
    let copied = match all.workspace(workspace) {
        Ok(ws) => ws.files().copy_in_archive(&target, guest_dir).await,
        Err(e) => Err(e),
    };
    let unmounted = unmount(&target);
    let copied = copied.map_err(ShimError::workspace(format!(
        "copy the container's root filesystem into workspace {workspace} at {guest_dir}"
    )))?;
    unmounted?;
    Ok(copied)
}

/// Unmounts everything at `target` (nothing mounted is fine).
pub fn unmount(target: &Path) -> Result<(), ShimError> {
    let path: PathBuf = target.to_owned();
    containerd_shim::mount::umount_recursive(path.to_str(), libc::MNT_DETACH).map_err(|source| {
        ShimError::Mount {
            what: "unmount",
            target: path.clone(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(lower: &str, upper: &str) -> Mount {
        Mount {
            type_: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                "index=off".into(),
                format!("workdir={upper}/work"),
                format!("upperdir={upper}/fs"),
                format!("lowerdir={lower}"),
            ],
            ..Mount::default()
        }
    }

    #[test]
    fn containers_of_one_image_share_a_name_and_other_images_do_not() {
        let a = image_name(&[overlay("/s/2/fs:/s/1/fs", "/s/7")]);
        let b = image_name(&[overlay("/s/2/fs:/s/1/fs", "/s/8")]);
        let c = image_name(&[overlay("/s/3/fs:/s/1/fs", "/s/9")]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.starts_with(IMAGE_PREFIX));
        workspace::store::name::validate_name(&a).unwrap();
    }
}
