//! `rdma-hint serve`: the receiving side of `sweep --peer`, on another host or namespace.

use anyhow::{Context, Result};
use rdma_hint::{
    open, Arrival, BlockingTransport, MemoryKind, OpenOptions, PeerEndpoint, TransportError, TransportId,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Exposes a region of `bytes` on `listen` and serves one peer until it leaves or `timeout`.
pub(crate) fn run(
    listen: SocketAddr,
    transport_id: &TransportId,
    bytes: u64,
    timeout: Duration,
) -> Result<()> {
    let transport = open(transport_id, &OpenOptions::default())?;
    let region = transport.register(MemoryKind::Host, bytes)?;
    let address = transport.bind(listen).with_context(|| format!("listening on {listen}"))?;
    println!("serving {bytes} B over {transport_id} on {address}");
    let deadline = Instant::now() + timeout;
    transport.connect_blocking(PeerEndpoint::Listen(address), &[region.id], deadline)?;
    let mut arrivals = [Arrival::EMPTY; 64];
    loop {
        match transport.wait_arrivals_blocking(&mut arrivals, deadline) {
            Ok(_) => {}
            Err(TransportError::PeerGone(_)) => {
                println!("peer finished");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
}
