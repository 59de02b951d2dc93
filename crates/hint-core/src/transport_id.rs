//! [`TransportId`]: a transport named exactly as `rdma-hint probe` prints it, typed, so an id is
//! parsed once and compared, stored and displayed the same way everywhere.

use crate::TransportError;
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
/// use rdma_hint_core::TransportId;
/// let id: TransportId = "ucx:posix,cma".parse().unwrap();
/// assert_eq!(id.to_string(), "ucx:posix+cma");
/// assert_eq!(id.ucx_tls().as_deref(), Some("posix,cma,self"));
/// assert_eq!("staged:shm".parse::<TransportId>().unwrap(), TransportId::STAGED_SHM);
/// assert_eq!("verbs:rxe0".parse::<TransportId>().unwrap().backend(), "verbs");
/// assert!("staged:carrier-pigeon".parse::<TransportId>().is_err());
/// assert!("verbs:".parse::<TransportId>().is_err());
/// for id in ["loopback", "custom:my-rdma", "ucx:posix+cma", "verbs:mlx5_0"] {
///     assert_eq!(id.parse::<TransportId>().unwrap().to_string(), id);
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransportId {
    /// The staged backend over a channel.
    Staged(StagedChannelId),
    /// UCX restricted to a scope (`shm`, `tcp`, `posix+cma`; `default`: UCX chooses).
    Ucx(String),
    /// Raw verbs on an RDMA device (`mlx5_0`, `rxe0`).
    Verbs(String),
    /// The chunker's in-process loopback transport (a memcpy; tests and examples).
    Loopback,
    /// A transport an embedder implements itself (`custom:<name>`).
    Custom(String),
}

impl TransportId {
    /// `staged:shm`.
    pub const STAGED_SHM: TransportId = TransportId::Staged(StagedChannelId::Shm);
    /// `staged:tcp`.
    pub const STAGED_TCP: TransportId = TransportId::Staged(StagedChannelId::Tcp);

    /// A verbs id for RDMA device `device` (`mlx5_0`, `rxe0`).
    pub fn verbs(device: &str) -> Result<TransportId, TransportError> {
        format!("verbs:{device}").parse()
    }

    /// The backend's name (`staged`, `ucx`, `verbs`), which is also its facade cargo feature.
    pub fn backend(&self) -> &'static str {
        match self {
            TransportId::Staged(_) => "staged",
            TransportId::Ucx(_) => "ucx",
            TransportId::Verbs(_) => "verbs",
            TransportId::Loopback => "loopback",
            TransportId::Custom(_) => "custom",
        }
    }

    /// A UCX id for a `UCX_TLS` value (`shm,self` → `ucx:shm`; `None` → `ucx:default`).
    pub fn ucx_for_tls(tls: Option<&str>) -> Result<TransportId, TransportError> {
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
            TransportId::Staged(_) | TransportId::Loopback | TransportId::Custom(_) => false,
            TransportId::Verbs(device) => !(device.starts_with("rxe") || device.starts_with("siw")),
            TransportId::Ucx(scope) => scope
                .split('+')
                .any(|t| matches!(t, "rc" | "rc_x" | "ud" | "ud_x" | "dc" | "dc_x" | "ib" | "rc_verbs")),
        }
    }
}

/// Honours width and alignment (`{:<12}`), so ids line up in tables.
///
/// ```
/// use rdma_hint_core::TransportId;
/// assert_eq!(format!("[{:<12}]", TransportId::STAGED_SHM), "[staged:shm  ]");
/// assert_eq!(format!("[{:>8}]", TransportId::Ucx("tcp".into())), "[ ucx:tcp]");
/// ```
impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportId::Staged(StagedChannelId::Shm) => f.pad("staged:shm"),
            TransportId::Staged(StagedChannelId::Tcp) => f.pad("staged:tcp"),
            TransportId::Ucx(scope) => f.pad(&format!("ucx:{scope}")),
            TransportId::Verbs(device) => f.pad(&format!("verbs:{device}")),
            TransportId::Loopback => f.pad("loopback"),
            TransportId::Custom(name) => f.pad(&format!("custom:{name}")),
        }
    }
}

fn is_name(text: &str, extra: &[char]) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || extra.contains(&c))
}

impl FromStr for TransportId {
    /// An id that does not parse is [`TransportError::InvalidArgument`] (`what` is
    /// `"transport id"`), saying what was given and what is wrong with it.
    type Err = TransportError;

    fn from_str(text: &str) -> Result<TransportId, TransportError> {
        let invalid = |why: &str| TransportError::InvalidArgument {
            what: "transport id",
            why: format!("`{}`: {why}", text.escape_debug()),
        };
        if text == "loopback" {
            return Ok(TransportId::Loopback);
        }
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
            "custom" if is_name(rest, &['-', '.']) => Ok(TransportId::Custom(rest.to_string())),
            "custom" => Err(invalid("name the transport: custom:my-transport")),
            _ => Err(invalid("unknown backend (staged, ucx, verbs, loopback, custom)")),
        }
    }
}

/// An id equals the text it parses from (`"ucx:posix,cma"` equals `ucx:posix+cma`), so hints
/// can be picked by the id `probe` printed.
///
/// ```
/// use rdma_hint_core::TransportId;
/// assert!(TransportId::STAGED_SHM == "staged:shm");
/// assert!("ucx:posix,cma".parse::<TransportId>().unwrap() == "ucx:posix+cma");
/// assert!(TransportId::STAGED_SHM != "staged:carrier-pigeon");
/// ```
impl PartialEq<str> for TransportId {
    fn eq(&self, text: &str) -> bool {
        text.parse::<TransportId>().is_ok_and(|id| id == *self)
    }
}

impl PartialEq<&str> for TransportId {
    fn eq(&self, text: &&str) -> bool {
        *self == **text
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
