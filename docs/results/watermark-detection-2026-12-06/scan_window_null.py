"""The localized scan's null on 10,000 short inputs: every 128-token window of the run's 1,250
chunks scanned alone (no prompt, lengths 32 / 64 / 128, scored from the 5th token on), the
scan's corrected p-value and the broken one without the window correction.  Section 1 measured
the scan on the chunks' 1,250 documents of 1,024 tokens; this gives it the same 10,000 windows
as the other modes.  Reads the token ids of the run's cache (no model); the first windows are
also run through the library's ``scan`` and the script stops on any difference.

Run from the repository root (``D`` this folder): ``python $D/scan_window_null.py`` (under a
minute on one core; writes scan-windows.json here)."""

import glob
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CACHE = ROOT / "out/watermark-fpr-cache/smollm2-135m-float32-45ef044d"
sys.path.insert(0, str(ROOT))
import research.watermark_detection_field as F  # noqa: E402

from ersd.watermark.localize import scan  # noqa: E402

CHECK = 16  # windows checked against the library


def main() -> None:
    wm = F.watermark()
    h, k = wm.context_width, wm.num_salts
    files = sorted(glob.glob(f"{CACHE}/*.npz"))
    if len(files) != 1250:
        raise SystemExit(f"{CACHE}: {len(files)} chunks cached, not 1,250: run the fpr part first")
    rows_out = []
    t0 = time.perf_counter()
    for f in files:
        ids = np.load(f)["ids"]
        text, rows = F.chunk_rows(wm, ids)
        g = -np.log1p(-wm.prf(0).uniform_at(rows, text, salts=list(range(k))))
        for j in range(F.PER_CHUNK):
            o = j * F.WINDOW
            pos = o + h + F.first_occurrences(rows[o + h : o + F.WINDOW])  # the window alone
            ok, broken = F.scan_p(g[:, pos], k)
            if len(rows_out) < CHECK:
                lib = scan(text[o : o + F.WINDOW].tolist(), wm, min_tokens=1).p_value
                if not np.isclose(lib, ok, rtol=1e-9, atol=0):
                    raise SystemExit(f"{f} window {j}: library {lib} != {ok}")
            source = Path(f).name.rsplit("-", 1)[0]
            rows_out.append([source, Path(f).name, j, ok, broken])
    res = {
        "what": "every 128-token window of the fpr run's chunks scanned alone (no prompt)",
        "windows": len(rows_out),
        "seconds": time.perf_counter() - t0,
        "checked_against_library": CHECK,
        "modes": {},
    }
    for mode, col in (("scan_window_no_prompt", 3), ("BROKEN_scan_window_uncorrected", 4)):
        for source in (None, "man-pages", "pypi-docstrings"):
            ps = np.array([r[col] for r in rows_out if source is None or r[0] == source])
            res["modes"][mode + ("" if source is None else f" ({source})")] = {
                "n": int(ps.size),
                "fpr_1pct": F.rate(int((ps <= 0.01).sum()), ps.size),
                "fpr_0.1pct": F.rate(int((ps <= 0.001).sum()), ps.size),
                "ks_pvalue": float(stats.kstest(ps, "uniform").pvalue),
            }
    res["p_values"] = [[r[1], r[2], round(r[3], 6), round(r[4], 6)] for r in rows_out]
    (HERE / "scan-windows.json").write_text(json.dumps(res, indent=1))
    for mode, m in res["modes"].items():
        print(
            f"| {mode} | {m['n']} | {F.fmt_rate(m['fpr_1pct'])} | {F.fmt_rate(m['fpr_0.1pct'])} "
            f"| {m['ks_pvalue']:.3g} |"
        )


if __name__ == "__main__":
    main()
