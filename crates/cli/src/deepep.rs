//! `rdma-hint deepep-size`: DeepEP's low-latency RDMA buffer bytes for a model shape.

use crate::units::format_bytes;
use rdma_hint::deepep::{low_latency_rdma_size_hint, max_tokens_for_budget};
use serde_json::json;

/// Arguments of `deepep-size`.
pub(crate) struct DeepEpArgs {
    pub(crate) tokens: Option<u64>,
    pub(crate) hidden: u64,
    pub(crate) ranks: u64,
    pub(crate) experts: u64,
    pub(crate) budget: Option<u64>,
    pub(crate) json: bool,
}

/// Runs the command; the first line of plain output is the answer (bytes, or tokens with
/// `--budget`).
pub(crate) fn run(args: &DeepEpArgs) -> anyhow::Result<String> {
    let tokens = match (args.budget, args.tokens) {
        (Some(budget), _) => max_tokens_for_budget(budget, args.hidden, args.ranks, args.experts)?,
        (None, Some(tokens)) => tokens,
        (None, None) => {
            anyhow::bail!("give --tokens T (bytes for a shape) or --budget BYTES (tokens that fit)")
        }
    };
    let size = low_latency_rdma_size_hint(tokens, args.hidden, args.ranks, args.experts)?;
    if args.json {
        let mut object = json!({
            "bytes": size.bytes,
            "gib": size.gib(),
            "within_deepep_limits": size.within_deepep_limits(),
            "warnings": size.warnings,
            "num_max_dispatch_tokens_per_rank": tokens,
        });
        if let Some(budget) = args.budget {
            object["budget_bytes"] = json!(budget);
            object["max_tokens"] = json!(tokens);
        }
        return Ok(serde_json::to_string_pretty(&object)?);
    }
    let mut out = match args.budget {
        Some(budget) => format!(
            "{tokens}\nlargest num_max_dispatch_tokens_per_rank within {} ({budget} B): {tokens} tokens need {} B ({}){}\n",
            format_bytes(budget),
            size.bytes,
            format_bytes(size.bytes),
            if limited_by_deepep(tokens, args, budget) {
                "; DeepEP's own limit (bytes / 16 < INT_MAX, about 32 GiB) decides, not the budget"
            } else {
                ""
            }
        ),
        None => format!("{}\n{} for T={tokens} H={} ranks={} experts={}\n", size.bytes, format_bytes(size.bytes), args.hidden, args.ranks, args.experts),
    };
    out.push_str(
        "DeepEP low-latency RDMA buffer (DeepEP's meaning of the name: buffer bytes, not a block size)\n",
    );
    for warning in &size.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    Ok(out)
}

/// True when one more token would still fit `budget`: DeepEP's limit, not the budget, bound.
fn limited_by_deepep(tokens: u64, args: &DeepEpArgs, budget: u64) -> bool {
    low_latency_rdma_size_hint(tokens + 1, args.hidden, args.ranks, args.experts)
        .is_ok_and(|next| next.bytes <= budget)
}
