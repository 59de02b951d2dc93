//! Registered memory: page-aligned host buffers, sealed memfd regions a same-host peer maps
//! through a descriptor we hand it (never a name in a shared directory), and the peer's regions
//! mapped here. All access goes through bounds-checked raw copies.

use rdma_hint_backend_core::MAX_REGION_BYTES;
use rdma_hint_core::{CallerMemory, ForeignMemory, TransportError};
use rdma_hint_stream_copy::{self as stream_copy, Run};
use std::alloc::Layout;
use std::fs::File;
use std::marker::PhantomData;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Which way bytes cross a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// From the region to the socket.
    Send,
    /// From the socket into the region.
    Receive,
}

const PAGE: usize = 4096;
/// The seals a shared region carries, and that a peer's region must carry: its size can never
/// change (no SIGBUS from a peer that shrinks it), nor its seals.
const REQUIRED_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

enum Backing {
    Heap(Layout),
    /// A memfd we created and sealed; its descriptor goes to the peer over a Unix socket.
    SharedOwned {
        _map: memmap2::MmapMut,
        file: File,
    },
    /// A peer's sealed memfd, received over a Unix socket and mapped here.
    SharedPeer {
        _map: memmap2::MmapMut,
    },
    /// Host memory the caller owns (`None` once handed back by `into_caller`).
    Caller(Option<CallerMemory>),
}

