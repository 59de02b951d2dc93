//! The one door to every compiled-in backend: [`TransportId`] names a transport exactly as
//! `rdma-hint probe` prints it, [`open`] turns it into a [`Transport`] with [`OpenOptions`].

use crate::error::Error;
pub(crate) use rdma_hint_core::{StagedChannelId, TransportId};
use rdma_hint_core::{Transport, WaitMode};
use rdma_hint_oob::Listener;
use std::fmt;
use std::sync::Arc;

/// How [`open`] sets a transport up. `Default` is no token, listening on loopback only, and
/// [`WaitMode::Adaptive`].
///
/// ```
/// use rdma_hint::OpenOptions;
/// use rdma_hint::transport::WaitMode;
/// let options = OpenOptions::default().token(b"pre-shared secret").wait_mode(WaitMode::BusyPoll);
/// assert!(format!("{options:?}").contains("redacted"));
/// ```
#[derive(Clone, Default)]
pub struct OpenOptions {
    token: Option<Vec<u8>>,
    unauthenticated_remote: bool,
    wait_mode: WaitMode,
    listener: Option<Arc<Listener>>,
    memory_cap: Option<u64>,
}

impl fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenOptions")
            .field("token", &self.token.as_ref().map(|t| format!("{} B, redacted", t.len())))
            .field("unauthenticated_remote", &self.unauthenticated_remote)
            .field("wait_mode", &self.wait_mode)
            .field("listener", &self.listener.as_ref().map(|listener| listener.local_addr()))
            .field("memory_cap", &self.memory_cap)
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

    /// Caps the memory the transport allocates for its regions at `cap_bytes` (live regions
    /// together; caller memory registered in place does not count). A registration past it,
    /// or past what the machine and this process's memory cgroups can spare (checked with or
    /// without a cap), is refused before anything is allocated.
    ///
    /// ```
    /// use rdma_hint::{open, MemoryKind, OpenOptions, Transport, TransportError, TransportId};
    /// let transport = open(&TransportId::STAGED_TCP, &OpenOptions::default().memory_cap(1 << 20))?;
    /// let first = transport.register(MemoryKind::Host, 768 << 10)?;
    /// let refused = transport.register(MemoryKind::Host, 512 << 10);
    /// assert!(matches!(refused, Err(TransportError::OutOfMemory { available, .. }) if available == 256 << 10));
    /// transport.deregister(first.id)?;
    /// transport.register(MemoryKind::Host, 512 << 10)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memory_cap(mut self, cap_bytes: u64) -> OpenOptions {
        self.memory_cap = Some(cap_bytes);
        self
    }

    /// Accept the peer on `listener` instead of binding a listener per transport: a server that
    /// opens one transport per peer keeps its port the whole time (nobody else can take it
    /// between peers, and a peer that dials while another is served waits in the backlog).
    /// `connect(PeerEndpoint::Listen(listener.local_addr()))` accepts on it.
    ///
    /// ```
    /// use rdma_hint::{open, OpenOptions, Transport, TransportId};
    /// use rdma_hint::transport::Listener;
    /// use std::sync::Arc;
    /// let listener = Arc::new(Listener::bind("127.0.0.1:0".parse().unwrap())?);
    /// let options = OpenOptions::default().listener(listener.clone());
    /// for _peer in 0..2 {
    ///     let transport = open(&TransportId::STAGED_TCP, &options)?;
    ///     assert_eq!(transport.bind("127.0.0.1:0".parse().unwrap())?, listener.local_addr());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn listener(mut self, listener: Arc<Listener>) -> OpenOptions {
        self.listener = Some(listener);
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
#[cfg_attr(
    not(any(feature = "staged", feature = "ucx", feature = "verbs")),
    allow(unreachable_code, unused_variables)
)]
pub fn open(id: &TransportId, options: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    let transport: Box<dyn Transport> = match id {
        #[cfg(feature = "staged")]
        TransportId::Staged(channel) => open_staged(*channel, options)?,
        #[cfg(feature = "ucx")]
        TransportId::Ucx(_) => open_ucx(id, options)?,
        #[cfg(feature = "verbs")]
        TransportId::Verbs(device) => open_verbs(id, device, options)?,
        other => {
            compiled_in(other)?;
            return Err(Error::InvalidTransportId {
                id: other.to_string(),
                why: "not a backend `open` starts: build the loopback or your own transport directly".into(),
            });
        }
    };
    transport.set_wait_mode(options.wait_mode);
    Ok(transport)
}

