//! The UCX backend's put bandwidth measured the way `ucx_perftest -t ucp_put_bw` measures
//! UCX's: one message size, the same source and destination buffer every time, many messages
//! in flight, bandwidth = bytes / time from the first post to the last completion. Prints
//! MB/s with UCX's MB (2²⁰ bytes) so the columns compare directly.
//!
//! ```text
//! ucx_put_bw serve <listen-address> <UCX_TLS> <bytes>          # prints LISTENING <address>
//! ucx_put_bw run <address> <UCX_TLS> <bytes> <messages>        # prints RESULT <MB/s>
//! ```
//!
//! Run by `benches/ucx-vs-perftest.sh`.

use rdma_hint_core::{Arrival, Completion, MemoryKind, PeerEndpoint, Transport, TransportError, WriteOp};
use rdma_hint_ucx::UcxTransport;
use std::time::{Duration, Instant};

/// Puts per `post_writes` call; the last of each is signalled.
const BATCH: usize = 16;
/// Batches in flight at once.
const WINDOW: usize = 8;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).cloned().ok_or_else(|| "usage: see the source".to_string());
    let bytes: u64 = arg(4)?.parse().map_err(|e| format!("bytes: {e}"))?;
    let transport = UcxTransport::open(Some(&arg(3)?)).map_err(|e| e.to_string())?;
    let region = transport.register(MemoryKind::Host, bytes).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(120);
    match arg(1)?.as_str() {
        "serve" => {
            let address = transport.bind(arg(2)?.parse().map_err(|e| format!("address: {e}"))?);
            println!("LISTENING {}", address.map_err(|e| e.to_string())?);
            pollster::block_on(transport.connect(
                PeerEndpoint::Listen(arg(2)?.parse().unwrap()),
                &[region.id],
                deadline,
            ))
            .map_err(|e| e.to_string())?;
            // Serve until the peer leaves.
            let mut arrivals = [Arrival::EMPTY; 4];
            loop {
                match pollster::block_on(transport.wait_arrivals(&mut arrivals, deadline)) {
                    Ok(_) => {}
                    Err(TransportError::PeerGone(_)) => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        "run" => {
            let messages: usize = arg(5)?.parse().map_err(|e| format!("messages: {e}"))?;
            let peer = PeerEndpoint::Dial(arg(2)?.parse().map_err(|e| format!("address: {e}"))?);
            let remote =
                pollster::block_on(transport.connect(peer, &[], deadline)).map_err(|e| e.to_string())?[0];
            let mut batch = [WriteOp {
                wr_id: 0,
                local: region.id,
                local_offset: 0,
                remote: remote.id,
                remote_offset: 0,
                len: bytes,
                signalled: false,
                imm: None,
            }; BATCH];
            batch[BATCH - 1].signalled = true;
            let batches = messages.div_ceil(BATCH).max(1);
            let mut completions = [Completion::EMPTY; WINDOW];
            let mut run = |count: usize| -> Result<Duration, String> {
                let started = Instant::now();
                let (mut posted, mut done) = (0, 0);
                while done < count {
                    while posted < count && posted - done < WINDOW {
                        transport.post_writes(&batch).map_err(|e| e.to_string())?;
                        posted += 1;
                    }
                    let ready = pollster::block_on(transport.wait_completions(&mut completions, deadline))
                        .map_err(|e| e.to_string())?;
                    done += ready;
                }
                Ok(started.elapsed())
            };
            run(WINDOW)?; // warm-up: wire-up and first touches
            let elapsed = run(batches)?;
            let moved = (batches * BATCH) as f64 * bytes as f64;
            println!("RESULT {:.2}", moved / elapsed.as_secs_f64() / f64::from(1u32 << 20));
            Ok(())
        }
        other => Err(format!("unknown mode {other} (serve or run)")),
    }
}
