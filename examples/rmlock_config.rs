//! A routing table read on every request and updated rarely, behind
//! [`scalemem::rmlock::RmLock`].
//!
//! `cargo run --release --example rmlock_config` runs request threads that route paths
//! by longest prefix while an administrator thread publishes a new table every few
//! milliseconds, and checks that no request ever sees a half-updated table.
//! `EXAMPLE_SECS` (default 1) and `EXAMPLE_THREADS` (default 8) change the run.
//!
//! The pattern: readers hold the read guard only while they look the route up and copy
//! out what they need (here an address and a table version); the administrator builds
//! the new table *outside* the lock, swaps it in under a short write guard, and drops
//! the old table after releasing the lock, so the writer holds the lock for a pointer
//! swap and readers never wait for an allocation or a free.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use scalemem::rmlock::RmLock;

/// Where requests for a prefix go.
#[derive(Clone, Debug)]
struct Backend {
    address: String,
    /// The version of the table this entry was published in: every entry of a table
    /// carries the table's version, which is what a request checks.
    version: u64,
}

/// Path prefix to backend. A table is replaced as a whole.
#[derive(Debug)]
struct RoutingTable {
    version: u64,
    routes: HashMap<String, Backend>,
}

impl RoutingTable {
    /// Table `version`: the same prefixes, spread over the pool of backends differently.
    fn build(version: u64) -> Self {
        const PREFIXES: [&str; 6] = ["/", "/api", "/api/v2", "/static", "/users", "/users/admin"];
        let routes = PREFIXES
            .iter()
            .enumerate()
            .map(|(i, prefix)| {
                let host = (i as u64 + version) % 4;
                let backend = Backend { address: format!("10.0.0.{host}:8080"), version };
                (prefix.to_string(), backend)
            })
            .collect();
        Self { version, routes }
    }

    /// The backend of the longest prefix of `path`.
    fn route(&self, path: &str) -> Option<&Backend> {
        let mut end = path.len();
        loop {
            if let Some(backend) = self.routes.get(&path[..end]) {
                return Some(backend);
            }
            end = path[..end].rfind('/')?;
            if end == 0 {
                return self.routes.get("/");
            }
        }
    }
}

/// The table every request reads. `RmLock::new` maps memory, so it is not `const`: a
/// static lock goes in a `LazyLock`.
static ROUTES: LazyLock<RmLock<RoutingTable>> = LazyLock::new(|| RmLock::new(RoutingTable::build(0)));

/// One request: route `path`, returning the backend's address and the table version.
fn handle(path: &str) -> (String, u64) {
    let table = ROUTES.read();
    let backend = table.route(path).expect("\"/\" routes everything");
    // The invariant a torn update would break: an entry's version is its table's.
    assert_eq!(backend.version, table.version, "a request saw a half-updated table");
    (backend.address.clone(), table.version)
}

fn main() {
    let secs: f64 = std::env::var("EXAMPLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let threads: usize = std::env::var("EXAMPLE_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let paths = ["/api/v2/orders", "/api/health", "/static/app.js", "/users/admin/audit", "/users/42", "/about"];
    let requests = AtomicU64::new(0);
    let newest_seen = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let started = Instant::now();

    let (updates, write_time, worst_write) = std::thread::scope(|s| {
        for t in 0..threads {
            let (requests, newest_seen, stop) = (&requests, &newest_seen, &stop);
            s.spawn(move || {
                let mut served = 0u64;
                let mut last_version = 0;
                while !stop.load(Relaxed) {
                    let (address, version) = handle(paths[(served as usize + t) % paths.len()]);
                    // Versions only move forward for one thread: a write is visible to
                    // every read that starts after it.
                    assert!(version >= last_version, "a request went back to an older table");
                    last_version = version;
                    std::hint::black_box(address);
                    served += 1;
                }
                requests.fetch_add(served, Relaxed);
                newest_seen.fetch_max(last_version, Relaxed);
            });
        }

        // The administrator: a new table every 5 ms, built outside the lock.
        let mut updates = 0u64;
        let mut write_time = Duration::ZERO;
        let mut worst_write = Duration::ZERO;
        while started.elapsed().as_secs_f64() < secs {
            std::thread::sleep(Duration::from_millis(5));
            updates += 1;
            let new_table = RoutingTable::build(updates);
            let start = Instant::now();
            let old_table = std::mem::replace(&mut *ROUTES.write(), new_table);
            let took = start.elapsed();
            drop(old_table); // freed after the write guard is gone
            write_time += took;
            worst_write = worst_write.max(took);
        }
        stop.store(true, Relaxed);
        (updates, write_time, worst_write)
    });

    let elapsed = started.elapsed().as_secs_f64();
    let requests = requests.load(Relaxed);
    assert_eq!(ROUTES.read().version, updates);
    assert!(newest_seen.load(Relaxed) <= updates);
    println!(
        "{threads} request threads, {secs} s: {requests} requests ({:.1} M/s), {updates} table updates \
         (write lock acquire + swap {:.1} us on average, {:.1} us at worst), no torn reads",
        requests as f64 / elapsed / 1e6,
        write_time.as_secs_f64() * 1e6 / updates.max(1) as f64,
        worst_write.as_secs_f64() * 1e6,
    );
}
