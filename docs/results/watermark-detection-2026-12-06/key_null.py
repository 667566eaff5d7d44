"""The weighted detector's null with other keys on the same 10,000 windows (the real PRF,
fresh keys).  Run: python key_null.py PART NPARTS KEYNO (parts in parallel; out/keyK_P.json)."""

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

part, nparts, keyno = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
wm = Watermark(key=bytes([keyno]) * 32, version=2, num_salts=256)
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
    u = wm.prf(0).uniform_at(rows, text, salts=list(range(wm.num_salts)))
    e = -np.log(u)
    for j in range(F.PER_CHUNK):
        o = j * F.WINDOW
        pos = o + F.first_occurrences(rows[o : o + F.WINDOW])
        out.append([f.rsplit("/", 1)[1], j, F.weighted_p(e[:, pos], p1[pos], wm.num_salts)])
(ROOT / f"out/key{keyno}_{part}.json").write_text(json.dumps(out))
ps = [x[2] for x in out]
print(keyno, part, len(ps), sum(p <= 0.01 for p in ps), sum(p <= 0.001 for p in ps))
