//! What a transport that vouches its posts never wait
//! ([`Capabilities::posts_without_waiting`](rdma_hint_core::Capabilities::posts_without_waiting))
//! must keep: the transfer engine rings such a lane's small doorbells holding its own lock, so
//! a post that waited for a stalled peer would stall every thread of the engine.

use crate::backend::Backend;
use crate::contract::shared;
use crate::pair::{deadline, pair};
use crate::Subject;
use rdma_hint_backend_core::blocking::block_on;
use rdma_hint_core::{Arrival, Completion, CompletionStatus, Transport, TransportError, WriteOp};
use rdma_hint_integration_tests::{first_mismatch, random_bytes};
use std::sync::Arc;
use std::time::Duration;

/// Posts of one 4 KiB write each, with an immediate, to a peer whose application polls
/// nothing meanwhile: every post answers within the bound (accepted, or refused as a full
/// queue), so no post waits for the peer's application; once it polls again, every accepted
/// write arrives, every signalled one completes, and the bytes are there. Past the completions
/// the contract lets be outstanding, posts go unsignalled. (On staged shm the peer's ring
/// thread keeps taking announcements off the ring into its arrivals queue, over which a peer
/// breaks the link past 4096; so the posts stay below that and the ring never fills here: the
/// rule holds a post to not waiting for the application, not to a full ring.) Says nothing of
/// a transport that does not vouch for it.
pub fn a_post_that_never_waits_answers_while_the_peer_stalls<B: Backend>(s: &Subject<'_, B>) {
    let _shared = shared();
    let p = Arc::new(pair(s.backend, 4096, s.backend.listen_address()));
    let caps = p.sender.capabilities();
    if !caps.posts_without_waiting {
        return;
    }
    let expected = random_bytes(4096, 23);
    p.sender.write_region(p.source.id, 0, &expected).expect("fill the source");
    // Four windows of completions' worth, below what a peer may leave unpolled (4096).
    let posts = (4 * caps.max_outstanding_wrs).clamp(64, 2048);
    // Signalled as far as the contract lets completions be outstanding, unsignalled past it.
    let signalled = caps.max_outstanding_wrs;
    let (answered, answers) = std::sync::mpsc::channel();
    let posting = Arc::clone(&p);
    // A thread of its own: a post that waits for the peer is reported, not waited for.
    std::thread::spawn(move || {
        let (mut accepted, mut signalled_accepted) = (0u32, 0u32);
        for post in 0..posts {
            let op = WriteOp {
                wr_id: u64::from(post),
                local: posting.source.id,
                local_offset: 0,
                remote: posting.remote.id,
                remote_offset: 0,
                len: 4096,
                signalled: post < signalled,
                imm: Some(post),
            };
            match posting.sender.post_writes(&[op]) {
                Ok(()) => {
                    accepted += 1;
                    signalled_accepted += u32::from(op.signalled);
                }
                Err(TransportError::QueueFull { .. }) => {}
                Err(other) => panic!("post {post}: {other}"),
            }
        }
        let _ = answered.send((accepted, signalled_accepted));
    });
    let bound = Duration::from_secs(s.backend.scale().report_within_s);
    let (accepted, signalled) = answers
        .recv_timeout(bound)
        .unwrap_or_else(|_| panic!("{posts} posts to a stalled peer did not all answer within {bound:?}"));
    assert!(accepted > 0, "not one of {posts} posts was accepted");
    // The peer polls again: every accepted write arrives and completes, its bytes intact.
    let mut arrivals = vec![Arrival::EMPTY; 64];
    let mut arrived = 0;
    while arrived < accepted {
        let got = block_on(p.receiver.wait_arrivals(&mut arrivals, deadline(20)));
        arrived += got.expect("the accepted writes' arrivals") as u32;
    }
    let mut completions = vec![Completion::EMPTY; 64];
    let mut completed = 0;
    while completed < signalled {
        let got = block_on(p.sender.wait_completions(&mut completions, deadline(20)));
        let got = got.unwrap_or_else(|e| panic!("{completed} of {signalled} completions: {e}"));
        assert!(
            completions[..got].iter().all(|c| c.status == CompletionStatus::Success),
            "{:?}",
            &completions[..got]
        );
        completed += got as u32;
    }
    let mut landed = vec![0u8; 4096];
    p.receiver.read_region(p.target.id, 0, &mut landed).expect("read the target");
    assert_eq!(first_mismatch(&landed, &expected), None, "first wrong byte");
}
