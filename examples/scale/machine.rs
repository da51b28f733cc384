//! What the report says about the machine and the build: CPU model, CPU count, kernel,
//! glibc, memory, the peers' crate versions (from the `Cargo.lock` compiled in), the
//! commit and the date.

use std::ffi::CStr;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// The lock file this example was built with.
const CARGO_LOCK: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"));

/// The crates whose versions the report names.
const PEERS: [&str; 12] = [
    "crossbeam-epoch",
    "seize",
    "haphazard",
    "arc-swap",
    "parking_lot",
    "crossbeam-utils",
    "tikv-jemallocator",
    "tikv-jemalloc-sys",
    "mimalloc",
    "libmimalloc-sys",
    "libc",
    "plotters",
];

#[derive(Debug, Clone)]
pub struct Machine {
    /// (label, value) in display order.
    pub fields: Vec<(&'static str, String)>,
    /// (crate, versions) of the peers.
    pub crates: Vec<(String, String)>,
}

impl Machine {
    pub fn describe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let listed = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
        let nproc = std::thread::available_parallelism().map_or(0, usize::from);
        let kernel = read_trimmed("/proc/sys/kernel/osrelease");
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| m.lines().find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_owned())))
            .map_or_else(|| "unknown".to_owned(), |kb| format_kb(&kb));
        let load = read_trimmed("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        let fields = vec![
            ("CPU", cpu),
            ("nproc", format!("{nproc} (available to this process; /proc/cpuinfo lists {listed})")),
            ("kernel", format!("Linux {kernel}")),
            ("glibc", glibc_version()),
            ("memory", memory),
            ("load average at start", load),
            ("rustc", command_line("rustc", &["--version"])),
            ("scalemem commit", git_commit()),
            ("scalemem version", env!("CARGO_PKG_VERSION").to_owned()),
            ("date (UTC)", utc_now()),
        ];
        let crates = PEERS.iter().map(|name| ((*name).to_owned(), locked_versions(name).join(", "))).collect();
        Self { fields, crates }
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned())
}

/// "24567890 kB" as GiB.
fn format_kb(kb: &str) -> String {
    let value = kb.split_whitespace().next().and_then(|v| v.parse::<f64>().ok());
    value.map_or_else(|| kb.to_owned(), |v| format!("{:.1} GiB", v / (1024.0 * 1024.0)))
}

fn glibc_version() -> String {
    // SAFETY: gnu_get_libc_version takes no arguments and returns a pointer to a static,
    // NUL-terminated string that lives as long as the process.
    let version = unsafe { CStr::from_ptr(libc::gnu_get_libc_version()) };
    version.to_string_lossy().into_owned()
}

/// The first line a command prints, or "unknown".
fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn git_commit() -> String {
    let commit = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .is_some_and(|o| o.status.success() && !o.stdout.is_empty());
    if dirty && commit != "unknown" { format!("{commit} (with uncommitted changes)") } else { commit }
}

/// The versions of `name` in the compiled-in `Cargo.lock`.
pub fn locked_versions(name: &str) -> Vec<String> {
    let mut versions = Vec::new();
    let mut current: Option<&str> = None;
    for line in CARGO_LOCK.lines() {
        if line.starts_with("[[package]]") {
            current = None;
        } else if let Some(n) = line.strip_prefix("name = ") {
            current = Some(n.trim_matches('"'));
        } else if let Some(v) = line.strip_prefix("version = ")
            && current == Some(name)
        {
            versions.push(v.trim_matches('"').to_owned());
        }
    }
    if versions.is_empty() {
        versions.push("not in Cargo.lock".to_owned());
    }
    versions
}

/// The current UTC time as `YYYY-MM-DD HH:MM:SS`.
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rest / 3600, rest / 60 % 60, rest % 60)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
