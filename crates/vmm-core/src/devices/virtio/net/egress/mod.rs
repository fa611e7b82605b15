//! The egress filter of a network whose backend cannot filter (`passt`,
//! the rootless `user` network): the VMM sees every frame the guest sends
//! and every frame it gets, so it enforces the policy there.
//!
//! Outbound, a new flow to a denied destination goes nowhere: a TCP SYN is
//! answered with a reset from the destination (clients fail at once), a
//! UDP datagram, an ICMP message or a fragment is dropped. Only new flows
//! are judged for TCP: passt keeps no connection a SYN did not open, so a
//! rule removed while a connection runs ends no connection. DNS questions
//! to the network's resolver are read: under an allowlist, one for a name
//! not on it is answered REFUSED by the filter itself. Inbound, the
//! resolver's answers for allowed names teach the filter their addresses
//! (through CNAMEs) for their TTL. Frames that are not IP (ARP) pass.
//! Each refusal is counted and the last ones kept, for `inspect` and
//! events. The policy can be replaced while the machine runs.

pub mod dns;
pub mod frame;
pub mod rules;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::frame::{Packet, Transport, PROTO_ICMP, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_SYN};
use self::rules::{DenyReason, FilterMode, FilterPolicy};
use super::backend::NetBackend;

/// Refusals kept for `inspect`.
pub const DENIALS_KEPT: usize = 32;
/// Addresses learned from DNS answers, at most.
const LEARNED_MAX: usize = 4096;
/// A learned address is kept at least this long (a zero TTL would make
/// the connection that follows the lookup fail) and at most a day.
const LEARNED_MIN: Duration = Duration::from_secs(30);
const LEARNED_MAX_TTL: Duration = Duration::from_secs(86_400);
/// Frames the filter's own answers may queue for the guest.
const ANSWERS_MAX: usize = 64;

/// One refused flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// Numbers refusals from 1, so a reader can take only new ones.
    pub seq: u64,
    /// Where the guest was going.
    pub dst: IpAddr,
    /// The destination port, where the packet showed one.
    pub port: Option<u16>,
    /// `tcp`, `udp`, `icmp`, `dns` (a question) or `ip`.
    pub protocol: &'static str,
    /// The name asked about, for a refused DNS question.
    pub name: Option<String>,
    /// Why.
    pub reason: DenyReason,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// What to do with a frame the guest sent.
#[derive(Debug, PartialEq, Eq)]
pub enum Outbound {
    /// On to the backend.
    Pass,
    /// Nowhere.
    Drop,
    /// Drop it and give the guest this frame instead.
    Answer(Vec<u8>),
}

