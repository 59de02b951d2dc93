//! `rdma-hint plan`: the blocks, doorbell batches and signalled requests of one transfer.

use crate::units::{self, format_bytes, plural};
use rdma_hint::engine::{BlockSpec, ChunkPlan, PostPolicy};
use serde_json::json;
use std::fmt::Write;

/// Plans with more blocks than this are summarised, not listed, in JSON.
const MAX_LISTED_BLOCKS: u64 = 1_000_000;

/// Arguments of `plan`.
#[derive(clap::Args)]
pub(crate) struct PlanArgs {
    /// Bytes to transfer (e.g. 1048576, 1M).
    #[arg(long, value_parser = units::parse_bytes)]
    pub(crate) len: u64,
    /// Block size (a multiple of --align).
    #[arg(long, value_parser = units::parse_bytes)]
    pub(crate) block: u64,
    /// Alignment (a power of two).
    #[arg(long, value_parser = units::parse_bytes)]
    pub(crate) align: u64,
    /// Start of the transfer in the region (on --align, every block starts aligned).
    #[arg(long, value_parser = units::parse_bytes, default_value = "0")]
    pub(crate) offset: u64,
    /// Registered region size (default: offset + len).
    #[arg(long, value_parser = units::parse_bytes)]
    pub(crate) region: Option<u64>,
    /// Work requests per doorbell.
    #[arg(long, value_parser = units::parse_count_u32, default_value = "8")]
    pub(crate) batch: u32,
    /// Signal every k-th work request of a doorbell (and its last, and the transfer's last).
    #[arg(long, value_parser = units::parse_count_u32, default_value = "8")]
    pub(crate) signal_every: u32,
    /// Print JSON: {"blocks":[{offset,len}],"batches":[[..]],"signalled":[..]}.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn run(args: &PlanArgs) -> anyhow::Result<String> {
    let spec = BlockSpec::new(args.block, args.align)?;
    let region = match args.region {
        Some(region) => region,
        None => args
            .offset
            .checked_add(args.len)
            .ok_or_else(|| anyhow::anyhow!("offset + len overflows 64 bits"))?,
    };
    let plan = ChunkPlan::new(region, args.offset, args.len, spec)?;
    let window = args.batch.max(args.signal_every);
    let policy = PostPolicy { wrs_per_doorbell: args.batch, signal_every: args.signal_every, window };
    policy.validate()?;
    let count = plan.block_count();
    let signalled =
        (0..count).zip(policy.signalled_blocks(count)).filter(|(_, yes)| *yes).map(|(index, _)| index);

    if args.json {
        if count > MAX_LISTED_BLOCKS {
            anyhow::bail!("the plan has {count} blocks; --json lists at most {MAX_LISTED_BLOCKS}");
        }
        let batches: Vec<Vec<u64>> =
            (0..policy.batch_count(count)).map(|b| policy.batch(b, count).collect()).collect();
        let object = json!({
            "len": plan.len(),
            "offset": plan.offset(),
            "region_bytes": plan.region_len(),
            "block_bytes": spec.block_bytes(),
            "align_bytes": spec.align_bytes(),
            "blocks": plan.blocks().collect::<Vec<_>>(),
            "batches": batches,
            "signalled": signalled.collect::<Vec<_>>(),
        });
        return Ok(serde_json::to_string_pretty(&object)?);
    }

    let mut out = String::new();
    let signalled_count = signalled.count();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "{} at offset {} in a {} region: {} of {} ({} aligned), the last what is left",
        format_bytes(plan.len()),
        plan.offset(),
        format_bytes(plan.region_len()),
        plural(count, "block"),
        format_bytes(spec.block_bytes()),
        format_bytes(spec.align_bytes()),
    );
    let _ = writeln!(
        out,
        "{} of ≤ {}; {signalled_count} signalled (every {} of a doorbell, its last and the transfer's last)",
        plural(policy.batch_count(count), "doorbell"),
        plural(u64::from(policy.wrs_per_doorbell), "work request"),
        policy.signal_every
    );
    let _ =
        writeln!(out, "{:>8} {:>14} {:>12} {:>6} {:>9}", "block", "offset B", "bytes", "batch", "signalled");
    let shown = |i: u64| i < 16 || i + 4 >= count;
    let mut previous = None;
    for (index, signalled) in (0..count).zip(policy.signalled_blocks(count)).filter(|(i, _)| shown(*i)) {
        if previous.is_some_and(|p: u64| index > p + 1) {
            let _ = writeln!(out, "{:>8}", "…");
        }
        previous = Some(index);
        let block = plan.block(index);
        let _ = writeln!(
            out,
            "{index:>8} {:>14} {:>12} {:>6} {:>9}",
            block.offset,
            block.len,
            index / u64::from(policy.wrs_per_doorbell),
            if signalled { "yes" } else { "" }
        );
    }
    Ok(out)
}
