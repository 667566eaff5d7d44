"""A variant of auto's acceptance estimate tried on the replay (replay.py) and not kept:
acceptance by **run length** -- the number of consecutive accepted positions before a token --
instead of by depth in the tree, so that a prompt's hard start (short runs) would not hold down
the estimate of a long easy stretch (long runs).

Over the 20 recorded prompts P(agree | run length) rises from 0.71 (right after a disagreement)
to 0.96 (12 or more agreements before it), and 0.96-0.98 on code, maths and editing.  The
variant keeps per-bucket rank counts (buckets of run lengths, EDGES), each shrunk towards the
pool of all runs >= 1 as the library shrinks depths towards the observations made right after
an accepted token; a step from a row whose run is s predicts depth d from bucket(s + d).  After
a rejection (s = 0) or a step without drafting the root is estimated over all roots, as in the
library.  A full acceptance counts the bonus token as agreeing until the next step's draft says
otherwise (observe_beyond).

    ../../../.venv/bin/python runlength.py agree-128.json > runlength.md
"""

import json
import sys

import numpy as np
import replay as R

import ersd.auto as A
from ersd.auto import MAX_RANK, OnlineProfile, TreeChooser

DEPTHS = 17  # estimates returned for depths 1..16 (and below)
BUCKETS = {  # name: run-length bucket edges
    "runs 0,1,2,3,4,6,8,12,16,24,32,48": [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48],
    "runs 0,1,3,8,16": [0, 1, 3, 8, 16],
    "runs 0,1,4,12": [0, 1, 4, 12],
    "runs 0,2,8": [0, 2, 8],
    "runs 0,8": [0, 8],
}


def run_of(state):
    """A row's run length from the chooser's per-row state (an int here; None or a bool: 0)."""
    return state if isinstance(state, int) and not isinstance(state, bool) else 0


def profile_class(edges, decay):
    def bucket(r):
        return max(i for i, e in enumerate(edges) if r >= e)

    class RunProfile(OnlineProfile):
        def __init__(self, ranked, prior_probs=None, prior_trials=None):
            super().__init__(ranked, prior_probs, prior_trials)
            self.bc = np.zeros((len(edges), MAX_RANK))
            self.bn = np.zeros(len(edges))
            self.rc = np.zeros(MAX_RANK)  # roots, whatever their run
            self.rn = 0.0

        def _obs(self, rho, rank):
            b = bucket(rho)
            self.bn[b] += 1
            if rank is not None and 1 <= rank <= MAX_RANK:
                self.bc[b][rank - 1] += 1

        def _step(self, root_rank):
            self.bc *= decay
            self.bn *= decay
            self.rc *= decay
            self.rn *= decay
            self.rn += 1
            if root_rank is not None and 1 <= root_rank <= MAX_RANK:
                self.rc[root_rank - 1] += 1

        def observe_chain(self, accepted, depth, state=None):
            super().observe_chain(accepted, depth, None)
            s = run_of(state)
            if depth > 0:
                self._step(1 if accepted > 0 else None)
            for d in range(min(accepted + 1, depth)):
                self._obs(s + d, 1 if d < accepted else None)

        def observe_beyond(self, depth, rank, state=0):
            if depth >= 2:
                self._obs(state + depth - 1, 1 if rank == 1 else None)

        def depth_probs(self, states=None):
            w = A.PRIOR_WEIGHT
            total, n_all = self.bc.sum(0), self.bn.sum()
            pool = (total + w * self.prior) / (n_all + w)
            after, n_after = self.bc[1:].sum(0), self.bn[1:].sum()

            def est(b):
                c, n = self.bc[b], self.bn[b]
                if b == 0:
                    return (c + w * pool) / (n + w)
                return (c + w * (after - c + w * pool) / (n_after - n + w)) / (n + w)

            root = (self.rc + w * pool) / (self.rn + w)
            rows = []
            for st in states if states is not None else [None]:
                s = run_of(st)
                rows.append(
                    [root if s == 0 else est(bucket(s))]
                    + [est(bucket(s + d)) for d in range(1, DEPTHS)]
                )
            return [sum(r[d] for r in rows) / len(rows) for d in range(DEPTHS)]

    return RunProfile


lib_observe, lib_beyond = TreeChooser.observe, TreeChooser.observe_beyond


def observe(self, ranks, accepted, depth, row=None):
    s = run_of(self._after.get(row))
    out = lib_observe(self, ranks, accepted, depth, row)
    self._after[row] = (s + depth + 1 if accepted >= depth else 0) if depth > 0 else None
    self._profile_version += 1
    return out


def observe_beyond(self, depth, rank):
    if not self.learns_beyond:
        return
    s = run_of(self._after.get(self._last_row))  # the bonus sat at run s - 1
    self.online.observe_beyond(depth, rank, max(s - depth, 0))
    if rank != 1:
        self._after[self._last_row] = 0
    self._learned += 1
    self._profile_version += 1


def settings(data, sets, prior):
    out = []
    for c in R.COSTS:
        for n in R.LENGTHS:
            r = R.evaluate(data, n, R.cost_model(c), R.PRIORS[prior], "library")
            out.append([r[s]["per_mean"] for s in sets])
    return np.array(out)


def main():
    with open(sys.argv[1]) as f:
        data = json.load(f)
    sets = sorted({d["set"] for d in data.values()})
    print("# Acceptance by run length, replayed (runlength.py)\n")
    print(
        "Auto ÷ each prompt's own best fixed chain, mean over a category's prompts; each cell is "
        "the range over the four settings (curve / steps costs × 96 / 128 tokens), stored-code "
        "prior. **Δ**: the variant less the library, the lowest over the settings.\n"
    )
    print("| estimate | " + " | ".join(sets) + " | all (mean) | Δ per category (min) |")
    print("|---|" + "---|" * (len(sets) + 2))
    lib = settings(data, sets, "stored-code")

    def row(name, res, delta):
        cells = " | ".join(f"{res[:, i].min():.3f}–{res[:, i].max():.3f}" for i in range(len(sets)))
        d = " ".join(f"{x:+.3f}" for x in (res - lib).min(0)) if delta else ""
        print(f"| {name} | {cells} | {res.mean():.4f} | {d} |", flush=True)

    row("library (by depth, Markov root)", lib, False)
    for name, edges in BUCKETS.items():
        for decay in (1.0, 0.97):
            R.OnlineProfile = profile_class(edges, decay)
            TreeChooser.observe, TreeChooser.observe_beyond = observe, observe_beyond
            try:
                res = settings(data, sets, "stored-code")
            finally:
                R.OnlineProfile = OnlineProfile
                TreeChooser.observe, TreeChooser.observe_beyond = lib_observe, lib_beyond
            row(name + (f", recency {decay}" if decay < 1 else ""), res, True)


if __name__ == "__main__":
    main()
