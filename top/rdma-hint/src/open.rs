//! The one door to every compiled-in backend: [`TransportId`] names a transport exactly as
//! `rdma-hint probe` prints it, [`open`] turns it into a [`Transport`] with [`OpenOptions`].

use crate::error::Error;
use rdma_hint_transport::{Transport, WaitMode};
use std::fmt;
use std::str::FromStr;

/// The channel of the staged backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StagedChannelId {
    /// Same host: regions in shared memory, one copy per block.
    Shm,
    /// Any host: framed writes over TCP.
    Tcp,
}

/// A transport by name: the ids `rdma-hint probe` prints.
///
/// | id | backend (cargo feature) |
/// |---|---|
/// | `staged:shm`, `staged:tcp` | host-staged (`staged`, default) |
/// | `ucx:shm`, `ucx:tcp`, `ucx:<UCX_TLS scope>` (`ucx:posix+cma`, `ucx:default`) | UCX (`ucx`) |
/// | `verbs:<device>` (`verbs:mlx5_0`, `verbs:rxe0`) | raw ibverbs (`verbs`) |
///
/// A UCX scope lists UCX transport names joined by `+` (a `,` is accepted and normalised);
/// `self` is implied. `ucx:default` lets UCX choose (or read `UCX_TLS`).
///
/// ```
/// use rdma_hint::TransportId;
/// let id: TransportId = "ucx:posix,cma".parse().unwrap();
/// assert_eq!(id.to_string(), "ucx:posix+cma");
/// assert_eq!(id.ucx_tls().as_deref(), Some("posix,cma,self"));
/// assert_eq!("staged:shm".parse::<TransportId>().unwrap(), TransportId::STAGED_SHM);
/// assert_eq!("verbs:rxe0".parse::<TransportId>().unwrap().backend(), "verbs");
/// assert!("staged:carrier-pigeon".parse::<TransportId>().is_err());
/// assert!("verbs:".parse::<TransportId>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransportId {
    /// The staged backend over a channel.
    Staged(StagedChannelId),
    /// UCX restricted to a scope (`shm`, `tcp`, `posix+cma`; `default`: UCX chooses).
    Ucx(String),
    /// Raw verbs on an RDMA device (`mlx5_0`, `rxe0`).
    Verbs(String),
}

impl TransportId {
    /// `staged:shm`.
    pub const STAGED_SHM: TransportId = TransportId::Staged(StagedChannelId::Shm);
    /// `staged:tcp`.
    pub const STAGED_TCP: TransportId = TransportId::Staged(StagedChannelId::Tcp);

    /// The backend's name (`staged`, `ucx`, `verbs`), which is also its cargo feature.
    pub fn backend(&self) -> &'static str {
        match self {
            TransportId::Staged(_) => "staged",
            TransportId::Ucx(_) => "ucx",
            TransportId::Verbs(_) => "verbs",
        }
    }

    /// A UCX id for a `UCX_TLS` value (`shm,self` → `ucx:shm`; `None` → `ucx:default`).
    pub fn ucx_for_tls(tls: Option<&str>) -> Result<TransportId, Error> {
        let names: Vec<&str> = tls
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty() && *t != "self")
            .collect();
        let scope = if names.is_empty() { "default".to_string() } else { names.join("+") };
        format!("ucx:{scope}").parse()
    }

    /// For UCX ids: the `UCX_TLS` value the scope stands for (`self` added; `None` for
    /// `ucx:default`).
    pub fn ucx_tls(&self) -> Option<String> {
        match self {
            TransportId::Ucx(scope) if scope != "default" => {
                Some(format!("{},self", scope.replace('+', ",")))
            }
            _ => None,
        }
    }

    /// Whether data on this transport crosses a NIC that should copy without the CPU (not
    /// staged, not UCX over shm/tcp, not the kernel's software RDMA: rxe and siw).
    pub fn bypasses_cpu(&self) -> bool {
        match self {
            TransportId::Staged(_) => false,
            TransportId::Verbs(device) => !(device.starts_with("rxe") || device.starts_with("siw")),
            TransportId::Ucx(scope) => scope
                .split('+')
                .any(|t| matches!(t, "rc" | "rc_x" | "ud" | "ud_x" | "dc" | "dc_x" | "ib" | "rc_verbs")),
        }
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportId::Staged(StagedChannelId::Shm) => f.write_str("staged:shm"),
            TransportId::Staged(StagedChannelId::Tcp) => f.write_str("staged:tcp"),
            TransportId::Ucx(scope) => write!(f, "ucx:{scope}"),
            TransportId::Verbs(device) => write!(f, "verbs:{device}"),
        }
    }
}

fn is_name(text: &str, extra: &[char]) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || extra.contains(&c))
}

impl FromStr for TransportId {
    type Err = Error;

