//! DeepEP-compatible buffer sizing: **a different meaning of the same name.**
//!
//! Our [`compute_hint`](crate::compute_hint) answers "which *block size* should this NIC path use" from the
//! hardware. DeepEP's `Buffer.get_low_latency_rdma_size_hint(T, H, num_ranks, E)` answers
//! "how many *bytes of RDMA buffer* do the low-latency MoE kernels need for this model shape"
//! (BF16 activations), independent of hardware. This module reproduces DeepEP's formulas
//! exactly (upstream `csrc/legacy/config.hpp`), with checked arithmetic, typed errors for shapes
//! DeepEP would assert on, and warnings where the result breaks DeepEP's own limits.
//!
//! ```
//! use rdma_hint_core::deepep::low_latency_rdma_size_hint;
//! // DeepSeek-V3 shape: 128 tokens per rank, hidden 7168, 16 ranks, 256 experts.
//! let size = low_latency_rdma_size_hint(128, 7168, 16, 256).unwrap();
//! assert_eq!(size.bytes, 1_908_410_496);
//! assert!(size.within_deepep_limits());
//! ```

use serde::Serialize;
use thiserror::Error;

/// DeepEP's buffer alignment (`NUM_BUFFER_ALIGNMENT_BYTES`).
pub const BUFFER_ALIGNMENT_BYTES: u64 = 128;
/// GPUs per NVLink domain DeepEP assumes (`NUM_MAX_NVL_PEERS`).
pub const MAX_NVL_PEERS: u64 = 8;
/// `sizeof(internode::SourceMeta)`: two `int`s.
pub const SOURCE_META_BYTES: u64 = 8;
/// DeepEP's `kNumMaxTopK` and `kNumMaxScales` for normal-mode buffers.
const MAX_TOPK: u64 = 128;
const MAX_SCALES: u64 = 128;
/// DeepEP indexes buffers in 16-byte `int4` units with a 32-bit `int`: bytes / 16 must stay
/// below `INT_MAX`, i.e. the buffer below 32 GiB.
pub const MAX_BUFFER_BYTES: u64 = (i32::MAX as u64) * 16;

/// A shape DeepEP would reject, or a size that does not fit 64 bits.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeepEpError {
    /// An argument that must be positive is 0.
    #[error("{name} must be at least 1")]
    Zero {
        /// Argument name.
        name: &'static str,
    },
    /// An argument DeepEP takes as a 32-bit `int` is larger than `INT_MAX`.
    #[error("{name} = {value} exceeds DeepEP's 32-bit int ({})", i32::MAX)]
    TooLargeForInt {
        /// Argument name.
        name: &'static str,
        /// Value given.
        value: u64,
    },
    /// `hidden` is not a multiple of 128 (one FP8 scale per 128 channels).
    #[error("hidden = {hidden} is not a multiple of 128 (DeepEP keeps one scale per 128 channels)")]
    HiddenNotMultipleOf128 {
        /// Value given.
        hidden: u64,
    },
    /// The per-token scales (4 B per 128 channels) do not fit in `hidden` bytes.
    #[error("hidden = {hidden}: 4 × hidden/128 = {scale_bytes} B of scales exceed hidden (DeepEP asserts num_scales * sizeof(float) <= hidden)")]
    ScalesExceedHidden {
        /// Value given.
        hidden: u64,
        /// Scale bytes per token.
        scale_bytes: u64,
    },
    /// The size overflows 64-bit arithmetic.
    #[error("the buffer size overflows 64 bits while computing {what}")]
    Overflow {
        /// Which term.
        what: &'static str,
    },
    /// A normal-mode `Config` DeepEP's constructor or hint functions would assert on.
    #[error("invalid DeepEP config: {0}")]
    InvalidConfig(String),
    /// Not even one token per rank fits the byte budget.
    #[error("a budget of {budget_bytes} B fits no token: one token per rank needs {one_token_bytes} B")]
    BudgetTooSmall {
        /// Budget given.
        budget_bytes: u64,
        /// Size for one token per rank.
        one_token_bytes: u64,
    },
}