/// A registered buffer.
pub(crate) struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: `Memory` is a raw buffer; every access is a bounds-checked copy (`copy_in`, `copy_out`,
// `copy_to`, `copy_from_reader`); no Rust reference into it outlives one call. Concurrent writes to
// overlapping bytes are the application's contract, exactly as with RDMA hardware writing
// into registered memory.
unsafe impl Send for Memory {}
// SAFETY: see `Send`; no method hands out a reference another thread could alias with a write.
unsafe impl Sync for Memory {}

fn registration(len: u64, reason: impl Into<String>) -> TransportError {
    TransportError::Registration { len, reason: reason.into() }
}

fn checked_len(len: u64) -> Result<usize, TransportError> {
    if len == 0 || len > MAX_REGION_BYTES {
        return Err(registration(len, format!("length must be 1 B … {MAX_REGION_BYTES} B")));
    }
    usize::try_from(len).map_err(|_| registration(len, "does not fit this address space"))
}

impl Memory {
    /// Zeroed, page-aligned host memory, every page touched now: registration commits the
    /// memory (as `ibv_reg_mr` pins it), so transfers take no first-touch page faults.
    pub(crate) fn host(len: u64) -> Result<Memory, TransportError> {
        let size = checked_len(len)?;
        let layout = Layout::from_size_align(size, PAGE).map_err(|e| registration(len, e.to_string()))?;
        // SAFETY: `layout` has a non-zero size (checked_len rejects 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| registration(len, "the allocator refused"))?;
        for page in (0..size).step_by(PAGE) {
            // SAFETY: `page < size`, inside the allocation just made; writing the zero it holds
            // changes nothing but makes the kernel back the page now.
            unsafe { ptr.as_ptr().add(page).write_volatile(0) };
        }
        Ok(Memory { ptr, len: size, backing: Backing::Heap(layout) })
    }

    /// Zeroed memory in a new anonymous memfd, committed (a shortage is a registration error
    /// here, not a SIGBUS later) and sealed against any change of size. It has no name another
    /// process could open, and vanishes with the last descriptor and mapping, whatever way the
    /// process ends.
    pub(crate) fn shared(len: u64) -> Result<Memory, TransportError> {
        let size = checked_len(len)?;
        let fail = |what: &str, e: std::io::Error| registration(len, format!("{what}: {e}"));
        // SAFETY: the name is a NUL-terminated literal; the result is checked below.
        let fd = unsafe {
            libc::memfd_create(c"rdma-hint-region".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(fail("memfd_create", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.set_len(len).map_err(|e| fail("sizing the memfd", e))?;
        // SAFETY: F_ADD_SEALS on our own memfd; takes an int argument, no pointers.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, REQUIRED_SEALS) } != 0 {
            return Err(fail("sealing the memfd", std::io::Error::last_os_error()));
        }
        // Mapped first, then committed through the mapping: the pages count in this process's
        // resident set, so were memory short after all, the OOM killer would see whose they are
        // (pages committed to a file nobody maps are charged to nobody it can pick).
        let mut map = map(&file).map_err(|e| fail("mapping the memfd", e))?;
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| registration(len, "mmap returned null"))?;
        commit(&map).map_err(|e| fail("committing the memory", e))?;
        Ok(Memory { ptr, len: size, backing: Backing::SharedOwned { _map: map, file } })
    }

    /// The caller's host memory, used in place (admitted by the backend core's `caller_memory::admit`,
    /// so it is non-empty, bounded and aligned).
    pub(crate) fn caller(memory: CallerMemory) -> Result<Memory, CallerMemory> {
        let ForeignMemory::Host { address, len } = memory.memory() else { return Err(memory) };
        let Ok(size) = usize::try_from(len) else { return Err(memory) };
        let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(address)) else {
            return Err(memory);
        };
        Ok(Memory { ptr, len: size, backing: Backing::Caller(Some(memory)) })
    }

    /// Whether this is the caller's memory.
    pub(crate) fn is_caller(&self) -> bool {
        matches!(self.backing, Backing::Caller(_))
    }

    /// Hands the caller's memory back (`Err(self)` for memory the transport allocated).
    pub(crate) fn into_caller(mut self) -> Result<CallerMemory, Memory> {
        match &mut self.backing {
            Backing::Caller(memory) => memory.take().ok_or(self),
            _ => Err(self),
        }
    }

    /// Lends the whole buffer to `access`.
    ///
    /// # Safety
    /// No op of this transport may read or write the buffer during the call (the caller
    /// checked none is in flight); a peer writing an exposed region concurrently is the RDMA
    /// contract the application orders with arrivals.
    pub(crate) unsafe fn lend(&self, access: &mut dyn FnMut(&mut [u8])) {
        // SAFETY: `ptr..ptr + len` is this buffer, alive for the call; the caller guarantees
        // the transport touches none of it meanwhile.
        access(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) });
    }

    /// Base address (page-aligned) and length of the whole buffer, for the GPU driver to
    /// page-lock and for the shm ring's atomics.
    pub(crate) fn mapping(&self) -> (*mut u8, usize) {
        (self.ptr.as_ptr(), self.len)
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// The descriptor a same-host peer maps, for shared regions.
    pub(crate) fn shm_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backing {
            Backing::SharedOwned { file, .. } => Some(file.as_fd()),
            _ => None,
        }
    }

    fn check(&self, offset: u64, len: usize, side: &'static str) -> Result<usize, TransportError> {
        let out =
            || TransportError::OutOfBounds { side, offset, len: len as u64, region_len: self.len as u64 };
        let start = usize::try_from(offset).map_err(|_| out())?;
        start.checked_add(len).filter(|end| *end <= self.len).ok_or_else(out)?;
        Ok(start)
    }

    /// Copies `data` in at `offset`.
    pub(crate) fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        let start = self.check(offset, data.len(), "local")?;
        // SAFETY: `start + data.len() <= self.len` (checked); `data` is a separate Rust slice, so
        // the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(start), data.len()) };
        Ok(())
    }

    /// Copies out from `offset` into `out`.
    pub(crate) fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        let start = self.check(offset, out.len(), "local")?;
        // SAFETY: in bounds (checked); `out` is a separate Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(start), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `len` bytes from `self[from..]` to `target[to..]` (the shm channel's one copy).
    /// Given the connection's [`Run`], a copy that continues a long run of adjacent writes
    /// streams past the cache (then [`Run::fence`] before the bytes are announced).
    pub(crate) fn copy_to(
        &self,
        from: u64,
        target: &Memory,
        to: u64,
        len: u64,
        run: Option<&mut Run>,
    ) -> Result<(), TransportError> {
        let bytes = len;
        let len = usize::try_from(len)
            .map_err(|_| TransportError::MessageTooLarge { len, max_msg_bytes: u64::MAX })?;
        let source = self.check(from, len, "local")?;
        let destination = target.check(to, len, "remote")?;
        let (from, to) =
            (self.ptr.as_ptr().wrapping_add(source), target.ptr.as_ptr().wrapping_add(destination));
        // Overlapping addresses arise only if a mapping is copied into itself, which must not
        // stream. (A memfd mapped twice, a region written into this side's own mapping of it,
        // has two addresses: its bytes are then as a concurrent write by a peer leaves them.)
        let overlaps = self.ptr == target.ptr && source < destination + len && destination < source + len;
        let stream = match run {
            Some(run) if !overlaps => run.streams(to as usize, bytes),
            Some(run) => {
                run.fence();
                false
            }
            None => false,
        };
        // SAFETY: both ranges are in bounds (checked), and overlap only with `stream` off.
        unsafe { stream_copy::copy(from, to, len, stream) };
        Ok(())
    }

    /// Sends `offset..offset + len` to `socket` straight from the buffer, or receives exactly
    /// that many bytes into it: the kernel reads or writes it through a raw pointer, and no Rust
    /// reference to registered memory (which the peer or another thread may be writing) is
    /// ever made.
    pub(crate) fn over_socket(
        &self,
        socket: &TcpStream,
        direction: Direction,
        range: (u64, u64),
    ) -> std::io::Result<()> {
        let (offset, len) = range;
        let (start, len) = self.io_range(offset, len)?;
        let mut done = 0;
        while done < len {
            // SAFETY: `start + len <= self.len` (checked), so `ptr + start + done` and the
            // `len - done` bytes after it lie inside the buffer, which lives as long as `self`;
            // the kernel reads (send) or writes (recv) at most that many bytes.
            let moved = unsafe {
                let at = self.ptr.as_ptr().add(start + done).cast();
                match direction {
                    Direction::Send => libc::send(socket.as_raw_fd(), at, len - done, libc::MSG_NOSIGNAL),
                    Direction::Receive => libc::recv(socket.as_raw_fd(), at, len - done, 0),
                }
            };
            done += bytes_moved(direction, moved)?;
        }
        Ok(())
    }

    /// Receives exactly a frame's `header` and then `offset..offset + len` into the buffer,
    /// with one system call when all of it is waiting (`recvmsg` of two pieces; a short read
    /// continues where it stopped), straight into the buffer as [`Memory::over_socket`] does.
    /// (Sends go through [`GatherSend`].)
    pub(crate) fn receive_framed(
        &self,
        socket: &TcpStream,
        header: &mut [u8],
        (offset, len): (u64, u64),
    ) -> std::io::Result<()> {
        let (start, len) = self.io_range(offset, len)?;
        let header_len = header.len();
        let header = header.as_mut_ptr();
        let total = header_len + len;
        let mut done = 0;
        while done < total {
            let (head_left, body_done) = (header_len.saturating_sub(done), done.saturating_sub(header_len));
            let mut pieces = [
                libc::iovec {
                    iov_base: header.wrapping_add(header_len - head_left).cast(),
                    iov_len: head_left,
                },
                libc::iovec {
                    iov_base: self.ptr.as_ptr().wrapping_add(start + body_done).cast(),
                    iov_len: len - body_done,
                },
            ];
            let first = usize::from(head_left == 0);
            // SAFETY: an all-zero msghdr is a valid one (no name, no control data).
            let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
            message.msg_iov = pieces[first..].as_mut_ptr();
            message.msg_iovlen = (2 - first) as _;
            // SAFETY: `message` points at `pieces`, live for the call, whose pieces lie in the
            // caller's header (borrowed mutably for the call) and in the buffer's checked range
            // `start..start + len` (alive as long as `self`, only ever reached through raw
            // pointers); the kernel writes at most those bytes.
            let moved = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, 0) };
            done += bytes_moved(Direction::Receive, moved)?;
        }
        Ok(())
    }

    fn io_range(&self, offset: u64, len: u64) -> std::io::Result<(usize, usize)> {
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        let start = self.check(offset, len, "local").map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok((start, len))
    }

    /// The address of `offset` after checking that `offset..offset + len` lies in the buffer,
    /// for a GPU copy into a peer's mapped region. A raw pointer, not a slice: the peer may read
    /// or write those bytes at any time (as a remote NIC may), so no Rust reference is formed.
    #[cfg(feature = "cuda")]
    pub(crate) fn range_ptr(&self, offset: u64, len: u64) -> Result<*mut u8, TransportError> {
        let len = usize::try_from(len)
            .map_err(|_| TransportError::MessageTooLarge { len, max_msg_bytes: u64::MAX })?;
        let start = self.check(offset, len, "local")?;
        // `start + len` is within the buffer (checked), so the offset stays in the allocation.
        Ok(self.ptr.as_ptr().wrapping_add(start))
    }
}

