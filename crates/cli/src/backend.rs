//! Which backend `sweep` and `serve` drive, opened behind one trait object.

use rdma_hint::core::{Transport, TransportError};
use rdma_hint_staged::{StagedChannel, StagedTransport};
use std::net::SocketAddr;

/// A transport that can also listen for its peer (every backend's out-of-band side).
pub(crate) trait Endpoint: Transport {
    /// Binds the out-of-band listener (port 0 picks one); returns the bound address.
    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError>;
    /// Views the endpoint as a plain transport (for the chunker).
    fn transport(&self) -> &dyn Transport;
}

impl Endpoint for StagedTransport {
    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        StagedTransport::bind(self, address)
    }

    fn transport(&self) -> &dyn Transport {
        self
    }
}

#[cfg(feature = "ucx")]
impl Endpoint for rdma_hint_ucx::UcxTransport {
    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        rdma_hint_ucx::UcxTransport::bind(self, address)
    }

    fn transport(&self) -> &dyn Transport {
        self
    }
}

#[cfg(feature = "verbs")]
impl Endpoint for rdma_hint_verbs::VerbsTransport {
    fn bind(&self, address: SocketAddr) -> Result<SocketAddr, TransportError> {
        rdma_hint_verbs::VerbsTransport::bind(self, address)
    }

    fn transport(&self) -> &dyn Transport {
        self
    }
}

/// The backend and its scope, from `--backend`, `--channel`, `--ucx-tls` and `--device`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The staged backend over one channel.
    Staged(StagedChannel),
    /// UCX restricted to a `UCX_TLS` scope.
    Ucx(String),
    /// Raw verbs on a device (`None`: the first one).
    Verbs(Option<String>),
}

impl Backend {
    /// `staged` + `shm|tcp`; `ucx` + `shm|tcp` (→ `shm,self` / `tcp,self`) unless `ucx_tls` names
    /// the scope itself.
    pub(crate) fn parse(
        backend: &str,
        channel: &str,
        ucx_tls: Option<&str>,
        device: Option<&str>,
    ) -> Result<Backend, String> {
        if device.is_some() && backend != "verbs" {
            return Err("--device applies to --backend verbs".into());
        }
        let channel_scope = match channel {
            "shm" => "shm,self",
            "tcp" => "tcp,self",
            other => return Err(format!("unknown channel `{other}` (shm or tcp)")),
        };
        match backend {
            "staged" if ucx_tls.is_some() => Err("--ucx-tls applies to --backend ucx".into()),
            "staged" => Ok(Backend::Staged(if channel == "shm" {
                StagedChannel::SharedMemory
            } else {
                StagedChannel::Tcp
            })),
            "ucx" => Ok(Backend::Ucx(ucx_tls.unwrap_or(channel_scope).to_string())),
            "verbs" if ucx_tls.is_some() => Err("--ucx-tls applies to --backend ucx".into()),
            "verbs" => Ok(Backend::Verbs(device.map(str::to_string))),
            other => Err(format!("unknown backend `{other}` (staged, ucx, verbs)")),
        }
    }

    /// The transport id hints are looked up and recorded under (`staged:shm`, `ucx:tcp`).
    pub(crate) fn transport_id(&self) -> String {
        match self {
            Backend::Staged(channel) => channel.to_string(),
            Backend::Ucx(tls) => ucx_id(tls),
            Backend::Verbs(device) => verbs_id(device.as_deref()),
        }
    }

    /// Whether the data path should leave copying to a NIC: only then does a busy CPU mean
    /// something is wrong (staged, and UCX over shm or tcp, copy with the CPU by design).
    pub(crate) fn should_bypass_cpu(&self) -> bool {
        match self {
            Backend::Staged(_) => false,
            // Soft-RoCE (rxe) and soft-iWARP (siw) are the kernel copying: busy by design.
            Backend::Verbs(device) => {
                let id = verbs_id(device.as_deref());
                !(id.starts_with("verbs:rxe") || id.starts_with("verbs:siw"))
            }
            Backend::Ucx(tls) => {
                tls.split(',').any(|t| matches!(t.trim(), "rc" | "rc_x" | "ud" | "dc" | "ib" | "rc_verbs"))
            }
        }
    }

