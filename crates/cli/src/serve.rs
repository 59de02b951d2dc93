//! `rdma-hint serve`: the receiving side of `sweep --peer`, on another host or namespace. It
//! serves peers one after another on one listener; a peer that fails its handshake or breaks
//! the protocol is an error line for that run, and the next peer is served.

use crate::sweep::{SWEEP_FINISHED, SWEEP_REGION_TOO_SMALL};
use crate::units::{format_bytes, parse_bytes};
use anyhow::{bail, Context, Result};
use rdma_hint::transport::Listener;
use rdma_hint::{
    open, Arrival, BlockingTransport, MemoryKind, OpenOptions, PeerEndpoint, RegionId, Transport,
    TransportError, TransportId,
};
use std::net::SocketAddr;
use std::sync::Arc;
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

/// `--idle-timeout-s`: 1…3600 seconds.
pub(crate) fn parse_idle_seconds(text: &str) -> Result<u64, String> {
    match crate::units::parse_count(text)? {
        seconds @ 1..=3600 => Ok(seconds),
        _ => Err(format!("`{text}` must be 1…3600 seconds")),
    }
}

/// What `serve` was asked to do.
pub(crate) struct ServeArgs {
    pub(crate) listen: SocketAddr,
    pub(crate) transport: TransportId,
    pub(crate) options: OpenOptions,
    pub(crate) bytes: u64,
    /// How long one run may wait for its peer and its transfer.
    pub(crate) timeout: Duration,
    /// How long a connected peer may send nothing before its run ends.
    pub(crate) idle_timeout: Duration,
    /// Peers to serve; `None`: until the process is stopped.
    pub(crate) count: Option<u64>,
}

/// Serves `count` peers (or forever), one at a time, each on a fresh transport exposing `bytes`,
/// all on one listener bound once: the port stays ours between peers, and a peer that dials
/// while another is served is told at once that serve is busy. A peer's failure is a line and the next peer
/// is served; what would fail every run (the listen address, opening the transport, the
/// region) ends `serve` at once. Fails if any run failed, after serving them all.
pub(crate) fn run(args: &ServeArgs) -> Result<()> {
    let listener = Listener::bind(args.listen)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("--listen {}: cannot listen there", args.listen))?;
    let address = listener.local_addr();
    // Anyone who dials while a peer's handshake (a shm hand-off above all) is still under way
    // is told serve is busy too, not only once the run has begun.
    listener.serve_one_at_a_time();
    let listener = Arc::new(listener);
    let options = args.options.clone().listener(listener.clone());
    let mut failed = 0u64;
    let mut served = 0u64;
    while args.count.is_none_or(|count| served < count) {
        // Checked per run, before any peer is waited for: a failure here is not the peer's.
        let transport = open(&args.transport, &options).map_err(|error| listen_error(error, args.listen))?;
        let region = transport
            .register(MemoryKind::Host, args.bytes)
            .with_context(|| format!("--bytes {}: cannot register the region", format_bytes(args.bytes)))?;
        if served == 0 {
            crate::output::print_line(&format!(
                "serving {} over {} on {address}",
                format_bytes(args.bytes),
                args.transport
            ))?;
        }
        served += 1;
        match serve_one(transport.as_ref(), region.id, &listener, args) {
            Ok(()) => crate::output::print_line(&format!("run {served}: the peer's sweep finished"))?,
            Err(error) if crate::output::is_broken_pipe(&error) => return Err(error),
            Err(error) => {
                failed += 1;
                eprintln!("rdma-hint: run {served}: {}", crate::output::error_line(&error));
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {served} runs failed");
    }
    Ok(())
}

/// `open`'s error, with the flags that fix a refused listen address.
fn listen_error(error: rdma_hint::Error, listen: SocketAddr) -> anyhow::Error {
    match error {
        rdma_hint::Error::Transport(TransportError::InvalidArgument { what: "listen address", why }) => {
            anyhow::anyhow!("--listen {listen}: {why} (--token-file, or --insecure to allow anyone)")
        }
        other => other.into(),
    }
}

/// One peer: authenticate and handshake on the shared listener (bad candidates are dropped by
/// the library within seconds while it keeps listening), then receive until the peer says how
/// its sweep ended and leaves. Meanwhile, anyone else who dials is told serve is busy; a peer
/// silent for the idle timeout ends the run.
fn serve_one(
    transport: &dyn Transport,
    region: RegionId,
    listener: &Arc<Listener>,
    args: &ServeArgs,
) -> Result<()> {
    let deadline = Instant::now() + args.timeout;
    transport.connect_blocking(PeerEndpoint::Listen(listener.local_addr()), &[region], deadline)?;
    let _busy = listener.turn_away_while_busy();
    let mut arrivals = [Arrival::EMPTY; 64];
    let mut outcome = None;
    let mut heard = Instant::now();
    loop {
        let wake = deadline.min(heard + args.idle_timeout);
        match transport.wait_arrivals_blocking(&mut arrivals, wake) {
            Ok(count) => {
                heard = Instant::now();
                if let Some(last) = arrivals[..count].iter().rev().find(|a| is_outcome(a.imm)) {
                    outcome = Some(last.imm);
                }
            }
            Err(TransportError::DeadlineExceeded { .. }) if Instant::now() < deadline => bail!(
                "the peer went quiet: nothing arrived for {} s (--idle-timeout-s)",
                args.idle_timeout.as_secs()
            ),
            Err(TransportError::PeerGone(why)) => {
                // A link broken by a protocol violation fails the run, whatever came before.
                if why.contains("protocol error") {
                    bail!("the peer broke the protocol: {why}");
                }
                return match outcome {
                    Some(SWEEP_FINISHED) => Ok(()),
                    Some(_) => bail!(
                        "the peer's sweep needs a larger region than the {} this side exposes: restart serve with a larger --bytes",
                        format_bytes(args.bytes)
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
