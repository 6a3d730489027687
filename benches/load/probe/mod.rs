//! `LOAD_PERF` and `LOAD_SYSCALLS`: a `perf record` or `perf trace -s`
//! attached to the process under test for one extra run, and its summary.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::processes::{command, lock, signal, CHILDREN};
use crate::procfs::{all_pids, proc_stat};
use crate::scenarios::Scenario;
use crate::servers::tool;
use crate::world::{target_dir, World};

/// A `perf` attached to the process under test for one run.
pub(crate) struct Probe {
    pid: u32,
    out: PathBuf,
    trace: bool,
    /// The pids under test, comma-separated.
    pids: String,
}

/// `perf record` (a flat profile; with `LOAD_PERF_CALLGRAPH=1` also kernel
/// call chains) or `perf trace -s` (syscall counts) on the process under test.
pub(crate) fn start_probe(w: &World, sc: &Scenario, trace: bool, callgraph: bool) -> Option<Probe> {
    // nginx does its work in the master's children.
    let root = w.server_pid(sc.target)?;
    let pid = std::iter::once(root)
        .chain(
            all_pids()
                .into_iter()
                .filter(|&p| proc_stat(p).is_some_and(|(ppid, _)| ppid == root)),
        )
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let (out, args): (PathBuf, Vec<&str>) = if trace {
        let out = target_dir().join(format!("load-syscalls-{}.txt", sc.key));
        (out, vec!["trace", "-s", "-p", &pid, "-o"])
    } else {
        let out = target_dir().join(format!("load-perf-{}.data", sc.key));
        // System-wide (-a) and filtered by pid when reported: per-task
        // events would be switched on every context switch, which halves
        // the throughput of the switch-heavy store scenarios.
        let mut a = vec!["record", "-a", "-F", "999"];
        if callgraph {
            // User call chains are garbage without frame pointers; kernel
            // ones say which syscalls the kernel time comes from. Sampling
            // call chains costs much throughput on this VM.
            a.push("-g");
        }
        a.push("-o");
        (out, a)
    };
    let mut cmd = command(&tool("perf"));
    cmd.args(&args)
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match cmd.spawn() {
        Ok(c) => {
            let id = c.id();
            lock(&CHILDREN).push(("perf".into(), c));
            std::thread::sleep(Duration::from_millis(300));
            Some(Probe {
                pid: id,
                out,
                trace,
                pids: pid,
            })
        }
        Err(e) => {
            eprintln!("load: perf does not start ({e}); no profile");
            None
        }
    }
}

pub(crate) fn stop_probe(p: &Probe) {
    signal(p.pid, libc::SIGINT);
    let mut children = lock(&CHILDREN);
    if let Some(i) = children.iter().position(|(_, c)| c.id() == p.pid) {
        let (_, mut c) = children.remove(i);
        drop(children);
        let _ = c.wait();
    }
}

/// Prints the probe's summary; `requests` is what wrk counted in the run.
pub(crate) fn report_probe(p: &Probe, key: char, requests: u64) {
    if p.trace {
        report_syscalls(p, key, requests);
        return;
    }
    // `--sort dso` with a pid filter drops the kernel's samples (perf 6.x),
    // so the objects are summed here from a dso,sym listing.
    let report = Command::new(tool("perf"))
        .args(["report", "--stdio", "--no-children", "-g", "none"])
        .arg(format!("--pid={}", p.pids))
        .args(["--percentage=relative", "--sort", "dso,sym", "-i"])
        .arg(&p.out)
        .stderr(Stdio::null())
        .output();
    let Ok(out) = report else { return };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut by_dso: BTreeMap<String, f64> = BTreeMap::new();
    let mut syms: Vec<(f64, String)> = Vec::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let mut f = l.split_whitespace();
        let (Some(pct), Some(dso)) = (f.next(), f.next()) else {
            continue;
        };
        let Ok(pct) = pct.trim_end_matches('%').parse::<f64>() else {
            continue;
        };
        *by_dso.entry(dso.to_string()).or_default() += pct;
        syms.push((pct, l.trim().to_string()));
    }
    let mut dsos: Vec<(String, f64)> = by_dso.into_iter().collect();
    dsos.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "\nperf, scenario ({key}), samples of the process under test ({}):",
        p.out.display()
    );
    let objects: Vec<String> = dsos
        .iter()
        .filter(|(_, v)| *v >= 0.5)
        .map(|(d, v)| format!("{d} {v:.1}%"))
        .collect();
    println!("  by object: {}", objects.join(", "));
    println!("  self time by symbol, >= 0.7%:");
    for (_, l) in syms.iter().filter(|(v, _)| *v >= 0.7).take(40) {
        println!("    {l}");
    }
}

/// Sums `perf trace -s` over threads: calls per syscall, per request.
fn report_syscalls(p: &Probe, key: char, requests: u64) {
    let text = std::fs::read_to_string(&p.out).unwrap_or_default();
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "   sendto   1234   0   12.345   0.001 ..." : name, calls, errors, total msec, …
        if f.len() >= 4
            && f[0]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            if let (Ok(n), Ok(_)) = (f[1].parse::<u64>(), f[3].parse::<f64>()) {
                *calls.entry(f[0].to_string()).or_default() += n;
            }
        }
    }
    let mut v: Vec<(String, u64)> = calls.into_iter().collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.1));
    let n = requests.max(1) as f64;
    let total: u64 = v.iter().map(|(_, c)| c).sum();
    println!(
        "\nsyscalls of the process under test, scenario ({key}), per request \
         (perf trace slows the run; counts, not speed; {}):",
        p.out.display()
    );
    println!("  all: {:.2}", total as f64 / n);
    for (name, c) in v.iter().take(15) {
        println!("  {name:<20} {:.2}", *c as f64 / n);
    }
}