    /// Short name: `staged` or `ucx`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Staged(_) => "staged",
            Backend::Ucx(_) => "ucx",
            Backend::Verbs(_) => "verbs",
        }
    }

    /// Opens one unconnected transport of this backend.
    pub(crate) fn open(&self) -> Result<Box<dyn Endpoint>, String> {
        match self {
            Backend::Staged(channel) => Ok(Box::new(StagedTransport::new(*channel))),
            Backend::Ucx(tls) => open_ucx(tls),
            Backend::Verbs(device) => open_verbs(device.as_deref()),
        }
    }
}

#[cfg(feature = "verbs")]
fn open_verbs(device: Option<&str>) -> Result<Box<dyn Endpoint>, String> {
    Ok(Box::new(rdma_hint_verbs::VerbsTransport::open(device).map_err(|e| e.to_string())?))
}

#[cfg(not(feature = "verbs"))]
fn open_verbs(_device: Option<&str>) -> Result<Box<dyn Endpoint>, String> {
    Err("this rdma-hint was built without the `verbs` feature: cargo build --features verbs".into())
}

/// `verbs:<device>`; without a device name, the first device libibverbs lists.
fn verbs_id(device: Option<&str>) -> String {
    match device {
        Some(name) => format!("verbs:{name}"),
        None => {
            first_verbs_device().map_or_else(|| "verbs:(none)".to_string(), |name| format!("verbs:{name}"))
        }
    }
}

#[cfg(feature = "verbs")]
fn first_verbs_device() -> Option<String> {
    rdma_hint_verbs::devices().ok()?.into_iter().next().map(|d| d.name)
}

#[cfg(not(feature = "verbs"))]
fn first_verbs_device() -> Option<String> {
    None
}

#[cfg(feature = "ucx")]
fn ucx_id(tls: &str) -> String {
    rdma_hint_ucx::transport_id(Some(tls))
}

#[cfg(not(feature = "ucx"))]
fn ucx_id(tls: &str) -> String {
    format!("ucx:{tls}")
}

#[cfg(feature = "ucx")]
fn open_ucx(tls: &str) -> Result<Box<dyn Endpoint>, String> {
    Ok(Box::new(rdma_hint_ucx::UcxTransport::open(Some(tls)).map_err(|e| e.to_string())?))
}

#[cfg(not(feature = "ucx"))]
fn open_ucx(_tls: &str) -> Result<Box<dyn Endpoint>, String> {
    Err("this rdma-hint was built without the `ucx` feature: cargo build --features ucx".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_and_scopes_parse() {
        assert_eq!(Backend::parse("staged", "tcp", None, None), Ok(Backend::Staged(StagedChannel::Tcp)));
        assert_eq!(Backend::parse("ucx", "shm", None, None), Ok(Backend::Ucx("shm,self".into())));
        assert_eq!(
            Backend::parse("ucx", "shm", Some("posix,cma"), None),
            Ok(Backend::Ucx("posix,cma".into()))
        );
        assert_eq!(
            Backend::parse("verbs", "shm", None, Some("rxe0")),
            Ok(Backend::Verbs(Some("rxe0".into())))
        );
        assert_eq!(Backend::Verbs(Some("rxe0".into())).transport_id(), "verbs:rxe0");
        assert!(Backend::parse("staged", "shm", Some("tcp"), None).is_err());
        assert!(Backend::parse("staged", "shm", None, Some("rxe0")).is_err());
        assert!(Backend::parse("ucx", "carrier-pigeon", None, None).is_err());
        assert_eq!(Backend::Staged(StagedChannel::SharedMemory).transport_id(), "staged:shm");
    }
}
