//! The engine's metrics as an embedder scrapes them: transfers over each transport id, every
//! byte checked where it landed, then `curl` (a real HTTP client) fetches the loopback
//! endpoint and the answer is parsed as Prometheus text, whose counters must say what moved.
//! And the endpoint as an attacker meets it: a path it does not serve, a request too large, a
//! client that connects and sends nothing (the next scrape still answers), a public address.

use rdma_hint::engine::events::{MetricsEndpoint, MetricsSubscriber, TracingSubscriber};
use rdma_hint::engine::{Engine, EngineConfig, TransferRequest};
use rdma_hint::{
    block_on, get_low_latency_rdma_size_hint_with, open, Device, MemoryKind, OpenOptions, PeerEndpoint,
    Transport, TransportSelector,
};
use rdma_hint_embedder::{ids, payload};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEN: u64 = 3 << 20;

/// `curl` fetches `url`: (HTTP status, body).
fn curl(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["--silent", "--max-time", "10", "--write-out", "\n%{http_code}", url])
        .output()
        .expect("curl runs (scripts/install-deps.sh installs it)");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let (body, status) = text.rsplit_once('\n').expect("a status line");
    (status.parse().expect("a status"), body.to_string())
}

/// Parses the text exposition format strictly: `# HELP`/`# TYPE` lines name a family before
/// its samples, every sample is `name{label="value",...} number` of a declared family, and
/// `# EOF` ends it. The samples by their name and labels.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut families: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "ends with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(["counter", "histogram", "gauge"].contains(&kind), "{line}");
            families.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
        let name = series.split('{').next().unwrap();
        if let Some(labels) = series.strip_prefix(name) {
            let inner = labels
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .unwrap_or_else(|| panic!("{line}"));
            for pair in inner.split(',') {
                let (key, quoted) = pair.split_once('=').unwrap_or_else(|| panic!("label=\"value\": {line}"));
                assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{line}");
                assert!(quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'), "{line}");
            }
        }
        let family = ["_total", "_bucket", "_count", "_sum", "_created"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|base| families.contains_key(*base)))
            .unwrap_or(name);
        assert!(families.contains_key(family), "a sample of an undeclared family: {line}");
        samples.insert(series.to_string(), value);
    }
    samples
}