/// A buffer size and the DeepEP limits it breaks, if any.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeepEpSize {
    /// Buffer bytes, exactly as DeepEP computes them.
    pub bytes: u64,
    /// Where the result (or the shape) breaks DeepEP's own limits.
    pub warnings: Vec<String>,
}

impl DeepEpSize {
    /// No warning: DeepEP will accept a buffer of this size for this shape.
    pub fn within_deepep_limits(&self) -> bool {
        self.warnings.is_empty()
    }

    /// Size in GiB.
    pub fn gib(&self) -> f64 {
        self.bytes as f64 / (1u64 << 30) as f64
    }

    fn checked(bytes: u64, mut warnings: Vec<String>) -> DeepEpSize {
        if !bytes.is_multiple_of(BUFFER_ALIGNMENT_BYTES) {
            warnings.push(format!("{bytes} B is not a multiple of DeepEP's 128 B buffer alignment"));
        }
        if bytes / 16 >= i32::MAX as u64 {
            warnings.push(format!(
                "{bytes} B ≥ 32 GiB: DeepEP requires bytes / 16 < INT_MAX and will refuse the buffer; lower the tokens per rank or the expert count"
            ));
        }
        DeepEpSize { bytes, warnings }
    }
}

fn mul(a: u64, b: u64, what: &'static str) -> Result<u64, DeepEpError> {
    a.checked_mul(b).ok_or(DeepEpError::Overflow { what })
}

fn add(a: u64, b: u64, what: &'static str) -> Result<u64, DeepEpError> {
    a.checked_add(b).ok_or(DeepEpError::Overflow { what })
}

fn positive_int(name: &'static str, value: u64) -> Result<u64, DeepEpError> {
    if value == 0 {
        return Err(DeepEpError::Zero { name });
    }
    if value > i32::MAX as u64 {
        return Err(DeepEpError::TooLargeForInt { name, value });
    }
    Ok(value)
}

/// Bytes of one dispatch message and one combine message for `hidden` channels (BF16).
fn message_bytes(hidden: u64) -> Result<(u64, u64), DeepEpError> {
    if !hidden.is_multiple_of(128) {
        return Err(DeepEpError::HiddenNotMultipleOf128 { hidden });
    }
    let num_scales = hidden / 128;
    let scale_bytes = 4 * num_scales;
    if scale_bytes > hidden {
        return Err(DeepEpError::ScalesExceedHidden { hidden, scale_bytes });
    }
    // sizeof(int4) + max(hidden * sizeof(bf16), hidden + num_scales * sizeof(float))
    let dispatch = 16 + (2 * hidden).max(hidden + scale_bytes);
    // num_scales * sizeof(bf16x2) + hidden * sizeof(bf16)
    let combine = scale_bytes + 2 * hidden;
    Ok((dispatch, combine))
}

/// DeepEP's `get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden,
/// num_ranks, num_experts)`: the RDMA buffer bytes its low-latency kernels need.
///
/// `num_ranks` is checked but, as in DeepEP, does not enter the formula. The result keeps
/// DeepEP's quirk of adding a full 128 B when the total is already aligned.
pub fn low_latency_rdma_size_hint(
    num_max_dispatch_tokens_per_rank: u64,
    hidden: u64,
    num_ranks: u64,
    num_experts: u64,
) -> Result<DeepEpSize, DeepEpError> {
    let tokens = positive_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)?;
    let hidden = positive_int("hidden", hidden)?;
    let ranks = positive_int("num_ranks", num_ranks)?;
    let experts = positive_int("num_experts", num_experts)?;
    let (dispatch_msg, combine_msg) = message_bytes(hidden)?;

    let expert_tokens = mul(experts, tokens, "num_experts × tokens")?;
    let send = mul(tokens, dispatch_msg, "dispatch send buffer")?.max(mul(
        expert_tokens,
        combine_msg,
        "combine send buffer",
    )?);
    let recv = mul(expert_tokens, dispatch_msg, "dispatch receive buffer")?.max(mul(
        expert_tokens,
        combine_msg,
        "combine receive buffer",
    )?);
    let signal = (4 * experts).div_ceil(128) * 128;
    let total = add(
        add(mul(send, 2, "send buffers")?, mul(recv, 2, "receive buffers")?, "total")?,
        2 * signal,
        "total",
    )?;
    let bytes =
        mul(add(total, BUFFER_ALIGNMENT_BYTES, "alignment")? / BUFFER_ALIGNMENT_BYTES, 128, "alignment")?;

    let mut warnings = Vec::new();
    if expert_tokens > i32::MAX as u64 {
        warnings.push(format!(
            "num_experts × tokens = {expert_tokens} overflows the 32-bit int DeepEP multiplies them in"
        ));
    }
    if experts % ranks != 0 {
        warnings.push(format!(
            "num_experts = {experts} is not a multiple of num_ranks = {ranks}: DeepEP's low-latency kernels need the same number of experts on every rank"
        ));
    }
    Ok(DeepEpSize::checked(bytes, warnings))
}

