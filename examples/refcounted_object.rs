//! Counted objects two ways.
//!
//! 1. A service table owned by one thread: readers on other threads enter with
//!    `tryget_live` on a `PercpuRef` (per-CPU, no shared write), and the owner shuts it
//!    down with `kill_and_confirm`, after which no new reader gets in and the last one
//!    out runs `release`.
//! 2. Connections in a `Refcache`: many objects, no owner, references moved between
//!    threads; each connection is freed about two epochs after its last reference is
//!    dropped, and a weak reference (a lookup table's entry, say) can revive it until
//!    then.
//!
//! ```text
//! cargo run --release --example refcounted_object
//! ```

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use scalemem::refcount::{Config, PercpuRef, RcRef, Refcache};

fn service_shutdown() {
    let released = AtomicBool::new(false);
    let service = PercpuRef::new(|| released.store(true, SeqCst)).expect("per-CPU slots");
    let served = AtomicUsize::new(0);
    let refused = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                // Serve until turned away.
                while service.tryget_live() {
                    served.fetch_add(1, SeqCst); // use the service
                    service.put();
                }
                refused.fetch_add(1, SeqCst);
            });
        }
        std::thread::sleep(Duration::from_millis(5));
        service.kill_and_confirm(|_| println!("service: every CPU now sees it as dead"));
    });
    assert!(released.load(SeqCst) && service.is_zero());
    println!("service: {} requests served, then {} workers turned away", served.load(SeqCst), refused.load(SeqCst));
}

struct Connection {
    id: usize,
}

impl Drop for Connection {
    fn drop(&mut self) {
        if self.id.is_multiple_of(1000) {
            println!("connection {} closed", self.id);
        }
    }
}

fn connections() {
    // The default config: a background thread advances epochs every 10 ms.
    let cache = Refcache::with_config(Config::default()).expect("per-CPU caches and the ticker");
    let mut table = Vec::new(); // weak entries: a lookup table that does not keep objects alive
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<RcRef<'_, Connection>>();
        s.spawn(move || {
            // A worker that takes references and drops them on its own CPU.
            for connection in rx {
                let extra = connection.clone();
                assert_eq!(extra.id, connection.id);
            }
        });
        for id in 0..5_000 {
            let connection = cache.alloc(Connection { id });
            table.push(RcRef::downgrade(&connection));
            tx.send(connection).expect("the worker is alive");
        }
    });
    // Revive one entry before its review: the upgrade vetoes the free.
    let revived = table[4_999].upgrade();
    let start = Instant::now();
    while cache.stats().live > usize::from(revived.is_some()) {
        assert!(start.elapsed() < Duration::from_secs(10), "the ticker is not freeing: {:?}", cache.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("connections: all but the revived one freed after {:?} ({:?})", start.elapsed(), cache.stats());
    drop(revived);
    drop(table);
}

fn main() {
    service_shutdown();
    connections();
}
