//! virtio-vsock with the hybrid Unix-socket backend (being written).
