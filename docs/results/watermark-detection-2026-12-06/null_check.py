"""The weighted detector's null on the run's 10,000 windows, positions and weights (T = 1, with
the prompt), with other noise in place of the run's keyed race: ``iid`` draws fresh i.i.d.
Exp(1) (seeded per chunk: the p-value's own calibration), a number K uses the real PRF under
the key ``bytes([K]) * 32``.  Reads the run's cached probabilities (no model time).

Run: python null_check.py NOISE PART NPARTS  (parts in parallel; writes out/null-NOISE_PART.json,
``[chunk file, window, p]`` per window, and prints the hits at 1% and 0.1%)."""

import glob
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
CACHE = ROOT / "out/watermark-fpr-cache/smollm2-135m-float32-45ef044d"
sys.path.insert(0, str(ROOT))
import research.watermark_detection_field as F  # noqa: E402

from ersd.watermark.settings import Watermark  # noqa: E402

noise, part, nparts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if noise == "iid":
    wm = F.watermark()  # its context windows only: the noise is drawn below
else:
    wm = Watermark(key=bytes([int(noise)]) * 32, version=2, num_salts=256)
out = []
for f in sorted(glob.glob(f"{CACHE}/*.npz"))[part::nparts]:
    z = np.load(f)
    ids = z["ids"]
    p1 = z["p1"].astype(np.float64)
    text, rows = F.chunk_rows(wm, ids)
    if noise == "iid":  # fresh i.i.d. Exp(1): the exact null
        rng = np.random.default_rng(
            [20261206, int(f.rsplit("-", 1)[1].split(".")[0]), int("man-pages" in f)]
        )
        e = rng.exponential(size=(wm.num_salts, len(text)))
    else:
        e = -np.log(wm.prf(0).uniform_at(rows, text, salts=list(range(wm.num_salts))))
    for j in range(F.PER_CHUNK):
        o = j * F.WINDOW
        pos = o + F.first_occurrences(rows[o : o + F.WINDOW])
        out.append([f.rsplit("/", 1)[1], j, F.weighted_p(e[:, pos], p1[pos], wm.num_salts)])
(ROOT / f"out/null-{noise}_{part}.json").write_text(json.dumps(out))
ps = [x[2] for x in out]
print(noise, part, len(ps), sum(p <= 0.01 for p in ps), sum(p <= 0.001 for p in ps))