/// The policy, what it learned, and what it refused.
#[derive(Debug)]
pub struct EgressFilter {
    policy: FilterPolicy,
    /// Address, until when, and the name it was learned for.
    learned: HashMap<IpAddr, (Instant, String)>,
    denials: VecDeque<Denial>,
    denied: u64,
    /// Told (without waiting) at each refusal: a reader sleeps until
    /// there is something to read.
    on_refusal: Option<SyncSender<()>>,
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl EgressFilter {
    /// A filter enforcing `policy`, having learned nothing.
    pub fn new(policy: FilterPolicy) -> Self {
        Self {
            policy,
            learned: HashMap::new(),
            denials: VecDeque::with_capacity(DENIALS_KEPT),
            denied: 0,
            on_refusal: None,
        }
    }

    /// Replaces the policy, for new flows from now on; addresses learned
    /// for names it no longer allows are forgotten.
    pub fn set_policy(&mut self, policy: FilterPolicy) {
        self.learned.retain(|_, (_, name)| policy.learns(name));
        self.policy = policy;
    }

    /// The policy in force.
    pub fn policy(&self) -> &FilterPolicy {
        &self.policy
    }

    /// Refusals so far, and the last [`DENIALS_KEPT`] of them, oldest
    /// first.
    pub fn denials(&self) -> (u64, Vec<Denial>) {
        (self.denied, self.denials.iter().cloned().collect())
    }

    /// Tells `to` at every refusal from now on; a full channel already
    /// holds the news, so a refusal never waits for the reader.
    pub fn notify_refusals(&mut self, to: SyncSender<()>) {
        self.on_refusal = Some(to);
    }

    fn refuse(
        &mut self,
        packet: &Packet,
        protocol: &'static str,
        name: Option<String>,
        reason: DenyReason,
    ) {
        self.denied += 1;
        if self.denials.len() == DENIALS_KEPT {
            self.denials.pop_front();
        }
        self.denials.push_back(Denial {
            seq: self.denied,
            dst: packet.dst,
            port: packet.transport.dst_port(),
            protocol,
            name,
            reason,
            at_ms: wall_ms(),
        });
        if let Some(to) = &self.on_refusal {
            let _ = to.try_send(());
        }
    }

    fn is_learned(&self, dst: IpAddr, now: Instant) -> bool {
        self.learned
            .get(&dst)
            .is_some_and(|(until, _)| *until > now)
    }

    /// Judges a frame the guest sent.
    pub fn outbound(&mut self, frame: &[u8], now: Instant) -> Outbound {
        let Some(packet) = frame::parse(frame) else {
            // ARP and other link traffic pass; IP too broken to read does
            // not.
            return if frame::is_ip(frame) {
                Outbound::Drop
            } else {
                Outbound::Pass
            };
        };
        let to_resolver = packet.dst == IpAddr::V4(self.policy.resolver);
        let (protocol, judged) = match packet.transport {
            // Established flows and resets: passt has no flow a SYN did
            // not open.
            Transport::Tcp { flags, .. } => ("tcp", flags & TCP_SYN != 0 && flags & TCP_ACK == 0),
            Transport::Udp { dst_port: 53, .. } if to_resolver => {
                return self.question(frame, &packet);
            }
            Transport::Udp { .. } => ("udp", true),
            // Neighbour discovery (ICMPv6 133-137) is link traffic.
            Transport::Icmp { kind } if packet.dst.is_ipv6() && (133..=137).contains(&kind) => {
                return Outbound::Pass;
            }
            Transport::Icmp { .. } => ("icmp", true),
            Transport::Opaque { protocol } => (
                match protocol {
                    PROTO_TCP => "tcp",
                    PROTO_UDP => "udp",
                    PROTO_ICMP => "icmp",
                    _ => "ip",
                },
                true,
            ),
        };
        if !judged {
            return Outbound::Pass;
        }
        let port = packet.transport.dst_port();
        // DNS over TCP to the resolver cannot be read: under an allowlist
        // it is refused like DNS to any other resolver.
        let verdict = if to_resolver && protocol == "tcp" && self.policy.mode != FilterMode::All {
            Err(DenyReason::OtherResolver)
        } else {
            self.policy
                .decide(packet.dst, port, self.is_learned(packet.dst, now))
        };
        match verdict {
            Ok(()) => Outbound::Pass,
            Err(reason) => {
                self.refuse(&packet, protocol, None, reason);
                frame::tcp_reset(&packet).map_or(Outbound::Drop, Outbound::Answer)
            }
        }
    }

    /// A UDP datagram to the resolver's port 53: a question the policy
    /// allows passes, another is answered REFUSED, and what cannot be read
    /// as a question passes only when everything may.
    fn question(&mut self, frame: &[u8], packet: &Packet) -> Outbound {
        let Transport::Udp {
            payload_at,
            payload_len,
            ..
        } = packet.transport
        else {
            return Outbound::Drop;
        };
        let payload = &frame[payload_at..payload_at + payload_len];
        let Some(question) = dns::query(payload) else {
            return if self.policy.mode == FilterMode::All {
                Outbound::Pass
            } else {
                self.refuse(packet, "dns", None, DenyReason::NameNotAllowed);
                Outbound::Drop
            };
        };
        if self.policy.may_ask(&question.name) {
            return Outbound::Pass;
        }
        let reason = if self.policy.mode == FilterMode::Nothing {
            DenyReason::Nothing
        } else {
            DenyReason::NameNotAllowed
        };
        self.refuse(packet, "dns", Some(question.name.clone()), reason);
        dns::refused(payload, &question)
            .and_then(|answer| frame::udp_reply(packet, &answer))
            .map_or(Outbound::Drop, Outbound::Answer)
    }

    /// Reads a frame on its way to the guest: the resolver's answers for
    /// allowed names teach their addresses.
    pub fn inbound(&mut self, frame: &[u8], now: Instant) {
        let Some(packet) = frame::parse(frame) else {
            return;
        };
        let Transport::Udp {
            src_port: 53,
            payload_at,
            payload_len,
            ..
        } = packet.transport
        else {
            return;
        };
        if packet.src != IpAddr::V4(self.policy.resolver) {
            return;
        }
        let Some((name, learned)) = dns::answer(&frame[payload_at..payload_at + payload_len])
        else {
            return;
        };
        if !self.policy.learns(&name) {
            return;
        }
        for found in learned {
            let ttl =
                Duration::from_secs(u64::from(found.ttl_secs)).clamp(LEARNED_MIN, LEARNED_MAX_TTL);
            if self.learned.len() >= LEARNED_MAX && !self.learned.contains_key(&found.addr) {
                self.learned.retain(|_, (until, _)| *until > now);
                if self.learned.len() >= LEARNED_MAX {
                    continue;
                }
            }
            self.learned.insert(found.addr, (now + ttl, name.clone()));
        }
    }
}

/// A backend whose traffic goes through an [`EgressFilter`] (shared with
/// whoever changes its policy and reads its refusals).
pub struct FilteredBackend {
    inner: Box<dyn NetBackend>,
    filter: Arc<Mutex<EgressFilter>>,
    /// The filter's answers, delivered before the backend's frames.
    answers: VecDeque<Vec<u8>>,
}

impl FilteredBackend {
    /// `inner` behind `filter`.
    pub fn new(inner: Box<dyn NetBackend>, filter: Arc<Mutex<EgressFilter>>) -> Self {
        Self {
            inner,
            filter,
            answers: VecDeque::new(),
        }
    }

