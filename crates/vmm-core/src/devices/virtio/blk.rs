//! virtio-blk over a host file (being written).
