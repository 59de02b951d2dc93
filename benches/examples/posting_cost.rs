//! Runs `TRANSFERS` chunked transfers of 64 MiB on the null transport, through the chunker or
//! the hand-written loop, for instruction counting under callgrind (`benches/posting-cost.sh`).
//!
//! `posting_cost chunker|hand BLOCK_BYTES TRANSFERS`

use rdma_hint::engine::{BlockSpec, Chunker, PostPolicy, TransferRequest};
use rdma_hint::Device;
use rdma_hint::{RemoteRegion, Transport};
use rdma_hint_benches::flags::Flags;
use rdma_hint_benches::{block_on, hand_written_loop, NullTransport};
use std::time::{Duration, Instant};

const TRANSFER: u64 = 64 << 20;

fn main() {
    let mut given = Flags::from_env("usage: posting_cost chunker|hand BLOCK_BYTES TRANSFERS");
    let Some(mode) = given.next_arg() else { given.fail("no mode given") };
    let block: u64 = given.value("BLOCK_BYTES");
    let transfers: u64 = given.value("TRANSFERS");
    let policy = PostPolicy::default();
    let transport = NullTransport::new(256);
    let mut blocks = 0;
    match mode.as_str() {
        "chunker" => {
            let local = transport.region(0, TRANSFER);
            let remote = RemoteRegion { id: local.id, len: TRANSFER };
            let mut chunker = Chunker::new(policy, transport.capabilities()).expect("policy");
            chunker.set_hint(Device::Host(0), BlockSpec::new(block, 4096).expect("spec"));
            let deadline = Instant::now() + Duration::from_secs(3600);
            for _ in 0..transfers {
                blocks += block_on(chunker.transfer(
                    &transport,
                    TransferRequest::single(&local, 0, &remote, 0, TRANSFER),
                    deadline,
                ))
                .expect("transfer")
                .blocks;
            }
        }
        "hand" => {
            for _ in 0..transfers {
                blocks += hand_written_loop(&transport, TRANSFER, block, &policy);
            }
        }
        other => given.fail(&format!("unknown mode {other}")),
    }
    println!("{blocks}");
}
