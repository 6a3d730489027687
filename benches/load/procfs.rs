//! CPU, I/O and memory of processes and of the machine, from `/proc`.

pub(crate) fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// (ppid, utime + stime in ticks) of a process.
pub(crate) fn proc_stat(pid: u32) -> Option<(u32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state(3) ppid(4) … utime(14) stime(15), 1-based in stat.
    Some((
        f[1].parse().ok()?,
        f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?,
    ))
}

pub(crate) fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// CPU ticks of a process and its direct children (nginx's workers).
pub(crate) fn tree_ticks(pid: u32) -> u64 {
    let mut total = proc_stat(pid).map_or(0, |(_, t)| t);
    for p in all_pids() {
        if let Some((ppid, t)) = proc_stat(p) {
            if ppid == pid {
                total += t;
            }
        }
    }
    total
}

/// CPU ticks of each of `pids` and its direct children (a valkey-server's
/// forks), in one pass over `/proc`.
pub(crate) fn trees_ticks(pids: &[u32]) -> u64 {
    all_pids()
        .into_iter()
        .filter_map(proc_stat_of)
        .filter(|&(pid, ppid, _)| pids.contains(&pid) || pids.contains(&ppid))
        .map(|(_, _, t)| t)
        .sum()
}

fn proc_stat_of(pid: u32) -> Option<(u32, u32, u64)> {
    proc_stat(pid).map(|(ppid, t)| (pid, ppid, t))
}

/// CPU ticks of every `postgres` process on the machine (not only ours).
pub(crate) fn postgres_ticks() -> u64 {
    all_pids()
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "postgres")
        })
        .filter_map(|p| proc_stat(p).map(|(_, t)| t))
        .sum()
}

/// Busy ticks of the whole machine (all CPUs), from /proc/stat.
pub(crate) fn machine_busy_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = s.lines().next().unwrap_or("");
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    get(0) + get(1) + get(2) + get(5) + get(6) + get(7)
}

/// CPU time of reaped children (wrk), in µs.
pub(crate) fn children_cpu_us() -> f64 {
    // SAFETY: getrusage writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// What a process read and wrote (`/proc/PID/io`): `rchar` counts the
/// bytes of its `read`/`pread` calls (a store's page-cache misses; sockets
/// are read with `recv`, which it does not count), `write_bytes` what it
/// sent toward the disk. Counted, not timed: an A/B of a store's layout
/// shows in them where its throughput is lost in this VM's variance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProcIo {
    pub(crate) read_bytes: u64,
    pub(crate) written_bytes: u64,
}

/// [`ProcIo`] over a run, per request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IoPerRequest {
    pub(crate) read_kib: f64,
    pub(crate) written_kib: f64,
}

pub(crate) fn proc_io(pid: u32) -> Option<ProcIo> {
    Some(ProcIo {
        read_bytes: testkit::proc_number(pid, "io", "rchar:")?,
        written_bytes: testkit::proc_number(pid, "io", "write_bytes:")?,
    })
}

/// `VmRSS` and `VmHWM` (peak) in MiB.
pub(crate) fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let mib = |key: &str| testkit::memory_kib(pid, key).map(|kib| kib as f64 / 1024.0);
    Some((mib("VmRSS:")?, mib("VmHWM:")?))
}
