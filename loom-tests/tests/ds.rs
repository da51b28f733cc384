//! loom models of the data structures of `scalemem::ds` under both reclamation schemes:
//! the Treiber stack and the Michael-Scott queue, each with epoch-based reclamation and
//! with hazard pointers (the global domain, through the thread-local record cache). Each
//! model checks that values come out once (and, for the queue, in order). Every node
//! embeds a canary cell that readers touch after reaching it and that its drop writes, so
//! a node freed while another thread may still read it is a causality violation.
#![cfg(scalemem_loom)]

use loom::sync::Arc;
use loom::thread;

use scalemem::ds::{MsQueue, TreiberStack};
use scalemem::reclaim::{Ebr, Hazard, Reclaim};
use scalemem_loom_tests::run_model;

fn stack_model<R: Reclaim + Default + Send + 'static>() {
    let stack = Arc::new(TreiberStack::<usize, R>::new());
    stack.push(0);
    let threads: Vec<_> = (1..=2)
        .map(|t| {
            let stack = stack.clone();
            thread::spawn(move || {
                stack.push(t);
                let popped = stack.pop();
                R::default().flush(); // reclaim while the other thread may still read
                popped
            })
        })
        .collect();
    let mut seen: Vec<usize> = threads.into_iter().filter_map(|t| t.join().unwrap()).collect();
    while let Some(v) = stack.pop() {
        seen.push(v);
    }
    R::default().flush();
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2]);
}

fn queue_model<R: Reclaim + Default + Send + 'static>() {
    // One producer, two consumers (a thread and main), each consumer reclaiming right
    // after its pop, so a sentinel is freed while the other consumer may still read it.
    let queue = Arc::new(MsQueue::<usize, R>::new());
    let producer = {
        let queue = queue.clone();
        thread::spawn(move || {
            queue.push(1);
            queue.push(2);
        })
    };
    let consumer = {
        let queue = queue.clone();
        thread::spawn(move || {
            let got = queue.pop();
            R::default().flush();
            got
        })
    };
    let mine = queue.pop();
    R::default().flush();
    producer.join().unwrap();
    let theirs = consumer.join().unwrap();
    for got in [mine, theirs] {
        // Each consumer saw the values in order: a lone pop of 2 means 1 went elsewhere.
        if got == Some(2) {
            assert!(mine == Some(1) || theirs == Some(1), "2 dequeued before 1");
        }
    }
    let mut seen: Vec<usize> = [mine, theirs].into_iter().flatten().collect();
    while let Some(v) = queue.pop() {
        seen.push(v);
    }
    R::default().flush();
    seen.sort_unstable();
    assert_eq!(seen, [1, 2]);
}

#[test]
fn treiber_stack_under_epoch() {
    run_model("ds: treiber stack, epoch", stack_model::<Ebr>);
}

#[test]
fn treiber_stack_under_hazard_pointers() {
    run_model("ds: treiber stack, hazard pointers", stack_model::<Hazard>);
}

#[test]
fn ms_queue_under_epoch() {
    run_model("ds: michael-scott queue, epoch", queue_model::<Ebr>);
}

#[test]
fn ms_queue_under_hazard_pointers() {
    run_model("ds: michael-scott queue, hazard pointers", queue_model::<Hazard>);
}