/// The largest `num_max_dispatch_tokens_per_rank` whose low-latency buffer fits `budget_bytes`
/// and that DeepEP accepts (`num_experts × tokens` and `bytes / 16` within its 32-bit `int`):
/// past about 32 GiB DeepEP's limit, not the budget, decides.
///
/// ```
/// use rdma_hint_core::deepep::{low_latency_rdma_size_hint, max_tokens_for_budget};
/// let tokens = max_tokens_for_budget(2 << 30, 7168, 16, 256).unwrap();
/// assert!(low_latency_rdma_size_hint(tokens, 7168, 16, 256).unwrap().bytes <= 2 << 30);
/// assert!(low_latency_rdma_size_hint(tokens + 1, 7168, 16, 256).unwrap().bytes > 2 << 30);
/// ```
pub fn max_tokens_for_budget(
    budget_bytes: u64,
    hidden: u64,
    num_ranks: u64,
    num_experts: u64,
) -> Result<u64, DeepEpError> {
    // Within the budget and within what DeepEP accepts (its int arithmetic and its
    // bytes / 16 < INT_MAX buffer limit), so a huge budget answers a usable token count.
    let fits = |tokens: u64| -> Result<bool, DeepEpError> {
        match low_latency_rdma_size_hint(tokens, hidden, num_ranks, num_experts) {
            Ok(size) => Ok(size.bytes <= budget_bytes
                && size.bytes / 16 < i32::MAX as u64
                && tokens.saturating_mul(num_experts) <= i32::MAX as u64),
            Err(DeepEpError::Overflow { .. }) => Ok(false),
            Err(other) => Err(other),
        }
    };
    let one_token = low_latency_rdma_size_hint(1, hidden, num_ranks, num_experts)?;
    if one_token.bytes > budget_bytes {
        return Err(DeepEpError::BudgetTooSmall { budget_bytes, one_token_bytes: one_token.bytes });
    }
    // The size grows with the token count, so bisect on [1, INT_MAX].
    let (mut fitting, mut too_many) = (1u64, i32::MAX as u64 + 1);
    while too_many - fitting > 1 {
        let middle = fitting + (too_many - fitting) / 2;
        if fits(middle)? {
            fitting = middle;
        } else {
            too_many = middle;
        }
    }
    Ok(fitting)
}

/// DeepEP's normal-mode `Config` (high-throughput kernels): SMs and chunk sizes in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NormalConfig {
    /// SMs used by the kernels (two per channel).
    pub num_sms: u64,
    /// NVLink chunk sent per step, in tokens.
    pub nvl_send_tokens: u64,
    /// NVLink receive buffer per channel and peer, in tokens.
    pub nvl_recv_tokens: u64,
    /// RDMA chunk sent per step, in tokens.
    pub rdma_send_tokens: u64,
    /// RDMA receive buffer per channel and peer, in tokens (rounded up to a multiple of
    /// `rdma_send_tokens`, as DeepEP's constructor does).
    pub rdma_recv_tokens: u64,
}

