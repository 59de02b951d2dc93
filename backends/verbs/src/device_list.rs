//! The device list (`ibv_get_device_list` / `ibv_free_device_list`) and the devices on it, each
//! valid while the list lives: what a [`Context`](crate::context::Context) is opened from.

use rdma_hint_core::TransportError;
use rdma_mummy_sys as ibv;
use std::ffi::CStr;
use std::marker::PhantomData;

/// Whether libibverbs could be loaded (`libibverbs.so.1`, package `libibverbs1` / rdma-core).
pub fn library_loaded() -> bool {
    // SAFETY: dlopen with a NUL-terminated name; the handle is released right away (the loader
    // keeps the library mapped while rdma-mummy-sys holds its own handle).
    unsafe {
        let handle = libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

/// Why no device can be used, in words a person can act on.
fn no_library() -> TransportError {
    TransportError::Unavailable {
        backend: crate::BACKEND,
        reason: "no libibverbs: libibverbs.so.1 cannot be loaded (install rdma-core and ibverbs-providers)"
            .into(),
    }
}

/// `ibv_get_device_list` returned NULL: say why in words (ENOSYS: no uverbs in this kernel).
fn no_device_list() -> TransportError {
    let error = std::io::Error::last_os_error();
    TransportError::Unavailable {
        backend: crate::BACKEND,
        reason: if error.raw_os_error() == Some(libc::ENOSYS) {
            "no RDMA device: libibverbs is installed but this kernel offers no RDMA (ib_uverbs) support"
                .into()
        } else {
            format!("ibv_get_device_list failed: {error}")
        },
    }
}

/// The device list of libibverbs, freed on drop.
pub(crate) struct DeviceList {
    raw: *mut *mut ibv::ibv_device,
    pub(crate) count: usize,
}

impl DeviceList {
    /// The devices libibverbs sees, or why it cannot list any.
    pub(crate) fn get() -> Result<DeviceList, TransportError> {
        if !library_loaded() {
            return Err(no_library());
        }
        let mut count = 0;
        // SAFETY: libibverbs allocates the list; `Drop` frees it.
        let raw = unsafe { ibv::ibv_get_device_list(&mut count) };
        if raw.is_null() {
            return Err(no_device_list());
        }
        Ok(DeviceList { raw, count: count.max(0) as usize })
    }

    /// Every listed device, with its name.
    pub(crate) fn entries(&self) -> impl Iterator<Item = ListedDevice<'_>> + '_ {
        (0..self.count).map(|index| {
            // SAFETY: the list holds `count` device pointers, each with a NUL-terminated name
            // owned by libibverbs while the list lives.
            unsafe {
                let raw = *self.raw.add(index);
                let name = CStr::from_ptr(ibv::ibv_get_device_name(raw)).to_string_lossy().into_owned();
                ListedDevice { raw, name, _list: PhantomData }
            }
        })
    }

    /// The device named `name`, or the first device when `None`.
    pub(crate) fn find(&self, name: Option<&str>) -> Result<ListedDevice<'_>, TransportError> {
        let Some(device) = self.entries().find(|device| name.is_none_or(|wanted| wanted == device.name))
        else {
            let names: Vec<String> = self.entries().map(|device| device.name).collect();
            return Err(TransportError::Unavailable {
                backend: crate::BACKEND,
                reason: match name {
                    Some(wanted) => format!("no RDMA device named {wanted} (devices: {})", names.join(", ")),
                    None => "no RDMA device (libibverbs loaded, ibv_get_device_list found none)".into(),
                },
            });
        };
        Ok(device)
    }
}

/// One device of a live [`DeviceList`] (it cannot outlive the list), to open.
pub(crate) struct ListedDevice<'list> {
    raw: *mut ibv::ibv_device,
    /// Device name (`rxe0`, `mlx5_0`).
    pub(crate) name: String,
    _list: PhantomData<&'list DeviceList>,
}

impl ListedDevice<'_> {
    /// The raw device, valid while the list it came from lives.
    pub(crate) fn raw(&self) -> *mut ibv::ibv_device {
        self.raw
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ibv::ibv_free_device_list(self.raw) };
    }
}
