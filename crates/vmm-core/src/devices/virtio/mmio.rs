//! virtio-mmio transport (being written).
