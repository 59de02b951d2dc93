//! `rdma-hint`: probe the machine and print every hint with its reasons.
#![forbid(unsafe_code)]

mod backend;
mod calibrate;
mod cpu_share;
mod deepep;
mod output;
mod plan;
mod plot;
mod png_text;
mod render;
mod serve;
mod sweep;
mod token;
mod units;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rdma_hint::probing::ProbeOptions;
use rdma_hint::{probe, OpenOptions};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "rdma-hint", version, about = "Block-size hints for RDMA-class transfers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Which transport: backend, channel and device, as `sweep`, `calibrate` and `serve` take it.
#[derive(clap::Args)]
struct TransportArgs {
    /// Backend: staged, ucx or verbs (the last two need their cargo features).
    #[arg(long, default_value = "staged")]
    backend: String,
    /// Channel of staged or ucx: shm or tcp (for ucx: UCX_TLS=shm,self or tcp,self); `serve`
    /// and `sweep --peer` default to tcp (the two sides must agree), the others to shm. Not for
    /// verbs.
    #[arg(long)]
    channel: Option<String>,
    /// UCX transports to allow instead of --channel's (UCX_TLS syntax, e.g. posix,cma).
    #[arg(long, value_name = "TLS", conflicts_with = "channel")]
    ucx_tls: Option<String>,
    /// RDMA device for --backend verbs (default: the first one).
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
}

impl TransportArgs {
    /// The transport id, `default_channel` where none was given.
    fn resolve(&self, default_channel: &str) -> anyhow::Result<rdma_hint::TransportId> {
        backend::transport_id(
            &self.backend,
            self.channel.as_deref(),
            default_channel,
            self.ucx_tls.as_deref(),
            self.device.as_deref(),
        )
    }
}

/// The path `sweep` and `calibrate` measure: a transport and a memory source.
#[derive(clap::Args)]
struct PathArgs {
    #[command(flatten)]
    transport: TransportArgs,
    /// Memory source: host:N or gpu:N.
    #[arg(long, default_value = "host:0")]
    source: String,
}

