//! The rules about the out-of-band handshake: what a listener answers garbage, and the
//! pre-shared tokens that gate it.

use crate::backend::Backend;
use crate::contract::shared;
use crate::pair::{chunker, deadline, round_trip, Pair};
use crate::Subject;
use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::{MemoryKind, PeerEndpoint, Transport, TransportError};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How a raw client starts: `None` without authenticating, `Some(token)` after authenticating
/// with `token` (itself `None` for a backend without one).
type Authenticated = Option<Option<&'static [u8]>>;

/// What a listener of this backend answers a raw client that sends `bytes` (after
/// authenticating with `token` when given): the error its connect reports at a short deadline,
/// or `None` when it connected anyway.
fn listener_answers<B: Backend>(
    s: &Subject<'_, B>,
    bytes: &'static [u8],
    token: Authenticated,
) -> Option<TransportError> {
    let listener = s.backend.open(s.backend.token());
    let region = listener.register(MemoryKind::Host, 4096).expect("register");
    let address = listener.bind(s.backend.listen_address()).expect("bind");
    let raw = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(address).expect("connect");
        if let Some(token) = token {
            let token = token.map(|bytes| rdma_hint_oob::Token::new(bytes).expect("a valid token"));
            let _ = rdma_hint_oob::authenticate(&mut stream, token.as_ref(), rdma_hint_oob::Role::Dialer);
        }
        let _ = stream.write_all(bytes);
        let mut sink = [0u8; 4096];
        let _ = stream.read(&mut sink);
    });
    let connected = block_on(listener.connect(PeerEndpoint::Listen(address), &[region.id], deadline(3)));
    raw.join().expect("raw client");
    connected.err()
}

/// Garbage before authenticating, garbage and a truncated hello after it: typed errors within
/// the deadline, and the listener takes a real peer afterwards.
pub fn garbage_hellos_are_typed_errors_and_the_listener_survives<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let token = s.backend.token();
    let http: &'static [u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    type Expect = fn(&TransportError) -> bool;
    let refused: Expect = |e| matches!(e, TransportError::Unauthorized { .. });
    let malformed: Expect = |e| matches!(e, TransportError::Handshake(_));
    // A short hello is malformed too, or still waiting for its rest when the deadline comes.
    let short: Expect = |e| {
        matches!(
            e,
            TransportError::Handshake(_)
                | TransportError::PeerGone(_)
                | TransportError::DeadlineExceeded { .. }
        )
    };
    let cases: [(&str, &'static [u8], Authenticated, Expect); 4] = [
        ("no authentication", http, None, refused),
        ("garbage after authenticating", http, Some(token), malformed),
        ("ones after authenticating", &[0xFF; 64], Some(token), malformed),
        ("a truncated hello", b"RDMAH", Some(token), short),
    ];
    for (what, bytes, auth, expected) in cases {
        match listener_answers(s, bytes, auth) {
            Some(error) => assert!(expected(&error), "{what}: {error:?}"),
            None => panic!("{what}: the listener connected"),
        }
    }
    // The same listener drops a bad candidate and takes the next, real one.
    let listener = s.backend.open(s.backend.token());
    let target = listener.register(MemoryKind::Host, 1 << 20).expect("register");
    let address = listener.bind(s.backend.listen_address()).expect("bind");
    let garbage = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(address).expect("connect");
        let _ = stream.write_all(http);
        std::thread::sleep(Duration::from_millis(200));
    });
    let accepting = std::thread::spawn(move || {
        block_on(listener.connect(PeerEndpoint::Listen(address), &[target.id], deadline(20)))
            .map(|_| listener)
    });
    std::thread::sleep(Duration::from_millis(100));
    let sender = s.backend.open(token);
    let source = sender.register(MemoryKind::Host, 1 << 20).expect("register");
    let remote = block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline(20)))
        .expect("a real peer after garbage")[0];
    let receiver = accepting.join().expect("accepting").expect("the listener survived the garbage");
    drop(garbage);
    let p = Pair { sender, receiver, source, target, remote };
    round_trip(&p, &mut chunker(&p.sender, 64 * 1024), 1 << 20, 4, 4);
}

/// Connects a listener and a dialler holding the given tokens: what each side's connect
/// returned. Each waits `seconds` at most: a refused peer's listener waits out its deadline for
/// another, while a connect that should succeed gets as long as a loaded machine needs.
fn connect_with_tokens<B: Backend>(
    s: &Subject<'_, B>,
    (listener, dialler): (Option<&[u8]>, Option<&[u8]>),
    seconds: u64,
) -> (Result<(), TransportError>, Result<(), TransportError>) {
    let listening = s.backend.open(listener);
    let region = listening.register(MemoryKind::Host, 4096).expect("register");
    let address = listening.bind(s.backend.listen_address()).expect("bind");
    // The listener lives until the dialler's connect has returned: one dropped as soon as its
    // own side connected gives its memory back, and a dialler still checking the shm ring it
    // handed over would find its pages gone (loaded run 31: "0 B of its 266240 B are
    // committed"), which is what a peer that leaves mid-handshake gets, not this rule's case.
    let accepting = std::thread::spawn(move || {
        let accepted =
            block_on(listening.connect(PeerEndpoint::Listen(address), &[region.id], deadline(seconds)));
        (accepted.map(drop), listening)
    });
    let dialling = s.backend.open(dialler);
    let dialled = block_on(dialling.connect(PeerEndpoint::Dial(address), &[], deadline(seconds))).map(drop);
    let (accepted, _listening) = accepting.join().expect("accepting");
    (accepted, dialled)
}

/// Equal tokens connect; a different or a missing one on either side connects neither.
pub fn pre_shared_tokens_gate_the_handshake<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let (a, b): (&[u8], &[u8]) = (b"token of the cluster", b"a guess at the token");
    let (accepted, dialled) = connect_with_tokens(s, (Some(a), Some(a)), 20);
    assert!(accepted.is_ok() && dialled.is_ok(), "equal tokens: listener {accepted:?}, dialler {dialled:?}");
    for (tokens, case) in [
        ((Some(a), Some(b)), "different tokens"),
        ((Some(a), None), "dialler without a token"),
        ((None, Some(a)), "listener without a token"),
    ] {
        let (accepted, dialled) = connect_with_tokens(s, tokens, 3);
        assert!(accepted.is_err() && dialled.is_err(), "{case}: listener {accepted:?}, dialler {dialled:?}");
    }
}
