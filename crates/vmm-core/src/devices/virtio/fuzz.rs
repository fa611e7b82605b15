//! Entry points for fuzzing device queue processing: arbitrary bytes become
//! guest memory holding a queue's descriptor table, rings and buffers, and
//! the device processes it; and the network's egress filter on arbitrary
//! frames. The `fuzz/` cargo-fuzz targets and
//! `cargo xtask fuzz` call these; a panic, hang or runaway allocation here is
//! a bug. Not for production use.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::{Arc, OnceLock};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::blk::BlockDevice;
use super::net::backend::StreamBackend;
use super::net::NetDevice;
use super::vsock::VsockDevice;
use super::{Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::memory::{create_guest_memory, GuestMemory, MIN_MEM_MIB};

/// Queue size used for fuzzing (descriptor table at 0, avail ring at 0x1000,
/// used ring at 0x2000; the fuzz input is written from address 0 on).
const QUEUE_SIZE: u16 = 16;
/// Most input bytes placed in guest memory.
const MAX_INPUT: usize = 1 << 20;
/// Where the queues the input does not describe live (zeroed memory).
const EMPTY_QUEUES: u32 = 0x20_0000;

/// A backing "disk": a 1 MiB memfd, shared by all iterations in a process
/// (each device gets a duplicate descriptor).
fn backing_file() -> &'static File {
    static FILE: OnceLock<File> = OnceLock::new();
    FILE.get_or_init(|| {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; the
        // returned fd (checked below) is owned by the File from here on.
        let fd = unsafe { libc::memfd_create(c"fuzz-disk".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create failed");
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(1 << 20).expect("sizing the fuzz disk");
        file
    })
}

/// Guest memory holding `data` from address 0, and a ready queue over it.
pub fn memory_and_queue(data: &[u8]) -> (GuestMemory, Queue) {
    let mem = create_guest_memory(MIN_MEM_MIB).expect("guest memory");
    let len = data.len().min(MAX_INPUT);
    mem.write_slice(&data[..len], GuestAddress(0))
        .expect("input fits");
    (mem, queue_at(0))
}

/// A ready queue with its descriptor table at `base`, avail ring at
/// `base + 0x1000` and used ring at `base + 0x2000`.
fn queue_at(base: u32) -> Queue {
    let mut queue = Queue::new(QUEUE_SIZE).expect("queue size");
    queue.set_size(QUEUE_SIZE);
    queue.set_desc_table_address(Some(base), Some(0));
    queue.set_avail_ring_address(Some(base + 0x1000), Some(0));
    queue.set_used_ring_address(Some(base + 0x2000), Some(0));
    queue.set_ready(true);
    queue
}

fn interrupt() -> Arc<Interrupt> {
    Arc::new(Interrupt::new(
        EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).expect("eventfd"),
    ))
}

/// Runs a virtio-blk device over a queue made of `data`.
pub fn blk_queue(data: &[u8]) {
    let (mem, queue) = memory_and_queue(data);
    let mut dev = BlockDevice::from_file(
        backing_file().try_clone(),
        std::path::Path::new("fuzz-disk"),
        false,
    )
    .expect("fuzz disk");
    dev.activate(mem, vec![queue], interrupt(), VIRTIO_F_VERSION_1)
        .expect("activation");
    dev.process_queue();
}

/// Runs a virtio-vsock device whose tx queue is made of `data` (rx and
/// event queues are empty, above the input).
pub fn vsock_queue(data: &[u8]) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (mem, tx) = memory_and_queue(data);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let uds =
        std::env::temp_dir().join(format!("microagent-fuzz-vsock-{}-{n}", std::process::id()));
    let mut dev = VsockDevice::new(3, uds).expect("vsock device");
    let queues = vec![queue_at(EMPTY_QUEUES), tx, queue_at(EMPTY_QUEUES + 0x4000)];
    dev.activate(mem, queues, interrupt(), VIRTIO_F_VERSION_1)
        .expect("activation");
    dev.handle_tx();
    dev.handle_rx();
}