#[test]
fn the_metrics_endpoint_is_scraped_by_curl_and_says_what_the_engine_moved() {
    for (index, id) in ids().into_iter().enumerate() {
        let options = OpenOptions::default().token(b"embedder metrics test");
        let sender: Arc<dyn Transport> = Arc::from(open(&id, &options).expect("open"));
        let receiver: Arc<dyn Transport> = Arc::from(open(&id, &options).expect("open"));
        let source = sender.register(MemoryKind::Host, LEN).expect("register");
        let target = receiver.register(MemoryKind::Host, LEN).expect("register");
        let bytes = payload(index as u32, LEN);
        sender.write_region(source.id, 0, &bytes).expect("fill");
        let deadline = Instant::now() + Duration::from_secs(20);
        let address = receiver.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        let accepting = {
            let receiver = receiver.clone();
            std::thread::spawn(move || {
                block_on(receiver.connect(PeerEndpoint::Listen(address), &[target.id], deadline))
            })
        };
        let remote = block_on(sender.connect(PeerEndpoint::Dial(address), &[], deadline)).expect("dial");
        accepting.join().unwrap().expect("accept");

        let hint = get_low_latency_rdma_size_hint_with(Device::Host(0), &TransportSelector::Id(id.clone()))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let engine = Engine::new(EngineConfig::default()).expect("engine");
        engine.set_size_hint(&hint).expect("the hint cuts blocks");
        let metrics = Arc::new(MetricsSubscriber::new());
        engine.subscribe(metrics.clone());
        engine.subscribe(Arc::new(TracingSubscriber));
        let peer = engine.add_peer(vec![sender.clone()], &remote).expect("peer");
        let bulk =
            engine.submit(peer, TransferRequest::single(&source, 0, &remote[0], 0, LEN), deadline).unwrap();
        let small = TransferRequest::single(&source, 0, &remote[0], 0, 4096).latency_first();
        let small = engine.submit(peer, small, deadline).unwrap();
        let blocks = engine.wait_blocking(bulk, deadline).expect("bulk").blocks
            + engine.wait_blocking(small, deadline).expect("small").blocks;
        let mut landed = vec![0u8; LEN as usize];
        receiver.read_region(target.id, 0, &mut landed).expect("read");
        assert!(landed == bytes, "{id}: the bytes landed as sent");

        let endpoint = MetricsEndpoint::serve(metrics, "127.0.0.1:0".parse().unwrap()).expect("serve");
        let (status, body) = curl(&format!("http://{}/metrics", endpoint.local_addr()));
        assert_eq!(status, 200, "{id}: {body}");
        let samples = parse(&body);
        let lane = r#"{peer="0",lane="0",op="write"}"#;
        assert_eq!(
            samples.get(&format!("rdma_hint_completed_bytes_total{lane}")),
            Some(&((LEN + 4096) as f64)),
            "{id}: {body}"
        );
        assert_eq!(
            samples.get(&format!("rdma_hint_completed_blocks_total{lane}")),
            Some(&(blocks as f64)),
            "{id}"
        );
        assert_eq!(
            samples.get(&format!("rdma_hint_posted_bytes_total{lane}")),
            Some(&((LEN + 4096) as f64)),
            "{id}"
        );
        let transfers: f64 = samples
            .iter()
            .filter(|(series, _)| {
                series.starts_with("rdma_hint_transfer_seconds_count{")
                    && series.contains(r#"outcome="delivered""#)
            })
            .map(|(_, count)| count)
            .sum();
        assert_eq!(transfers, 2.0, "{id}: two transfers delivered");
        let timed: f64 = samples
            .iter()
            .filter(|(series, _)| series.starts_with("rdma_hint_block_seconds_count{"))
            .map(|(_, count)| count)
            .sum();
        assert!(
            timed >= 1.0 && timed <= blocks as f64,
            "{id}: {timed} completions timed for {blocks} blocks"
        );
    }
}

/// Sends `request` as is and reads the whole answer (the endpoint closes after it): (status,
/// answer). A reset before the answer was read is an error, as a client would report it.
fn raw(at: SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(at).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap_or_else(|e| panic!("{e} after {answer:?}"));
    let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    (status, answer)
}

#[test]
fn the_endpoint_refuses_what_it_does_not_serve_and_no_client_holds_it_past_its_two_seconds() {
    let endpoint = MetricsEndpoint::serve(Arc::new(MetricsSubscriber::new()), "127.0.0.1:0".parse().unwrap())
        .expect("serve");
    let at = endpoint.local_addr();
    assert_eq!(curl(&format!("http://{at}/")).0, 404);
    assert_eq!(curl(&format!("http://{at}/metrics/../secrets")).0, 404);
    // Headers past 8 KiB are refused, not read on.
    let mut big = TcpStream::connect(at).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = big.write_all(format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(64 << 10)).as_bytes());
    let mut answer = String::new();
    let _ = big.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.80}");
    // A client that connects and says nothing holds the endpoint 2 s at most.
    let _silent = TcpStream::connect(at).unwrap();
    let started = Instant::now();
    assert_eq!(curl(&format!("http://{at}/metrics")).0, 200);
    assert!(started.elapsed() < Duration::from_secs(5), "answered after {:?}", started.elapsed());
    // Nor does one that trickles a byte every 0.5 s (each read's own timeout never fires):
    // the connection's 2 s are counted from its accept.
    let trickling = std::thread::spawn(move || {
        let mut slow = TcpStream::connect(at).unwrap();
        for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: 1234567890\r\n\r\n" {
            if slow.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    assert_eq!(curl(&format!("http://{at}/metrics")).0, 200);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered after {:?} behind a trickler",
        started.elapsed()
    );
    trickling.join().unwrap();
    // A page a rebinding DNS name points here sends its own name: refused.
    assert_eq!(raw(at, "GET /metrics HTTP/1.1\r\nHost: attacker.example:9464\r\n\r\n").0, 403);
    assert_eq!(raw(at, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").0, 200);
    assert_eq!(raw(at, "GET /metrics HTTP/1.1\r\nHost: [::1]:80\r\n\r\n").0, 200);
    // A bare-LF request is answered; a second request pipelined behind the first, or a body,
    // does not reset the connection before the answer is read.
    assert_eq!(raw(at, "GET /metrics HTTP/1.0\n\n").0, 200);
    let (status, answer) = raw(at, "GET /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200, "{answer}");
    // Dropping the endpoint while a client trickles returns within the connection's 2 s.
    let trickler = TcpStream::connect(at).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    drop(endpoint);
    assert!(started.elapsed() < Duration::from_secs(4), "dropped after {:?}", started.elapsed());
    drop(trickler);
    // Metrics are served on loopback only.
    let public: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let refused = MetricsEndpoint::serve(Arc::new(MetricsSubscriber::new()), public).unwrap_err();
    assert_eq!(refused.kind(), rdma_hint::ErrorKind::InvalidInput, "{refused}");
}
