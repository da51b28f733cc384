// ci/preload.sh: node (V8, libuv's thread pool, worker threads) with and without
// LD_PRELOAD=libscalemem.so; the output must match. V8 keeps its JavaScript heap in its
// own mappings, but its compiler, its embedder's buffers, zlib and the worker threads'
// isolates go through malloc; strings and maps cross threads as structured clones.
"use strict";
const { Worker, isMainThread, parentPort, workerData } = require("worker_threads");
const crypto = require("crypto");
const zlib = require("zlib");

function work(seed) {
  let x = seed >>> 0;
  const next = () => (x = (Math.imul(x, 1103515245) + 12345) >>> 0);
  const table = new Map();
  for (let i = 0; i < 60000; i++) {
    const k = "k" + (next() % 20000);
    table.set(k, { n: i, s: "v".repeat(next() % 200), a: [i, i * 2, i * 3] });
  }
  for (let i = 0; i < 20000; i++) table.delete("k" + (next() % 20000));
  const keys = [...table.keys()].sort();
  const text = JSON.stringify(keys.map((k) => [k, table.get(k).n, table.get(k).s.length]));
  // Buffers live outside V8's heap (ArrayBuffer backing stores go through malloc).
  const bufs = [];
  for (let i = 0; i < 200; i++) bufs.push(Buffer.alloc(1 + (next() % 70000), i & 255));
  const packed = zlib.deflateSync(Buffer.from(text));
  const back = zlib.inflateSync(packed).toString();
  if (back !== text) throw new Error("zlib round trip changed the data");
  const h = crypto.createHash("sha256").update(text);
  for (const b of bufs) h.update(b);
  return { seed, entries: keys.length, hash: h.digest("hex") };
}

if (isMainThread) {
  const seeds = [1, 2, 3, 4, 5, 6, 7, 8];
  const results = seeds.map(
    (seed) =>
      new Promise((resolve, reject) => {
        const w = new Worker(__filename, { workerData: seed });
        w.on("message", resolve);
        w.on("error", reject);
      })
  );
  // The thread pool too: async hashing and compression of large buffers.
  const big = Buffer.alloc(8 << 20, 7);
  const pool = new Promise((resolve, reject) =>
    zlib.gzip(big, (err, gz) => (err ? reject(err) : resolve(crypto.createHash("sha256").update(gz).digest("hex"))))
  );
  Promise.all([...results, pool]).then((all) => {
    for (const r of all) console.log(typeof r === "string" ? "gzip " + r : `${r.seed} ${r.entries} ${r.hash}`);
    console.log("main", JSON.stringify(work(99)));
  });
} else {
  parentPort.postMessage(work(workerData));
}
