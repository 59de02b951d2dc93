//! Registered memory: page-aligned host buffers, `/dev/shm` files a same-host peer can map, and
//! the peer's files mapped here. All access goes through bounds-checked raw copies.

use rdma_hint_core::TransportError;
use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Largest region this backend registers (1 TiB): larger asks are typed errors, not aborts.
pub(crate) const MAX_REGION_BYTES: u64 = 1 << 40;
const PAGE: usize = 4096;

enum Backing {
    Heap(Layout),
    /// A file under the shm directory; we created it and unlink it on drop.
    SharedOwned {
        _map: memmap2::MmapMut,
        path: PathBuf,
    },
    /// A peer's shm file mapped here.
    SharedPeer {
        _map: memmap2::MmapMut,
    },
}

/// A registered buffer.
pub(crate) struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: `Memory` is a raw buffer; every access is a bounds-checked copy (`copy_in`, `copy_out`,
// `slice_mut` for socket reads). Concurrent writes to overlapping bytes are the application's
// contract, exactly as with RDMA hardware writing into registered memory.
unsafe impl Send for Memory {}
// SAFETY: see `Send`; no method hands out a shared reference that another thread could alias
// with a write except through the documented RDMA contract.
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

/// Directory for shared regions (`RDMA_HINT_SHM_DIR`, default `/dev/shm`).
pub(crate) fn shm_dir() -> PathBuf {
    std::env::var_os("RDMA_HINT_SHM_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

/// Whether `name` is a file name this backend could have created (no path tricks).
pub(crate) fn is_shm_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with("rdma-hint-")
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
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

    /// Zeroed memory in a new shm file that a peer on this host can map by name.
    pub(crate) fn shared(len: u64) -> Result<Memory, TransportError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let size = checked_len(len)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name =
            format!("rdma-hint-{}-{}-{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = shm_dir().join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| registration(len, format!("{}: {e}", path.display())))?;
        // Commit the file's pages now: a full tmpfs is a registration error here, not a SIGBUS
        // on first touch later.
        let mapped = commit(&file, len).and_then(|()| map(&file));
        let mut map = match mapped {
            Ok(map) => map,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(registration(len, format!("{}: {e}", path.display())));
            }
        };
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| registration(len, "mmap returned null"))?;
        Ok(Memory { ptr, len: size, backing: Backing::SharedOwned { _map: map, path } })
    }

    /// Maps a peer's shm file `name` of at least `len` bytes.
    pub(crate) fn map_peer(name: &str, len: u64) -> Result<Memory, TransportError> {
        if !is_shm_name(name) {
            return Err(TransportError::Handshake(format!("shm region name {name:?} is not one of ours")));
        }
        let size = checked_len(len).map_err(|e| TransportError::Handshake(e.to_string()))?;
        let path = shm_dir().join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| TransportError::Handshake(format!("{}: {e}", path.display())))?;
        let actual = file.metadata().map_err(|e| TransportError::Handshake(e.to_string()))?.len();
        if actual < len {
            return Err(TransportError::Handshake(format!(
                "peer advertised {len} B but {} holds {actual} B",
                path.display()
            )));
        }
        let mut map = map(&file).map_err(|e| TransportError::Handshake(e.to_string()))?;
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| TransportError::Handshake("mmap returned null".into()))?;
        Ok(Memory { ptr, len: size, backing: Backing::SharedPeer { _map: map } })
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// Name of the shm file a peer maps, for shared regions.
    pub(crate) fn shm_name(&self) -> Option<String> {
        match &self.backing {
            Backing::SharedOwned { path, .. } => path.file_name().map(|n| n.to_string_lossy().into_owned()),
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
    pub(crate) fn copy_to(
        &self,
        from: u64,
        target: &Memory,
        to: u64,
        len: u64,
    ) -> Result<(), TransportError> {
        let len = usize::try_from(len)
            .map_err(|_| TransportError::MessageTooLarge { len, max_msg_bytes: u64::MAX })?;
        let source = self.check(from, len, "local")?;
        let destination = target.check(to, len, "remote")?;
        // SAFETY: both ranges are in bounds (checked). `std::ptr::copy` tolerates overlap, which
        // only arises if a region is written into itself.
        unsafe { std::ptr::copy(self.ptr.as_ptr().add(source), target.ptr.as_ptr().add(destination), len) };
        Ok(())
    }

    /// The bytes `offset..offset + len` as a slice, for handing to a socket read or write.
    ///
    /// # Safety
    /// The caller must ensure no other code writes these bytes while the slice lives (the RDMA
    /// contract: the application does not touch a range while a transfer into it is in flight).
    #[allow(clippy::mut_from_ref)] // registered memory is written by the peer through `&self` by design
    pub(crate) unsafe fn slice_mut(&self, offset: u64, len: u64) -> Result<&mut [u8], TransportError> {
        let len = usize::try_from(len)
            .map_err(|_| TransportError::MessageTooLarge { len, max_msg_bytes: u64::MAX })?;
        let start = self.check(offset, len, "local")?;
        // SAFETY: in bounds (checked) and the buffer lives as long as `self`; exclusivity is the
        // caller's obligation (see above).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(start), len) })
    }
}

impl Memory {
    /// The bytes `offset..offset + len` as a shared slice, for a socket write.
    ///
    /// # Safety
    /// Nobody may write these bytes while the slice lives (the source of an in-flight write is
    /// left alone by the application, as with RDMA).
    pub(crate) unsafe fn slice(&self, offset: u64, len: u64) -> Result<&[u8], TransportError> {
        // SAFETY: forwarded obligation; a shared slice is a weaker view of the same range.
        unsafe { self.slice_mut(offset, len) }.map(|slice| &*slice)
    }
}

/// Allocates `len` bytes of `file` (tmpfs pages, not a sparse hole).
fn commit(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: `file` is an open descriptor for the call; no pointers are passed.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        code => Err(std::io::Error::from_raw_os_error(code)),
    }
}

