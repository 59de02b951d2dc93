//! The `Transport` trait every backend implements, and the plain data it moves.
//!
//! The shape follows RDMA WRITE: a registered local region is written into a registered remote
//! region at an offset. Posting takes a slice of [`WriteOp`]s (all `Copy`, so callers keep them in
//! pre-sized buffers) and rings one doorbell for the whole slice; completions are drained into a
//! caller-provided slice. Neither allocates.

use crate::caller_memory::{CallerMemory, CallerMemoryPath, CopiedBytes};
use crate::domain::Domain;
use crate::profile::TransportFacts;
use crate::region::{LocalRegion, MemoryKind, RegionId, RemoteRegion};
use crate::transport_error::TransportError;
use crate::wait_mode::WaitMode;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Instant;

/// What a transport can do, as the backend reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Rates, costs and limits the hint model reads (max message, MTU, wire rate, per-op cost).
    pub facts: TransportFacts,
    /// Work requests that may be outstanding at once (`max_qp_wr`, bounded by the CQ depth).
    pub max_outstanding_wrs: u32,
    /// Work requests accepted by one [`Transport::post_writes`] call (one doorbell): at most
    /// [`MAX_OPS_PER_POST`], fewer where the device's queue is shorter.
    pub max_wrs_per_post: u32,
    /// Scatter/gather entries per work request (`max_sge`).
    pub max_sges: u32,
    /// Memory kinds [`Transport::register`] accepts.
    pub memory_kinds: Vec<MemoryKind>,
    /// Memory kinds [`Transport::register_memory`] registers in place, each with the CPU
    /// copies a payload byte takes on that path; a kind not listed is refused with
    /// [`TransportError::UnsupportedMemory`].
    #[serde(default)]
    pub caller_memory: Vec<CallerMemoryPath>,
    /// A post returns without waiting for the peer, the network or room another thread makes:
    /// it may copy its own blocks first, and take the locks every post takes (other posters
    /// hold them as briefly; the region table's read lock waits for a registration, which
    /// holds the table while it allocates, and for an `access_region` closure). A caller may
    /// then post a small doorbell while holding a lock of its own (the transfer engine does,
    /// sparing a lock round trip per transfer); such a caller must not register regions or
    /// run an `access_region` closure that takes that lock. `false` unless the backend
    /// vouches for it.
    #[serde(default)]
    pub posts_without_waiting: bool,
}

impl Capabilities {
    /// [`TransportError::QueueFull`] for more ops than one post takes
    /// ([`max_wrs_per_post`](Self::max_wrs_per_post)): the count check every post starts with.
    pub fn check_post(&self, count: usize) -> Result<(), TransportError> {
        if count > self.max_wrs_per_post as usize {
            let given = u32::try_from(count).unwrap_or(u32::MAX);
            return Err(TransportError::QueueFull { given, max: self.max_wrs_per_post });
        }
        Ok(())
    }

    /// The caller-memory path for `kind`, if this transport registers that kind in place.
    ///
    /// ```
    /// # use rdma_hint_core::{Capabilities, CallerMemoryPath, MemoryKind, TransportFacts};
    /// # fn check(caps: &Capabilities) {
    /// match caps.caller_memory_path(MemoryKind::Host) {
    ///     Some(path) => println!("{} copies sending, {:?} receiving", path.send_copies, path.receive_copies),
    ///     None => println!("host memory goes through write_region"),
    /// }
    /// # }
    /// ```
    pub fn caller_memory_path(&self, kind: MemoryKind) -> Option<&CallerMemoryPath> {
        self.caller_memory.iter().find(|path| path.kind == kind)
    }
}

/// The most ops one post takes on any backend (one doorbell, one chain of work requests):
/// posting buffers are arrays of this size, so a post allocates nothing.
pub const MAX_OPS_PER_POST: usize = 64;

/// Who opens the out-of-band connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEndpoint {
    /// Wait for the peer on this address (bound now, unless [`Transport::bind`] already bound
    /// a listener: then that one accepts and this address is not used).
    Listen(SocketAddr),
    /// Dial the peer at this address.
    Dial(SocketAddr),
}

