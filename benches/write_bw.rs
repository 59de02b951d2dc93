//! The measurement behind `ucx_put_bw` and `verbs_write_bw`: one message size, the same source
//! and destination buffer every time, many messages in flight, bandwidth = bytes / time from the
//! first post to the last completion (how `ucx_perftest -t ucp_put_bw` / `-t ucp_get` and
//! `ib_write_bw` / `ib_read_bw` measure), of writes or of reads. The examples only open their
//! transport and call [`run`].

use rdma_hint::{Arrival, Completion, MemoryKind, PeerEndpoint, Transport, TransportError, WriteOp};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The token both sides of a bench run hold (the VM runs listen on a non-loopback address,
/// which needs one).
pub const BENCH_TOKEN: &[u8] = b"rdma-hint bench";

/// Puts per `post_writes` call; the last of each is signalled.
pub const BATCH: usize = 16;
/// Batches in flight at once.
pub const WINDOW: usize = 8;

/// Which side of the measurement this process is.
#[derive(Debug, Clone, Copy)]
pub enum Role {
    /// Expose a region on this address and stay until the peer leaves.
    Serve(SocketAddr),
    /// Write `messages` messages to the peer at this address and report.
    Run(SocketAddr, usize),
    /// Read `messages` messages from the peer at this address and report.
    Read(SocketAddr, usize),
}

impl Role {
    /// `serve ADDR`, `run ADDR MESSAGES` or `read ADDR MESSAGES` from the command line.
    pub fn parse(args: &[String]) -> Result<Role, String> {
        let address = |i: usize| -> Result<SocketAddr, String> {
            args.get(i).ok_or("missing address")?.parse().map_err(|e| format!("address: {e}"))
        };
        let messages = || -> Result<usize, String> {
            args.get(2).ok_or("missing message count")?.parse().map_err(|e| format!("messages: {e}"))
        };
        match args.first().map(String::as_str) {
            Some("serve") => Ok(Role::Serve(address(1)?)),
            Some("run") => Ok(Role::Run(address(1)?, messages()?)),
            Some("read") => Ok(Role::Read(address(1)?, messages()?)),
            _ => Err("usage: serve ADDR | run ADDR MESSAGES | read ADDR MESSAGES".into()),
        }
    }
}

/// Runs `role` on `transport` with messages of `bytes`; a run prints `RESULT <MB/s>` (2²⁰ B).
pub fn run(transport: &dyn Transport, role: Role, bytes: u64) -> Result<(), String> {
    let region = transport.register(MemoryKind::Host, bytes).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(600);
    match role {
        Role::Serve(address) => {
            let bound = transport.bind(address).map_err(|e| e.to_string())?;
            println!("LISTENING {bound}");
            crate::block_on(transport.connect(PeerEndpoint::Listen(bound), &[region.id], deadline))
                .map_err(|e| e.to_string())?;
            let mut arrivals = [Arrival::EMPTY; 4];
            loop {
                match crate::block_on(transport.wait_arrivals(&mut arrivals, deadline)) {
                    Ok(_) => {}
                    Err(TransportError::PeerGone(_)) => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        Role::Run(address, messages) | Role::Read(address, messages) => {
            let remote = crate::block_on(transport.connect(PeerEndpoint::Dial(address), &[], deadline))
                .map_err(|e| e.to_string())?
                .first()
                .copied()
                .ok_or("the peer exposed no region")?;
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
            let reads = batch.map(|op| op.as_read());
            let post = || match role {
                Role::Read(..) => transport.post_reads(&reads),
                _ => transport.post_writes(&batch),
            };
            let mut completions = [Completion::EMPTY; WINDOW];
            let mut timed = |batches: usize| -> Result<Duration, String> {
                let started = Instant::now();
                let (mut posted, mut done) = (0, 0);
                while done < batches {
                    while posted < batches && posted - done < WINDOW {
                        post().map_err(|e| e.to_string())?;
                        posted += 1;
                    }
                    done += crate::block_on(transport.wait_completions(&mut completions, deadline))
                        .map_err(|e| e.to_string())?;
                }
                Ok(started.elapsed())
            };
            timed(1)?; // warm-up: connection set-up, first touches
            let batches = messages.div_ceil(BATCH).max(1);
            let elapsed = timed(batches)?;
            let moved = (batches * BATCH) as f64 * bytes as f64;
            println!("RESULT {:.2}", moved / elapsed.as_secs_f64() / f64::from(1u32 << 20));
            Ok(())
        }
    }
}
