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
    // SAFETY: group is plain data the call fills; all-zero is a valid start.
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: every pointer is valid for the call and `buf` is as long as
    // the length given; `found` is set to `&entry` or null.
    let rc = unsafe {
        libc::getgrnam_r(
            c_name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some(entry.gr_gid)
}

/// What the `kvm` group lacks to use the device: nothing (`None`), or
/// the steps that give it (the group made if missing, the device's group
/// and mode set). No device, no steps: nothing to give.
pub fn missing_steps() -> Option<Vec<Step>> {
    let device = std::fs::metadata(KVM_DEVICE).ok()?;
    let gid = group_id(KVM_GROUP);
    let usable = gid == Some(device.gid()) && device.mode() & 0o060 == 0o060;
    if usable {
        return None;
    }
    let mut steps = Vec::new();
    if gid.is_none() {
        steps.push(Step::new(
            format!("creating the system group {KVM_GROUP} whose members may use {KVM_DEVICE}"),
            "groupadd",
            &["--system", KVM_GROUP],
        ));
    }
    steps.push(Step::new(
        format!("giving {KVM_DEVICE} to the group {KVM_GROUP}"),
        "chgrp",
        &[KVM_GROUP, KVM_DEVICE],
    ));
    steps.push(Step::new(
        format!("letting the group {KVM_GROUP} read and write {KVM_DEVICE}"),
        "chmod",
        &["0660", KVM_DEVICE],
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
}
