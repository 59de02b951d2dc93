//! The verbs backend's RDMA WRITE bandwidth, measured as `ib_write_bw` measures the NIC's
//! (see `rdma_hint_benches::write_bw`). Run inside the Soft-RoCE VM by
//! `benches/verbs-vs-perftest.sh`.
//!
//! ```text
//! verbs_write_bw <device> <bytes> serve <listen-address>     # prints LISTENING <address>
//! verbs_write_bw <device> <bytes> run <address> <messages>   # prints RESULT <MB/s>
//! verbs_write_bw <device> <bytes> read <address> <messages>  # reads; prints RESULT <MB/s>
//! ```

use rdma_hint::{open, OpenOptions, TransportId};
use rdma_hint_benches::flags::Flags;
use rdma_hint_benches::write_bw::{run, Role};

const USAGE: &str = "usage: verbs_write_bw DEVICE BYTES serve ADDR | run ADDR MESSAGES | read ADDR MESSAGES";

fn main() -> Result<(), String> {
    let args: Vec<String> = Flags::from_env(USAGE).rest();
    let (Some(device), Some(bytes)) = (args.first(), args.get(1)) else {
        return Err(USAGE.into());
    };
    let bytes: u64 = bytes.parse().map_err(|e| format!("bytes: {e}"))?;
    let id = TransportId::verbs(device).map_err(|e| e.to_string())?;
    let transport = open(&id, &OpenOptions::default().token(rdma_hint_benches::write_bw::BENCH_TOKEN))
        .map_err(|e| e.to_string())?;
    run(&*transport, Role::parse(&args[2..])?, bytes)
}