/// Opens `lanes` unconnected transports of one connection: the same backend, token and wait
/// mode over one region table (a region registered on one lane has the same id and memory on
/// all), for an [`Engine`](crate::engine::Engine) to stripe blocks over. Connect them all
/// with one [`Engine::connect`](crate::engine::Engine::connect): the lanes share one listener
/// (the one in `options`, or the one any lane binds), every lane of the peer dials that one
/// address, and the lanes pair in whatever order they arrive.
///
/// Every backend opens lanes, up to [`MAX_LANES`](crate::engine::MAX_LANES): the staged
/// backend sockets or channels over one region table, UCX workers of one context (on
/// `ucx:tcp` a socket each), verbs QPs in one protection domain over the same MRs. Zero
/// lanes, or more than that, is [`Error::Lanes`].
///
/// ```
/// use rdma_hint::{open_lanes, MemoryKind, OpenOptions, Transport, TransportId};
/// let lanes = open_lanes(&TransportId::STAGED_TCP, &OpenOptions::default(), 2)?;
/// let region = lanes[0].register(MemoryKind::Host, 4096)?;
/// lanes[0].write_region(region.id, 0, b"striped")?;
/// let mut seen = [0u8; 7];
/// lanes[1].read_region(region.id, 0, &mut seen)?; // the same memory on the other lane
/// assert_eq!(&seen, b"striped");
/// assert!(open_lanes(&TransportId::STAGED_TCP, &OpenOptions::default(), 0).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open_lanes(
    id: &TransportId,
    options: &OpenOptions,
    lanes: usize,
) -> Result<Vec<Arc<dyn Transport>>, Error> {
    let refuse = |why: String| Error::Lanes { transport: id.clone(), lanes, why };
    let max = rdma_hint_engine::MAX_LANES;
    if lanes == 0 || lanes > max {
        return Err(refuse(format!("give 1 to {max} lanes")));
    }
    if lanes == 1 {
        return Ok(vec![Arc::from(open(id, options)?)]);
    }
    match id {
        #[cfg(feature = "staged")]
        TransportId::Staged(channel) => {
            lanes_of(staged_transport(*channel, options)?, options, lanes, |first| Ok(first.open_lane()))
        }
        #[cfg(feature = "ucx")]
        TransportId::Ucx(_) => lanes_of(ucx_transport(id, options)?, options, lanes, |first| {
            first.open_lane().map_err(unavailable(id))
        }),
        #[cfg(feature = "verbs")]
        TransportId::Verbs(device) => {
            lanes_of(verbs_transport(id, device, options)?, options, lanes, |first| {
                first.open_lane().map_err(unavailable(id))
            })
        }
        other => {
            compiled_in(other)?;
            Err(refuse("this transport opens one lane per connection: open separate connections".into()))
        }
    }
}

/// `first` in the wait mode of `options`, and `lanes - 1` more lanes opened off it.
#[cfg(any(feature = "staged", feature = "ucx", feature = "verbs"))]
fn lanes_of<T: Transport + 'static>(
    first: T,
    options: &OpenOptions,
    lanes: usize,
    open_lane: impl Fn(&T) -> Result<T, Error>,
) -> Result<Vec<Arc<dyn Transport>>, Error> {
    first.set_wait_mode(options.wait_mode);
    let mut opened = Vec::with_capacity(lanes);
    for _ in 1..lanes {
        opened.push(Arc::new(open_lane(&first)?) as Arc<dyn Transport>);
    }
    opened.insert(0, Arc::new(first));
    Ok(opened)
}

