"""Large buffers of mixed sizes that grow in place or move (BENCHMARKS.md, "Large blocks
of mixed sizes"): CPython bytearrays of 200 KB-3 MB, six to seven live, one in seven
extended by up to 500 KB (a realloc). Deterministic; prints a digest of what it freed and
the bytes live at the end, the same under every allocator. Run under /usr/bin/time -f %M
with each LD_PRELOAD to compare peak RSS.
"""

import hashlib
import random

r = random.Random(7)
blobs = []
h = hashlib.sha256()
for i in range(3000):
    n = r.randint(200_000, 3_000_000)
    b = bytearray(n)
    b[0] = i & 255
    b[-1] = 7
    blobs.append(b)
    if len(blobs) > 6:
        x = blobs.pop(r.randrange(len(blobs)))
        h.update(bytes(x[:16]))
        h.update(len(x).to_bytes(8, "little"))
    if i % 7 == 0 and blobs:
        y = blobs[r.randrange(len(blobs))]
        y.extend(b"z" * r.randint(1, 500_000))
print(h.hexdigest(), sum(len(b) for b in blobs))
