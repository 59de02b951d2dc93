//! `rdma-hint`: probe the machine and print every hint with its reasons.

mod render;

use clap::{Parser, Subcommand};
use rdma_hint::{probe, ProbeOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "rdma-hint", version, about = "Block-size hints for RDMA-class transfers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print every memory source, NIC, path class and hint (like `ucx_info -d` + `nvidia-smi topo -m`).
    Probe {
        /// Print one JSON object instead of the text report.
        #[arg(long)]
        json: bool,
        /// Read this sysfs tree instead of /sys (live CUDA facts are then not used).
        #[arg(long, value_name = "DIR")]
        sysfs_root: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RDMA_HINT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("rdma-hint: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Probe { json, sysfs_root } => {
            let options = match sysfs_root {
                Some(root) => ProbeOptions::for_tree(root),
                None => ProbeOptions::default(),
            };
            let report = probe(&options).map_err(|err| err.to_string())?;
            if json {
                let text = serde_json::to_string_pretty(&report).map_err(|err| err.to_string())?;
                println!("{text}");
            } else {
                print!("{}", render::probe_text(&report));
            }
            Ok(())
        }
    }
}
