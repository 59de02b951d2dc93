//! What the compiled-in backends contribute: software transports, GPU facts, and plain words
//! for every backend that cannot contribute here.

use rdma_hint_core::TransportId;
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
    pub transport: TransportId,
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
        .map(|channel| {
            let caps = rdma_hint_staged::capabilities(*channel);
            SoftwareTransport {
                detail: Some(format!(
                    "lanes: up to {} per connection (open_lanes; the engine stripes blocks of the source's hint over them, each lane at that hint); a request gathers up to {} local ranges",
                    rdma_hint_engine::MAX_LANES,
                    caps.max_sges
                )),
                facts: caps.facts,
                driver: format!("rdma-hint-staged {}", env!("CARGO_PKG_VERSION")),
            }
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
    let mut facts = ucx.capabilities().facts.clone();
    let clamped = clamp_ucx_estimate(&mut facts, scope, ucx_net_device_gbps().as_ref());
    Ok(SoftwareTransport {
        facts,
        driver: format!("UCX {}", rdma_hint_ucx::version()),
        detail: Some(format!(
            "UCX_TLS={scope}: UCX estimates {:.3} GB/s and {:.2} µs per message (ucp_ep_evaluate_perf at 64 KiB and 4 MiB); UCX lanes {}; engine lanes: up to {} per connection (open_lanes: workers of one context over one registration); a request gathers up to {} local ranges (one put each){}",
            estimate.gbps,
            estimate.overhead_us,
            estimate.lanes,
            rdma_hint_engine::MAX_LANES,
            ucx.capabilities().max_sges,
            clamped.map(|note| format!("; {note}")).unwrap_or_default()
        )),
    })
}

#[cfg(any(feature = "ucx", test))]
/// A UCX estimate below this share of the path's plausible floor is not believed.
pub(crate) const IMPLAUSIBLE_SHARE: f64 = 0.1;
#[cfg(any(feature = "ucx", test))]
/// Plausible floor of a shared-memory copy, in GB/s: the staged backend's shm rate (one
/// memcpy stream; any machine of the last decade copies faster).
pub(crate) const SHM_FLOOR_GBPS: f64 = 5.5;
#[cfg(any(feature = "ucx", test))]
/// Plausible floor of a TCP stream over loopback (or a NIC whose speed sysfs does not give),
/// in GB/s: the staged backend's TCP rate on loopback.
pub(crate) const TCP_FLOOR_GBPS: f64 = 3.0;

#[cfg(feature = "ucx")]
/// The speed of the interface `UCX_NET_DEVICES` names (the first one), from sysfs, in GB/s:
/// `(name, GB/s)`; none for loopback, unset, or an interface without a speed.
fn ucx_net_device_gbps() -> Option<(String, f64)> {
    let devices = std::env::var("UCX_NET_DEVICES").ok()?;
    let name = devices.split(',').next()?.split(':').next()?.trim().to_string();
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?;
    let megabits: f64 = text.trim().parse().ok()?;
    (megabits > 0.0).then(|| (name, megabits / 8.0 / 1000.0))
}

#[cfg(any(feature = "ucx", test))]
/// Raises an implausible UCX bandwidth estimate (below [`IMPLAUSIBLE_SHARE`] of what the
/// scope's path can do: the netdev's speed for tcp, else the floors above) to that floor, and
/// says so in the facts. Returns the note. UCX 1.13 estimates loopback tcp at 0.0125 GB/s,
/// which would put every hint on the policy minimum.
pub(crate) fn clamp_ucx_estimate(
    facts: &mut TransportFacts,
    scope: &str,
    netdev: Option<&(String, f64)>,
) -> Option<String> {
    let (floor, what) = if scope.split(',').any(|tl| tl == "tcp") {
        match netdev {
            Some((name, gbps)) => (*gbps, format!("{name}'s speed {gbps:.2} GB/s")),
            None => (TCP_FLOOR_GBPS, format!("a loopback TCP stream's {TCP_FLOOR_GBPS} GB/s")),
        }
    } else {
        (SHM_FLOOR_GBPS, format!("a shared-memory copy's {SHM_FLOOR_GBPS} GB/s"))
    };
    if facts.wire_gbps >= IMPLAUSIBLE_SHARE * floor {
        return None;
    }
    let note = format!(
        "UCX's estimate {:.4} GB/s is below {:.0} % of {what}: clamped to {floor:.2} GB/s",
        facts.wire_gbps,
        IMPLAUSIBLE_SHARE * 100.0
    );
    facts.wire_gbps = floor;
    facts.rate_note = Some(note.clone());
    Some(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(gbps: f64) -> TransportFacts {
        TransportFacts {
            id: TransportId::Ucx("tcp".into()),
            kind: rdma_hint_core::TransportKind::Ucx,
            wire_gbps: gbps,
            nic_pcie: None,
            per_op_overhead_us: 1.0,
            mtu_bytes: None,
            max_msg_bytes: 1 << 30,
            max_payload_bytes: None,
            queried_from_backend: true,
            rate_note: None,
        }
    }

    #[test]
    fn implausible_ucx_estimates_are_clamped_with_a_reason() {
        // UCX 1.13's loopback tcp estimate.
        let mut tcp = facts(0.0125);
        let note = clamp_ucx_estimate(&mut tcp, "tcp,self", None).unwrap();
        assert_eq!(tcp.wire_gbps, TCP_FLOOR_GBPS);
        assert!(note.contains("0.0125") && tcp.rate_note.as_deref() == Some(note.as_str()));
        // A 100 Gb/s netdev sets the floor for tcp.
        let mut fast = facts(0.5);
        clamp_ucx_estimate(&mut fast, "tcp", Some(&("eth0".into(), 12.5))).unwrap();
        assert_eq!(fast.wire_gbps, 12.5);
        // Plausible estimates stay as UCX said.
        let mut shm = facts(21.9);
        assert!(clamp_ucx_estimate(&mut shm, "shm,self", None).is_none());
        assert_eq!(shm.wire_gbps, 21.9);
        let mut slow_but_plausible = facts(0.4);
        assert!(clamp_ucx_estimate(&mut slow_but_plausible, "tcp", None).is_none());
    }
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
    rdma_hint_discovery::gpus()
        .map(|gpus| gpus.into_iter().map(|g| (g.ordinal, g.facts)).collect())
        .map_err(|err| err.to_string())
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