/// Runs a virtio-net device whose transmit queue is made of `data` and
/// whose receive queue (above the input) takes frames a peer wrote,
/// including one cut short.
pub fn net_queue(data: &[u8]) {
    use std::io::Write;
    let (mem, tx) = memory_and_queue(data);
    let (ours, mut peer) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let backend = StreamBackend::new(ours).expect("stream backend");
    let mut dev = NetDevice::new([2, 0, 0, 0, 0, 1], Box::new(backend)).expect("net device");
    let queues = vec![queue_at(EMPTY_QUEUES), tx];
    dev.activate(mem, queues, interrupt(), VIRTIO_F_VERSION_1)
        .expect("activation");
    let frame = data.get(..data.len().min(1500)).unwrap_or_default();
    let mut framed = (frame.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(frame);
    framed.extend_from_slice(&[0, 0, 0x10]);
    peer.set_nonblocking(true).expect("non-blocking peer");
    let _ = peer.write_all(&framed);
    dev.process_tx();
    dev.process_rx();
}

/// Arbitrary bytes as frames through the egress filter, both ways, under
/// an allowlist with one name and one host port: each cut of the input
/// (its first byte says where) is a frame the guest sends and one it
/// gets. Parsing, answers and learning must never panic, and the record
/// of refusals stays bounded.
pub fn egress_frames(data: &[u8]) {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Instant;

    use super::net::egress::rules::{FilterMode, FilterPolicy, NamePattern, NetRule, Prefix};
    use super::net::egress::{EgressFilter, DENIALS_KEPT};
    let policy = FilterPolicy {
        mode: FilterMode::Allowlist,
        nets: vec![NetRule {
            prefix: Prefix {
                addr: IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)),
                len: 32,
            },
            port: Some(8000),
        }],
        names: vec![NamePattern {
            name: "allowed.test".into(),
            below_only: true,
        }],
        guarded: Vec::new(),
        resolver: Ipv4Addr::new(10, 0, 2, 3),
    };
    let mut filter = EgressFilter::new(policy);
    let now = Instant::now();
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let cut = usize::from(cut).max(14);
    for frame in rest.chunks(cut) {
        let _ = filter.outbound(frame, now);
        filter.inbound(frame, now);
    }
    assert!(filter.denials().1.len() <= DENIALS_KEPT);
}

/// Register accesses on a virtio-mmio transport (of a virtio-blk device
/// over memory holding the input): each 12 bytes of the input are one
/// access (byte 0: bit 0 write, bits 1-2 width 1, 2, 4 or 8; bytes 1-2:
/// the offset; bytes 4-11: the value), so feature negotiation, queue
/// setup, activation with any addresses and resets all occur. Then the
/// restore validation: what the transport saved goes into a fresh one, and
/// so does that state with fields taken from the input (as a damaged or
/// forged snapshot could hold them); each is taken or refused, never a
/// panic.
pub fn mmio_registers(data: &[u8]) {
    use super::mmio::MmioTransport;
    use crate::devices::bus::BusDevice;
    let device = || -> Arc<std::sync::Mutex<dyn VirtioDevice>> {
        let blk = BlockDevice::from_file(
            backing_file().try_clone(),
            std::path::Path::new("fuzz-disk"),
            false,
        )
        .expect("fuzz disk");
        Arc::new(std::sync::Mutex::new(blk))
    };
    let (mem, _) = memory_and_queue(data);
    let mut transport = MmioTransport::new(device(), mem.clone(), interrupt());
    for op in data.chunks_exact(12).take(512) {
        let offset = u64::from(u16::from_le_bytes([op[1], op[2]]) % 0x200);
        let width = [1usize, 2, 4, 8][usize::from((op[0] >> 1) & 3)];
        if op[0] & 1 == 1 {
            let _ = transport.write(offset, &op[4..4 + width]);
        } else {
            let mut out = [0u8; 8];
            transport.read(offset, &mut out[..width]);
        }
    }
    let saved = transport.save_state();
    let mut fresh = MmioTransport::new(device(), mem.clone(), interrupt());
    let _ = fresh.restore_state(&saved);
    // The saved state with fields a damaged or forged snapshot could hold,
    // taken from the input's last words.
    let mut words = data
        .chunks_exact(8)
        .rev()
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
    let mut next = move || words.next().unwrap_or(0);
    let mut forged = saved;
    forged.acked_features = next();
    forged.queue_sel = next() as u32;
    forged.status = next() as u32;
    forged.interrupt_status = next() as u32;
    if next().is_multiple_of(4) {
        forged.device_type = next() as u32;
    }
    let queue = super::mmio::SavedQueue {
        max_size: next() as u16,
        next_avail: next() as u16,
        next_used: next() as u16,
        event_idx_enabled: next() % 2 == 1,
        size: next() as u16,
        ready: next() % 2 == 1,
        desc_table: next(),
        avail_ring: next(),
        used_ring: next(),
    };
    match next() % 3 {
        0 => forged.active_queues.push(queue),
        1 => forged.active_queues = vec![queue],
        _ => {}
    }
    let mut other = MmioTransport::new(device(), mem, interrupt());
    let _ = other.restore_state(&forged);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few structured and random inputs run clean (the real fuzzing is
    /// `cargo xtask fuzz` and the cargo-fuzz targets).
    #[test]
    fn survives_sample_inputs() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        blk_queue(&[]);
        vsock_queue(&[]);
        net_queue(&[]);
        for _ in 0..50 {
            let data: Vec<u8> = (0..0x3000).map(|_| next() as u8).collect();
            blk_queue(&data);
            vsock_queue(&data);
            net_queue(&data);
        }
    }
}
