"""The scored rows' finiteness check: entry-wise ``isfinite().all()`` (before issue 28) against one
sum (``ersd.models.checks.all_finite``), alternating, on the shapes a Qwen chain:4 step checks."""

import statistics
import time

import torch

from ersd.models.checks import all_finite


def entrywise(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


res: dict[tuple[int, str], list[float]] = {}
for rows in (1, 5):
    x = torch.randn(rows, 151936)
    for rep in range(30):
        pair = [("before", entrywise), ("new", all_finite)]
        for name, f in pair if rep % 2 == 0 else pair[::-1]:
            t0 = time.perf_counter()
            assert f(x)
            res.setdefault((rows, name), []).append((time.perf_counter() - t0) * 1e3)
print(f"torch threads {torch.get_num_threads()}")
for (rows, name), v in res.items():
    print(f"[{rows}, 151936] {name:>6}: median {statistics.median(v):.3f} ms (30 runs)")
