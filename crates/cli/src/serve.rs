//! `rdma-hint serve`: the receiving side of `sweep --peer`, on another host or namespace.

use crate::backend::Backend;
use rdma_hint::core::{Arrival, MemoryKind, PeerEndpoint, TransportError};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Exposes a region of `bytes` on `listen` and serves one peer until it leaves or `timeout`.
pub(crate) fn run(
    listen: SocketAddr,
    backend: &Backend,
    bytes: u64,
    timeout: Duration,
) -> Result<(), String> {
    let transport = backend.open()?;
    let region = transport.register(MemoryKind::Host, bytes).map_err(|e| e.to_string())?;
    let address = transport.bind(listen).map_err(|e| e.to_string())?;
    println!("serving {bytes} B over {} on {address}", backend.transport_id());
    let deadline = Instant::now() + timeout;
    pollster::block_on(transport.connect(PeerEndpoint::Listen(address), &[region.id], deadline))
        .map_err(|e| e.to_string())?;
    let mut arrivals = [Arrival::EMPTY; 64];
    loop {
        match pollster::block_on(transport.wait_arrivals(&mut arrivals, deadline)) {
            Ok(_) => {}
            Err(TransportError::PeerGone(_)) => {
                println!("peer finished");
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