impl NormalConfig {
    /// Builds a config with DeepEP's constructor checks and its rounding of the RDMA receive
    /// buffer up to a multiple of the send chunk.
    ///
    /// ```
    /// use rdma_hint_core::deepep::NormalConfig;
    /// let config = NormalConfig::new(24, 6, 256, 6, 130).unwrap();
    /// assert_eq!(config.rdma_recv_tokens, 132);
    /// assert!(NormalConfig::new(24, 256, 256, 6, 128).is_err()); // NVL send must be < recv
    /// ```
    pub fn new(
        num_sms: u64,
        nvl_send_tokens: u64,
        nvl_recv_tokens: u64,
        rdma_send_tokens: u64,
        rdma_recv_tokens: u64,
    ) -> Result<NormalConfig, DeepEpError> {
        for (name, value) in [
            ("nvl_send_tokens", nvl_send_tokens),
            ("nvl_recv_tokens", nvl_recv_tokens),
            ("rdma_send_tokens", rdma_send_tokens),
            ("rdma_recv_tokens", rdma_recv_tokens),
        ] {
            positive_int(name, value)?;
        }
        if num_sms > i32::MAX as u64 {
            return Err(DeepEpError::TooLargeForInt { name: "num_sms", value: num_sms });
        }
        if nvl_send_tokens >= nvl_recv_tokens {
            return Err(DeepEpError::InvalidConfig(format!(
                "NVL send chunk {nvl_send_tokens} must be smaller than the NVL receive buffer {nvl_recv_tokens}"
            )));
        }
        let rdma_recv_tokens = rdma_recv_tokens.div_ceil(rdma_send_tokens) * rdma_send_tokens;
        if rdma_send_tokens * 2 > rdma_recv_tokens {
            return Err(DeepEpError::InvalidConfig(format!(
                "RDMA send chunk {rdma_send_tokens} must be at most half the RDMA receive buffer {rdma_recv_tokens} (lazy head update)"
            )));
        }
        Ok(NormalConfig { num_sms, nvl_send_tokens, nvl_recv_tokens, rdma_send_tokens, rdma_recv_tokens })
    }

    /// `Config::get_nvl_buffer_size_hint(hidden_bytes, num_ranks)`: NVLink buffer bytes.
    pub fn nvl_buffer_size_hint(&self, hidden_bytes: u64, num_ranks: u64) -> Result<DeepEpSize, DeepEpError> {
        let hidden_bytes = positive_int("hidden_bytes", hidden_bytes)?;
        let ranks = positive_int("num_ranks", num_ranks)?;
        if !(ranks < MAX_NVL_PEERS || ranks % MAX_NVL_PEERS == 0) {
            return Err(DeepEpError::InvalidConfig(format!(
                "num_ranks = {ranks}: above 8 it must be a multiple of 8 (GPUs per NVLink domain)"
            )));
        }
        if ranks > MAX_NVL_PEERS && !self.num_sms.is_multiple_of(2) {
            return Err(DeepEpError::InvalidConfig(format!("num_sms = {} must be even", self.num_sms)));
        }
        let rdma_ranks = (ranks / MAX_NVL_PEERS).max(1);
        let nvl_ranks = ranks.min(MAX_NVL_PEERS);
        let lanes = mul(self.num_sms / 2, nvl_ranks, "channels × NVL ranks")?;
        let slots = mul(lanes, self.nvl_recv_tokens, "NVL token slots")?;
        let per_token = add(
            hidden_bytes,
            SOURCE_META_BYTES + MAX_TOPK * 8 + MAX_TOPK * 4 + MAX_SCALES * 4,
            "bytes per token",
        )?;
        let bytes = add(
            mul(lanes, (2 * rdma_ranks + 3) * 4, "NVL head/tail/prefix")?,
            mul(slots, per_token, "NVL token buffers")?,
            "total",
        )?;
        Ok(DeepEpSize::checked(bytes.div_ceil(128) * 128, Vec::new()))
    }

