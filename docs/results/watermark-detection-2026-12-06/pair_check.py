"""Are the Qwen 1.5B watermarked texts of ``tpr-qwen-1.5b.json`` the Qwen pair's ERSD texts?

They were written by target-only sampling of Qwen2.5-Coder-1.5B (float32) under the study's
key.  This regenerates the first ``--texts`` of each cell with ERSD on the pair (1.5B float32
target <- 0.5B int8 draft, ``chain:4``, the same seeds, prompts and key) and compares the first
``--tokens`` tokens.  Run from the repository root (``D`` this folder):
``PYTHONPATH=. OMP_NUM_THREADS=2 .venv/bin/python $D/pair_check.py > $D/pair_check.txt``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from research.watermark_detection_field import prompts_for, watermark

import ersd

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=2, help="texts per cell")
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    d = json.loads((HERE / "tpr-qwen-1.5b.json").read_text())
    target = ersd.load_model("qwen2.5-coder-1.5b", dtype="float32")
    draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="int8")
    wm = watermark()
    same = total = 0
    for cell in d["cells"]:
        temp, domain = float(cell.split()[0][2:]), cell.split()[1]
        rows = [t for t in d["texts"] if t["T"] == temp and t["domain"] == domain]
        rows = rows[: args.texts]
        prompts = prompts_for(target.tokenizer, domain, len(rows))
        out = ersd.generate_batch(
            target, draft, prompts, seeds=[t["seed"] for t in rows], tree="chain:4",
            max_new_tokens=args.tokens, temperature=temp, watermark=wm,
        )  # fmt: skip
        for t, r in zip(rows, out, strict=True):
            ok = list(r.tokens) == t["tokens"][: args.tokens]
            same += ok
            total += 1
            print(f"{cell} seed {t['seed']}: ERSD (pair, chain:4) == target-only: {ok}")
    print(f"same text: {same}/{total} (first {args.tokens} tokens, float32 <- int8, CPU)")


if __name__ == "__main__":
    main()
