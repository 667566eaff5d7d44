"""The weighted detector's null with fresh i.i.d. Exp(1) in place of the keyed race, on the same
10,000 windows, positions and weights (the p-value's own calibration).  Run: python
synth_null.py PART NPARTS (parts in parallel; out/synth_P.json)."""

import glob
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
CACHE = ROOT / "out/watermark-fpr-cache/smollm2-135m-float32-45ef044d"
sys.path.insert(0, str(ROOT))
import research.watermark_detection_field as F  # noqa: E402

part, nparts = int(sys.argv[1]), int(sys.argv[2])
wm = F.watermark()
h = wm.context_width
files = sorted(glob.glob(f"{CACHE}/*.npz"))[part::nparts]
out = []
for f in files:
    z = np.load(f)
    ids = z["ids"]
    p1 = z["p1"].astype(np.float64)
    text = ids[F.PREFIX :]
    padded = np.concatenate([np.asarray(wm.initial_window(ids[: F.PREFIX].tolist())), text])
    rows = np.lib.stride_tricks.sliding_window_view(padded, h)[: len(text)]
    rng = np.random.default_rng(
        [20261206, int(f.rsplit("-", 1)[1].split(".")[0]), int("man-pages" in f)]
    )
    e = rng.exponential(size=(wm.num_salts, len(text)))  # fresh i.i.d. Exp(1): the exact null
    for j in range(F.PER_CHUNK):
        o = j * F.WINDOW
        pos = o + F.first_occurrences(rows[o : o + F.WINDOW])
        out.append(F.weighted_p(e[:, pos], p1[pos], wm.num_salts))
(ROOT / f"out/synth_{part}.json").write_text(json.dumps(out))
print(part, len(out), sum(p <= 0.01 for p in out), sum(p <= 0.001 for p in out))
