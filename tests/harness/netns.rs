//! Two hosts on one machine: two network namespaces joined by a veth pair.

use std::process::Command;

/// Two network namespaces joined by a veth pair, each with its own address; removed on drop.
#[derive(Debug)]
pub struct TwoHosts {
    /// Namespace names (`ip netns exec <name>`).
    pub names: [String; 2],
    /// veth device in each namespace.
    pub links: [String; 2],
    /// IPv4 address of each namespace's veth.
    pub addresses: [String; 2],
}

/// Runs `ip args…`, panicking when it fails.
pub fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip (iproute2)");
    assert!(status.success(), "ip {}", args.join(" "));
}

impl TwoHosts {
    /// Creates both namespaces (names and a /24 derived from this process id and `salt`, so
    /// parallel test binaries do not collide).
    pub fn create(salt: u32) -> TwoHosts {
        let tag = (std::process::id() + salt * 7919) % 100_000;
        let names = [format!("rh-a-{tag}"), format!("rh-b-{tag}")];
        let links = [format!("rha{tag}"), format!("rhb{tag}")];
        let subnet = 10 + tag % 200;
        let third = 77 + salt % 100;
        let addresses = [format!("10.{third}.{subnet}.1"), format!("10.{third}.{subnet}.2")];
        let hosts = TwoHosts { names: names.clone(), links: links.clone(), addresses };
        for name in &names {
            ip(&["netns", "add", name]);
        }
        ip(&["link", "add", &links[0], "type", "veth", "peer", "name", &links[1]]);
        for i in 0..2 {
            ip(&["link", "set", &links[i], "netns", &names[i]]);
            let address = format!("{}/24", hosts.addresses[i]);
            ip(&["-n", &names[i], "addr", "add", &address, "dev", &links[i]]);
            ip(&["-n", &names[i], "link", "set", &links[i], "up"]);
            ip(&["-n", &names[i], "link", "set", "lo", "up"]);
        }
        hosts
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// Whether this process runs as root (network namespaces need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// `true` when namespace tests can run here. Without root they are skipped with a note,
/// unless `RDMA_HINT_REQUIRE_NETNS` is set (CI sets it), which makes skipping a failure.
pub fn netns_available() -> bool {
    if is_root() {
        return true;
    }
    assert!(std::env::var_os("RDMA_HINT_REQUIRE_NETNS").is_none(), "netns tests required but not root");
    eprintln!("skipped: creating network namespaces needs root (CI runs it as root)");
    false
}
