//! The owning wrapper every verbs object sits in (as `sideway` keeps one RAII handle per
//! object): a non-null pointer destroyed once, on drop, by the call that matches its creation,
//! with what it was created on kept alive until then.

use rdma_mummy_sys as ibv;
use std::ptr::NonNull;

/// An ibverbs object type and the call that destroys it.
pub(crate) trait Verbs {
    /// The destroying call, for the log line when it fails.
    const DESTROY: &'static str;

    /// Destroys `raw`, returning the call's status (0: done).
    ///
    /// # Safety
    ///
    /// `raw` was returned by this type's creating call, is destroyed once, and no object created
    /// on it is still alive.
    unsafe fn destroy(raw: *mut Self) -> i32;
}

/// An owned verbs object of type `T`, created on `P` (the `Arc`s of what it was created on),
/// which stays alive until `T` is destroyed.
pub(crate) struct Owned<T: Verbs, P> {
    raw: NonNull<T>,
    // Dropped after `raw` is destroyed: `Drop::drop` runs before the fields drop.
    parent: P,
}

// SAFETY: libibverbs objects may be used from any thread (the library and its providers lock
// what they share; the transport serializes posting and polling anyway); an `Owned` destroys
// its object exactly once, on drop, and hands out only the raw pointer for calls.
unsafe impl<T: Verbs, P: Send> Send for Owned<T, P> {}
// SAFETY: see `Send`: shared access only passes the pointer to thread-safe verbs calls.
unsafe impl<T: Verbs, P: Sync> Sync for Owned<T, P> {}

impl<T: Verbs, P> Owned<T, P> {
    /// Takes `raw` as its creating call returned it on `parent`; `None` when the call failed
    /// (null), with `errno` saying why.
    ///
    /// # Safety
    ///
    /// A non-null `raw` is a live object that nothing else destroys, and every object created
    /// on it will hold this `Owned` (or the type around it) alive until it is destroyed itself.
    pub(crate) unsafe fn take(raw: *mut T, parent: P) -> Option<Owned<T, P>> {
        Some(Owned { raw: NonNull::new(raw)?, parent })
    }

    /// The raw object, for verbs calls; valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut T {
        self.raw.as_ptr()
    }

    /// What the object was created on.
    pub(crate) fn parent(&self) -> &P {
        &self.parent
    }
}

impl<T: Verbs, P: std::fmt::Debug> std::fmt::Debug for Owned<T, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(std::any::type_name::<T>())
            .field("raw", &self.raw)
            .field("parent", &self.parent)
            .finish()
    }
}

impl<T: Verbs, P> Drop for Owned<T, P> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from its creating call and is destroyed only here; whatever was
        // created on it holds this object alive (`take`'s contract), so nothing is left.
        let status = unsafe { T::destroy(self.raw.as_ptr()) };
        if status != 0 {
            tracing::warn!(call = T::DESTROY, status, "verbs: destroying an object failed");
        }
    }
}

macro_rules! verbs_object {
    ($($object:ident => $destroy:ident,)+) => {$(
        impl Verbs for ibv::$object {
            const DESTROY: &'static str = stringify!($destroy);

            unsafe fn destroy(raw: *mut Self) -> i32 {
                // SAFETY: the caller upholds `Verbs::destroy`'s contract.
                unsafe { ibv::$destroy(raw) }
            }
        }
    )+};
}

verbs_object! {
    ibv_context => ibv_close_device,
    ibv_pd => ibv_dealloc_pd,
    ibv_comp_channel => ibv_destroy_comp_channel,
    ibv_cq => ibv_destroy_cq,
    ibv_qp => ibv_destroy_qp,
    ibv_mr => ibv_dereg_mr,
}