    fn from_str(text: &str) -> Result<TransportId, Error> {
        let invalid = |why: &str| Error::InvalidTransportId { id: text.to_string(), why: why.to_string() };
        let (backend, rest) = text.split_once(':').ok_or_else(|| {
            invalid("expected `backend:name` (staged:shm, staged:tcp, ucx:<scope>, verbs:<device>)")
        })?;
        match backend {
            "staged" => match rest {
                "shm" => Ok(TransportId::STAGED_SHM),
                "tcp" => Ok(TransportId::STAGED_TCP),
                _ => Err(invalid("the staged backend has the channels shm and tcp")),
            },
            "ucx" => {
                let names: Vec<&str> =
                    rest.split(['+', ',']).map(str::trim).filter(|t| *t != "self").collect();
                if names.is_empty() || !names.iter().all(|n| is_name(n, &[])) {
                    return Err(invalid(
                        "a UCX scope is UCX transport names joined by `+` (shm, tcp, posix+cma)",
                    ));
                }
                Ok(TransportId::Ucx(names.join("+")))
            }
            "verbs" if is_name(rest, &['-', '.']) => Ok(TransportId::Verbs(rest.to_string())),
            "verbs" => Err(invalid("name the RDMA device: verbs:mlx5_0, verbs:rxe0")),
            _ => Err(invalid("unknown backend (staged, ucx, verbs)")),
        }
    }
}

impl serde::Serialize for TransportId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TransportId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// How [`open`] sets a transport up. `Default` is no token, listening on loopback only, and
/// [`WaitMode::Adaptive`].
///
/// ```
/// use rdma_hint::{OpenOptions, WaitMode};
/// let options = OpenOptions::default().token(b"pre-shared secret").wait_mode(WaitMode::BusyPoll);
/// assert!(format!("{options:?}").contains("redacted"));
/// ```
#[derive(Clone, Default)]
pub struct OpenOptions {
    token: Option<Vec<u8>>,
    unauthenticated_remote: bool,
    wait_mode: WaitMode,
}

impl fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenOptions")
            .field("token", &self.token.as_ref().map(|t| format!("{} B, redacted", t.len())))
            .field("unauthenticated_remote", &self.unauthenticated_remote)
            .field("wait_mode", &self.wait_mode)
            .finish()
    }
}

impl OpenOptions {
    /// Requires the peer to prove it holds `token` (1…64 bytes, pre-shared out of band) before
    /// anything else is exchanged, and proves it in turn: an HMAC-SHA-256 over fresh nonces of
    /// both sides, so the token itself never crosses the wire. Needed to listen on any address
    /// but loopback.
    pub fn token(mut self, token: &[u8]) -> OpenOptions {
        self.token = Some(token.to_vec());
        self
    }

    /// Lets the transport listen on a non-loopback address without a token, which it refuses
    /// otherwise ([`TransportError::InvalidArgument`](crate::TransportError)): anyone who can
    /// reach the address may then connect and write into the regions it exposes.
    pub fn allow_unauthenticated_remote(mut self, allow: bool) -> OpenOptions {
        self.unauthenticated_remote = allow;
        self
    }

    /// How the transport's waits spend their time (see [`WaitMode`]).
    pub fn wait_mode(mut self, mode: WaitMode) -> OpenOptions {
        self.wait_mode = mode;
        self
    }
}

/// Opens an unconnected transport of any compiled-in backend.
///
/// A backend that is not compiled in is [`Error::FeatureMissing`] naming the cargo feature;
/// one that cannot run here (no library, no such device) is [`Error::Unavailable`] with the
/// backend's reason.
///
/// ```
/// use rdma_hint::{open, BlockingTransport, MemoryKind, OpenOptions, PeerEndpoint, Transport, TransportId};
/// use std::time::{Duration, Instant};
///
/// let id: TransportId = "staged:tcp".parse()?;
/// let receiver = open(&id, &OpenOptions::default())?;
/// let sender = open(&id, &OpenOptions::default())?;
/// let target = receiver.register(MemoryKind::Host, 4096)?;
/// let source = sender.register(MemoryKind::Host, 4096)?;
/// let address = receiver.bind("127.0.0.1:0".parse().unwrap())?;
/// let deadline = Instant::now() + Duration::from_secs(10);
/// let accepting = std::thread::spawn(move || {
///     receiver.connect_blocking(PeerEndpoint::Listen(address), &[target.id], deadline).map(|_| receiver)
/// });
/// let remote = sender.connect_blocking(PeerEndpoint::Dial(address), &[], deadline)?;
/// assert_eq!(remote[0].len, 4096);
/// let _receiver = accepting.join().unwrap()?;
/// # let _ = source;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open(id: &TransportId, options: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    let transport = match id {
        TransportId::Staged(channel) => open_staged(id, *channel, options)?,
        TransportId::Ucx(_) => open_ucx(id, options)?,
        TransportId::Verbs(device) => open_verbs(id, device, options)?,
    };
    transport.set_wait_mode(options.wait_mode);
    Ok(transport)
}

