//! How a transport's waits spend their time until their event: part of the [`Transport`]
//! contract (`set_wait_mode`), implemented by the backends' waits.
//!
//! [`Transport`]: crate::Transport

use serde::{Deserialize, Serialize};

/// How a transport's waits spend their time until the event arrives.
///
/// ```
/// use rdma_hint_core::WaitMode;
/// assert_eq!(WaitMode::default(), WaitMode::Adaptive);
/// assert_eq!("busy-poll".parse::<WaitMode>().unwrap(), WaitMode::BusyPoll);
/// assert_eq!(WaitMode::BusyPoll.to_string(), "busy-poll");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitMode {
    /// Poll for a few microseconds (the backend core's `ADAPTIVE_SPIN`), then sleep until the event wakes the task: near zero CPU
    /// while a peer is silent. The default.
    #[default]
    Adaptive,
    /// Never sleep: poll the completion source until it yields or the deadline passes,
    /// yielding to the executor every slice of a few hundred microseconds (the backend core's `BUSY_POLL_SLICE`). For latency-critical threads (as
    /// perftest and DeepEP poll their CQs); burns a core while waiting.
    BusyPoll,
}

impl std::fmt::Display for WaitMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WaitMode::Adaptive => "adaptive",
            WaitMode::BusyPoll => "busy-poll",
        })
    }
}

impl std::str::FromStr for WaitMode {
    type Err = String;

    fn from_str(text: &str) -> Result<WaitMode, String> {
        match text {
            "adaptive" => Ok(WaitMode::Adaptive),
            "busy-poll" | "busypoll" => Ok(WaitMode::BusyPoll),
            other => Err(format!("unknown wait mode `{other}` (adaptive or busy-poll)")),
        }
    }
}
