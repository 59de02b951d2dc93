//! Chunker: cuts transfers into fixed-length, alignment-padded blocks and posts them in batches
//! over any [`rdma_hint_core::Transport`]. The planner and posting pipeline land with the
//! chunker issue; this crate holds its place in the workspace.
#![forbid(unsafe_code)]
