//! Host memory the transport allocates and maps with `ucp_mem_map`.

use crate::status::status_text;
use rdma_hint_backend_core::region_memory::{DomainRegion, Lease};
use rdma_hint_backend_core::region_table::RegionLen;
use rdma_hint_backend_core::MAX_REGION_BYTES;
use rdma_hint_core::transport::check_range;
use rdma_hint_core::{CallerMemory, ForeignMemory, MemoryKind, Refused, TransportError};
use rdma_hint_ucx_sys as sys;

/// Memory UCP allocated and mapped (`UCP_MEM_MAP_ALLOCATE`), or the caller's mapped in place
/// (on shared memory UCX then reaches it through CMA or its own copies). Allocated, so that on shared memory it lives
/// in a segment the peer can map: a put is then one `memcpy` by the writer, with no work and no
/// wake-up on the receiving side (as `ucx_perftest` allocates its buffers). Its address never
/// moves, so the peer may write it at any time after its packed rkey was sent.
#[derive(Debug)]
pub(crate) struct Region {
    base: *mut u8,
    len: u64,
    pub(crate) memh: sys::ucp_mem_h,
    pub(crate) packed_rkey: Vec<u8>,
    /// The caller's memory, when the region maps it in place (not freed by `unmap`).
    caller: Option<CallerMemory>,
}

// SAFETY: `base` points into memory UCP allocated for this region, freed only by `unmap` (or
// caller memory, which the `CallerMemory` contract keeps mapped until the region is released);
// every access goes through `copy_in`/`copy_out`, which bound-check and copy with raw pointers
// (the same bytes may be written by the peer concurrently, as with any RDMA target). `memh` is
// only passed to UCP calls on its context (created `mt_workers_shared`: UCX serialises them
// when built multi-threaded, and a second lane opens only then, see `Context`) or to puts of a
// lane under that lane's engine lock.
unsafe impl Send for Region {}
// SAFETY: see `Send`: shared access only copies bytes through raw pointers.
unsafe impl Sync for Region {}

impl RegionLen for Region {
    fn region_len(&self) -> u64 {
        self.len
    }
}

impl Region {
    /// Allocates `len` bytes (zeroed) and maps them for local access and remote writes (no
    /// remote read: the peer gets only what the transport exposes it to).
    pub(crate) fn map(context: sys::ucp_context_h, len: u64) -> Result<Region, TransportError> {
        if len == 0 || len > MAX_REGION_BYTES {
            return Err(TransportError::Registration {
                len,
                reason: format!("length must be 1 B … {MAX_REGION_BYTES} B"),
            });
        }
        let region =
            Region::register(context, std::ptr::null_mut(), len, None).map_err(|(error, _)| error)?;
        // Zeroed, so no stale bytes of an earlier user of the segment are ever read back.
        // SAFETY: UCP allocated at least `len` writable bytes at `base`.
        unsafe { std::ptr::write_bytes(region.base, 0, len as usize) };
        Ok(region)
    }

    /// Maps the caller's host memory in place (`ucp_mem_map` with its address, nothing
    /// allocated); admitted already (non-empty, bounded, aligned).
    pub(crate) fn map_caller(context: sys::ucp_context_h, memory: CallerMemory) -> Result<Region, Refused> {
        let ForeignMemory::Host { address, len } = memory.memory() else {
            return Err(Refused { error: TransportError::UnsupportedMemory { kind: memory.kind() }, memory });
        };
        let base = std::ptr::with_exposed_provenance_mut::<u8>(address);
        Region::register(context, base, len, Some(memory)).map_err(|(error, memory)| match memory {
            Some(memory) => Refused { error, memory },
            None => unreachable!("caller memory comes back on failure"),
        })
    }