/// One RDMA WRITE: `len` bytes from `local[local_offset..]` to `remote[remote_offset..]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOp {
    /// Caller's tag, returned in the [`Completion`].
    pub wr_id: u64,
    /// Source region.
    pub local: RegionId,
    /// Offset in the source region, in bytes.
    pub local_offset: u64,
    /// Destination region (from [`Transport::connect`]).
    pub remote: RegionId,
    /// Offset in the destination region, in bytes.
    pub remote_offset: u64,
    /// Bytes to write.
    pub len: u64,
    /// Whether this op produces a completion (selective signalling).
    pub signalled: bool,
    /// Immediate data delivered to the receiver with the write, if any.
    pub imm: Option<u32>,
}

impl WriteOp {
    /// A blank op to pre-fill posting buffers with.
    pub const EMPTY: WriteOp = WriteOp {
        wr_id: 0,
        local: RegionId(0),
        local_offset: 0,
        remote: RegionId(0),
        remote_offset: 0,
        len: 0,
        signalled: false,
        imm: None,
    };

    /// The read of the same ranges: `remote[remote_offset..]` fetched into
    /// `local[local_offset..]` (a read carries no immediate).
    ///
    /// ```
    /// use rdma_hint_core::{RegionId, WriteOp};
    /// let op = WriteOp { wr_id: 3, local: RegionId(1), local_offset: 64, remote: RegionId(2),
    ///                    remote_offset: 4096, len: 100, signalled: true, imm: Some(7) };
    /// let read = op.as_read();
    /// assert_eq!((read.wr_id, read.local_offset, read.remote_offset, read.len), (3, 64, 4096, 100));
    /// assert!(read.signalled);
    /// ```
    pub fn as_read(&self) -> ReadOp {
        ReadOp {
            wr_id: self.wr_id,
            local: self.local,
            local_offset: self.local_offset,
            remote: self.remote,
            remote_offset: self.remote_offset,
            len: self.len,
            signalled: self.signalled,
        }
    }

    /// The one check an op gets before it is posted: not empty, within the transport's max
    /// message, and inside both regions (`local_len`, `remote_len` bytes) without overflow.
    /// Backends call it through the backend core's `RegionTable::check_write`,
    /// which also looks both regions up.
    ///
    /// ```
    /// use rdma_hint_core::{RegionId, WriteOp};
    /// let op = WriteOp { wr_id: 1, local: RegionId(0), local_offset: 0, remote: RegionId(0),
    ///                    remote_offset: 2048, len: 4096, signalled: true, imm: None };
    /// assert!(op.check_lens(4096, 8192, 1 << 30).is_ok());
    /// assert!(op.check_lens(4096, 4096, 1 << 30).is_err()); // runs past the remote end
    /// ```
    #[inline]
    pub fn check_lens(
        &self,
        local_len: u64,
        remote_len: u64,
        max_msg_bytes: u64,
    ) -> Result<(), TransportError> {
        if self.len == 0 {
            return Err(TransportError::ZeroLength { wr_id: self.wr_id });
        }
        if self.len > max_msg_bytes {
            return Err(TransportError::MessageTooLarge { len: self.len, max_msg_bytes });
        }
        check_range("local", self.local_offset, self.len, local_len)?;
        check_range("remote", self.remote_offset, self.len, remote_len)
    }
}

/// One RDMA READ: `len` bytes of the peer's `remote[remote_offset..]` (a region its connect
/// exposed) into `local[local_offset..]`. `Copy`, like [`WriteOp`], so callers keep reads in
/// pre-sized buffers. The peer is not told (a read carries no immediate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOp {
    /// Caller's tag, returned in the [`Completion`].
    pub wr_id: u64,
    /// Destination region, on this side.
    pub local: RegionId,
    /// Offset in the destination region, in bytes.
    pub local_offset: u64,
    /// Source region, the peer's (from [`Transport::connect`]).
    pub remote: RegionId,
    /// Offset in the source region, in bytes.
    pub remote_offset: u64,
    /// Bytes to read.
    pub len: u64,
    /// Whether this read produces a completion (selective signalling).
    pub signalled: bool,
}