#[cfg(any(feature = "ucx", feature = "verbs"))]
fn unavailable(id: &TransportId) -> impl FnOnce(rdma_hint_transport::TransportError) -> Error + '_ {
    move |source| Error::Unavailable { transport: id.to_string(), source }
}

#[cfg(feature = "staged")]
fn open_staged(
    _id: &TransportId,
    channel: StagedChannelId,
    options: &OpenOptions,
) -> Result<Box<dyn Transport>, Error> {
    use rdma_hint_staged::{StagedChannel, StagedTransport};
    let channel = match channel {
        StagedChannelId::Shm => StagedChannel::SharedMemory,
        StagedChannelId::Tcp => StagedChannel::Tcp,
    };
    let transport = StagedTransport::new(channel);
    Ok(Box::new(gated(transport, options)?))
}

#[cfg(not(feature = "staged"))]
fn open_staged(id: &TransportId, _: StagedChannelId, _: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    Err(Error::FeatureMissing { transport: id.to_string(), feature: "staged" })
}

#[cfg(feature = "ucx")]
fn open_ucx(id: &TransportId, options: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    let transport = rdma_hint_ucx::UcxTransport::open(id.ucx_tls().as_deref()).map_err(unavailable(id))?;
    Ok(Box::new(gated(transport, options)?))
}

#[cfg(not(feature = "ucx"))]
fn open_ucx(id: &TransportId, _: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    Err(Error::FeatureMissing { transport: id.to_string(), feature: "ucx" })
}

#[cfg(feature = "verbs")]
fn open_verbs(id: &TransportId, device: &str, options: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    let transport = rdma_hint_verbs::VerbsTransport::open(Some(device)).map_err(unavailable(id))?;
    Ok(Box::new(gated(transport, options)?))
}

#[cfg(not(feature = "verbs"))]
fn open_verbs(id: &TransportId, _: &str, _: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    Err(Error::FeatureMissing { transport: id.to_string(), feature: "verbs" })
}

/// `transport` with the token and remote-listening choice of `options` applied.
#[cfg(any(feature = "staged", feature = "ucx", feature = "verbs"))]
fn gated<T: rdma_hint_oob::Gated>(transport: T, options: &OpenOptions) -> Result<T, Error> {
    let transport = match &options.token {
        Some(token) => transport.with_token(token)?,
        None => transport,
    };
    Ok(if options.unauthenticated_remote { transport.allow_unauthenticated_remote() } else { transport })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_their_strings() {
        for text in
            ["staged:shm", "staged:tcp", "ucx:shm", "ucx:tcp", "ucx:posix+cma", "ucx:default", "verbs:mlx5_0"]
        {
            let id: TransportId = text.parse().unwrap();
            assert_eq!(id.to_string(), text);
        }
        assert_eq!(TransportId::ucx_for_tls(Some("shm,self")).unwrap().to_string(), "ucx:shm");
        assert_eq!(TransportId::ucx_for_tls(Some("posix,self")).unwrap().to_string(), "ucx:posix");
        assert_eq!(TransportId::ucx_for_tls(None).unwrap().to_string(), "ucx:default");
        assert_eq!("ucx:shm".parse::<TransportId>().unwrap().ucx_tls().as_deref(), Some("shm,self"));
        let json = serde_json::to_string(&TransportId::STAGED_SHM).unwrap();
        assert_eq!(json, "\"staged:shm\"");
        assert_eq!(serde_json::from_str::<TransportId>(&json).unwrap(), TransportId::STAGED_SHM);
        assert!(serde_json::from_str::<TransportId>("\"staged:x\"").is_err());
        for bad in ["", "staged", "staged:", "ucx:", "ucx:tcp;rm", "verbs:a b", "nccl:x", "verbs:(none)"] {
            assert!(matches!(bad.parse::<TransportId>(), Err(Error::InvalidTransportId { .. })), "{bad}");
        }
    }

    #[test]
    fn missing_backends_name_their_feature() {
        #[cfg(not(feature = "ucx"))]
        assert!(matches!(
            open(&"ucx:shm".parse().unwrap(), &OpenOptions::default()),
            Err(Error::FeatureMissing { feature: "ucx", .. })
        ));
        #[cfg(not(feature = "verbs"))]
        assert!(matches!(
            open(&"verbs:rxe0".parse().unwrap(), &OpenOptions::default()),
            Err(Error::FeatureMissing { feature: "verbs", .. })
        ));
        #[cfg(feature = "staged")]
        assert!(matches!(
            open(&TransportId::STAGED_TCP, &OpenOptions::default().token(&[0u8; 65])),
            Err(Error::Transport(rdma_hint_transport::TransportError::InvalidArgument { what: "token", .. }))
        ));
    }
}
