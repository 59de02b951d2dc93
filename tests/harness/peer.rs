//! Peer processes: the running test binary re-run as a named role.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

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
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
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
        let lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        Peer { child, lines }
    }

    /// What follows `prefix` on the next line that holds it (libtest prefixes the first line
    /// a test prints with `test peer_main ... `). Panics when the peer exits first.
    pub fn expect(&mut self, prefix: &str) -> String {
        for line in self.lines.by_ref() {
            let line = line.expect("read peer stdout");
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim().to_string();
            }
        }
        panic!("peer exited before printing {prefix}");
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