/// A frame's header and ranges of buffers sent with one `sendmsg` (continued where a short
/// send stopped): a gather write's payload leaves from its sources, with no staging copy.
pub(crate) struct GatherSend<'a> {
    pieces: [libc::iovec; GATHER_PIECES],
    count: usize,
    total: usize,
    /// The header and the buffers the pieces point into, borrowed until the send.
    _borrows: PhantomData<&'a Memory>,
}

/// Local ranges one gather write takes, at most (one `sendmsg` carries them all, after the
/// header).
pub(crate) const MAX_SGES: u32 = 32;
/// A header and [`MAX_SGES`] ranges.
const GATHER_PIECES: usize = MAX_SGES as usize + 1;

impl<'a> GatherSend<'a> {
    /// Starts with `header`.
    pub(crate) fn new(header: &'a [u8]) -> GatherSend<'a> {
        let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        let mut send = GatherSend {
            pieces: [empty; GATHER_PIECES],
            count: 1,
            total: header.len(),
            _borrows: PhantomData,
        };
        // The kernel only reads a send's pieces: the pointer is never written through.
        send.pieces[0] = libc::iovec { iov_base: header.as_ptr().cast_mut().cast(), iov_len: header.len() };
        send
    }

    /// Appends `offset..offset + len` of `memory` (checked).
    pub(crate) fn push(&mut self, memory: &'a Memory, offset: u64, len: u64) -> std::io::Result<()> {
        let (start, len) = memory.io_range(offset, len)?;
        if self.count == GATHER_PIECES {
            return Err(std::io::Error::other("more pieces than a gather write takes"));
        }
        self.pieces[self.count] =
            libc::iovec { iov_base: memory.ptr.as_ptr().wrapping_add(start).cast(), iov_len: len };
        self.count += 1;
        self.total += len;
        Ok(())
    }

    /// Sends every piece, in order.
    pub(crate) fn send(mut self, socket: &TcpStream) -> std::io::Result<()> {
        let (mut first, mut left) = (0, self.total);
        while left > 0 {
            while self.pieces[first].iov_len == 0 {
                first += 1;
            }
            // SAFETY: an all-zero msghdr is a valid one (no name, no control data).
            let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
            message.msg_iov = self.pieces[first..self.count].as_mut_ptr();
            message.msg_iovlen = (self.count - first) as _;
            // SAFETY: `message` points at `pieces`, live for the call; each piece lies in the
            // header or in a checked range of a buffer borrowed for `'a` (only ever reached
            // through raw pointers), shortened by what earlier calls sent; the kernel reads at
            // most those bytes.
            let moved = unsafe { libc::sendmsg(socket.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
            let mut moved = bytes_moved(Direction::Send, moved)?;
            left -= moved;
            while moved > 0 {
                let piece = &mut self.pieces[first];
                let step = moved.min(piece.iov_len);
                piece.iov_base = piece.iov_base.wrapping_add(step);
                piece.iov_len -= step;
                moved -= step;
                if piece.iov_len == 0 && first + 1 < self.count {
                    first += 1;
                }
            }
        }
        Ok(())
    }
}

/// What a `send`/`recv`-like call's result `moved` means: bytes moved (0 after a signal), or
/// the error (a receive's 0 is the peer's end).
fn bytes_moved(direction: Direction, moved: isize) -> std::io::Result<usize> {
    match moved {
        0 if direction == Direction::Receive => Err(std::io::ErrorKind::UnexpectedEof.into()),
        n if n > 0 => Ok(n as usize),
        _ => match std::io::Error::last_os_error() {
            e if e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
            e => Err(e),
        },
    }
}

/// Allocates and maps every page of `map` now (shmem pages, not a sparse hole), writing
/// nothing: a shortage is an error here, not a SIGBUS at the first write.
fn commit(map: &memmap2::MmapMut) -> std::io::Result<()> {
    // SAFETY: the range is exactly the mapping, alive for the call; MADV_POPULATE_WRITE faults
    // its pages in as a write would, without changing their contents.
    let status =
        unsafe { libc::madvise(map.as_ptr() as *mut libc::c_void, map.len(), libc::MADV_POPULATE_WRITE) };
    if status != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Maps `file` whole, without populating it: a page is committed only where it is written
/// (ours are committed at registration, through the mapping; a peer's were by the peer).
fn map(file: &File) -> std::io::Result<memmap2::MmapMut> {
    let options = memmap2::MmapOptions::new();
    // SAFETY: the file is a sealed memfd shared on purpose with one peer (its size cannot change,
    // so the mapping stays backed); concurrent modification
    // through the peer's mapping is the transport's RDMA-WRITE semantics, and every access from
    // this side goes through bounds-checked raw copies, never long-lived Rust references.
    unsafe { options.map_mut(file) }
}

/// A region the peer handed over, checked at connect and mapped when this side first writes
/// into it: a peer that exposes regions this side never writes costs it no mapping.
#[derive(Debug)]
pub(crate) struct PeerMapping {
    len: u64,
    file: Mutex<Option<File>>,
    mapped: OnceLock<Memory>,
}

impl PeerMapping {
    /// Checks the descriptor is what a peer of ours sends for a region of `len` bytes: a
    /// sealed memfd (its size can never change under us) of exactly `len` bytes, every page of
    /// it already committed by the peer (mapping a hole would commit memory on our side, and a
    /// larger file than advertised would be mapped at its real size).
    pub(crate) fn check(fd: OwnedFd, len: u64) -> Result<PeerMapping, TransportError> {
        let refuse = |why: String| TransportError::Handshake(format!("the peer's shm region: {why}"));
        checked_len(len).map_err(|e| refuse(e.to_string()))?;
        // SAFETY: F_GET_SEALS on a descriptor we own; no pointers. Anything but a sealable
        // file (a memfd) fails with EINVAL.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(refuse(format!("not a sealable memfd ({})", std::io::Error::last_os_error())));
        }
        if seals & REQUIRED_SEALS != REQUIRED_SEALS {
            return Err(refuse(format!(
                "seals {seals:#x} lack {REQUIRED_SEALS:#x}: its size could change under us"
            )));
        }
        // A memfd of shared memory only: a hugetlbfs one can be sealed too, but a write into a
        // page the peer punched out of it, with the huge-page pool empty, is a SIGBUS here.
        // SAFETY: fstatfs fills the zeroed `statfs` on this stack frame for a descriptor we own.
        let mut filesystem: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above: the pointer is to `filesystem`, valid for the call.
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut filesystem) } != 0 {
            return Err(refuse(format!("cannot tell its filesystem: {}", std::io::Error::last_os_error())));
        }
        if filesystem.f_type != libc::TMPFS_MAGIC {
            return Err(refuse(format!(
                "a file of filesystem {:#x}, not a memfd of shared memory (tmpfs)",
                filesystem.f_type
            )));
        }
        let file = File::from(fd);
        let metadata = file.metadata().map_err(|e| refuse(e.to_string()))?;
        if metadata.len() != len {
            return Err(refuse(format!("advertised {len} B, holds {} B", metadata.len())));
        }
        let committed = metadata.blocks().saturating_mul(512);
        if committed < len {
            return Err(refuse(format!(
                "{committed} B of its {len} B are committed: mapping the rest would commit it here"
            )));
        }
        Ok(PeerMapping { len, file: Mutex::new(Some(file)), mapped: OnceLock::new() })
    }

    /// The mapping, made on the first call.
    pub(crate) fn get(&self) -> Result<&Memory, TransportError> {
        if let Some(mapped) = self.mapped.get() {
            return Ok(mapped);
        }
        let refuse = |why: String| TransportError::Handshake(format!("the peer's shm region: {why}"));
        let file = self.file.lock().unwrap_or_else(PoisonError::into_inner).take();
        let file = file.ok_or_else(|| refuse("its mapping failed before".into()))?;
        // Its seals keep its size, not its pages: a peer may punch holes after `check`, and a
        // write into a hole commits that page here, charged to us. So its pages are counted
        // again now, and the mapping is not populated: a hole punched after this count costs
        // us the pages our own writes cover, never the whole region at once (populating a
        // 1 GiB region punched after its hand-off OOM-killed a sweep in a 600 MiB cgroup).
        // (`SEEK_HOLE` cannot tell: it reports a peer's `fallocate`d pages as holes.)
        let committed = file.metadata().map_err(|e| refuse(e.to_string()))?.blocks().saturating_mul(512);
        if committed < self.len {
            return Err(refuse(format!(
                "only {committed} B of its {} B are committed now: the peer punched holes after handing it over, and writing them would commit that memory here",
                self.len
            )));
        }
        let mut map = map(&file).map_err(|e| refuse(e.to_string()))?;
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| refuse("mmap returned null".into()))?;
        let size = checked_len(self.len)?;
        Ok(self.mapped.get_or_init(|| Memory { ptr, len: size, backing: Backing::SharedPeer { _map: map } }))
    }
}