/// [`Error::FeatureMissing`] naming the cargo feature when `id`'s backend is not compiled into
/// this build: what every entry point (open, hints, calibration, records) answers first.
pub(crate) fn compiled_in(id: &TransportId) -> Result<(), Error> {
    let feature = match id {
        TransportId::Staged(_) if !cfg!(feature = "staged") => "staged",
        TransportId::Ucx(_) if !cfg!(feature = "ucx") => "ucx",
        TransportId::Verbs(_) if !cfg!(feature = "verbs") => "verbs",
        _ => return Ok(()),
    };
    Err(Error::FeatureMissing { transport: id.clone(), feature })
}

#[cfg(any(feature = "ucx", feature = "verbs"))]
fn unavailable(id: &TransportId) -> impl FnOnce(rdma_hint_core::TransportError) -> Error + '_ {
    move |source| Error::Unavailable { transport: id.clone(), source }
}

#[cfg(feature = "staged")]
fn open_staged(channel: StagedChannelId, options: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    Ok(Box::new(staged_transport(channel, options)?))
}

#[cfg(feature = "staged")]
fn staged_transport(
    channel: StagedChannelId,
    options: &OpenOptions,
) -> Result<rdma_hint_staged::StagedTransport, Error> {
    use rdma_hint_staged::{StagedChannel, StagedTransport};
    let channel = match channel {
        StagedChannelId::Shm => StagedChannel::SharedMemory,
        StagedChannelId::Tcp => StagedChannel::Tcp,
    };
    configured(StagedTransport::new(channel), options)
}

#[cfg(feature = "ucx")]
fn open_ucx(id: &TransportId, options: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    Ok(Box::new(ucx_transport(id, options)?))
}

#[cfg(feature = "ucx")]
fn ucx_transport(id: &TransportId, options: &OpenOptions) -> Result<rdma_hint_ucx::UcxTransport, Error> {
    use rdma_hint_ucx::UcxTransport;
    let transport = UcxTransport::open(id.ucx_tls().as_deref()).map_err(unavailable(id))?;
    configured(transport, options)
}

#[cfg(feature = "verbs")]
fn open_verbs(id: &TransportId, device: &str, options: &OpenOptions) -> Result<Box<dyn Transport>, Error> {
    Ok(Box::new(verbs_transport(id, device, options)?))
}

#[cfg(feature = "verbs")]
fn verbs_transport(
    id: &TransportId,
    device: &str,
    options: &OpenOptions,
) -> Result<rdma_hint_verbs::VerbsTransport, Error> {
    use rdma_hint_verbs::VerbsTransport;
    let transport = VerbsTransport::open(Some(device)).map_err(unavailable(id))?;
    configured(transport, options)
}

/// `transport` with the memory cap, token and remote-listening choice of `options` applied.
#[cfg(any(feature = "staged", feature = "ucx", feature = "verbs"))]
fn configured<T: rdma_hint_oob::Gated + Transport>(transport: T, options: &OpenOptions) -> Result<T, Error> {
    if let Some(cap) = options.memory_cap {
        transport.domain().cap_memory(cap)?;
    }
    let transport = match &options.token {
        Some(token) => transport.with_token(token)?,
        None => transport,
    };
    let transport =
        if options.unauthenticated_remote { transport.allow_unauthenticated_remote() } else { transport };
    Ok(match &options.listener {
        Some(listener) => transport.with_listener(listener.clone())?,
        None => transport,
    })
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
            assert!(
                matches!(
                    bad.parse::<TransportId>(),
                    Err(rdma_hint_core::TransportError::InvalidArgument { what: "transport id", .. })
                ),
                "{bad}"
            );
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
            Err(Error::Transport(rdma_hint_core::TransportError::InvalidArgument { what: "token", .. }))
        ));
    }
}