    fn filter(&self) -> std::sync::MutexGuard<'_, EgressFilter> {
        // A panic elsewhere while holding it leaves a filter still whole.
        self.filter.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for FilteredBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilteredBackend")
            .field("answers", &self.answers.len())
            .finish_non_exhaustive()
    }
}

impl NetBackend for FilteredBackend {
    fn fd(&self) -> RawFd {
        self.inner.fd()
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let verdict = self.filter().outbound(frame, Instant::now());
        match verdict {
            Outbound::Pass => self.inner.send(frame),
            Outbound::Drop => Ok(()),
            Outbound::Answer(answer) => {
                if self.answers.len() < ANSWERS_MAX {
                    self.answers.push_back(answer);
                }
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> io::Result<bool> {
        self.inner.flush()
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if let Some(answer) = self.answers.pop_front() {
            let len = answer.len().min(buf.len());
            buf[..len].copy_from_slice(&answer[..len]);
            return Ok(Some(len));
        }
        let got = self.inner.recv(buf)?;
        if let Some(len) = got {
            self.filter().inbound(&buf[..len], Instant::now());
        }
        Ok(got)
    }

    fn has_queued(&self) -> bool {
        !self.answers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::dns::tests::{answer_for, query_for};
    use super::frame::tests::{tcp, udp, v4_frame};
    use super::rules::tests::{policy, prefix, v4};
    use super::rules::{NamePattern, NetRule};
    use super::*;

    fn syn(dst: [u8; 4], port: u16) -> Vec<u8> {
        v4_frame(dst, PROTO_TCP, &tcp(40000, port, 1, TCP_SYN, b""))
    }

    /// A frame from the resolver to the guest carrying `dns`.
    fn from_resolver(dns: &[u8]) -> Vec<u8> {
        let mut frame = v4_frame([10, 0, 2, 15], PROTO_UDP, &udp(53, 5353, dns));
        // Source 10.0.2.3 (the helper writes the guest's address there).
        frame[26..30].copy_from_slice(&[10, 0, 2, 3]);
        frame
    }

    #[test]
    fn the_default_policy_resets_syns_to_the_host_and_metadata() {
        let mut f = EgressFilter::new(policy(FilterMode::All));
        let now = Instant::now();
        assert_eq!(
            f.outbound(&syn([93, 184, 216, 34], 443), now),
            Outbound::Pass
        );
        let Outbound::Answer(reset) = f.outbound(&syn([169, 254, 169, 254], 80), now) else {
            panic!("no reset");
        };
        assert_eq!(frame::parse(&reset).unwrap().src, v4(169, 254, 169, 254));
        assert_eq!(
            f.outbound(&v4_frame([10, 0, 2, 2], PROTO_UDP, &udp(1, 9, b"x")), now),
            Outbound::Drop
        );
        // An established flow's segments are not judged.
        let ack = v4_frame([10, 0, 2, 2], PROTO_TCP, &tcp(1, 22, 9, TCP_ACK, b"data"));
        assert_eq!(f.outbound(&ack, now), Outbound::Pass);
        // ARP passes; a broken IP header does not.
        let mut arp = syn([1, 1, 1, 1], 1);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(f.outbound(&arp, now), Outbound::Pass);
        assert_eq!(f.outbound(&syn([1, 1, 1, 1], 1)[..20], now), Outbound::Drop);
        let (count, kept) = f.denials();
        assert_eq!(count, 2);
        assert_eq!((kept[0].protocol, kept[0].port), ("tcp", Some(80)));
        assert_eq!(kept[0].reason, DenyReason::Guarded);
        assert_eq!(kept[1].seq, 2);
    }

    #[test]
    fn an_allowlist_learns_names_and_refuses_the_rest() {
        let mut p = policy(FilterMode::Allowlist);
        p.names.push(NamePattern {
            name: "allowed.test".into(),
            below_only: false,
        });
        let mut f = EgressFilter::new(p);
        let now = Instant::now();
        let ask = |name: &str| v4_frame([10, 0, 2, 3], PROTO_UDP, &udp(5353, 53, &query_for(name)));
        assert_eq!(f.outbound(&ask("allowed.test"), now), Outbound::Pass);
        let Outbound::Answer(refusal) = f.outbound(&ask("denied.test"), now) else {
            panic!("not refused");
        };
        let reply = frame::parse(&refusal).unwrap();
        let Transport::Udp { payload_at, .. } = reply.transport else {
            panic!("{reply:?}");
        };
        assert_eq!(refusal[payload_at + 3] & 0x0f, 5, "REFUSED");
        // Before the answer, the address is closed; after, open for its TTL.
        assert!(matches!(
            f.outbound(&syn([192, 0, 2, 7], 443), now),
            Outbound::Answer(_)
        ));
        f.inbound(
            &from_resolver(&answer_for("allowed.test", None, &[[192, 0, 2, 7]], 60)),
            now,
        );
        // An answer about a name not on the list teaches nothing.
        f.inbound(
            &from_resolver(&answer_for("denied.test", None, &[[192, 0, 2, 8]], 60)),
            now,
        );
        assert_eq!(f.outbound(&syn([192, 0, 2, 7], 443), now), Outbound::Pass);
        assert!(matches!(
            f.outbound(&syn([192, 0, 2, 8], 443), now),
            Outbound::Answer(_)
        ));
        let later = now + Duration::from_secs(61);
        assert!(matches!(
            f.outbound(&syn([192, 0, 2, 7], 443), later),
            Outbound::Answer(_)
        ));
        // Another resolver, by UDP or TCP to ours: refused.
        let other = v4_frame(
            [1, 1, 1, 1],
            PROTO_UDP,
            &udp(5353, 53, &query_for("allowed.test")),
        );
        assert_eq!(f.outbound(&other, now), Outbound::Drop);
        assert!(matches!(
            f.outbound(&syn([10, 0, 2, 3], 53), now),
            Outbound::Answer(_)
        ));
        let reasons: Vec<DenyReason> = f.denials().1.iter().map(|d| d.reason).collect();
        assert_eq!(reasons[0], DenyReason::NameNotAllowed);
        assert_eq!(f.denials().1[0].name.as_deref(), Some("denied.test"));
        assert!(reasons.ends_with(&[DenyReason::OtherResolver, DenyReason::OtherResolver]));
    }

    #[test]
    fn a_new_policy_applies_to_the_next_flow() {
        let mut f = EgressFilter::new(policy(FilterMode::All));
        let now = Instant::now();
        assert!(matches!(
            f.outbound(&syn([10, 0, 2, 2], 8000), now),
            Outbound::Answer(_)
        ));
        let mut p = policy(FilterMode::All);
        p.nets.push(NetRule {
            prefix: prefix(v4(10, 0, 2, 2), 32),
            port: Some(8000),
        });
        f.set_policy(p);
        assert_eq!(f.outbound(&syn([10, 0, 2, 2], 8000), now), Outbound::Pass);
        f.set_policy(policy(FilterMode::Nothing));
        assert!(matches!(
            f.outbound(&syn([93, 184, 216, 34], 443), now),
            Outbound::Answer(_)
        ));
    }

    #[test]
    fn refusals_signal_their_reader_once_however_many_come() {
        let mut f = EgressFilter::new(policy(FilterMode::Nothing));
        let (to, from) = std::sync::mpsc::sync_channel(1);
        f.notify_refusals(to);
        let now = Instant::now();
        assert!(from.try_recv().is_err(), "nothing refused yet");
        for port in [443, 444, 445] {
            assert!(matches!(
                f.outbound(&syn([93, 184, 216, 34], port), now),
                Outbound::Answer(_)
            ));
        }
        assert!(from.try_recv().is_ok());
        assert!(from.try_recv().is_err(), "one message for the three");
        assert_eq!(f.denials().0, 3);
        // A reader gone never blocks the filter.
        drop(from);
        let _ = f.outbound(&syn([93, 184, 216, 34], 446), now);
        assert_eq!(f.denials().0, 4);
    }

    #[test]
    fn garbage_never_panics_and_keeps_the_record_bounded() {
        let mut f = EgressFilter::new(policy(FilterMode::Allowlist));
        let now = Instant::now();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..2000 {
            let mut frame = syn([10, 0, 2, 3], 53);
            for b in frame.iter_mut().skip(12) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(7) {
                    *b = x as u8;
                }
            }
            frame.truncate(14 + (i % frame.len()));
            let _ = f.outbound(&frame, now);
            f.inbound(&frame, now);
        }
        assert!(f.denials().1.len() <= DENIALS_KEPT);
    }
}