impl PeerMapping {
    /// Maps the region now and hands the mapping over (the shm ring, which is used at once).
    pub(crate) fn map_now(self) -> Result<Memory, TransportError> {
        self.get()?;
        self.mapped
            .into_inner()
            .ok_or_else(|| TransportError::Handshake("the peer's shm ring is not mapped".into()))
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: allocated in `host` with exactly this layout, freed once here.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) },
            // A peer may keep the descriptor we handed it (and leave): its pages are given back
            // now, or they would stay committed, and charged to us, for as long as it keeps it.
            // Our seals include F_SEAL_SEAL, so no peer can have sealed the punch away.
            Backing::SharedOwned { file, .. } => {
                let len = i64::try_from(self.len).unwrap_or(i64::MAX);
                // SAFETY: fallocate on our own memfd, over its own length; no pointers.
                let punched = unsafe {
                    libc::fallocate(
                        file.as_raw_fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        0,
                        len,
                    )
                };
                if punched != 0 {
                    tracing::warn!(error = %std::io::Error::last_os_error(), "staged: could not give back a shared region's pages");
                }
            }
            // The mapping and the descriptor close themselves; the caller's buffer drops with
            // its owner.
            Backing::SharedPeer { .. } | Backing::Caller(_) => {}
        }
    }
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.backing {
            Backing::Heap(_) => "heap",
            Backing::SharedOwned { .. } => "shm",
            Backing::SharedPeer { .. } => "peer-shm",
            Backing::Caller(_) => "caller",
        };
        f.debug_struct("Memory").field("kind", &kind).field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_hint_stream_copy::STREAM_AFTER_BYTES;

    #[test]
    fn bounds_are_checked() {
        let memory = Memory::host(8192).unwrap();
        memory.copy_in(8000, &[1; 192]).unwrap();
        assert!(memory.copy_in(8001, &[1; 192]).is_err());
        assert!(memory.copy_in(u64::MAX, &[1]).is_err());
        let mut out = [0u8; 192];
        memory.copy_out(8000, &mut out).unwrap();
        assert_eq!(out, [1; 192]);
        assert!(Memory::host(0).is_err());
        assert!(Memory::host(u64::MAX).is_err());
    }

    fn duplicate(memory: &Memory) -> OwnedFd {
        memory.shm_fd().unwrap().try_clone_to_owned().unwrap()
    }

    #[test]
    fn shared_regions_map_across_through_their_descriptor() {
        let owner = Memory::shared(1 << 16).unwrap();
        let mapping = PeerMapping::check(duplicate(&owner), 1 << 16).unwrap();
        let peer = mapping.get().unwrap();
        let source = Memory::host(4096).unwrap();
        source.copy_in(0, &[7; 4096]).unwrap();
        source.copy_to(0, peer, 4096, 4096, None).unwrap();
        let mut out = [0u8; 4096];
        owner.copy_out(4096, &mut out).unwrap();
        assert_eq!(out, [7; 4096]);
        assert!(PeerMapping::check(duplicate(&owner), 1 << 17).is_err(), "smaller than advertised");
        assert!(PeerMapping::check(duplicate(&owner), 1 << 15).is_err(), "larger than advertised");
    }

    /// A hugetlbfs memfd is refused even sealed and committed: a write into a huge page the
    /// peer punched out, with the pool empty, would be a SIGBUS here.
    #[test]
    fn a_hugetlb_memfd_is_not_taken() {
        // SAFETY: the name is a NUL-terminated literal; the result is checked below.
        let fd = unsafe {
            libc::memfd_create(
                c"huge".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
            )
        };
        if fd < 0 {
            eprintln!("skipped: no hugetlb memfds here ({})", std::io::Error::last_os_error());
            return;
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let len = 2u64 << 20;
        let _ = File::from(fd.try_clone().unwrap()).set_len(len);
        // SAFETY: F_ADD_SEALS on a memfd this test owns; an int argument, no pointers.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, REQUIRED_SEALS) };
        let refused = PeerMapping::check(fd, len).map(drop).unwrap_err();
        assert!(refused.to_string().contains("not a memfd of shared memory"), "{refused}");
    }

    /// Holes the peer punches after its region passed `check` are refused when the region is
    /// first mapped, before anything is populated (before, the mapping's population committed
    /// the whole region here).
    #[test]
    fn holes_punched_after_the_check_are_refused_at_mapping() {
        let owner = Memory::shared(1 << 20).unwrap();
        let mapping = PeerMapping::check(duplicate(&owner), 1 << 20).unwrap();
        let fd = owner.shm_fd().unwrap().as_raw_fd();
        // SAFETY: fallocate on a memfd this test owns, within its length; no pointers.
        let punched = unsafe {
            libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 65_536, 4096)
        };
        assert_eq!(punched, 0, "{}", std::io::Error::last_os_error());
        let refused = mapping.get().map(|_| ()).unwrap_err();
        assert!(refused.to_string().contains("punched holes after handing it over"), "{refused}");
    }

    /// The shm channel's copy: adjacent writes past the threshold stream (and leave a fence
    /// owed), a write elsewhere does not, and every byte lands either way.
    #[test]
    fn a_long_run_of_adjacent_copies_streams_into_the_peer_mapping() {
        let len = (STREAM_AFTER_BYTES + (1 << 20)) as usize;
        let owner = Memory::shared(len as u64).unwrap();
        let mapping = PeerMapping::check(duplicate(&owner), len as u64).unwrap();
        let peer = mapping.get().unwrap();
        let source = Memory::host(len as u64).unwrap();
        let pattern: Vec<u8> = (0..len).map(|i| (i * 31 % 253) as u8).collect();
        source.copy_in(0, &pattern).unwrap();
        let (block, mut run, mut streamed) = (16u64 << 10, Run::default(), 0);
        for at in (0..len as u64).step_by(block as usize) {
            source.copy_to(at, peer, at, block, Some(&mut run)).unwrap();
            streamed += u64::from(run.unfenced());
        }
        run.fence();
        let expected = if cfg!(target_arch = "x86_64") { (1 << 20) / block } else { 0 };
        assert_eq!(streamed, expected, "only the blocks past the threshold stream");
        let mut landed = vec![0u8; len];
        owner.copy_out(0, &mut landed).unwrap();
        assert!(landed == pattern, "a streamed copy lost bytes");
        source.copy_to(0, peer, 0, block, Some(&mut run)).unwrap();
        assert!(!run.unfenced(), "a write back at the start begins a new run");
    }

    /// A sealed memfd of the advertised size whose pages were never committed: mapping it
    /// (populated) would commit the peer's region on this side.
    #[test]
    fn a_peer_region_with_holes_is_refused() {
        // SAFETY: a NUL-terminated literal name; checked below.
        let fd =
            unsafe { libc::memfd_create(c"sparse".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        let sparse = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        sparse.set_len(1 << 20).unwrap();
        // SAFETY: F_ADD_SEALS on our own memfd, an int argument.
        assert_eq!(unsafe { libc::fcntl(sparse.as_raw_fd(), libc::F_ADD_SEALS, REQUIRED_SEALS) }, 0);
        let err = PeerMapping::check(sparse.into(), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("are committed"), "{err}");
    }

    /// What a hostile peer could hand over instead: a region it can still shrink (mapping it
    /// would let it SIGBUS us), or an ordinary file. Both are refused; our own regions cannot
    /// be shrunk or grown through the descriptor we hand out.
    #[test]
    fn only_sealed_memfds_are_mapped_and_ours_cannot_change_size() {
        // SAFETY: a NUL-terminated literal name; checked below.
        let fd = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        let unsealed = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        unsealed.set_len(1 << 16).unwrap();
        let err = PeerMapping::check(unsealed.into(), 1 << 16).unwrap_err();
        assert!(err.to_string().contains("seals") || err.to_string().contains("sealable"), "{err}");
        let plain = File::open("/proc/self/exe").unwrap();
        assert!(PeerMapping::check(plain.into(), 1).is_err(), "an ordinary file");

        let owner = Memory::shared(1 << 16).unwrap();
        let handed_out = File::from(duplicate(&owner));
        assert!(handed_out.set_len(4096).is_err(), "a peer shrank our region");
        assert!(handed_out.set_len(1 << 20).is_err(), "a peer grew our region");
    }
}