    /// `Config::get_rdma_buffer_size_hint(hidden_bytes, num_ranks)`: RDMA buffer bytes, or
    /// `None` where DeepEP returns 0 (at most 8 ranks: one NVLink domain needs no RDMA buffer).
    pub fn rdma_buffer_size_hint(
        &self,
        hidden_bytes: u64,
        num_ranks: u64,
    ) -> Result<Option<DeepEpSize>, DeepEpError> {
        let hidden_bytes = positive_int("hidden_bytes", hidden_bytes)?;
        let ranks = positive_int("num_ranks", num_ranks)?;
        if ranks <= MAX_NVL_PEERS {
            return Ok(None);
        }
        if ranks % MAX_NVL_PEERS != 0 {
            return Err(DeepEpError::InvalidConfig(format!("num_ranks = {ranks} must be a multiple of 8")));
        }
        if !self.num_sms.is_multiple_of(2) {
            return Err(DeepEpError::InvalidConfig(format!("num_sms = {} must be even", self.num_sms)));
        }
        let lanes = mul(self.num_sms / 2, ranks / MAX_NVL_PEERS, "channels × RDMA ranks")?;
        let slots = mul(lanes, self.rdma_recv_tokens, "RDMA token slots")?;
        let per_token = add(
            hidden_bytes,
            SOURCE_META_BYTES + MAX_TOPK * 8 + MAX_TOPK * 4 + MAX_SCALES * 4 + 16,
            "bytes per token",
        )?;
        let bytes = add(
            mul(lanes, (MAX_NVL_PEERS * 2 + 2) * 2 * 4, "RDMA metadata")?,
            mul(mul(slots, per_token, "RDMA token buffers")?, 2, "RDMA token buffers")?,
            "total",
        )?;
        Ok(Some(DeepEpSize::checked(bytes.div_ceil(128) * 128, Vec::new())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepseek_v3_shape_by_hand() {
        // S = 7168/128 = 56; dispatch = 16 + max(14336, 7168 + 224) = 14352;
        // combine = 224 + 14336 = 14560.
        // send = max(128·14352, 256·128·14560) = 477 102 080
        // recv = max(256·128·14352 = 470 286 336, 477 102 080) = 477 102 080
        // signal = align(1024, 128) = 1024
        // total = 4·477 102 080 + 2048 = 1 908 410 368 (already a multiple of 128 → +128)
        let size = low_latency_rdma_size_hint(128, 7168, 16, 256).unwrap();
        assert_eq!(size.bytes, 1_908_410_368 + 128);
        assert!(size.warnings.is_empty());
    }

    #[test]
    fn small_shape_where_dispatch_dominates() {
        // T=1, H=128, E=1: S=1; dispatch = 16 + max(256, 132) = 272; combine = 4 + 256 = 260.
        // send = max(272, 260) = 272; recv = max(272, 260) = 272; signal = align(4, 128) = 128.
        // total = 544 + 544 + 256 = 1344 = 10.5·128 → ((1344 + 128) / 128)·128 = 11·128 = 1408.
        let size = low_latency_rdma_size_hint(1, 128, 1, 1).unwrap();
        assert_eq!(size.bytes, 1408);
    }

    #[test]
    fn num_ranks_does_not_enter_the_formula() {
        let a = low_latency_rdma_size_hint(64, 4096, 8, 64).unwrap();
        let b = low_latency_rdma_size_hint(64, 4096, 32, 64).unwrap();
        assert_eq!(a.bytes, b.bytes);
    }

    #[test]
    fn invalid_shapes_are_typed_errors() {
        assert_eq!(
            low_latency_rdma_size_hint(0, 7168, 16, 256),
            Err(DeepEpError::Zero { name: "num_max_dispatch_tokens_per_rank" })
        );
        assert_eq!(low_latency_rdma_size_hint(128, 0, 16, 256), Err(DeepEpError::Zero { name: "hidden" }));
        assert_eq!(
            low_latency_rdma_size_hint(128, 7168, 0, 256),
            Err(DeepEpError::Zero { name: "num_ranks" })
        );
        assert_eq!(
            low_latency_rdma_size_hint(128, 7168, 16, 0),
            Err(DeepEpError::Zero { name: "num_experts" })
        );
        assert_eq!(
            low_latency_rdma_size_hint(128, 7000, 16, 256),
            Err(DeepEpError::HiddenNotMultipleOf128 { hidden: 7000 })
        );
        assert!(matches!(
            low_latency_rdma_size_hint(1 << 31, 7168, 16, 256),
            Err(DeepEpError::TooLargeForInt { .. })
        ));
    }

    #[test]
    fn huge_shapes_warn_instead_of_overflowing() {
        // Many redundant experts (the vLLM case): past 32 GiB DeepEP refuses the buffer.
        let size = low_latency_rdma_size_hint(1024, 7168, 64, 1024).unwrap();
        assert!(size.bytes > 32 << 30);
        assert!(!size.within_deepep_limits());
        assert!(size.warnings.iter().any(|w| w.contains("32 GiB")));
        // num_experts × tokens past INT_MAX: DeepEP's own int arithmetic would overflow.
        let size = low_latency_rdma_size_hint(i32::MAX as u64, 7168, 1, 2).unwrap();
        assert!(size.warnings.iter().any(|w| w.contains("32-bit int")));
        // The largest shape stays within u64.
        let largest = low_latency_rdma_size_hint(i32::MAX as u64, 2_147_483_520, 1, i32::MAX as u64);
        assert!(matches!(largest, Err(DeepEpError::Overflow { .. })), "{largest:?}");
    }

    #[test]
    fn experts_not_divisible_by_ranks_warns() {
        let size = low_latency_rdma_size_hint(128, 7168, 12, 256).unwrap();
        assert!(size.warnings.iter().any(|w| w.contains("multiple of num_ranks")));
    }

    #[test]
    fn budget_inverse_is_tight() {
        for budget in [1 << 30, 3 << 30, 30 << 30] {
            let tokens = max_tokens_for_budget(budget, 7168, 16, 256).unwrap();
            assert!(low_latency_rdma_size_hint(tokens, 7168, 16, 256).unwrap().bytes <= budget);
            assert!(low_latency_rdma_size_hint(tokens + 1, 7168, 16, 256).unwrap().bytes > budget);
        }
        // Past 32 GiB DeepEP's own limit decides: the answer is a buffer DeepEP accepts.
        for budget in [40u64 << 30, 8_000_000 << 40] {
            let tokens = max_tokens_for_budget(budget, 7168, 16, 256).unwrap();
            assert!(tokens < i32::MAX as u64, "not the bisection's upper end");
            assert!(low_latency_rdma_size_hint(tokens, 7168, 16, 256).unwrap().within_deepep_limits());
            assert!(!low_latency_rdma_size_hint(tokens + 1, 7168, 16, 256).unwrap().within_deepep_limits());
        }
        assert!(matches!(
            max_tokens_for_budget(1000, 7168, 16, 256),
            Err(DeepEpError::BudgetTooSmall { .. })
        ));
    }

    #[test]
    fn normal_mode_by_hand() {
        // DeepEP's dispatch config for 16 ranks: Config(24 SMs, 6, 256, 6, 128); hidden 7168 BF16.
        let config = NormalConfig::new(24, 6, 256, 6, 128).unwrap();
        assert_eq!(config.rdma_recv_tokens, 132, "rounded up to a multiple of 6");
        // NVL: channels 12, nvl ranks 8, rdma ranks 2.
        // 12·8·(2·2+3)·4 = 2688; slots = 12·8·256 = 24576;
        // per token = 14336 + 8 + 1024 + 512 + 512 = 16392 → 24576·16392 = 402 849 792.
        // total = 402 852 480 = 3 147 285·128 exactly.
        assert_eq!(config.nvl_buffer_size_hint(14336, 16).unwrap().bytes, 402_852_480);
        // RDMA: channels 12, rdma ranks 2 → lanes 24; metadata 24·18·2·4 = 3456;
        // slots = 24·132 = 3168; per token = 14336 + 8 + 1024 + 512 + 512 + 16 = 16408;
        // 3168·16408·2 = 103 961 088; total 103 964 544 = 812 223·128 exactly.
        assert_eq!(config.rdma_buffer_size_hint(14336, 16).unwrap().unwrap().bytes, 103_964_544);
        assert_eq!(config.rdma_buffer_size_hint(14336, 8).unwrap(), None, "one NVLink domain");
        assert!(config.rdma_buffer_size_hint(14336, 12).is_err());
        assert!(config.nvl_buffer_size_hint(14336, 12).is_err());
        let odd = NormalConfig::new(23, 6, 256, 6, 128).unwrap();
        assert!(odd.rdma_buffer_size_hint(14336, 16).is_err());
        // 50 rounds up to 100 = the send chunk: DeepEP asserts send < recv and send ≤ recv / 2.
        assert!(NormalConfig::new(24, 6, 256, 100, 50).is_err());
        assert!(NormalConfig::new(24, 6, 256, 100, 128).is_ok(), "128 rounds up to 200");
    }
}
