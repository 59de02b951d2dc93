//! Peer processes: the running test binary re-run as a named role.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long [`Peer::expect`] waits for a line before it fails the test (a wedged peer must not
/// hang the suite).
pub const EXPECT_WITHIN: Duration = Duration::from_secs(180);

/// Environment variable that carries the role of a peer process.
pub const ROLE_VAR: &str = "RDMA_HINT_PEER";

/// The role this process was started as, when it is a peer (see [`Peer::spawn`]).
///
/// A test binary declares one ignored test named `peer_main` that dispatches on this.
pub fn peer_role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

/// A child process running this test binary's `peer_main` test as `role`, with its stdout
/// readable line by line. Killed and reaped on drop.
#[derive(Debug)]
pub struct Peer {
    /// The process.
    pub child: Child,
    lines: Receiver<String>,
}

impl Peer {
    /// Spawns the peer in this network namespace.
    pub fn spawn(role: &str, vars: &[(&str, String)]) -> Peer {
        Peer::spawn_in(None, role, vars)
    }

    /// Spawns the peer inside network namespace `netns` (via `ip netns exec`) when given.
    pub fn spawn_in(netns: Option<&str>, role: &str, vars: &[(&str, String)]) -> Peer {
        let exe = std::env::current_exe().expect("test binary path");
        let mut command = match netns {
            Some(name) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", name]).arg(exe);
                command
            }
            None => Command::new(exe),
        };
        command
            .args(["--exact", "peer_main", "--ignored", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, role)
            .stdout(Stdio::piped());
        for (name, value) in vars {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("spawn peer process");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        // Read on a thread of its own, so `expect` can give up at its deadline.
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Peer { child, lines }
    }

    /// What follows `prefix` on the next line that holds it (libtest prefixes the first line
    /// a test prints with `test peer_main ... `). Panics when the peer exits first or no such
    /// line comes within [`EXPECT_WITHIN`].
    pub fn expect(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + EXPECT_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find(prefix) {
                        return line[at + prefix.len()..].trim().to_string();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("the peer printed no {prefix} within {EXPECT_WITHIN:?}")
                }
                Err(RecvTimeoutError::Disconnected) => panic!("peer exited before printing {prefix}"),
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads environment variable `name` of a peer, panicking with its name when unset.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}