impl PathArgs {
    /// The transport id (`default_channel` where none was given) and the source.
    fn resolve(&self, default_channel: &str) -> anyhow::Result<(rdma_hint::TransportId, rdma_hint::Device)> {
        let transport = self.transport.resolve(default_channel)?;
        let source = self.source.parse().map_err(|e| anyhow::anyhow!("--source {}: {e}", self.source))?;
        Ok((transport, source))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Print every memory source, NIC, path class and hint (like `ucx_info -d` + `nvidia-smi topo -m`).
    Probe {
        /// Print one JSON object instead of the text report.
        #[arg(long)]
        json: bool,
        /// Read this sysfs tree instead of /sys (live CUDA facts are then not used).
        #[arg(long, value_name = "DIR", conflicts_with = "calibrate")]
        sysfs_root: Option<PathBuf>,
        /// Calibrate every path this process can open first (about a second each, in-process
        /// loopback) and show the fitted o and B in the reasons.
        #[arg(long)]
        calibrate: bool,
        /// With --calibrate: measuring time per path in milliseconds (at most 600000).
        #[arg(long, value_parser = units::parse_count, default_value = "1000", requires = "calibrate")]
        budget_ms: u64,
    },
    /// Fit the path's fixed cost per block o and bandwidth B on the live transport (about a
    /// second, in-process loopback), store them and print the calibrated hint.
    Calibrate {
        #[command(flatten)]
        path: PathArgs,
        /// Measuring time in milliseconds (at most 600000).
        #[arg(long, value_parser = units::parse_count, default_value = "1000")]
        budget_ms: u64,
        /// Start a new pool: the hint answers this run alone, and the path's earlier
        /// calibrations are replaced once it is stored (a run that fails keeps them; by default
        /// the hint answers the median of the last 5 calibrations of the day).
        #[arg(long)]
        fresh: bool,
        /// Print one JSON object: block_bytes, align_bytes, origin, fixed_cost_us,
        /// bandwidth_gbps, fit_r2, elapsed_ms, then the whole calibration.
        #[arg(long)]
        json: bool,
    },
    /// Predict how long a transfer of --len bytes takes at the hint, with a low and a high
    /// bound from the stored calibration's margins (run `calibrate` for the path first).
    Estimate {
        #[command(flatten)]
        path: PathArgs,
        /// Bytes of the transfer (e.g. 4K, 1G).
        #[arg(long, value_parser = units::parse_nonzero_bytes)]
        len: u64,
        /// Print one JSON object: len_bytes, block_bytes, origin, blocks, seconds, low_seconds,
        /// high_seconds, gbps, low_gbps, high_gbps.
        #[arg(long)]
        json: bool,
    },
    /// Measure the block-size curve on a real backend: bandwidth, latency percentiles, CPU use,
    /// plateau and knee next to the model's hint; stores the knee as a measured hint.
    Sweep {
        #[command(flatten)]
        path: PathArgs,
        /// Block sizes: a range `4K..64M` (the powers of two between two powers of two) or a
        /// list `64K,96K,1M` of multiples of the alignment (the hint is added).
        #[arg(long, default_value = "4K..64M")]
        sizes: String,
        /// Timed transfers per size (after one warm-up), at least 1.
        #[arg(long, value_parser = units::parse_count_u32, default_value = "5")]
        iters: u32,
        /// Bytes per transfer, at least the largest block of --sizes.
        #[arg(long, value_parser = units::parse_nonzero_bytes, default_value = "64M")]
        transfer: u64,
        /// Single-block round trips per size for the latency histogram, at least 1.
        #[arg(long, value_parser = units::parse_count_u32, default_value = "200")]
        latency_samples: u32,
        /// Write the report as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Write a plot to this file: SVG or PNG, as its name ends.
        #[arg(long, value_name = "FILE.svg|FILE.png", value_parser = plot::parse_plot_path)]
        plot: Option<PathBuf>,
        /// Send to a peer running `rdma-hint serve` (TCP) instead of an in-process receiver:
        /// IP:PORT or HOST:PORT.
        #[arg(long, conflicts_with = "loopback", value_parser = units::parse_address)]
        peer: Option<std::net::SocketAddr>,
        /// Seconds connecting may take, the peer's handshake and the shm hand-off included.
        #[arg(long, value_parser = units::parse_seconds, default_value = "30")]
        connect_timeout_s: u64,
        /// Stripe each transfer over this many lanes (transports opened together, 1 to 16)
        /// through the transfer engine, in-process: the curve of a connection of N lanes
        /// (every backend opens lanes). A curve over several lanes is not recorded.
        #[arg(long, default_value = "1", conflicts_with = "peer", value_parser = clap::value_parser!(u16).range(1..=16))]
        lanes: u16,
        /// Loop back inside this process (the default).
        #[arg(long)]
        loopback: bool,
        /// Do not store the measured knee in the hint cache.
        #[arg(long)]
        no_record: bool,
        /// Allocate at most this many bytes of registered memory (e.g. 512M); whatever the cap,
        /// registrations past what the machine and this process's memory cgroup can spare are
        /// refused before anything is allocated.
        #[arg(long, value_parser = units::parse_nonzero_bytes)]
        memory_cap: Option<u64>,
        /// Read the pre-shared token (1…64 bytes) from this file; default: $RDMA_HINT_TOKEN.
        /// Both sides must hold the same one; it is proven, never sent.
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
    },
    /// Receive for `sweep --peer` on another host: expose a region and serve peers one after
    /// another on one listener, until stopped (or --count peers).
    Serve {
        /// Address to listen on, IP:PORT or HOST:PORT (loopback unless told otherwise).
        #[arg(long, default_value = "127.0.0.1:7470", value_parser = units::parse_address)]
        listen: std::net::SocketAddr,
        #[command(flatten)]
        transport: TransportArgs,
        /// Bytes to expose (at least the sweep's largest transfer; at least 4 KiB).
        #[arg(long, value_parser = serve::parse_region_bytes, default_value = "128M")]
        bytes: u64,
        /// Seconds one run may wait for its peer and its transfer (handshakes are cut off
        /// after 5 s regardless).
        #[arg(long, value_parser = units::parse_seconds, default_value = "600")]
        timeout_s: u64,
        /// Seconds a connected peer may stay silent (nothing arrives from it) before its run
        /// ends as failed and the next peer is served; 1…3600.
        #[arg(long, value_parser = serve::parse_idle_seconds, default_value = "30")]
        idle_timeout_s: u64,
        /// Peers to serve, one after another (default: until stopped).
        #[arg(long, value_parser = units::parse_count)]
        count: Option<u64>,
        /// Allocate at most this many bytes of registered memory (e.g. 512M); whatever the cap,
        /// registrations past what the machine and this process's memory cgroup can spare are
        /// refused before anything is allocated.
        #[arg(long, value_parser = units::parse_nonzero_bytes)]
        memory_cap: Option<u64>,
        /// Read the pre-shared token (1…64 bytes) from this file; default: $RDMA_HINT_TOKEN.
        /// Needed to listen on any address but loopback.
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
        /// Listen on a non-loopback address without a token: anyone who reaches it may write
        /// into the exposed region.
        #[arg(long)]
        insecure: bool,
    },
    /// Print how a transfer is cut into blocks, doorbell batches and signalled requests.
    Plan(plan::PlanArgs),
    /// DeepEP's `get_low_latency_rdma_size_hint`: RDMA *buffer bytes* its low-latency MoE kernels
    /// need for a model shape (BF16). A different meaning from the block-size hint of `probe`.
    DeepepSize {
        /// num_max_dispatch_tokens_per_rank (a whole number).
        #[arg(long, value_parser = units::parse_count, conflicts_with = "budget")]
        tokens: Option<u64>,
        /// Hidden size (a multiple of 128).
        #[arg(long, value_parser = units::parse_count)]
        hidden: u64,
        /// Number of ranks (checked, unused by DeepEP's formula).
        #[arg(long, value_parser = units::parse_count)]
        ranks: u64,
        /// Number of experts.
        #[arg(long, value_parser = units::parse_count)]
        experts: u64,
        /// Print the largest token count whose buffer fits this many bytes (e.g. 2GiB) and that
        /// DeepEP accepts, instead of the bytes for --tokens.
        #[arg(long, value_parser = units::parse_nonzero_bytes)]
        budget: Option<u64>,
        /// Print JSON: {"bytes","gib","within_deepep_limits","warnings"}.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // Before any thread exists: UCX's log to stderr, so stdout holds only our output.
    #[cfg(feature = "ucx")]
    let _ = rdma_hint::ucx::route_log_to_stderr();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RDMA_HINT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output left (`| head`): nothing more to say, as for any filter.
        Err(error) if output::is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rdma-hint: {}", output::error_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// `options` with `--memory-cap` applied, if given.
fn capped(options: OpenOptions, memory_cap: Option<u64>) -> OpenOptions {
    match memory_cap {
        Some(cap) => options.memory_cap(cap),
        None => options,
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Probe { json, sysfs_root, calibrate, budget_ms } => {
            probe_command(json, sysfs_root, calibrate.then_some(std::time::Duration::from_millis(budget_ms)))
        }
        Command::Sweep {
            path,
            sizes,
            iters,
            transfer,
            latency_samples,
            json,
            plot,
            peer,
            connect_timeout_s,
            lanes,
            loopback: _,
            no_record,
            token_file,
            memory_cap,
        } => {
            let sizes = sweep::parse_sizes(&sizes).map_err(|e| anyhow::anyhow!("--sizes {e}"))?;
            let largest = sizes.iter().copied().max().unwrap_or(1);
            if transfer < largest {
                anyhow::bail!(
                    "--transfer {} is smaller than the largest block of --sizes ({}): a transfer holds at least one block",
                    units::format_bytes(transfer),
                    units::format_bytes(largest)
                );
            }
            // Against a `serve`, the channel is serve's default unless given: both sides agree.
            let (transport, source) = path.resolve(if peer.is_some() { "tcp" } else { "shm" })?;
            // Output paths are checked before minutes of measuring, not after.
            let json = json.map(|path| output::OutputFile::reserve(&path, "--json")).transpose()?;
            let plot = plot.map(|path| output::OutputFile::reserve(&path, "--plot")).transpose()?;
            // Both ends of the in-process loopback get a fresh token: the pair is authenticated
            // like any other (and the UCX backend connects only to authenticated peers).
            let options =
                capped(sweep_options(token_file.as_deref(), peer.is_some(), &transport)?, memory_cap);
            let args = sweep::SweepArgs {
                options,
                transport,
                source,
                sizes,
                iters,
                transfer_bytes: transfer,
                latency_samples,
                peer,
                memory_cap,
                connect_timeout: std::time::Duration::from_secs(connect_timeout_s.max(1)),
                lanes: usize::from(lanes),
                record: !no_record,
            };
            let outcome = sweep::run(&args)?;
            output::print(&sweep::table(&outcome.report))?;
            write_sweep_files(&outcome.report, json, plot)?;
            report_recording(&outcome)
        }
        Command::Serve {
            listen,
            transport,
            bytes,
            timeout_s,
            idle_timeout_s,
            count,
            token_file,
            memory_cap,
            insecure,
        } => {
            let transport = transport.resolve("tcp")?;
            let token = token::load(token_file.as_deref())?;
            token::required_by(&transport, token.is_some())?;
            let options = match token {
                Some(token) => OpenOptions::default().token(&token),
                None => OpenOptions::default(),
            }
            .allow_unauthenticated_remote(insecure);
            let options = capped(options, memory_cap);
            serve::run(&serve::ServeArgs {
                listen,
                transport,
                options,
                bytes,
                timeout: std::time::Duration::from_secs(timeout_s),
                idle_timeout: std::time::Duration::from_secs(idle_timeout_s),
                count,
            })
        }
        Command::Calibrate { path, budget_ms, fresh, json } => {
            calibrate_command(path, std::time::Duration::from_millis(budget_ms), fresh, json)
        }
        Command::Estimate { path, len, json } => estimate_command(path, len, json),
        Command::Plan(args) => {
            output::print_line(&plan::run(&args)?)?;
            Ok(())
        }
        Command::DeepepSize { tokens, hidden, ranks, experts, budget, json } => {
            let text = deepep::run(&deepep::DeepEpArgs { tokens, hidden, ranks, experts, budget, json })?;
            output::print_line(&text)?;
            Ok(())
        }
    }
}

/// Says what became of the sweep's hint: recorded, skipped and why, or failed (an error: the
/// results printed above stand).
fn report_recording(outcome: &sweep::Outcome) -> anyhow::Result<()> {
    match &outcome.recording {
        sweep::Recording::NotAsked => Ok(()),
        sweep::Recording::Recorded { file, block_bytes } => Ok(output::print_line(&format!(
            "recorded: {} as the hint for {} over {} in {}",
            units::format_bytes(*block_bytes),
            outcome.report.source,
            outcome.report.transport,
            file.display()
        ))?),
        sweep::Recording::Skipped(why) => Ok(output::print_line(&format!("recorded: nothing ({why})"))?),
        // The results above (and --json) stand; only storing them failed.
        sweep::Recording::Failed(why) => {
            anyhow::bail!("the sweep's results are above; recording its hint failed: {why}")
        }
    }
}

/// `estimate`: how long `len` bytes take over the path at its hint, with the bounds.
fn estimate_command(path: PathArgs, len: u64, json: bool) -> anyhow::Result<()> {
    let (transport, source) = path.resolve("shm")?;
    let estimate = rdma_hint::estimate(len, source, &transport)?;
    if json {
        output::print_line(&serde_json::to_string_pretty(&estimate)?)?;
    } else {
        output::print_line(&format!(
            "{} over {} from {source}: {} ({} to {}) in {} of {} ({}), {:.3} GB/s ({:.3} to {:.3})",
            units::format_bytes(len),
            transport,
            units::format_seconds(estimate.seconds),
            units::format_seconds(estimate.low_seconds),
            units::format_seconds(estimate.high_seconds),
            units::plural(estimate.blocks, "block"),
            units::format_bytes(estimate.block_bytes),
            format!("{:?}", estimate.origin).to_lowercase(),
            estimate.gbps,
            estimate.low_gbps,
            estimate.high_gbps
        ))?;
    }
    Ok(())
}

/// `probe`, after calibrating every path it can open within `calibrate` each, if asked.
fn probe_command(
    json: bool,
    sysfs_root: Option<std::path::PathBuf>,
    calibrate: Option<std::time::Duration>,
) -> anyhow::Result<()> {
    let options = match sysfs_root {
        Some(root) => ProbeOptions::for_tree(root),
        None => ProbeOptions::default(),
    };
    if let Some(budget) = calibrate {
        let token = token::ephemeral()?;
        let options = OpenOptions::default().token(&token);
        for line in calibrate::every_path(&probe(&ProbeOptions::default())?, &options, budget) {
            eprintln!("{line}");
        }
    }
    let report = probe(&options)?;
    if json {
        output::print_line(&serde_json::to_string_pretty(&report)?)?;
    } else {
        output::print(&render::probe_text(&report))?;
    }
    Ok(())
}

/// A sweep's open options: the token from `token_file` (or `RDMA_HINT_TOKEN`), which a sweep
/// against a `serve` over a transport that needs one must have; both ends of the in-process
/// loopback get a fresh one otherwise (the pair is authenticated like any other, and the UCX
/// backend connects only to authenticated peers).
fn sweep_options(
    token_file: Option<&std::path::Path>,
    against_serve: bool,
    transport: &rdma_hint::TransportId,
) -> anyhow::Result<OpenOptions> {
    let loaded = token::load(token_file)?;
    if against_serve {
        token::required_by(transport, loaded.is_some())?;
    }
    let token = match (loaded, against_serve) {
        (Some(token), _) => Some(token),
        (None, false) => Some(token::ephemeral()?),
        (None, true) => None,
    };
    Ok(match token {
        Some(token) => OpenOptions::default().token(&token),
        None => OpenOptions::default(),
    })
}

/// Writes a sweep's `--json` report and `--plot` to the files reserved for them.
fn write_sweep_files(
    report: &sweep::SweepReport,
    json: Option<output::OutputFile>,
    plot: Option<output::OutputFile>,
) -> anyhow::Result<()> {
    if let Some(file) = json {
        let text = serde_json::to_string_pretty(report)?;
        std::fs::write(file.path(), text).with_context(|| format!("writing {}", file.path().display()))?;
        output::print_line(&format!("report: {}", file.path().display()))?;
        file.done();
    }
    if let Some(file) = plot {
        plot::write(report, file.path())?;
        output::print_line(&format!("plot: {}", file.path().display()))?;
        file.done();
    }
    Ok(())
}

/// `calibrate`: over both ends of the path in this process, stored unless the fit is poor.
fn calibrate_command(
    path: PathArgs,
    budget: std::time::Duration,
    fresh: bool,
    json: bool,
) -> anyhow::Result<()> {
    let (transport, source) = path.resolve("shm")?;
    let token = token::ephemeral()?;
    let options = OpenOptions::default().token(&token);
    let calibrate = if fresh {
        rdma_hint::calibration::recalibrate_loopback
    } else {
        rdma_hint::calibration::calibrate_loopback
    };
    let calibration = calibrate(&transport, source, &options, budget)?;
    if json {
        output::print_line(&serde_json::to_string_pretty(&calibrate::CalibrationJson::new(&calibration))?)?;
    } else {
        output::print(&calibrate::text(&calibration))?;
    }
    Ok(())
}
