//! How the VMM opens the files it is given (no KVM needed): a symlink
//! where a disk or a kernel should be is refused, not followed
//! (docs/security.md, "Disk and image files").

use vmm_core::devices::virtio::blk::{BlockDevice, BlockError};

#[test]
fn a_symlink_is_not_opened_as_a_disk() {
    let dir = std::env::temp_dir().join(format!("blk-link-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let real = dir.join("disk");
    std::fs::write(&real, vec![0u8; 1024]).unwrap();
    let link = dir.join("link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert!(BlockDevice::new(&real, true).is_ok());
    let err = BlockDevice::new(&link, true).unwrap_err();
    assert!(matches!(err, BlockError::Open { .. }), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