impl ReadOp {
    /// A blank read to pre-fill posting buffers with.
    pub const EMPTY: ReadOp = ReadOp {
        wr_id: 0,
        local: RegionId(0),
        local_offset: 0,
        remote: RegionId(0),
        remote_offset: 0,
        len: 0,
        signalled: false,
    };

    /// The write with the same ranges: what the shared checks and a backend's posting
    /// machinery take (the direction is the backend's to keep).
    ///
    /// ```
    /// use rdma_hint_core::{ReadOp, RegionId};
    /// let read = ReadOp { wr_id: 1, local: RegionId(0), local_offset: 0, remote: RegionId(2),
    ///                     remote_offset: 4096, len: 4096, signalled: true };
    /// assert!(read.ranges().check_lens(4096, 8192, 1 << 30).is_ok());
    /// assert!(read.ranges().check_lens(4096, 4096, 1 << 30).is_err()); // past the peer's end
    /// ```
    pub fn ranges(&self) -> WriteOp {
        WriteOp {
            wr_id: self.wr_id,
            local: self.local,
            local_offset: self.local_offset,
            remote: self.remote,
            remote_offset: self.remote_offset,
            len: self.len,
            signalled: self.signalled,
            imm: None,
        }
    }

    /// The ranges of every read of one post, in `out` (a posting buffer: nothing allocates);
    /// more reads than one post takes are refused.
    ///
    /// ```
    /// use rdma_hint_core::{ReadOp, WriteOp, MAX_OPS_PER_POST};
    /// let mut out = [WriteOp::EMPTY; MAX_OPS_PER_POST];
    /// let reads = [ReadOp { len: 64, ..ReadOp::EMPTY }; 2];
    /// assert_eq!(ReadOp::ranges_of(&reads, &mut out).unwrap().len(), 2);
    /// assert!(ReadOp::ranges_of(&[ReadOp::EMPTY; MAX_OPS_PER_POST + 1], &mut out).is_err());
    /// ```
    pub fn ranges_of<'a>(
        ops: &[ReadOp],
        out: &'a mut [WriteOp; MAX_OPS_PER_POST],
    ) -> Result<&'a mut [WriteOp], TransportError> {
        if ops.len() > MAX_OPS_PER_POST {
            return Err(TransportError::QueueFull { given: ops.len() as u32, max: MAX_OPS_PER_POST as u32 });
        }
        for (slot, op) in out.iter_mut().zip(ops) {
            *slot = op.ranges();
        }
        Ok(&mut out[..ops.len()])
    }
}

/// One local range of a [`GatherOp`]: `len` bytes of region `local` from byte `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherEntry {
    /// Source region.
    pub local: RegionId,
    /// Offset in the source region, in bytes.
    pub offset: u64,
    /// Bytes taken from it.
    pub len: u64,
}

/// One work request that gathers several local ranges into one contiguous remote range (a
/// verbs WR with several SGEs): entries `first..first + count` of the post's entry slice land
/// back to back at `remote[remote_offset..]`. `Copy`, like [`WriteOp`], so callers keep both
/// slices in pre-sized buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherOp {
    /// Caller's tag, returned in the [`Completion`].
    pub wr_id: u64,
    /// Index of the op's first entry in the post's entry slice.
    pub first: u32,
    /// Entries the op gathers (1..=[`Capabilities::max_sges`]).
    pub count: u32,
    /// Destination region (from [`Transport::connect`]).
    pub remote: RegionId,
    /// Offset in the destination region of the first entry's bytes, in bytes.
    pub remote_offset: u64,
    /// Whether this op produces a completion (selective signalling).
    pub signalled: bool,
    /// Immediate data delivered to the receiver once all of the op's bytes landed, if any.
    pub imm: Option<u32>,
}

impl GatherEntry {
    /// A blank entry to pre-fill buffers with.
    pub const EMPTY: GatherEntry = GatherEntry { local: RegionId(0), offset: 0, len: 0 };
}

