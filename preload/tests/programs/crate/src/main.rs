//! Threads that build maps, strings and vectors and hand them to each other; the
//! output is a checksum per thread, the same under any correct malloc.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;
use std::thread;

fn work(seed: u64, to_next: mpsc::Sender<Vec<String>>, from_prev: mpsc::Receiver<Vec<String>>) -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut map: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut words: HashMap<String, usize> = HashMap::new();
    let mut sum = 0u64;
    for round in 0..20 {
        let batch: Vec<String> =
            (0..2000).map(|_| format!("{:x}", next() % 100_000).repeat(1 + (next() % 8) as usize)).collect();
        to_next.send(batch).unwrap();
        for s in from_prev.recv().unwrap() {
            *words.entry(s).or_default() += 1;
        }
        for _ in 0..3000 {
            let k = next() % 5000;
            let len = (next() % 3000) as usize;
            map.entry(k).or_default().extend(std::iter::repeat_n((k % 251) as u8, len));
            if next() % 4 == 0 {
                map.remove(&(next() % 5000));
            }
        }
        sum = sum.wrapping_add(map.values().map(|v| v.len() as u64).sum::<u64>() * (round + 1));
    }
    let mut keys: Vec<_> = words.into_iter().collect();
    keys.sort();
    keys.iter().fold(sum, |h, (k, n)| h.wrapping_mul(31).wrapping_add(k.len() as u64 * *n as u64))
}

fn main() {
    const THREADS: usize = 8;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel()).unzip();
    let mut receivers: Vec<Option<_>> = receivers.into_iter().map(Some).collect();
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let to_next = senders[(i + 1) % THREADS].clone();
            let from_prev = receivers[i].take().unwrap();
            thread::spawn(move || work(i as u64 + 1, to_next, from_prev))
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        println!("thread {i}: {:016x}", h.join().unwrap());
    }
}
