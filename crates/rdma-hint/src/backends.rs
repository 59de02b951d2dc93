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

/// A transport that needs no NIC, as a compiled-in backend describes it.
#[derive(Debug, Clone)]
pub(crate) struct SoftwareTransport {
    pub(crate) facts: TransportFacts,
    /// Library and version the facts hold for (part of the hint's cache key).
    pub(crate) driver: String,
    /// What the backend says about how it moves data here (UCX: its estimate and lanes).
    pub(crate) detail: Option<String>,
}

/// What one backend found out about itself on this machine, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendDetail {
    /// Transport id (`ucx:shm`).
    pub transport: String,
    /// One line, with units.
    pub detail: String,
}

/// Software transports of the compiled-in backends: staged shm and TCP always; UCX's shm and
/// tcp scopes when the `ucx` feature is on and `live` (a fixture tree says nothing about the
/// UCX of this machine). Scopes UCX refuses become absences.
pub(crate) fn software_transports(live: bool) -> (Vec<SoftwareTransport>, Vec<Absence>) {
    let mut transports = staged_transports();
    let (ucx, absent) = if live { ucx_transports() } else { (Vec::new(), Vec::new()) };
    transports.extend(ucx);
    (transports, absent)
}

#[cfg(feature = "staged")]
fn staged_transports() -> Vec<SoftwareTransport> {
    rdma_hint_staged::StagedChannel::ALL
        .iter()
        .map(|channel| SoftwareTransport {
            facts: rdma_hint_staged::capabilities(*channel).facts,
            driver: format!("rdma-hint-staged {}", env!("CARGO_PKG_VERSION")),
            detail: None,
        })
        .collect()
}

#[cfg(not(feature = "staged"))]
fn staged_transports() -> Vec<SoftwareTransport> {
    Vec::new()
}

/// UCX's shm and tcp scopes, with UCX's estimate as facts; scopes UCX refuses are absences.
#[cfg(feature = "ucx")]
fn ucx_transports() -> (Vec<SoftwareTransport>, Vec<Absence>) {
    let mut transports = Vec::new();
    let mut absent = Vec::new();
    for scope in ["shm,self", "tcp,self"] {
        match ucx_transport(scope) {
            Ok(transport) => transports.push(transport),
            Err(why) => absent.push(Absence { component: "ucx", why }),
        }
    }
    (transports, absent)
}

/// One UCX scope (`UCX_TLS` syntax) as a software transport, with UCX's estimate as facts.
#[cfg(feature = "ucx")]
pub(crate) fn ucx_transport(scope: &str) -> Result<SoftwareTransport, String> {
    use rdma_hint_core::Transport;
    let ucx =
        rdma_hint_ucx::UcxTransport::open(Some(scope)).map_err(|err| format!("UCX_TLS={scope}: {err}"))?;
    let estimate = ucx.estimate();
    Ok(SoftwareTransport {
        facts: ucx.capabilities().facts.clone(),
        driver: format!("UCX {}", rdma_hint_ucx::version()),
        detail: Some(format!(
            "UCX_TLS={scope}: UCX estimates {:.3} GB/s and {:.2} µs per message (ucp_ep_evaluate_perf at 64 KiB and 4 MiB); lanes {}",
            estimate.gbps, estimate.overhead_us, estimate.lanes
        )),
    })
}

#[cfg(not(feature = "ucx"))]
pub(crate) fn ucx_transport(_scope: &str) -> Result<SoftwareTransport, String> {
    Err("the UCX backend is not compiled in (cargo feature `ucx`)".into())
}

#[cfg(not(feature = "ucx"))]
fn ucx_transports() -> (Vec<SoftwareTransport>, Vec<Absence>) {
    (Vec::new(), Vec::new())
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

/// One RDMA device as the verbs backend queried it (`ibv_query_device` / `ibv_query_port`).
#[derive(Debug, Clone)]
pub(crate) struct VerbsDevice {
    pub(crate) name: String,
    pub(crate) facts: TransportFacts,
    pub(crate) detail: String,
}

/// The devices the verbs backend can open (feature `verbs`, live machine only), or why none.
pub(crate) fn verbs_devices(live: bool) -> Result<Vec<VerbsDevice>, String> {
    #[cfg(feature = "verbs")]
    {
        if !live {
            return Err("device facts are queried on the live machine only, not for a sysfs tree".into());
        }
        rdma_hint_verbs::devices()
            .map(|devices| {
                devices
                    .into_iter()
                    .map(|d| VerbsDevice {
                        name: d.name,
                        facts: d.facts,
                        detail: format!("{} (fw {})", d.summary, d.firmware),
                    })
                    .collect()
            })
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "verbs"))]
    {
        let _ = live;
        Err("the verbs backend is not compiled in (cargo feature `verbs`)".into())
    }
}

/// Plain statements about backends that do not contribute hints of their own here.
/// `verbs` is what [`verbs_devices`] answered.
pub(crate) fn absences(
    rdma_devices: usize,
    sysfs_root: &str,
    live: bool,
    verbs: &Result<Vec<VerbsDevice>, String>,
) -> Vec<Absence> {
    let mut absent = Vec::new();
    if rdma_devices == 0 {
        absent.push(Absence {
            component: "verbs",
            why: format!("no RDMA device under {sysfs_root}/class/infiniband, so no verbs hints"),
        });
    }
    if let Err(why) = verbs {
        absent.push(Absence {
            component: "verbs",
            why: format!("{why}; any RDMA NIC hints use sysfs facts and model defaults"),
        });
    }
    if !cfg!(feature = "ucx") {
        absent.push(Absence {
            component: "ucx",
            why: "the UCX backend is not compiled in (cargo feature `ucx`), so no UCX hints".into(),
        });
    } else if !live {
        absent.push(Absence {
            component: "ucx",
            why: "UCX is probed on the live machine only, not for a sysfs tree".into(),
        });
    }
    if !cfg!(feature = "staged") {
        absent.push(Absence {
            component: "staged",
            why: "the staged backend is not compiled in (cargo feature `staged`), so no host-staged hints"
                .into(),
        });
    }
    absent
}