impl GatherOp {
    /// A blank op to pre-fill buffers with.
    pub const EMPTY: GatherOp = GatherOp {
        wr_id: 0,
        first: 0,
        count: 0,
        remote: RegionId(0),
        remote_offset: 0,
        signalled: false,
        imm: None,
    };

    /// The op's entries in `entries` and its total length, checked: `1..=max_sges` entries
    /// inside the slice, a total within `max_msg_bytes` without overflow. The ranges
    /// themselves are checked per piece ([`GatherOp::pieces`] through
    /// [`WriteOp::check_lens`]).
    ///
    /// ```
    /// use rdma_hint_core::{GatherEntry, GatherOp, RegionId};
    /// let entries = [GatherEntry { local: RegionId(0), offset: 8192, len: 4096 },
    ///                GatherEntry { local: RegionId(0), offset: 0, len: 4096 }];
    /// let op = GatherOp { wr_id: 7, first: 0, count: 2, remote: RegionId(0), remote_offset: 0,
    ///                     signalled: true, imm: Some(1) };
    /// assert_eq!(op.entries(&entries, 4, 1 << 30).unwrap().1, 8192);
    /// assert!(op.entries(&entries, 1, 1 << 30).is_err()); // more entries than max_sges
    /// assert!(GatherOp { count: 3, ..op }.entries(&entries, 4, 1 << 30).is_err()); // past the slice
    /// ```
    pub fn entries<'a>(
        &self,
        entries: &'a [GatherEntry],
        max_sges: u32,
        max_msg_bytes: u64,
    ) -> Result<(&'a [GatherEntry], u64), TransportError> {
        if self.count == 0 {
            return Err(TransportError::ZeroLength { wr_id: self.wr_id });
        }
        if self.count > max_sges {
            return Err(TransportError::TooManyEntries { given: self.count, max_sges });
        }
        let end = self.first.checked_add(self.count).filter(|end| *end as usize <= entries.len());
        let Some(end) = end else {
            return Err(TransportError::InvalidArgument {
                what: "gather entries",
                why: format!(
                    "entries {}..+{} lie outside the {} given",
                    self.first,
                    self.count,
                    entries.len()
                ),
            });
        };
        let own = &entries[self.first as usize..end as usize];
        let mut len = 0u64;
        for entry in own {
            len = len
                .checked_add(entry.len)
                .ok_or(TransportError::MessageTooLarge { len: u64::MAX, max_msg_bytes })?;
        }
        if len > max_msg_bytes {
            return Err(TransportError::MessageTooLarge { len, max_msg_bytes });
        }
        Ok((own, len))
    }

    /// The op as the plain writes it amounts to, in order: entry `k` to the remote range right
    /// after entry `k - 1`'s, each with the op's `wr_id`; only the last is signalled and
    /// carries the immediate. A backend without a gather of its own posts these (and
    /// checks each with [`WriteOp::check_lens`]).
    ///
    /// ```
    /// use rdma_hint_core::{GatherEntry, GatherOp, RegionId};
    /// let entries = [GatherEntry { local: RegionId(0), offset: 8192, len: 4096 },
    ///                GatherEntry { local: RegionId(1), offset: 0, len: 100 }];
    /// let op = GatherOp { wr_id: 7, first: 0, count: 2, remote: RegionId(2), remote_offset: 64,
    ///                     signalled: true, imm: Some(1) };
    /// let pieces: Vec<_> = op.pieces(&entries).collect();
    /// assert_eq!((pieces[1].remote_offset, pieces[1].len, pieces[1].imm), (64 + 4096, 100, Some(1)));
    /// assert!(!pieces[0].signalled && pieces[0].imm.is_none());
    /// ```
    pub fn pieces<'a>(&self, entries: &'a [GatherEntry]) -> impl Iterator<Item = WriteOp> + Clone + 'a {
        let op = *self;
        let own = entries.get(op.first as usize..(op.first as usize).saturating_add(op.count as usize));
        let own = own.unwrap_or(&[]);
        let last = own.len().saturating_sub(1);
        own.iter().enumerate().scan(op.remote_offset, move |remote_offset, (index, entry)| {
            let piece = WriteOp {
                wr_id: op.wr_id,
                local: entry.local,
                local_offset: entry.offset,
                remote: op.remote,
                remote_offset: *remote_offset,
                len: entry.len,
                signalled: op.signalled && index == last,
                imm: if index == last { op.imm } else { None },
            };
            *remote_offset = remote_offset.saturating_add(entry.len);
            Some(piece)
        })
    }
}

