//! What the compiled-in backends contribute: software transports, GPU facts, and plain words
//! for every backend that cannot contribute here.

use rdma_hint_core::{GpuFacts, TransportFacts};
use serde::Serialize;

/// A component that is not available, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Absence {
    /// `verbs`, `ucx`, `cuda`, `staged`.
    pub component: &'static str,
    /// Why it is absent, in a sentence.
    pub why: String,
}

/// Software transports of the compiled-in backends (staged shm and TCP).
pub(crate) fn software_transports() -> Vec<TransportFacts> {
    #[cfg(feature = "staged")]
    {
        rdma_hint_staged::StagedChannel::ALL
            .iter()
            .map(|channel| rdma_hint_staged::capabilities(*channel).facts)
            .collect()
    }
    #[cfg(not(feature = "staged"))]
    {
        Vec::new()
    }
}

/// GPUs as the CUDA driver numbers them: `(ordinal, facts)`, or why there are none.
pub(crate) fn cuda_gpus() -> Result<Vec<(u32, GpuFacts)>, String> {
    #[cfg(feature = "staged")]
    {
        rdma_hint_staged::gpu::probe_gpus()
            .map(|gpus| gpus.into_iter().map(|g| (g.ordinal, g.facts)).collect())
            .map_err(|err| err.to_string())
    }
    #[cfg(not(feature = "staged"))]
    {
        Err("built without the `staged`/`cuda` features: GPU facts come from sysfs only".into())
    }
}

/// Plain statements about backends that do not contribute hints of their own here.
pub(crate) fn absences(rdma_devices: usize, sysfs_root: &str) -> Vec<Absence> {
    let mut absent = Vec::new();
    let verbs_why = if cfg!(feature = "verbs") {
        "the verbs backend is compiled in but does not move data yet (issue #4); RDMA NIC hints use sysfs facts and model defaults"
    } else {
        "the verbs backend is not compiled in (cargo feature `verbs`); RDMA NIC hints use sysfs facts and model defaults"
    };
    if rdma_devices == 0 {
        absent.push(Absence {
            component: "verbs",
            why: format!(
                "no RDMA device under {sysfs_root}/class/infiniband, so no verbs hints; {verbs_why}"
            ),
        });
    } else {
        absent.push(Absence { component: "verbs", why: verbs_why.into() });
    }
    absent.push(Absence {
        component: "ucx",
        why: if cfg!(feature = "ucx") {
            "the UCX backend is compiled in but does not move data yet (issue #5), so no UCX hints".into()
        } else {
            "the UCX backend is not compiled in (cargo feature `ucx`), so no UCX hints".into()
        },
    });
    if !cfg!(feature = "staged") {
        absent.push(Absence {
            component: "staged",
            why: "the staged backend is not compiled in (cargo feature `staged`), so no host-staged hints"
                .into(),
        });
    }
    absent
}
