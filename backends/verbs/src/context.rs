//! The opened device context (`ibv_open_device` / `ibv_close_device`): every other verbs object
//! is created on it and holds an `Arc` of it, so it closes after the last of them.

use crate::device_list::ListedDevice;
use crate::handle::Owned;
use crate::status::unavailable;
use rdma_hint_core::TransportError;
use rdma_mummy_sys as ibv;

/// An open device context, closed on drop.
#[derive(Debug)]
pub(crate) struct Context {
    handle: Owned<ibv::ibv_context, ()>,
    /// Device name (`rxe0`, `mlx5_0`).
    pub(crate) name: String,
}

impl Context {
    /// Opens `device` (`ibv_open_device`); the context does not need the device list afterwards.
    pub(crate) fn open(device: &ListedDevice<'_>) -> Result<Context, TransportError> {
        // SAFETY: `device.raw()` comes from a device list that outlives `device` (its lifetime);
        // the context is ours alone, and everything created on it holds an `Arc<Context>`.
        let handle = unsafe { Owned::take(ibv::ibv_open_device(device.raw()), ()) }
            .ok_or_else(|| unavailable("ibv_open_device"))?;
        Ok(Context { handle, name: device.name.clone() })
    }

    /// The raw context, for the verbs calls made on it; valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut ibv::ibv_context {
        self.handle.raw()
    }

    /// Entry `index` of `port`'s GID table, `None` when the query fails.
    pub(crate) fn query_gid(&self, port: u8, index: i32) -> Option<[u8; 16]> {
        // SAFETY: ibv_gid is plain bytes; zero is valid.
        let mut gid: ibv::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `gid` a valid out-pointer; an index outside the table
        // makes the query fail rather than write elsewhere.
        let status = unsafe { ibv::ibv_query_gid(self.raw(), port, index, &mut gid) };
        // SAFETY: every bit pattern of the union is valid bytes.
        let raw = unsafe { gid.raw };
        (status == 0).then_some(raw)
    }
}