    /// `ucp_mem_map` of `len` bytes at `address` (the caller's memory `caller`), or of `len`
    /// bytes UCP allocates (`address` null, `caller` none), then `ucp_rkey_pack`. A failure
    /// hands `caller` back.
    fn register(
        context: sys::ucp_context_h,
        address: *mut u8,
        len: u64,
        caller: Option<CallerMemory>,
    ) -> Result<Region, (TransportError, Option<CallerMemory>)> {
        let allocate = address.is_null();
        let params = sys::ucp_mem_map_params {
            field_mask: u64::from(
                sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                    | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                    | sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS
                    | sys::UCP_MEM_MAP_PARAM_FIELD_PROT,
            ),
            address: address.cast(),
            length: len as usize,
            flags: if allocate { sys::UCP_MEM_MAP_ALLOCATE } else { 0 },
            prot: (sys::UCP_MEM_MAP_PROT_LOCAL_READ
                | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE
                | sys::UCP_MEM_MAP_PROT_REMOTE_WRITE
                | sys::UCP_MEM_MAP_PROT_REMOTE_READ) as _,
            ..Default::default()
        };
        let fail = |reason: String| TransportError::Registration { len, reason };
        let mut memh: sys::ucp_mem_h = std::ptr::null_mut();
        // SAFETY: `context` is a live UCP context (its lane group holds it; UCX serialises
        // context calls of concurrent lanes, see `worker::Context`); `params` asks
        // UCP to allocate `len` bytes, or names `len` bytes of caller memory that stay mapped
        // while registered (the contract of `CallerMemory`); `ucp_mem_unmap` in `unmap` ends it.
        let status = unsafe { sys::ucp_mem_map(context, &params, &mut memh) };
        if status != sys::UCS_OK {
            return Err((fail(format!("ucp_mem_map: {}", status_text(status))), caller));
        }
        let mut attr = sys::ucp_mem_attr_t {
            field_mask: u64::from(sys::UCP_MEM_ATTR_FIELD_ADDRESS | sys::UCP_MEM_ATTR_FIELD_LENGTH),
            ..Default::default()
        };
        // SAFETY: `memh` was just returned by ucp_mem_map; `attr` is valid for the call.
        let status = unsafe { sys::ucp_mem_query(memh, &mut attr) };
        let usable = status == sys::UCS_OK
            && !attr.address.is_null()
            && (attr.length as u64) >= len
            && (allocate || attr.address.cast::<u8>() == address);
        if !usable {
            // SAFETY: undo the mapping made above; nothing else refers to `memh` yet.
            unsafe { sys::ucp_mem_unmap(context, memh) };
            return Err((fail("UCP mapped no usable memory".into()), caller));
        }
        let base = attr.address.cast::<u8>();
        let mut packed: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut packed_len = 0usize;
        // SAFETY: `memh` was just returned by ucp_mem_map on this context.
        let status = unsafe { sys::ucp_rkey_pack(context, memh, &mut packed, &mut packed_len) };
        if status != sys::UCS_OK {
            // SAFETY: undo the mapping made above; nothing else refers to `memh` yet.
            unsafe { sys::ucp_mem_unmap(context, memh) };
            return Err((fail(status_text(status)), caller));
        }
        // SAFETY: ucp_rkey_pack returned a buffer of `packed_len` bytes, released right after copying.
        let packed_rkey = unsafe { std::slice::from_raw_parts(packed.cast::<u8>(), packed_len) }.to_vec();
        // SAFETY: `packed` came from ucp_rkey_pack and is released exactly once.
        unsafe { sys::ucp_rkey_buffer_release(packed) };
        Ok(Region { base, len, memh, packed_rkey, caller })
    }

    /// Releases the registration and the memory; the region must not be used afterwards.
    pub(crate) fn unmap(&self, context: sys::ucp_context_h) {
        // SAFETY: `memh` belongs to `context` and is unmapped once (the caller removes the
        // region from its table, under the table's write lock, before calling this).
        let status = unsafe { sys::ucp_mem_unmap(context, self.memh) };
        if status != sys::UCS_OK {
            tracing::warn!(status = %crate::status::status_text(status), "ucx: ucp_mem_unmap failed");
        }
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Address of byte `offset` (the caller has bound-checked it).
    pub(crate) fn address(&self, offset: u64) -> u64 {
        self.base as u64 + offset
    }

    /// Pointer to byte `offset` (the caller has bound-checked it).
    pub(crate) fn pointer(&self, offset: u64) -> *mut u8 {
        self.base.wrapping_add(offset as usize)
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), TransportError> {
        check_range("local", offset, len as u64, self.len)
    }
}

impl DomainRegion for Region {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn is_caller(&self) -> bool {
        self.caller.is_some()
    }

    /// Call after `unmap` (the domain's `remove` unmaps).
    fn into_caller(self) -> Option<CallerMemory> {
        self.caller
    }

    fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.check(offset, data.len())?;
        // SAFETY: bounds checked above; `data` cannot overlap the anonymous mapping we own.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.pointer(offset), data.len()) };
        Ok(())
    }

    fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
        self.check(offset, out.len())?;
        // SAFETY: bounds checked above; `out` is caller memory, not part of the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.pointer(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn lend(&self, _lease: &Lease, access: &mut dyn FnMut(&mut [u8])) -> Result<(), TransportError> {
        // SAFETY: `base..base + len` is mapped for the region's life; the lease is the domain's
        // word that no put of any lane reads it and none can be posted meanwhile, and that no
        // lane's peer writes it (or the caller of `access_region_unchecked` vouches for that).
        access(unsafe { std::slice::from_raw_parts_mut(self.base, self.len as usize) });
        Ok(())
    }
}
