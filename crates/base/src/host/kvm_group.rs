//! Who may use `/dev/kvm`: the `kvm` group, as Debian's udev rules make
//! it (`root:kvm`, mode 0660). A host without udev (a container, a VM
//! image without it) leaves the device root's alone; setup then gives it
//! to the group, the one root step that lets every user in the group run
//! workspaces with state under their own home.

use std::os::unix::fs::MetadataExt;

use crate::host::plan::Step;

/// The KVM device.
pub const KVM_DEVICE: &str = "/dev/kvm";

/// The group whose members may use [`KVM_DEVICE`].
pub const KVM_GROUP: &str = "kvm";

/// The group id of `name`, if the group exists.
pub fn group_id(name: &str) -> Option<u32> {
    let c_name = std::ffi::CString::new(name).ok()?;
    // A group of many members needs a larger buffer: grown on ERANGE.
    let mut len = 16 * 1024;
    while len <= 4 << 20 {
        // SAFETY: group is plain data the call fills; all-zero is a valid start.
        let mut entry: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; len];
        // SAFETY: every pointer is valid for the call and `buf` is as long
        // as the length given; `found` is set to `&entry` or null.
        let rc = unsafe {
            libc::getgrnam_r(
                c_name.as_ptr(),
                &mut entry,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        if rc == libc::ERANGE {
            len *= 4;
            continue;
        }
        return (rc == 0 && !found.is_null()).then_some(entry.gr_gid);
    }
    None
}

/// Opens [`KVM_DEVICE`] for reading and writing, as a VMM does: whether
/// this process may use KVM.
pub fn open_device() -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(KVM_DEVICE)
        .map(drop)
}

/// The KVM device's major and minor numbers (`misc` 10, 232).
const KVM_DEVICE_NUMBER: (u32, u32) = (10, 232);

/// What the `kvm` group lacks to use the device: nothing (`None`), or
/// the steps that give it (the group made if missing, the device's group
/// set and its group bits made read-write). No steps for anything but the
/// KVM character device itself (a link is not followed), nor for a device
/// every user may already use (taking it from them is no fix).
pub fn missing_steps() -> Option<Vec<Step>> {
    use std::os::unix::fs::FileTypeExt;
    let device = std::fs::symlink_metadata(KVM_DEVICE).ok()?;
    let rdev = device.rdev();
    let number = (libc::major(rdev), libc::minor(rdev));
    if !device.file_type().is_char_device() || number != KVM_DEVICE_NUMBER {
        return None;
    }
    steps_for(device.mode(), device.gid(), group_id(KVM_GROUP))
}

/// [`missing_steps`] for a device of `mode` and group `gid`, with the
/// `kvm` group's id if it exists.
fn steps_for(mode: u32, gid: u32, kvm_gid: Option<u32>) -> Option<Vec<Step>> {
    let everyone = mode & 0o006 == 0o006;
    let group = kvm_gid == Some(gid) && mode & 0o060 == 0o060;
    if everyone || group {
        return None;
    }
    let mut steps = Vec::new();
    if kvm_gid.is_none() {
        steps.push(Step::new(
            format!("creating the system group {KVM_GROUP} whose members may use {KVM_DEVICE}"),
            "groupadd",
            &["--system", KVM_GROUP],
        ));
    }
    steps.push(Step::new(
        format!("giving {KVM_DEVICE} to the group {KVM_GROUP}"),
        "chgrp",
        &["--no-dereference", KVM_GROUP, KVM_DEVICE],
    ));
    steps.push(Step::new(
        format!("letting the group {KVM_GROUP} read and write {KVM_DEVICE}"),
        "chmod",
        &["g+rw", KVM_DEVICE],
    ));
    Some(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_looked_up() {
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("no-such-group-here"), None);
        assert_eq!(group_id("bad\0name"), None);
    }

    #[test]
    fn only_a_device_the_group_cannot_use_gets_steps() {
        // Every user may use it: nothing to give, nothing taken away.
        assert!(steps_for(0o20666, 0, Some(994)).is_none());
        // Debian's udev rule: root:kvm 0660.
        assert!(steps_for(0o20660, 994, Some(994)).is_none());
        // Root's alone: the group gets read and write, nothing else changes.
        let steps = steps_for(0o20600, 0, Some(994)).unwrap();
        let programs: Vec<&str> = steps.iter().map(|s| s.program.as_str()).collect();
        assert_eq!(programs, ["chgrp", "chmod"]);
        assert_eq!(steps[1].args, ["g+rw", KVM_DEVICE]);
        assert!(steps[0].args.contains(&"--no-dereference".to_owned()));
        // No group yet: made first.
        let steps = steps_for(0o20600, 0, None).unwrap();
        assert_eq!(steps[0].program, "groupadd");
    }
}