/// `Ok` when `offset + len` bytes fit in a region of `region_len` bytes (without overflow),
/// otherwise [`TransportError::OutOfBounds`] naming `side` (`local` or `remote`).
///
/// ```
/// use rdma_hint_core::transport::check_range;
/// assert!(check_range("local", 4096, 4096, 8192).is_ok());
/// assert!(check_range("local", 4097, 4096, 8192).is_err());
/// assert!(check_range("remote", u64::MAX, 2, u64::MAX).is_err()); // overflow, not a wrap
/// ```
#[inline]
pub fn check_range(side: &'static str, offset: u64, len: u64, region_len: u64) -> Result<(), TransportError> {
    if offset.checked_add(len).is_none_or(|end| end > region_len) {
        return Err(TransportError::OutOfBounds { side, offset, len, region_len });
    }
    Ok(())
}

/// Outcome of one signalled work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionStatus {
    /// Written and acknowledged by the peer.
    Success,
    /// Failed with the backend's status code (e.g. `ibv_wc_status`).
    Failed {
        /// Backend status code.
        code: u32,
    },
}

/// One drained completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The `wr_id` of the signalled op.
    pub wr_id: u64,
    /// Result.
    pub status: CompletionStatus,
}

impl Completion {
    /// A placeholder to pre-fill completion buffers with.
    pub const EMPTY: Completion = Completion { wr_id: 0, status: CompletionStatus::Success };
}

/// A write with immediate data that arrived from the peer: every byte written before it on the
/// same connection has landed in `region`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// The immediate value the peer attached.
    pub imm: u32,
    /// The local region the write landed in.
    pub region: RegionId,
    /// Bytes of the write that carried the immediate.
    pub len: u64,
}

impl Arrival {
    /// A placeholder to pre-fill arrival buffers with.
    pub const EMPTY: Arrival = Arrival { imm: 0, region: RegionId(0), len: 0 };
}

/// A data mover with RDMA WRITE semantics: one link (a connection, or one lane of one) over a
/// memory [`Domain`].
///
/// Lifecycle: [`register`](Transport::register) regions (in its domain), optionally [`bind`](Transport::bind)
/// the out-of-band listener, [`connect`](Transport::connect) to the peer exposing some of the
/// regions, then [`post_writes`](Transport::post_writes) batches and drain completions with
/// [`poll_completions`](Transport::poll_completions) or
/// [`wait_completions`](Transport::wait_completions). Posting and polling never allocate.
///
/// The async methods never block the calling thread: a pending wait stores its waker and is
/// woken by the backend's event (see the backend core's `wait`); each wait has a deadline.
/// Without an async runtime, use the `*_blocking` twins of
/// the backend core's `BlockingTransport`.
#[async_trait]
pub trait Transport: Send + Sync {
    /// What this transport can do; feeds the hint model.
    fn capabilities(&self) -> &Capabilities;

    /// Binds the out-of-band listener now (port 0 picks a free port) and returns its address,
    /// so the peer can be told where to dial before [`connect`](Transport::connect) with
    /// [`PeerEndpoint::Listen`] accepts.
    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError>;

    /// How waits spend their time until their event (see [`WaitMode`]); applies to waits that
    /// start afterwards.
    fn set_wait_mode(&self, mode: WaitMode);

    /// The wait mode in use.
    fn wait_mode(&self) -> WaitMode;

    /// The memory domain this link posts from and exposes. Its methods are reached through
    /// the link too (the ones below), so that one connection reads as one object.
    fn domain(&self) -> &dyn Domain;

