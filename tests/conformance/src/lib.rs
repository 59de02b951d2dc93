//! # rdma-hint-conformance
//!
//! The contract every [`Transport`] must meet, written once and run against every backend:
//! bytes verified over a size ladder (in one process and to a peer process), deadlines, a peer
//! that goes away or is killed mid-transfer, a link that goes down (two network namespaces,
//! where the backend crosses hosts), restart and reconnect on the same port, 100 cycles and 100
//! failed transfers without leaks, a soak, bad memory and bad hellos, pre-shared tokens, reads
//! of what the peer exposed, and regions exposed and withdrawn after connect.
//!
//! A backend implements [`Backend`] (how to open a transport) and instantiates the suite in its
//! own `tests/conformance.rs`:
//!
//! ```ignore
//! struct Tcp;
//! impl rdma_hint_conformance::Backend for Tcp {
//!     type Transport = StagedTransport;
//!     fn open(&self, token: Option<&[u8]>) -> StagedTransport { /* … */ }
//! }
//! rdma_hint_conformance::suite! { tcp: Tcp }
//! rdma_hint_conformance::two_hosts! { tcp: Tcp }
//! ```
//!
//! Each instance becomes a module of `#[test]`s (attributes before the name, such as
//! `#[ignore = "…"]`, apply to all of them) plus the `peer_main` entry point the two-process
//! tests re-run the binary as.
#![forbid(unsafe_code)]

mod answers;
mod backend;
pub mod contract;
mod exposure;
mod handshake;
mod lanes;
mod pair;
pub mod peer;
mod posting;
mod reads;

pub use backend::{Backend, Scale, TEST_TOKEN};
pub use contract::{alone, shared};
pub use pair::{chunker, deadline, pair, round_trip, Pair};
pub use peer::spawn_receiver;
pub use rdma_hint_core::Transport;

/// Generates the suite for each `name: backend` (an expression of a type that implements
/// [`Backend`]): a module `name` with one `#[test]` per contract rule, and one `peer_main`.
#[macro_export]
macro_rules! suite {
    ($( $(#[$meta:meta])* $name:ident : $backend:expr ),+ $(,)?) => {
        /// Entry point of the peer processes the two-process rules spawn.
        #[test]
        #[ignore = "runs only as a peer process spawned by the other tests"]
        fn peer_main() {
            let Some(key) = $crate::peer::backend_key() else { return };
            $( if key == stringify!($name) { return $crate::peer::run(&$backend); } )+
            panic!("no backend {key} in this suite");
        }
        $( $crate::suite!(@module [$(#[$meta])*] $name : $backend); )+
    };
    (@module [$($attrs:tt)*] $name:ident : $backend:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::suite!(@rules [$($attrs)*] $name : $backend;
                bytes_over_the_size_ladder_arrive_exact,
                writes_to_a_peer_process_arrive_byte_exact,
                writes_in_both_directions_at_once_complete,
                a_deadline_shorter_than_the_transfer_stops_it_in_time,
                a_receiver_that_goes_away_fails_the_sender_in_time,
                a_receiver_process_killed_mid_transfer_fails_the_sender_in_time,
                sender_and_receiver_restart_and_reconnect_on_the_same_port,
                a_hundred_cycles_leak_nothing,
                a_hundred_failed_transfers_leak_nothing,
                regions_are_reused_after_ten_thousand_cycles,
                soak_four_connections_verify_every_transfer,
                bad_memory_and_bad_ops_fail_before_posting,
                gather_writes_land_back_to_back_and_bad_ones_fail_before_posting,
                garbage_hellos_are_typed_errors_and_the_listener_survives,
                pre_shared_tokens_gate_the_handshake,
                caller_memory_moves_in_place_and_comes_back_intact,
                lanes_share_their_regions_and_guard_them_across_lanes,
                the_engine_moves_mixed_transfers_to_two_peers_over_their_lanes,
                the_engine_fails_transfers_to_a_peer_that_goes_away_in_time,
                the_engine_packs_scattered_pages_at_the_hint,
                the_engine_reads_scattered_pages_the_peer_exposed,
                the_engine_connects_a_peers_lanes_in_one_call_and_takes_regions_exposed_later,
                a_source_an_engine_transfer_names_is_held_until_collected,
                a_post_that_never_waits_answers_while_the_peer_stalls,
                an_answered_write_and_one_taken_just_before_a_drop_both_complete,
                reads_fetch_the_peers_exposed_bytes_exactly,
                bad_reads_fail_before_posting,
                reads_from_a_peer_that_went_away_end_in_time,
                regions_exposed_after_connect_are_written_read_and_withdrawn,
                a_withdrawal_waits_for_what_the_peer_posted,
                exposing_and_withdrawing_wrongly_are_typed_errors,
            );
        }
    };
    (@rules [$($attrs:tt)*] $name:ident : $backend:expr; $rule:ident, $($rest:ident,)*) => {
        #[test]
        $($attrs)*
        fn $rule() {
            $crate::contract::$rule(&$crate::Subject { key: stringify!($name), backend: &$backend });
        }
        $crate::suite!(@rules [$($attrs)*] $name : $backend; $($rest,)*);
    };
    (@rules [$($attrs:tt)*] $name:ident : $backend:expr;) => {};
}

/// The rule for backends that cross hosts over IP (not shared memory; not Soft-RoCE, which
/// carries no traffic inside network namespaces: verbs gets two VMs instead): a sender and a
/// receiver in two network namespaces, then a link that goes down mid-transfer. Names are
/// those of the same [`suite!`] call, whose `peer_main` the peers run.
#[macro_export]
macro_rules! two_hosts {
    ($( $name:ident : $backend:expr ),+ $(,)?) => {
        mod two_hosts {
            $(
                #[test]
                #[ignore = "needs root (network namespaces): test-all.sh runs it with --ignored"]
                fn $name() {
                    #[allow(unused_imports)]
                    use super::*;
                    $crate::contract::two_hosts_over_network_namespaces_and_a_link_going_down(
                        &$crate::Subject { key: stringify!($name), backend: &$backend },
                    );
                }
            )+
        }
    };
}

/// One backend under test and the name its suite instance has (which peer processes are
/// told, so they open the same backend).
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a, B> {
    /// The instance's name in [`suite!`].
    pub key: &'static str,
    /// The backend.
    pub backend: &'a B,
}
