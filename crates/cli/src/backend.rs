//! Which transport `sweep` and `serve` drive: `--backend`, `--channel`, `--ucx-tls` and
//! `--device` become one [`TransportId`], opened through the facade.

use anyhow::{bail, Context, Result};
use rdma_hint::probing::ProbeOptions;
use rdma_hint::TransportId;

/// `staged` + `shm|tcp`; `ucx` + `shm|tcp` (→ `ucx:shm` / `ucx:tcp`) unless `ucx_tls` names the
/// scope itself; `verbs` + `--device` (default: the first device this machine has). `channel`
/// is what the user gave; `default_channel` applies when they gave none.
pub(crate) fn transport_id(
    backend: &str,
    channel: Option<&str>,
    default_channel: &str,
    ucx_tls: Option<&str>,
    device: Option<&str>,
) -> Result<TransportId> {
    if device.is_some() && backend != "verbs" {
        bail!("--device applies to --backend verbs");
    }
    if ucx_tls.is_some() && backend != "ucx" {
        bail!("--ucx-tls applies to --backend ucx");
    }
    if let (Some(channel), "verbs") = (channel, backend) {
        bail!("--channel {channel} applies to --backend staged or ucx; verbs moves data through the RDMA device (--device)");
    }
    let channel = channel.unwrap_or(default_channel);
    if !matches!(channel, "shm" | "tcp") {
        bail!("--channel {channel}: unknown channel (shm or tcp)");
    }
    let id = match backend {
        "staged" if channel == "shm" => TransportId::STAGED_SHM,
        "staged" => TransportId::STAGED_TCP,
        "ucx" => match ucx_tls {
            Some(tls) => TransportId::ucx_for_tls(Some(tls)).with_context(|| format!("--ucx-tls {tls}"))?,
            None => TransportId::Ucx(channel.to_string()),
        },
        "verbs" => match device {
            Some(name) => TransportId::verbs(name).with_context(|| format!("--device {name}"))?,
            None => first_verbs_device()?,
        },
        other => bail!("--backend {other}: unknown backend (staged, ucx, verbs)"),
    };
    Ok(id)
}

/// The first RDMA device the probe found, or the probe's reason why there is none.
fn first_verbs_device() -> Result<TransportId> {
    let report = rdma_hint::probe(&ProbeOptions::default()).context("probing for an RDMA device")?;
    if let Some(device) = report.transports.iter().find(|t| matches!(t.id, TransportId::Verbs(_))) {
        return Ok(device.id.clone());
    }
    let why: Vec<String> =
        report.absent.iter().filter(|a| a.component == "verbs").map(|a| a.why.clone()).collect();
    bail!(
        "no RDMA device for --backend verbs: {}",
        if why.is_empty() { "none found".into() } else { why.join("; ") }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_and_scopes_parse() {
        let id = |b, c, t, d| {
            transport_id(b, c, "shm", t, d).map(|id| id.to_string()).map_err(|e| format!("{e:#}"))
        };
        assert_eq!(id("staged", Some("tcp"), None, None).unwrap(), "staged:tcp");
        assert_eq!(id("staged", None, None, None).unwrap(), "staged:shm");
        assert_eq!(id("ucx", Some("shm"), None, None).unwrap(), "ucx:shm");
        assert_eq!(id("ucx", None, Some("posix,cma"), None).unwrap(), "ucx:posix+cma");
        assert_eq!(id("ucx", None, Some("posix,self"), None).unwrap(), "ucx:posix");
        assert_eq!(id("verbs", None, None, Some("rxe0")).unwrap(), "verbs:rxe0");
        assert!(id("verbs", Some("tcp"), None, Some("rxe0")).unwrap_err().contains("--channel"));
        assert!(id("staged", None, Some("tcp"), None).is_err());
        assert!(id("staged", None, None, Some("rxe0")).is_err());
        assert!(id("ucx", Some("carrier-pigeon"), None, None).unwrap_err().contains("--channel"));
        assert!(id("nccl", None, None, None).unwrap_err().contains("--backend"));
    }
}
