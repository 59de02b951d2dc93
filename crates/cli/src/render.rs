//! Text rendering of the probe report: one section per table, every number with its unit.

use crate::units::format_bytes as bytes;
use rdma_hint::probing::NicKind;
use rdma_hint::probing::ProbeReport;
use std::fmt::Write;

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// A rate in GB/s with enough digits that a slow path does not print as zero.
fn gbps(rate: f64) -> String {
    if rate < 1.0 {
        format!("{rate:.3}")
    } else {
        format!("{rate:.1}")
    }
}

/// The full text report.
pub(crate) fn probe_text(report: &ProbeReport) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = render(report, &mut out);
    out
}

fn render(report: &ProbeReport, out: &mut String) -> std::fmt::Result {
    writeln!(out, "# rdma-hint probe — sysfs root {}", report.sysfs_root)?;
    writeln!(out, "# GPU facts: {}", report.gpu_facts)?;
    writeln!(out)?;
    for section in [sources, nics, path_matrix] {
        section(report, out)?;
        writeln!(out)?;
    }
    hints(report, out)?;
    unavailable(report, out)
}

/// The memory sources: kind, PCI address, NUMA node, memory, link and GPU facts.
fn sources(report: &ProbeReport, out: &mut String) -> std::fmt::Result {
    writeln!(out, "## Memory sources")?;
    writeln!(out, "{:<8} {:<5} {:<13} {:>5} {:>11}  pcie / gpu", "source", "kind", "pci", "numa", "memory")?;
    for source in &report.sources {
        let mut detail = source.pcie.map(|l| l.to_string()).unwrap_or_default();
        if let Some(gpu) = &source.gpu {
            let flag = |v: Option<bool>| match v {
                Some(true) => "yes",
                Some(false) => "no",
                None => "?",
            };
            write!(
                detail,
                "{}{} gpudirect-rdma={} dmabuf={} vmm-granularity={}",
                if detail.is_empty() { "" } else { "; " },
                gpu.name.as_deref().unwrap_or("GPU"),
                flag(gpu.gpudirect_rdma),
                flag(gpu.dmabuf),
                gpu.vmm_granularity_bytes.map(bytes).unwrap_or_else(|| "?".into())
            )?;
        }
        writeln!(
            out,
            "{:<8} {:<5} {:<13} {:>5} {:>11}  {}",
            source.id.to_string(),
            source.kind,
            or_dash(source.pci.as_ref()),
            or_dash(source.numa),
            source.memory_bytes.map(bytes).unwrap_or_else(|| "-".into()),
            detail
        )?;
    }
    Ok(())
}

/// The NICs: kind, place, rate, MTU, link, state, firmware and driver.
fn nics(report: &ProbeReport, out: &mut String) -> std::fmt::Result {
    writeln!(out, "## NICs")?;
    if report.nics.is_empty() {
        writeln!(out, "(none)")?;
    }
    for nic in &report.nics {
        let kind = match nic.kind {
            NicKind::Rdma => "rdma",
            NicKind::Net => "net",
        };
        writeln!(
            out,
            "{:<10} {:<4} pci={} numa={} rate={} mtu={} link={} state={} fw={} driver={}",
            nic.name,
            kind,
            or_dash(nic.pci.as_ref()),
            or_dash(nic.numa_node),
            nic.rate_gbits.map(|r| format!("{r} Gb/s")).unwrap_or_else(|| "-".into()),
            nic.mtu_bytes.map(|m| format!("{m} B")).unwrap_or_else(|| "-".into()),
            nic.link.map(|l| l.to_string()).unwrap_or_else(|| "-".into()),
            if nic.active { "active" } else { "down" },
            or_dash(nic.firmware.as_ref()),
            or_dash(nic.driver.as_ref()),
        )?;
    }
    Ok(())
}

