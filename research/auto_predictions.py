"""What ``tree="auto"`` chooses, and predicts, per batch size: a table for reports.

    python -m research.auto_predictions                      # built-in curves, example profile
    python -m research.auto_predictions --calibration calib.json --batch-sizes 1 4 8
    python -m research.auto_predictions --measure qwen2.5-coder-1.5b qwen2.5-coder-0.5b \
        --backend llamacpp --batch-sizes 1 4 8 --json out.json

Curves: ``llamacpp-2core`` is the llama.cpp curve measured on this 2-core machine (issue 15:
Qwen2.5-Coder 1.5B / 0.5B Q4_K_M, ms per decode of 1/2/4/8 tokens); ``flat`` a curve where 8
tokens cost 1.3× one (a many-core CPU or a GPU); ``--measure`` times real models
(:func:`ersd.costs.measure_costs`, fresh sessions, batched forwards where the backend has them).
The profile is a calibration / rank-profile file's or an example one (P(R = r) below).
No model is loaded unless ``--measure`` is given.
"""

from __future__ import annotations

import argparse
import json

from ersd.auto import TreeChooser
from ersd.costs import CostModel
from ersd.methods import get_method
from ersd.tree import AutoTree

SIZES = [1, 2, 4, 8]
CURVES = {
    "llamacpp-2core": CostModel(
        sizes=SIZES, target=[0.063, 0.110, 0.214, 0.472], draft=[0.030, 0.053, 0.082, 0.155]
    ),
    "flat": CostModel(
        sizes=SIZES, target=[0.020, 0.021, 0.023, 0.026], draft=[0.006, 0.006, 0.007, 0.008]
    ),
}
#: example rank profile (a Qwen-like pair at T = 1): P(R = 1), P(R = 2), ...
EXAMPLE_PROFILE = [[0.72, 0.1, 0.04, 0.02, 0.01]]


def table(costs: CostModel, profile, batch_sizes: list[int]) -> list[dict]:
    ersd_m = get_method("ersd")
    rows = []
    for b in batch_sizes:
        chooser = TreeChooser(
            AutoTree(profile=profile, costs=costs), None, None, ersd_m, ersd_m, 1.0
        )
        chooser.choose([0], batch=b)
        c = chooser.last
        assert c is not None
        rows.append(c.to_dict())
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calibration", help="calibration or rank-profile file (profile and costs)")
    ap.add_argument("--measure", nargs=2, metavar=("TARGET", "DRAFT"), help="measure these models")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--json", help="also write the tables here")
    args = ap.parse_args()
    profile = args.calibration or EXAMPLE_PROFILE
    curves = dict(CURVES)
    if args.calibration:
        from ersd.theory.profile import load_profiles

        data = load_profiles(args.calibration).data.get("costs")
        if data:
            curves = {"calibration": CostModel.from_dict(data)}
    if args.measure:
        import ersd
        from ersd.costs import measure_costs

        opts = {"backend": args.backend}
        if args.backend != "llamacpp":
            opts["dtype"] = args.dtype
        target = ersd.load_model(args.measure[0], **opts)
        draft = ersd.load_model(args.measure[1], **opts)
        ids = target.tokenizer.encode("def fibonacci(n):\n    " * 8)
        curves = {
            "measured": measure_costs(target, draft, ids, SIZES, 2, batch_sizes=args.batch_sizes)
        }
    out = {}
    for name, costs in curves.items():
        rows = table(costs, profile, args.batch_sizes)
        out[name] = {"costs": costs.to_dict(), "choices": rows}
        print(f"\n{name}: target ms {[round(t * 1e3, 1) for t in costs.target]} for {SIZES} tokens")
        print("batch | auto chose | predicted tok/s | target-only tok/s | best tree (tok/s)")
        for r in rows:
            best = f"{r['best_tree']} ({r['best_tree_predicted']:.1f})" if r["best_tree"] else "-"
            print(
                f"{r['batch']:>5} | {r['tree']:>10} | {r['predicted']:>15.1f} | "
                f"{r['target_only']:>17.1f} | {best}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
