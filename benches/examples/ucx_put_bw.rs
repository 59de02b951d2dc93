//! The UCX backend's put (or get) bandwidth, measured as `ucx_perftest -t ucp_put_bw` (or
//! `-t ucp_get`) measures UCX's (see `rdma_hint_benches::write_bw`). Run by
//! `benches/ucx-vs-perftest.sh`.
//!
//! ```text
//! ucx_put_bw <UCX_TLS> <bytes> serve <listen-address>        # prints LISTENING <address>
//! ucx_put_bw <UCX_TLS> <bytes> run <address> <messages>      # writes; prints RESULT <MB/s>
//! ucx_put_bw <UCX_TLS> <bytes> read <address> <messages>     # reads; prints RESULT <MB/s>
//! ```

use rdma_hint::{open, OpenOptions, TransportId};
use rdma_hint_benches::flags::Flags;
use rdma_hint_benches::write_bw::{run, Role};

fn main() -> Result<(), String> {
    let args: Vec<String> = Flags::from_env(
        "usage: ucx_put_bw UCX_TLS BYTES serve ADDR | run ADDR MESSAGES | read ADDR MESSAGES",
    )
    .rest();
    let (Some(tls), Some(bytes)) = (args.first(), args.get(1)) else {
        return Err(
            "usage: ucx_put_bw UCX_TLS BYTES serve ADDR | run ADDR MESSAGES | read ADDR MESSAGES".into()
        );
    };
    let bytes: u64 = bytes.parse().map_err(|e| format!("bytes: {e}"))?;
    let id = TransportId::ucx_for_tls(Some(tls)).map_err(|e| e.to_string())?;
    let transport = open(&id, &OpenOptions::default().token(rdma_hint_benches::write_bw::BENCH_TOKEN))
        .map_err(|e| e.to_string())?;
    run(&*transport, Role::parse(&args[2..])?, bytes)
}
