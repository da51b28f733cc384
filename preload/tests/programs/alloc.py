"""ci/preload.sh: an allocation-heavy, deterministic workload on 8 threads.

Run with PYTHONMALLOC=malloc (every object through malloc), with and without
LD_PRELOAD=libscalemem.so; the output must match. Blocks cross threads: one thread's
results are freed by another.
"""

import collections
import concurrent.futures
import hashlib
import json
import random
import re
import zlib


def work(seed):
    rnd = random.Random(seed)
    table = {}
    for i in range(20000):
        key = "".join(rnd.choice("abcdefghij") for _ in range(rnd.randint(1, 10)))
        table.setdefault(key, []).append(round(i * rnd.random(), 6))
    text = json.dumps(table, sort_keys=True)
    assert json.loads(text) == table
    words = collections.Counter(re.findall(r"[a-c]+", text))
    blobs = [rnd.randbytes(rnd.randint(500, 5000)) for _ in range(300)]
    packed = zlib.compress(b"".join(blobs) + text.encode(), 6)
    assert zlib.decompress(packed).endswith(text.encode())
    grown = []
    for i in range(2000):
        grown.append("x" * (i % 700))
        if i % 3 == 0:
            grown.pop(rnd.randrange(len(grown)))
    digest = hashlib.sha256()
    digest.update(text.encode())
    digest.update(repr(sorted(words.most_common(40))).encode())
    digest.update(b"".join(blobs))
    digest.update("".join(grown).encode())
    return seed, len(table), len(text), digest.hexdigest(), table


def main():
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(16)))
    merged = {}
    for seed, keys, size, digest, table in results:
        print(seed, keys, size, digest)
        for k, v in table.items():
            merged.setdefault(k, []).extend(v)
    del results
    print(len(merged), sum(len(v) for v in merged.values()))


main()
