//! `rdma-hint serve`: the receiving side of `sweep --peer`, on another host or namespace.

use crate::sweep::{SWEEP_FINISHED, SWEEP_REGION_TOO_SMALL};
use crate::units::{format_bytes, parse_bytes};
use anyhow::{bail, Context, Result};
use rdma_hint::{
    open, Arrival, BlockingTransport, MemoryKind, OpenOptions, PeerEndpoint, TransportError, TransportId,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The smallest region `serve` exposes: one page-aligned block.
const MIN_REGION_BYTES: u64 = 4096;

/// `--bytes`: a byte count of at least [`MIN_REGION_BYTES`].
pub(crate) fn parse_region_bytes(text: &str) -> Result<u64, String> {
    match parse_bytes(text)? {
        bytes if bytes < MIN_REGION_BYTES => Err(format!("must be at least {MIN_REGION_BYTES} B (4K)")),
        bytes => Ok(bytes),
    }
}

/// Exposes a region of `bytes` on `listen` and serves one peer until it leaves or `timeout`.
/// Succeeds only when the peer's sweep said it finished; a peer that leaves without saying so
/// (its sweep failed, or it was killed) is an error, as is a sweep that needed more bytes.
pub(crate) fn run(
    listen: SocketAddr,
    transport_id: &TransportId,
    bytes: u64,
    timeout: Duration,
) -> Result<()> {
    let transport = open(transport_id, &OpenOptions::default())?;
    let region = transport.register(MemoryKind::Host, bytes)?;
    let address =
        transport.bind(listen).with_context(|| format!("--listen {listen}: cannot listen there"))?;
    crate::output::print_line(&format!("serving {} over {transport_id} on {address}", format_bytes(bytes)))?;
    let deadline = Instant::now() + timeout;
    transport.connect_blocking(PeerEndpoint::Listen(address), &[region.id], deadline)?;
    let mut arrivals = [Arrival::EMPTY; 64];
    let mut outcome = None;
    loop {
        match transport.wait_arrivals_blocking(&mut arrivals, deadline) {
            Ok(count) => {
                if let Some(last) = arrivals[..count].iter().rev().find(|a| is_outcome(a.imm)) {
                    outcome = Some(last.imm);
                }
            }
            Err(TransportError::PeerGone(why)) => {
                return match outcome {
                    Some(SWEEP_FINISHED) => crate::output::print_line("the peer's sweep finished").map_err(Into::into),
                    Some(_) => bail!(
                        "the peer's sweep needs a larger region than the {} this side exposes: restart serve with a larger --bytes",
                        format_bytes(bytes)
                    ),
                    None => bail!("the peer left before its sweep finished ({why}); its own output says why"),
                };
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn is_outcome(imm: u32) -> bool {
    matches!(imm, SWEEP_FINISHED | SWEEP_REGION_TOO_SMALL)
}