    /// [`Domain::register`] of this link's domain: allocates and registers `len` bytes of
    /// `kind` memory for local use and remote exposure.
    fn register(&self, kind: MemoryKind, len: u64) -> Result<LocalRegion, TransportError> {
        self.domain().register(kind, len)
    }

    /// [`Domain::deregister`] of this link's domain.
    fn deregister(&self, region: RegionId) -> Result<(), TransportError> {
        self.domain().deregister(region)
    }

    /// [`Domain::register_memory`] of this link's domain: registers memory the caller owns in
    /// place.
    fn register_memory(&self, memory: CallerMemory) -> Result<LocalRegion, TransportError> {
        self.domain().register_memory(memory)
    }

    /// [`Domain::release`] of this link's domain: hands caller memory back.
    fn release(&self, region: RegionId) -> Result<CallerMemory, TransportError> {
        self.domain().release(region)
    }

    /// [`Domain::hold`] of this link's domain.
    fn hold(&self, region: RegionId) -> Result<(), TransportError> {
        self.domain().hold(region)
    }

    /// [`Domain::unhold`] of this link's domain.
    fn unhold(&self, region: RegionId) {
        self.domain().unhold(region);
    }

    /// [`Domain::access_region`] of this link's domain: lends a host region's bytes in place
    /// (the receiver's read of an exposed region after an arrival is
    /// `domain().access_region_unchecked(..)`, whose contract the caller takes on).
    fn access_region(
        &self,
        region: RegionId,
        access: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TransportError> {
        self.domain().access_region(region, access)
    }

    /// [`Domain::device_pointer`] of this link's domain.
    fn device_pointer(&self, region: RegionId) -> Result<u64, TransportError> {
        self.domain().device_pointer(region)
    }

    /// [`Domain::copied_bytes`] of this link's domain.
    fn copied_bytes(&self) -> CopiedBytes {
        self.domain().copied_bytes()
    }

    /// [`Domain::write_region`] of this link's domain.
    fn write_region(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.domain().write_region(region, offset, data)
    }

    /// [`Domain::read_region`] of this link's domain.
    fn read_region(&self, region: RegionId, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        self.domain().read_region(region, offset, out)
    }

    /// Exchanges endpoint information with the peer over an out-of-band TCP connection and
    /// returns the regions the peer exposed. `expose` lists the local regions the peer may write.
    ///
    /// A [`PeerEndpoint::Dial`] retries while the address refuses, for 3 s at most (then
    /// [`TransportError::Refused`]: retry yourself if the peer may start later), and otherwise
    /// until `deadline`. Closing a connected transport (dropping it) tells the peer it left on
    /// purpose, so the peer's waits end in [`TransportError::PeerGone`] without a warning.
    async fn connect(
        &self,
        peer: PeerEndpoint,
        expose: &[RegionId],
        deadline: Instant,
    ) -> Result<Vec<RemoteRegion>, TransportError>;

    /// Exposes `region` (registered in this link's domain) to the connected peer after
    /// connect: its descriptor goes over the link's authenticated control channel, and this
    /// returns once the peer has loaded it, so the peer may write and read the region from
    /// then on (its [`peer_regions`](Transport::peer_regions) lists it). Tell the peer's
    /// application by any means (a write with immediate, its own channel). On a connection of
    /// several lanes, expose it on each lane the peer posts through.
    ///
    /// [`TransportError::NotConnected`] before connect; [`TransportError::UnregisteredRegion`];
    /// [`TransportError::InvalidArgument`] if this link exposes it already; a refusal of the
    /// peer is [`TransportError::Handshake`] (the region is then not exposed); a passed
    /// deadline leaves it exposed until [`withdraw`](Transport::withdraw)n.
    ///
    /// The default, for transports that expose regions only at connect, refuses with
    /// [`TransportError::InvalidArgument`].
    async fn expose(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        let _ = (region, deadline);
        Err(TransportError::InvalidArgument {
            what: "expose",
            why: "this transport exposes regions only at connect".into(),
        })
    }

    /// Withdraws a region this link exposed (at connect or with
    /// [`expose`](Transport::expose)): the peer's later posts to it fail with
    /// [`TransportError::RegionWithdrawn`], and this returns once every op the peer posted to
    /// it before has finished and the peer dropped its key, so from then on the region may be
    /// released, lent or deregistered as memory no peer reaches. Until then (a passed
    /// deadline included) it stays exposed, and those answer [`TransportError::RegionBusy`].
    ///
    /// The peer finishes its ops as it retires them, which on some backends (verbs) is when its
    /// application polls its completions: a peer whose last ops since a signalled completion
    /// were unsignalled (to any region) answers once a later signalled op of its completes and
    /// is polled.
    ///
    /// The default, for transports that expose regions only at connect, refuses with
    /// [`TransportError::InvalidArgument`].
    async fn withdraw(&self, region: RegionId, deadline: Instant) -> Result<(), TransportError> {
        let _ = (region, deadline);
        Err(TransportError::InvalidArgument {
            what: "withdraw",
            why: "this transport exposes regions only at connect".into(),
        })
    }

    /// The peer's regions this link may post to now, by id: those its connect named, and
    /// those it exposed since, less those it withdrew. Empty before connect.
    fn peer_regions(&self) -> Vec<RemoteRegion>;

    /// Posts every op in `ops` with one doorbell. Ops are checked before anything is posted.
    fn post_writes(&self, ops: &[WriteOp]) -> Result<(), TransportError>;

    /// Posts every read in `ops` with one doorbell: each fetches bytes of a region the peer
    /// exposed into a local region. Ops are checked before anything is posted (as writes are,
    /// [`ReadOp::ranges`]). A signalled read completes once its bytes, and those of every op
    /// posted before it on this transport, are in local memory; until then its local region is
    /// busy (it cannot be released or lent). Reads on a broken connection end in
    /// [`TransportError::PeerGone`], signalled ones queued before as flushed completions.
    fn post_reads(&self, ops: &[ReadOp]) -> Result<(), TransportError>;

    /// Posts gather writes with one doorbell: each [`GatherOp`] takes its entries from
    /// `entries` and lands them back to back in the peer's region, as one work request of up to
    /// [`Capabilities::max_sges`] entries. Ops are checked before anything is posted
    /// ([`GatherOp::entries`], then every piece as a [`WriteOp`]).
    ///
    /// The default, for transports with `max_sges` 1, posts ops of one entry each (up to
    /// [`MAX_OPS_PER_POST`] in a call) as plain writes and refuses a longer gather with
    /// [`TransportError::TooManyEntries`].
    fn post_gather_writes(&self, ops: &[GatherOp], entries: &[GatherEntry]) -> Result<(), TransportError> {
        if ops.len() > MAX_OPS_PER_POST {
            return Err(TransportError::QueueFull { given: ops.len() as u32, max: MAX_OPS_PER_POST as u32 });
        }
        let mut writes = [WriteOp::EMPTY; MAX_OPS_PER_POST];
        for (write, op) in writes.iter_mut().zip(ops) {
            op.entries(entries, 1, u64::MAX)?;
            *write = op.pieces(entries).next().unwrap_or(WriteOp::EMPTY);
        }
        self.post_writes(&writes[..ops.len()])
    }

    /// Moves finished completions into `out` without waiting; returns how many.
    fn poll_completions(&self, out: &mut [Completion]) -> Result<usize, TransportError>;

    /// Waits until at least one completion is ready or `deadline` passes.
    async fn wait_completions(
        &self,
        out: &mut [Completion],
        deadline: Instant,
    ) -> Result<usize, TransportError>;

    /// Receiver side: moves writes-with-immediate that arrived from the peer into `out` without
    /// waiting; returns how many.
    fn poll_arrivals(&self, out: &mut [Arrival]) -> Result<usize, TransportError>;

    /// Receiver side: waits until at least one arrival or `deadline`.
    async fn wait_arrivals(&self, out: &mut [Arrival], deadline: Instant) -> Result<usize, TransportError>;
}