fn map(file: &File) -> std::io::Result<memmap2::MmapMut> {
    // SAFETY: the file is a shm region shared on purpose with one peer; concurrent modification
    // through the peer's mapping is the transport's RDMA-WRITE semantics, and every access from
    // this side goes through bounds-checked raw copies, never long-lived Rust references.
    // Populated: the page tables are filled now, not by faults during transfers.
    unsafe { memmap2::MmapOptions::new().populate().map_mut(file) }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: allocated in `host` with exactly this layout, freed once here.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) },
            Backing::SharedOwned { path, .. } => {
                let _ = std::fs::remove_file(path);
            }
            Backing::SharedPeer { .. } => {}
        }
    }
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.backing {
            Backing::Heap(_) => "heap",
            Backing::SharedOwned { .. } => "shm",
            Backing::SharedPeer { .. } => "peer-shm",
        };
        f.debug_struct("Memory").field("kind", &kind).field("len", &self.len).finish()
    }
}

/// Path of one of our shm files; tests use it to check cleanup.
#[cfg(test)]
pub(crate) fn shm_path(name: &str) -> Option<PathBuf> {
    is_shm_name(name).then(|| shm_dir().join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn shared_regions_map_across_and_vanish_on_drop() {
        let owner = Memory::shared(1 << 16).unwrap();
        let name = owner.shm_name().unwrap();
        let peer = Memory::map_peer(&name, 1 << 16).unwrap();
        let source = Memory::host(4096).unwrap();
        source.copy_in(0, &[7; 4096]).unwrap();
        source.copy_to(0, &peer, 4096, 4096).unwrap();
        let mut out = [0u8; 4096];
        owner.copy_out(4096, &mut out).unwrap();
        assert_eq!(out, [7; 4096]);
        assert!(Memory::map_peer(&name, 1 << 17).is_err(), "smaller than advertised");
        assert!(Memory::map_peer("../etc/passwd", 1).is_err());
        let path = shm_path(&name).unwrap();
        drop(peer);
        drop(owner);
        assert!(!path.exists());
    }
}