/// The path class of every source to every NIC.
fn path_matrix(report: &ProbeReport, out: &mut String) -> std::fmt::Result {
    writeln!(out, "## Path matrix (source × NIC; PIX/PXB/PHB/NODE/SYS as in nvidia-smi topo -m)")?;
    if report.nics.is_empty() {
        writeln!(out, "(no NIC)")?;
    } else {
        write!(out, "{:<8}", "")?;
        for nic in &report.nics {
            write!(out, " {:>10}", nic.name)?;
        }
        writeln!(out)?;
        for source in &report.sources {
            write!(out, "{:<8}", source.id.to_string())?;
            for nic in &report.nics {
                let class = report
                    .paths
                    .iter()
                    .find(|p| p.source == source.id && p.nic == nic.name)
                    .map(|p| p.class.label())
                    .unwrap_or("?");
                write!(out, " {class:>10}")?;
            }
            writeln!(out)?;
        }
    }
    Ok(())
}

/// The hints, the defaults `get_low_latency_rdma_size_hint` answers, and each hint's reasons.
fn hints(report: &ProbeReport, out: &mut String) -> std::fmt::Result {
    writeln!(out, "## Hints")?;
    writeln!(
        out,
        "{:<8} {:<16} {:>10} {:>8} {:>6} {:>9} {:>9} {:>7} {:>11} {:<8}",
        "source", "transport", "block", "align", "class", "B GB/s", "pred GB/s", "η", "latency µs", "origin"
    )?;
    for hint in &report.hints {
        writeln!(
            out,
            "{:<8} {:<16} {:>10} {:>8} {:>6} {:>9} {:>9} {:>7.3} {:>11.2} {:<8}",
            hint.source.to_string(),
            hint.transport,
            bytes(hint.block_bytes),
            bytes(hint.align_bytes),
            hint.path_class.label(),
            gbps(hint.bandwidth_gbps),
            gbps(hint.predicted_gbps),
            hint.efficiency,
            hint.predicted_latency_us,
            format!("{:?}", hint.origin).to_lowercase(),
        )?;
    }
    for hint in &report.defaults {
        writeln!(
            out,
            "get_low_latency_rdma_size_hint({}) → {} over {} ({})",
            hint.source,
            bytes(hint.block_bytes),
            hint.transport,
            format!("{:?}", hint.origin).to_lowercase()
        )?;
    }
    for hint in &report.hints {
        writeln!(out)?;
        writeln!(
            out,
            "### {} over {} ({}): {} blocks, {} aligned",
            hint.source,
            hint.transport,
            hint.path_class,
            bytes(hint.block_bytes),
            bytes(hint.align_bytes)
        )?;
        for reason in &hint.reasons {
            writeln!(out, "  - {reason}")?;
        }
    }
    Ok(())
}

/// Pairs without a hint, backend details, what is not available here, warnings.
fn unavailable(report: &ProbeReport, out: &mut String) -> std::fmt::Result {
    if !report.no_hint.is_empty() {
        writeln!(out)?;
        writeln!(out, "## Pairs without a hint")?;
        for missing in &report.no_hint {
            writeln!(
                out,
                "{} over {}: {}{}",
                missing.source,
                missing.transport,
                missing.reason,
                missing.fallback.as_ref().map(|f| format!(" → fall back to {f}")).unwrap_or_default()
            )?;
        }
    }
    if !report.details.is_empty() {
        writeln!(out)?;
        writeln!(out, "## Backend details")?;
        for detail in &report.details {
            writeln!(out, "{}: {}", detail.transport, detail.detail)?;
        }
    }
    writeln!(out)?;
    writeln!(out, "## Not available here")?;
    if report.absent.is_empty() {
        writeln!(out, "(nothing: every compiled-in backend contributes)")?;
    }
    // One line per component, however many reasons it has.
    let mut components: Vec<&str> = Vec::new();
    for absence in &report.absent {
        if !components.contains(&absence.component) {
            components.push(absence.component);
        }
    }
    for component in components {
        let whys: Vec<&str> =
            report.absent.iter().filter(|a| a.component == component).map(|a| a.why.as_str()).collect();
        writeln!(out, "{component}: {}", whys.join("; "))?;
    }
    if !report.warnings.is_empty() {
        writeln!(out)?;
        writeln!(out, "## Warnings")?;
        for warning in &report.warnings {
            writeln!(out, "- {warning}")?;
        }
    }
    Ok(())
}
