"""tree="auto" measures once and keeps it (ersd.cost_store), never drafts where drafting cannot
pay, explores within a time budget, and prefills the draft only when a step drafts.

Decisions are made deterministic by explicit cost models and a fake clock (the step times given
to ``TreeChooser.observe_times``); the store's environment is a function the tests replace to
simulate another CPU, another build or another thread count."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
import torch

import ersd
from ersd.auto import RULES, CurveCache, TreeChooser
from ersd.cost_store import CostStore, model_key
from ersd.costs import DEFAULT_SIZES, CostModel
from ersd.drafting import ModelDrafter
from ersd.methods import get_method
from ersd.tree import AutoTree
from tests.toy import mixed_draft, table_model

V = 30
SIZES = [1, 2, 4, 8]
#: the llama.cpp curve of a 2-core CPU (issue 15): each extra token costs almost a forward
STEEP = CostModel(
    sizes=SIZES, target=[0.063, 0.110, 0.214, 0.472], draft=[0.030, 0.053, 0.082, 0.155]
)
#: a flat target and a cheap draft, with a per-step overhead: drafting pays only for a good draft
FLAT = CostModel(sizes=SIZES, target=[0.1] * 4, draft=[0.001] * 4, overhead=0.7)
ENV = {"cpu": "Fake CPU", "cpu_flags": "aaaa", "torch": "2.13.0", "torch_threads": 2}


class Described(ersd.FunctionModel):
    """A function model with a stable identity, as a Hugging Face model has."""

    def __init__(self, name: str, seed: int = 0) -> None:
        table = table_model(V, seed)
        super().__init__(table.fn, V)
        self.name = name

    def describe(self) -> dict[str, Any]:
        return {"backend": "hf", "name": self.name, "dtype": "float32"}


def store(tmp_path, env: dict[str, Any] | None = None) -> CostStore:
    e = dict(env or ENV)
    return CostStore(tmp_path, env=lambda: e)


def chooser(auto: AutoTree, curves: CurveCache | None = None) -> TreeChooser:
    m = get_method("ersd")
    return TreeChooser(auto, None, None, m, m, 1.0, curves)


# --- the store --------------------------------------------------------------------------------


def test_a_curve_is_measured_once_and_read_back_by_a_later_process(tmp_path) -> None:
    """A cache that learns keeps what it measured; one that does not (the default) measures
    the same and leaves the store as it found it."""
    model = Described("test/a")
    reader = CurveCache(store=store(tmp_path))
    assert not reader.learn and len(reader.curve(model, [1, 2, 3], 1)) == len(DEFAULT_SIZES)
    assert reader.measurements == 1 and not (tmp_path / "costs.json").exists()
    first = CurveCache(store=store(tmp_path), learn=True)
    curve = first.curve(model, [1, 2, 3], 1)
    assert first.measurements == 1 and first.measure_seconds > 0 and model.forward_calls > 0
    data = json.loads((tmp_path / "costs.json").read_text())
    assert len(data["curves"]) == 1
    entry = next(iter(data["curves"].values()))
    assert entry["seconds"] == curve and entry["env"] == ENV
    # a later process (a new cache, a new store object on the same directory) measures nothing
    calls = model.forward_calls
    later = CurveCache(store=store(tmp_path), learn=True)
    assert later.curve(model, [7, 8], 1) == curve
    assert later.measurements == 0 and later.measure_seconds == 0.0 and later.store is not None
    assert later.store.hits == 1 and model.forward_calls == calls
    # another batch size or another model is another entry
    later.curve(model, [1, 2, 3], 2)
    later.curve(Described("test/b"), [1, 2, 3], 1)
    assert later.measurements == 2
    assert len(json.loads((tmp_path / "costs.json").read_text())["curves"]) == 3


@pytest.mark.parametrize(
    "changed",
    [
        {"cpu_flags": "bbbb"},
        {"cpu": "Other CPU"},
        {"torch": "2.14.0"},
        {"torch_threads": 4},
        {"curve_rounds": "blocked x2"},
    ],
    ids=["cpu-flags", "cpu", "build", "threads", "older-measuring"],
)
def test_a_stale_curve_is_remeasured_never_trusted(tmp_path, changed) -> None:
    model = Described("test/a")
    CurveCache(store=store(tmp_path), learn=True).curve(model, [1, 2, 3], 1)
    # poison the stored seconds: a stale entry must not be read, whatever it says
    path = tmp_path / "costs.json"
    data = json.loads(path.read_text())
    for entry in data["curves"].values():
        entry["seconds"] = [123.0] * len(DEFAULT_SIZES)
    path.write_text(json.dumps(data))
    calls = model.forward_calls
    elsewhere = CurveCache(store=store(tmp_path, {**ENV, **changed}), learn=True)
    curve = elsewhere.curve(model, [1, 2, 3], 1)
    assert elsewhere.measurements == 1 and model.forward_calls > calls
    assert curve != [123.0] * len(DEFAULT_SIZES) and elsewhere.store is not None
    assert elsewhere.store.stale == 1
    entry = next(iter(json.loads(path.read_text())["curves"].values()))
    assert entry["env"] == {**ENV, **changed} and entry["seconds"] == curve  # replaced
    # the same environment reads the poisoned entry back: proof the check above is the env's
    same = CurveCache(store=store(tmp_path, {**ENV, **changed}), learn=True)
    assert same.curve(model, [1], 1) == curve and same.measurements == 0


def test_models_without_an_identity_are_not_stored_and_bad_files_are_rewritten(
    tmp_path, caplog
) -> None:
    toy = table_model(V, 0)  # a Python function: no stable identity
    assert model_key(toy) is None and model_key(Described("x")) is not None
    cache = CurveCache(store=store(tmp_path), learn=True)
    cache.curve(toy, [1, 2], 1)
    assert not (tmp_path / "costs.json").exists()
    (tmp_path / "costs.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="ersd"):
        CurveCache(store=store(tmp_path), learn=True).curve(Described("x"), [1, 2], 1)
    assert "unreadable" in caplog.text
    assert len(json.loads((tmp_path / "costs.json").read_text())["curves"]) == 1


def test_an_unwritable_store_warns_once_and_still_measures(tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = CurveCache(
        store=store(blocker / "sub"), learn=True
    )  # a directory below a file: not creatable
    with caplog.at_level(logging.WARNING, logger="ersd"):
        a = cache.curve(Described("x"), [1, 2], 1)
        cache.curve(Described("y"), [1, 2], 1)
    assert len(a) == len(DEFAULT_SIZES) and cache.measurements == 2
    assert caplog.text.count("cannot be written") == 1 and "ERSD_COST_STORE" in caplog.text


def test_the_store_is_off_with_the_environment_variable(monkeypatch, tmp_path) -> None:
    from ersd.cost_store import default_dir

    monkeypatch.setenv("ERSD_COST_STORE", "off")
    assert default_dir() is None and CostStore.default().path is None
    monkeypatch.setenv("ERSD_COST_STORE", str(tmp_path))
    assert CostStore.default().path == tmp_path / "costs.json"


def test_a_stored_rank_profile_is_the_online_estimates_prior(tmp_path) -> None:
    target, draft = Described("t"), Described("d", seed=1)
    s = store(tmp_path)
    s.put_profile(target, draft, "ersd", 1.0, [[0.95, 0.03], [0.9, 0.05]], observations=200)
    m = get_method("ersd")
    drafter = ModelDrafter(draft)
    c = TreeChooser(AutoTree(costs=FLAT), target, drafter, m, m, 1.0, CurveCache(store=s))
    assert c.stored_prior and c.online is not None
    assert c.online.prior[:2] == pytest.approx([0.925, 0.04])
    # a generic prior (no stored profile) for another temperature or a stale environment
    far = TreeChooser(AutoTree(costs=FLAT), target, drafter, m, m, 0.0, CurveCache(store=s))
    assert not far.stored_prior
    other = store(tmp_path, {**ENV, "cpu_flags": "cccc"})
    stale = TreeChooser(AutoTree(costs=FLAT), target, drafter, m, m, 1.0, CurveCache(other))
    assert not stale.stored_prior and other.stale == 1
    # the stored profile changes the decision: on FLAT the generic prior does not draft, a
    # stored profile of a near-perfect draft does
    assert far.choose([1]) is None and c.choose([1]) is not None


# --- no drafting where it cannot pay; exploration within a budget -------------------------------


def test_a_curve_where_drafting_cannot_pay_never_drafts_nor_explores() -> None:
    """STEEP: even if every drafted token were accepted, no tree beats one-token decoding, so
    no step drafts, however long the run and however much exploration budget it has."""
    c = chooser(AutoTree(costs=STEEP))  # online profile: exploration would be the only way in
    plain = STEEP.target_cost(1)
    c.observe_times(1, 0.0, 10 * plain, 10 * plain, prefill=True)
    c.elapsed = 1e6  # a huge budget (fake clock)
    decisions = []
    for _ in range(20 * RULES.explore_after):
        decisions.append(c.choose([1, 2, 3]))
        c.observe_times(1, 0.0, plain, plain)  # every plain step exactly as predicted
    assert all(d is None for d in decisions)
    assert c.last is not None and not c.last.can_pay and c.explore_spent == 0.0


class FakeClock:
    """perf_counter for the generation loop and the drafter: it advances only when a model is
    called, by that model's forward seconds on a cost curve (so timings are exact)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def model(self, base: ersd.FunctionModel, costs: list[float]) -> ersd.FunctionModel:
        """``base`` costing ``costs[s]`` seconds for a forward of the ``s``-th size (by the
        number of sequences scored at once, the size of a tree forward)."""

        def fn(seqs: list[list[int]]) -> torch.Tensor:
            n = len(seqs)
            self.now += costs[min(range(len(SIZES)), key=lambda i: abs(SIZES[i] - n))]
            return base.fn(seqs)

        return ersd.FunctionModel(fn, base.vocab_size)


def steep_generation(monkeypatch) -> tuple[Any, ersd.FunctionModel]:
    import ersd.drafting.model
    import ersd.generation

    clock = FakeClock()
    monkeypatch.setattr(ersd.generation, "time", clock)
    monkeypatch.setattr(ersd.drafting.model, "time", clock)
    base = table_model(V, seed=0)
    target = clock.model(base, STEEP.target)
    draft = clock.model(mixed_draft(base, table_model(V, seed=1), 0.3), STEEP.draft)
    res = ersd.generate(target, draft, [1, 2], max_new_tokens=120, tree=AutoTree(costs=STEEP))
    return res, draft


def test_cannot_pay_generates_with_zero_draft_forwards_and_reports_it(monkeypatch) -> None:
    """A real generation (toy pair on a fake clock that charges STEEP's seconds per forward):
    no draft forward at all -- the draft session is never even prefilled -- and the result
    reports what finding out cost.  The same run with the ceiling check removed (a
    deliberately broken chooser, exploration unbudgeted) drafts, so the check is what keeps
    the draft idle."""
    res, draft = steep_generation(monkeypatch)
    assert res.auto_choices == {"none": 120}
    assert draft.forward_calls == 0 and res.draft_forwards == 0 and res.num_draft_tokens == 0
    f = res.auto_finding_out
    assert f is not None and f["explore_steps"] == 0 and f["measure_s"] == 0.0
    assert not f["can_pay"] and "cannot pay" in res.summary()
    assert res.stats()["auto_finding_out"] == f

    import ersd.auto.chooser

    def broken(candidates, plain, state, rules=RULES):  # the ceiling rule off, unbudgeted
        off = replace(rules, cannot_pay=False, explore_budget=1e9)
        return ersd.auto.policy.decide(candidates, plain, state, off)

    monkeypatch.setattr(ersd.auto.chooser, "decide", broken)
    broken, broken_draft = steep_generation(monkeypatch)
    assert broken_draft.forward_calls > 0 and broken.auto_finding_out["explore_steps"] > 0
    assert broken.tokens == res.tokens  # ERSD: the text does not depend on the trees


def test_finding_out_reports_what_exploring_steps_lost_against_the_predicted_choice() -> None:
    """``explore_s`` counts exploring steps whole (an upper bound); ``lost_s`` only what each
    cost beyond the predicted choice's time for the tokens it emitted: a plain step against the
    best tree's rate, a drafting step against plain decoding's, a batch row at its share of
    the batch's rate -- never below zero, and measuring counts in full."""
    from ersd.results import GenerationResult, StepRecord

    def step(i: int, tokens: int, seconds: float, **choice: Any) -> StepRecord:
        c = {"tree": "none", "batch": 1, "explore": False, "predicted": 4.0, "target_only": 4.0}
        c.update(choice)
        return StepRecord(i, [7] * tokens, 0, 0, 0, 0, total_time=seconds, choice=c)

    steps = [
        step(0, 1, 0.3, explore=True, best_tree_predicted=5.0, target_only=4.0),  # 0.3 - 1/5
        step(1, 2, 0.8, tree="chain:4", explore=True, target_only=4.0),  # 0.8 - 2/4
        step(2, 1, 0.3, explore=True, batch=2, best_tree_predicted=8.0),  # 0.3 - 1/(8/2)
        step(3, 3, 0.1, tree="chain:4", explore=True, target_only=4.0),  # beat plain: 0
        step(4, 4, 1.0, tree="chain:4", target_only=4.0, measure_seconds=0.25),  # not exploring
    ]
    res = GenerationResult([7] * 11, 5, 8, steps, "ersd", "auto", "length", wall_time=5.0)
    f = res.auto_finding_out
    assert f is not None and f["explore_steps"] == 4
    assert f["explore_s"] == pytest.approx(1.5)
    assert f["share"] == pytest.approx((0.25 + 1.5) / 5.0)
    assert f["lost_s"] == pytest.approx(0.25 + 0.1 + 0.3 + 0.05)
    assert f["lost_share"] == pytest.approx(0.7 / 5.0)
    assert "lost against the predicted choice 14.0%" in res.summary()


def test_a_batch_where_drafting_cannot_pay_never_drafts(monkeypatch) -> None:
    """The same in a batch (one chooser for the rows, the engine's clock faked likewise):
    zero draft forwards for every row, and each row's text is its solo text."""
    import ersd.batch
    import ersd.drafting.model
    import ersd.generation

    clock = FakeClock()
    for mod in (ersd.generation, ersd.drafting.model, ersd.batch):
        monkeypatch.setattr(mod, "time", clock)
    base = table_model(V, seed=0)
    target = clock.model(base, STEEP.target)
    draft = clock.model(mixed_draft(base, table_model(V, seed=1), 0.3), STEEP.draft)
    prompts = [[1, 2], [3], [4, 5, 6], [7]]
    out = ersd.generate_batch(
        target, draft, prompts, max_new_tokens=60, tree=AutoTree(costs=STEEP), seeds=[3, 4, 5, 6]
    )
    assert draft.forward_calls == 0
    for res in out:
        assert res.draft_forwards == 0 and res.auto_choices == {"none": 60}
        assert res.auto_finding_out is not None and not res.auto_finding_out["can_pay"]
    solo = ersd.generate(target, None, prompts[0], max_new_tokens=60, seed=3)
    assert out[0].tokens == solo.tokens


def test_exploration_is_budgeted_and_counts_the_drafts_lazy_prefill() -> None:
    """Exploring after a long plain run costs the draft's catch-up on every token it has not
    seen (its prompt, on the first drafting step): the predicted loss includes it, so a long
    context needs a longer run before the budget allows one exploring step."""
    costs = CostModel(
        sizes=SIZES, target=[0.1] * 4, draft=[0.001, 0.002, 0.004, 0.008], overhead=0.7
    )
    short, long_ = chooser(AutoTree(costs=costs)), chooser(AutoTree(costs=costs))
    for c, context in ((short, [1] * 4), (long_, [1] * 4000)):
        c.elapsed = 40.0
        picks = [c.choose(context) for _ in range(RULES.explore_after + 1)]
        assert all(p is None for p in picks[: RULES.explore_after])
    assert short.explore_spent > 0 and short.last is not None and short.last.explore
    # 4000 tokens of the draft's prefill (4 s on this draft curve) do not fit 2% of 40 s
    assert long_.explore_spent == 0.0
    long_.elapsed = 1000.0
    assert long_.choose([1] * 4000) is not None and long_.last is not None and long_.last.explore
    assert long_.explore_spent > 4.0 and long_.explore_spent <= RULES.explore_budget * long_.elapsed


def test_a_run_that_states_its_length_budgets_on_the_whole_run() -> None:
    """With a horizon (the request's max_new_tokens) the budget is 2% of the larger of the time
    so far and the whole run's predicted plain time: a long run can afford its first exploring
    step (draft prefill included) at the first exploration point, a short one still cannot."""
    costs = CostModel(
        sizes=SIZES, target=[0.1] * 4, draft=[0.001, 0.002, 0.004, 0.008], overhead=0.7
    )
    m = get_method("ersd")
    runs = {}
    for horizon in (None, 40, 4000):
        c = TreeChooser(AutoTree(costs=costs), None, None, m, m, 1.0, None, horizon=horizon)
        c.elapsed = 40.0
        picks = [c.choose([1] * 4000) for _ in range(RULES.explore_after + 1)]
        assert all(p is None for p in picks[: RULES.explore_after])
        runs[horizon] = c
    assert runs[None].explore_spent == 0.0 and runs[40].explore_spent == 0.0
    long_ = runs[4000]  # 4000 tokens at 1.25 tokens/s: 3200 s, 2% = 64 s > the 4 s prefill
    assert long_.last is not None and long_.last.explore
    assert 4.0 < long_.explore_spent <= RULES.explore_budget * 4000 / 1.25


def test_a_drafting_step_that_fed_the_drafts_prefill_is_not_learned_from() -> None:
    c = chooser(AutoTree(profile=[[0.95, 0.03]], costs=FLAT))
    shape = c.choose([1] * 50)  # drafts at once: the draft session prefills 50 tokens lazily
    assert shape is not None and c._catchup == 50
    c.observe_times(1, 5.0, 0.1, 5.2)  # 5 s of draft prefill
    assert c.timing["spec"].steps == 0  # not taken as what a drafting step costs
    assert c.choose([1] * 55) is not None and c._catchup == 0
    t, d = c._forward_parts(FLAT, c._chosen[1], 1)  # type: ignore[index]
    c.observe_times(1, d, t, t + d + 0.7)
    assert c.timing["spec"].steps == 1 and c.timing["spec"].draft_ratio == pytest.approx(1.0)


def test_torch_threads_are_part_of_the_environment() -> None:
    from ersd.cost_store import environment

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = environment()
        torch.set_num_threads(2)
        two = environment()
    finally:
        torch.set_num_threads(threads)
    assert one != two and {k for k in one if one[k] != two[k]} == {"torch_threads"}


def test_models_calibrate_writes_what_auto_then_reads(tmp_path, monkeypatch) -> None:
    """`ersd models calibrate` measures the pair's curves (and rank profiles) into the store; a
    later generation with tree="auto" reads them and measures nothing."""
    from click.testing import CliRunner

    from ersd.cli import main

    monkeypatch.setenv("ERSD_COST_STORE", str(tmp_path))
    args = ["--target", "tiny-qwen2", "--draft", "tiny-qwen2-draft", "--tokens", "8"]
    out = CliRunner().invoke(
        main, ["models", "calibrate", *args, "--prompts", "1", "--temperatures", "1", "--json"]
    )
    assert out.exit_code == 0, out.output
    payload = json.loads(out.output.strip().splitlines()[-1])
    assert set(payload["curves"]) == {"target", "draft"} and payload["profiles"]["1.0"]
    target, draft = ersd.load_model("tiny-qwen2"), ersd.load_model("tiny-qwen2-draft")
    # the observations behind each depth are kept: the root's are every step's, a deeper
    # depth's only those of the steps that reached it (the prior weights depths by them)
    entry = CostStore.default().profile_entry(target, draft, "ersd", 1.0)
    assert entry is not None
    trials = entry[1]
    assert sum(trials) == payload["profiles"]["1.0"]["observations"]
    assert trials == sorted(trials, reverse=True) and trials[0] > 0
    cache = CurveCache()
    res = ersd.generate(target, draft, [1, 2, 3], max_new_tokens=8, tree=AutoTree(costs=cache))
    assert cache.measurements == 0 and cache.store is not None and cache.store.hits == 2
    assert res.auto_finding_out is not None and res.auto_finding_out["measure_s"] == 0.0
    m = get_method("ersd")
    c = TreeChooser(AutoTree(), target, ModelDrafter(draft), m, m, 1.0, cache)
    assert c.stored_prior
    # bad input names the option
    bad = CliRunner().invoke(main, ["models", "calibrate", *args, "--temperatures", "x"])
    assert bad.exit_code != 0 and "--temperatures" in bad.output


def test_serve_tree_auto_prepares_its_curves_at_start_up(tmp_path, monkeypatch) -> None:
    """`ersd serve --tree auto` has the curves of every batch size up to --max-batch-size before
    it serves (measured at the first start, read from the store at the next), so no client's
    request pays for a measurement. uvicorn.Server is replaced: no port is opened."""
    pytest.importorskip("uvicorn")
    import uvicorn
    from click.testing import CliRunner

    from ersd.cli import main

    seen: dict[str, Any] = {}

    class FakeServer:
        started = True
        should_exit = force_exit = False

        def __init__(self, config: Any) -> None:
            seen["app"] = config.app

        def run(self) -> None:
            pass

    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    monkeypatch.setenv("ERSD_COST_STORE", str(tmp_path))
    args = ["serve", "--target", "tiny-qwen2", "--draft", "tiny-qwen2-draft", "--tree", "auto"]
    args += ["--max-batch-size", "3"]
    counts = []
    for flags in ([], ["--auto-learn"], []):
        res = CliRunner().invoke(main, args + flags, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        curves = seen["app"].state.serving.engine.curves
        counts.append((curves.measurements, curves.store.hits, curves.learn))
        assert "tree auto: cost curves for batch 1..3 ready" in res.stderr
    # batch sizes 1, 2, 4 for the target and the draft: measured, and kept only when asked
    # (--auto-learn), then read back
    assert counts == [(6, 0, False), (6, 0, True), (0, 6, False)]


def test_auto_check_summary_pairs_runs_by_prompt_and_temperature() -> None:
    """The benchmark's summary: auto ÷ plain and auto ÷ the category's best fixed tree, paired
    per (prompt, temperature), with the 'all' row pooling the categories."""
    from research.auto_check import summarise

    def row(prompt: str, s: str, config: str, rate: float, can_pay: bool = True) -> dict:
        f = {"share": 0.01, "can_pay": can_pay} if config == "auto" else None
        return {
            "prompt": prompt,
            "set": s,
            "temperature": 1.0,
            "config": config,
            "rate": rate,
            "draft_forwards": 3 if config != "plain" else 0,
            "finding_out": f,
        }

    rows = [
        row("a", "code", "plain", 2.0),
        row("a", "code", "auto", 3.0),
        row("a", "code", "chain:4", 4.0),
        row("a", "code", "chain:6", 3.5),
        row("b", "chat", "plain", 4.0),
        row("b", "chat", "auto", 4.0, can_pay=False),
        row("b", "chat", "chain:4", 2.0),
        row("b", "chat", "chain:6", 5.0),
    ]
    out = summarise(rows, ["chain:4", "chain:6"])
    assert out["code T=1"]["auto/plain"] == "1.500" and out["code T=1"]["best_fixed"] == "chain:4"
    assert out["code T=1"]["auto/best-fixed"] == "0.750"
    assert out["chat T=1"]["auto/best-fixed(prompt)"] == "0.800"
    assert out["chat T=1"]["cannot_pay_prompts"] == 1
    pooled = out["all T=1"]
    assert pooled["n"] == 2 and pooled["auto/plain_min"] == 1.0
    assert pooled["best_fixed"] == "chain:6"  # mean 4.25 against chain:4's 3.0
    assert pooled["auto/best-fixed"].startswith("0.829")  # (3/3.5 + 4/5) / 2
    # repeats of a prompt (--repeats) are one prompt: its rate is the median of its repeats
    again = [dict(r, rate=r["rate"] * f) for r in rows[:4] for f in (0.5, 2.0)]
    out = summarise(rows[:4] + again, ["chain:4", "chain:6"])
    assert out["code T=1"]["n"] == 1 and out["code T=1"]["auto/plain"] == "1.500"
    skewed = [*rows[:4], dict(rows[1], rate=9.0), dict(rows[1], rate=8.0)]  # auto: 3, 9, 8
    assert summarise(skewed, [])["code T=1"]["auto/plain"] == "4.000"
    # the share lost against the predicted choice: a mean over prompts (of repeats' means),
    # and absent where a run did not report it (rows from before it was)
    assert "finding_out_lost_mean" not in out["code T=1"]
    lost = [
        dict(r, finding_out=dict(r["finding_out"], lost_share=x)) if r["config"] == "auto" else r
        for r, x in zip(rows, [0, 0.02, 0, 0, 0, 0.01, 0, 0], strict=True)
    ]
    twice = [*lost, dict(lost[1], finding_out=dict(lost[1]["finding_out"], lost_share=0.04))]
    cells = summarise(twice, ["chain:4", "chain:6"])
    assert cells["code T=1"]["finding_out_lost_mean"] == pytest.approx(0.03)
    assert cells["all T=1"]["finding_out_lost_mean"] == pytest.approx(0.02)  # (0.03 + 0.01) / 2


def test_auto_check_control_and_per_token_split_against_plain() -> None:
    """--control: plain-b ÷ plain per prompt (the machine's noise on identical work); and auto
    minus plain per token, split into the target's forwards and the rest of the loop."""
    import argparse

    from research.auto_check import config_list, summarise

    def row(prompt: str, config: str, rate: float, target_s: float, loop_s: float) -> dict:
        return {
            "prompt": prompt,
            "set": "code",
            "temperature": 0.0,
            "config": config,
            "rate": rate,
            "tokens": 100,
            "target_s": target_s,
            "loop_s": loop_s,
            "draft_forwards": 0,
            "finding_out": {"share": 0.0, "can_pay": False} if config == "auto" else None,
        }

    rows = [
        row("a", "plain", 10.0, 9.0, 1.0),
        row("a", "auto", 9.0, 9.5, 1.6),  # +5 ms/token forwards, +6 ms/token loop
        row("a", "plain-b", 11.0, 8.5, 1.0),
        row("b", "plain", 8.0, 11.0, 1.5),
        row("b", "auto", 8.0, 11.1, 1.5),  # +1, +0
        row("b", "plain-b", 6.0, 15.0, 1.5),
    ]
    cell = summarise(rows, [])["code T=0"]
    assert cell["control/plain"].startswith("0.925")  # (1.1 + 0.75) / 2
    assert cell["control/plain_min"] == 0.75
    assert cell["auto-plain target_ms/token"].startswith("3.000")
    assert cell["auto-plain loop_ms/token"].startswith("3.000")
    # without --control (or a run from before it) the cell has neither field
    plain = summarise([r for r in rows if r["config"] != "plain-b"], [])["code T=0"]
    assert "control/plain" not in plain
    args = argparse.Namespace(control=True, fixed=["chain:4"])
    assert [c[0] for c in config_list(args, "d", "auto")] == [
        "plain",
        "auto",
        "plain-b",
        "chain:4",
    ]
    assert config_list(args, "d", "auto")[2][1] is None  # the control drafts nothing


# --- what a run learned is kept for the next one ------------------------------------------------

#: a flat target and an almost free draft: drafting pays even under the generic prior
CHEAP = CostModel(sizes=SIZES, target=[0.1] * 4, draft=[0.001] * 4)


def test_a_runs_rank_observations_are_folded_into_the_stored_profile(tmp_path) -> None:
    """keep_profile merges only what is new since the last call, from KEEP_PROFILE_AFTER
    drafting steps on, weighting each depth by the observations behind it, and re-reads the
    file first (another process's write is kept)."""

    target, draft = Described("t"), Described("d", seed=1)
    s = store(tmp_path)
    s.put_profile(target, draft, "ersd", 1.0, [[0.5, 0.5], [1.0, 0.0]], 20, trials=[10, 10])
    m = get_method("ersd")
    learning = CurveCache(s, learn=True)
    c = TreeChooser(AutoTree(costs=CHEAP), target, ModelDrafter(draft), m, m, 1.0, learning)
    for _ in range(RULES.keep_profile_after - 1):
        c.observe([1, 2], 1, 2)
    assert not c.keep_profile()  # too few steps: nothing written
    c.observe([1, 2], 1, 2)
    assert c.keep_profile()
    n = RULES.keep_profile_after
    later = store(tmp_path)  # a later process
    probs, trials = later.profile_entry(target, draft, "ersd", 1.0)
    assert trials == [10 + n, 10 + n]
    assert probs[0][:2] == pytest.approx([(5 + n) / (10 + n), 5 / (10 + n)])
    assert probs[1][:2] == pytest.approx([10 / (10 + n), n / (10 + n)])
    # another process writes meanwhile; this chooser's next fold keeps that write and adds
    # only its observations since the last fold
    later.put_profile(target, draft, "ersd", 1.0, [[1.0], [1.0]], 200, trials=[100, 100])
    assert not c.keep_profile()
    for _ in range(RULES.keep_profile_after):
        c.observe([2], 0, 1)
    assert c.keep_profile()
    probs, trials = store(tmp_path).profile_entry(target, draft, "ersd", 1.0)
    assert trials == [100 + n, 100]
    assert probs[0][:2] == pytest.approx([100 / (100 + n), n / (100 + n)])
    assert probs[1][:1] == pytest.approx([1.0])


def test_identical_calls_draft_identically_and_a_run_writes_the_store_only_when_asked(
    monkeypatch,
) -> None:
    """End to end through ersd.generate (the store of conftest's $ERSD_COST_STORE).  Two
    identical calls draft the same trees step by step and leave the store as they found it:
    a run reads the store, it does not write it behind the caller's back (it used to keep its
    rank profile and timing there, so the second call started from the first's).  A run given
    ``CurveCache(learn=True)`` keeps them, and the next run's chooser starts from them.  The
    forwards run on a fake clock charging CHEAP's seconds, so the step times are exact."""
    import ersd.drafting.model
    import ersd.generation

    clock = FakeClock()
    monkeypatch.setattr(ersd.generation, "time", clock)
    monkeypatch.setattr(ersd.drafting.model, "time", clock)
    target, draft = Described("t"), Described("d", seed=0)  # a draft as good as the target
    for model, seconds in ((target, CHEAP.target), (draft, CHEAP.draft)):
        model.fn = clock.model(ersd.FunctionModel(model.fn, V), seconds).fn
    default = CostStore.default()
    assert default.path is not None and default.get_profile(target, draft, "ersd", 1.0) is None

    def run(auto: AutoTree) -> tuple[Any, list[str]]:
        res = ersd.generate(target, draft, [1, 2], max_new_tokens=200, tree=auto, seed=1)
        return res, [s.choice["tree"] for s in res.steps]

    before = default.path.read_bytes() if default.path.exists() else None
    first, trees = run(AutoTree(costs=CHEAP))
    second, again = run(AutoTree(costs=CHEAP))
    assert trees == again and first.tokens == second.tokens
    assert len({t for t in trees if t != "none"}) >= 1 and all(s.choice["why"] for s in first.steps)
    after = default.path.read_bytes() if default.path.exists() else None
    assert after == before
    m = get_method("ersd")
    assert not TreeChooser(
        AutoTree(costs=CHEAP), target, ModelDrafter(draft), m, m, 1.0
    ).stored_prior
    # asked to learn: the run keeps its ranks, and the next chooser starts from them (on
    # CHEAP's curves, stored as `ersd models calibrate` would: nothing is timed for real)
    for model, seconds in ((target, 0.1), (draft, 0.001)):
        default.put_curve(model, 1, DEFAULT_SIZES, [seconds] * len(DEFAULT_SIZES))
    learning = CurveCache(CostStore.default(), learn=True)
    res, _ = run(AutoTree(costs=learning))
    assert learning.measurements == 0
    drafted = [s for s in res.steps if s.ranks]
    assert len(drafted) >= 8
    probs, trials = CostStore.default().profile_entry(target, draft, "ersd", 1.0)
    assert trials[0] == len(drafted)
    ones = sum(1 for s in drafted if s.ranks[0] == 1) / len(drafted)
    assert probs[0][0] == pytest.approx(ones)
    nxt = TreeChooser(AutoTree(costs=CHEAP), target, ModelDrafter(draft), m, m, 1.0)
    assert nxt.stored_prior


def test_auto_check_rotates_the_configurations_per_prompt_temperature_and_repeat() -> None:
    import argparse

    from research.auto_check import rotations

    args = argparse.Namespace(temperatures=[0.0, 1.0], repeats=2)
    configs = [("plain", None, 1), ("auto", None, 2), ("chain:4", None, 3)]
    runs = list(rotations(2, args, configs))
    assert len(runs) == 2 * 2 * 2 * 3
    firsts = [c[0] for i, t, r, c in runs[::3]]  # the first configuration of each rotation
    assert firsts == ["plain", "auto", "chain:4", "plain", "auto", "chain:4", "plain", "auto"]
    assert [(i, t, r) for i, t, r, _ in runs[::3]][:3] == [(0, 0.0, 0), (0, 0.0, 1), (0, 1.0, 0)]
    assert all(
        sorted(c[0] for *_, c in runs[j : j + 3]) == ["auto", "chain:4", "plain"]
        for j in range(0, len(runs), 3)
    )


# --- a run's timing corrections are kept for the next run ---------------------------------------


def stored_curves(tmp_path, target: Any, draft: Any, t: float, d: float) -> CostStore:
    """A store holding flat measured curves of ``t`` and ``d`` seconds a row at batch 1 and 2
    (so that nothing is timed for real)."""
    s = store(tmp_path)
    for b in (1, 2):
        s.put_curve(target, b, DEFAULT_SIZES, [b * t] * len(DEFAULT_SIZES))
        s.put_curve(draft, b, DEFAULT_SIZES, [b * d] * len(DEFAULT_SIZES))
    return s


def test_a_runs_timing_correction_is_kept_and_starts_the_next_run(tmp_path) -> None:
    """On the Intel bf16 pair a drafting step at batch 8 took 1.17x the curves' prediction, and
    every run decided its first step (the one that prefills the draft) on the uncorrected
    curve.  Now a run keeps its corrections per batch size (after KEEP_TIMING_AFTER timed
    steps of a kind), and the next run starts from them: here a drafting step predicted at
    0.15 s that really takes 1.5x is drafted by a first run, not by the next."""

    target, draft = Described("t"), Described("d", seed=1)
    s = stored_curves(tmp_path, target, draft, 0.1, 0.05)
    m = get_method("ersd")

    def new(learn: bool = True) -> TreeChooser:
        auto = AutoTree(costs=CurveCache(s, learn=learn))
        return TreeChooser(auto, target, ModelDrafter(draft), m, m, 1.0)

    reader = new(learn=False)  # a run that was not asked to learn keeps nothing
    shape = reader.choose([1, 2, 3])
    t, d = reader._forward_parts(reader.costs_at([1], 1), shape, 1)
    for _ in range(2 * RULES.keep_timing_after):
        reader._catchup = 0
        reader.observe_times(1, 1.5 * d, 1.5 * t, 1.5 * (t + d))
    assert not reader.keep_timing() and not reader.keep_profile()
    assert CostStore(tmp_path, env=lambda: dict(ENV)).get_timing(target, draft, 1) == {}
    first = new()
    shape = first.choose([1, 2, 3])
    assert shape is not None  # uncorrected: chain:1 at 1.6 tokens / 0.15 s beats 10 tokens/s
    t, d = first._forward_parts(first.costs_at([1], 1), shape, 1)
    for _ in range(RULES.keep_timing_after - 1):
        first._catchup = 0  # steps after the first (which fed the draft's prefill)
        first.observe_times(1, 1.5 * d, 1.5 * t, 1.5 * (t + d))
    assert not first.keep_timing()  # too few steps timed: nothing written
    first.observe_times(1, 1.5 * d, 1.5 * t, 1.5 * (t + d))
    assert first.timing["spec"].target_ratio == pytest.approx(1.5)
    assert first.keep_timing()
    assert not first.keep_timing()  # nothing timed since: not written again
    entry = CostStore(tmp_path, env=lambda: dict(ENV)).get_timing(target, draft, 1)
    assert entry["spec"] == pytest.approx([1.5, 1.5, 0.0]) and "plain" not in entry
    for _ in range(RULES.keep_timing_after):  # plain steps as predicted (else plain borrows 1.5)
        first.observe_times(1, 0.0, 0.1, 0.1, step=None)
    assert first.keep_timing()
    entry = CostStore(tmp_path, env=lambda: dict(ENV)).get_timing(target, draft, 1)
    assert entry["plain"] == pytest.approx([1.0, 1.0, 0.0])
    assert entry["spec"][0] == pytest.approx(1.5)
    nxt = new()
    assert nxt.choose([1, 2, 3]) is None  # 1.6 tokens / 0.225 s: below plain decoding
    assert nxt.timing["spec"].steps == 1
    assert nxt.timing["spec"].target_ratio == pytest.approx(1.5)
    # another batch size, another machine or a given cost model start from 1.0
    at2 = new()
    at2.choose([1, 2, 3], batch=2)  # 1.6 tokens / 0.15 s again (not started: the batch margin)
    assert at2.last is not None and at2.last.best_tree_predicted is not None
    assert at2.last.best_tree_predicted > at2.last.target_only and at2.curves.measurements == 0
    other = store(tmp_path, {**ENV, "cpu": "Other CPU"})
    stale = TreeChooser(AutoTree(costs=CurveCache(other)), target, ModelDrafter(draft), m, m, 1.0)
    stale.choose([1, 2, 3])
    assert stale.timing["spec"].steps == 0 and other.stale >= 1
    given = TreeChooser(
        AutoTree(costs=CHEAP), target, ModelDrafter(draft), m, m, 1.0, CurveCache(s)
    )
    given.choose([1, 2, 3])
    assert given.timing["spec"].steps == 0 and not given.keep_timing()


# --- a batch is done when its slowest row is ------------------------------------------------------


def test_batch_finish_seconds_counts_the_steps_after_rows_have_left() -> None:
    from ersd.auto import batch_finish_seconds, order_statistics

    # rows needing 2 and 4 steps: 2 steps of both rows, then 2 of one
    assert batch_finish_seconds([4, 2], lambda b: float(b)) == pytest.approx(2 * 2 + 2 * 1)
    # a forward whose cost does not depend on the rows: the slowest row decides
    assert batch_finish_seconds([4, 2, 3], lambda b: 1.0) == pytest.approx(4.0)
    z = order_statistics(8)  # E[max of 8 standard normals] = 1.42
    assert order_statistics(1) == [0.0] and -1.5 < z[0] < -1.3 and z[-1] == pytest.approx(-z[0])
    assert z == sorted(z) and sum(z) == pytest.approx(0.0, abs=1e-12)


#: a forward costs the same for 1 and 8 rows (as the Intel bf16 target nearly does)
FLAT_ROWS = CostModel(
    sizes=SIZES,
    target=[0.2] * 4,
    draft=[0.1] * 4,
    batch_sizes=[1, 8],
    target_batch=[[0.2] * 4, [0.2] * 4],
    draft_batch=[[0.1] * 4, [0.1] * 4],
)


def test_a_batch_with_one_slow_row_decodes_plain(monkeypatch) -> None:
    """Per step, drafting beats plain decoding on the pooled acceptance (the old rule drafted
    at batch 8 and lost 9-16% to plain on the Intel bf16 pair).  But one row that accepts
    nothing needs nearly a step per token, and the batch runs until it is done: over the rest of
    the run plain decoding is faster, so auto stops drafting.  With every row accepting alike
    the rates are the per-step ones and auto drafts."""
    rules = replace(RULES, batch_start_margin=0.0)  # the rows' rule alone
    m = get_method("ersd")
    rows = [(k, 96) for k in range(8)]
    for slow in (False, True):
        auto = AutoTree(profile=[[0.9]] * 8, costs=FLAT_ROWS)
        c = TreeChooser(auto, None, None, m, m, 1.0, rules=rules)
        first = c.choose([1, 2, 3], 8, rows=rows)
        assert first is not None and c.last is not None
        per_step = c.last.step_tokens
        # the rows have shown nothing yet: each is taken as slow as the expected slowest
        assert per_step > 1.5 and c.last.predicted_tokens < 8 * per_step
        for _ in range(10):
            for k, _ in rows:
                ok = 0 if slow and k == 0 else first.depth
                c.observe([1] * first.depth, ok, first.depth, row=k)
        accepted = 0 if slow else 10 * first.depth
        assert c.row_factor(0) == pytest.approx((accepted + 4) / (10 * (per_step - 1) + 4))
        picked = c.choose([1, 2, 3], 8, rows=rows)
        assert (picked is None) == slow, (slow, c.last)
        # without the rows (one step's rate, the old rule) it drafts either way
        assert c.choose([1, 2, 3], 8) is not None


def test_a_batch_starts_its_draft_only_on_a_clear_predicted_gain() -> None:
    """Starting a batch's draft prefills it on every row, and at batch 8 on CPU drafting's
    predicted gain is a few percent, within the error of the step times it rests on (one batch
    of six started on such a gain and ran at 0.92 of target-only).  A batch starts its draft only
    if drafting is predicted BATCH_START_MARGIN faster; a lone sequence is not held back, and a
    batch whose draft has started goes on drafting on any predicted gain."""

    m = get_method("ersd")

    def chooser(p: float) -> TreeChooser:
        return TreeChooser(AutoTree(profile=[[p]] * 8, costs=FLAT_ROWS), None, None, m, m, 1.0)

    small, clear = chooser(0.6), chooser(0.75)
    assert small.choose([1, 2, 3], 8) is None and small.last is not None
    gain = small.last.best_tree_predicted / small.last.target_only  # chain:1, 1.6 tokens / 0.3 s
    assert 1.0 < gain < 1 + RULES.batch_start_margin and gain == pytest.approx(1.6 / 1.5)
    assert clear.choose([1, 2, 3], 8) is not None and clear.last is not None
    assert clear.last.best_tree_predicted / clear.last.target_only >= 1 + RULES.batch_start_margin
    assert chooser(0.6).choose([1, 2, 3], 1) is not None  # one row: the same gain drafts
    started = chooser(0.6)
    started._ever_drafted = True  # an earlier step (an exploring one, say) started the draft
    assert started.choose([1, 2, 3], 8) is not None


def test_the_spread_of_rows_is_kept_for_the_next_batch(tmp_path, monkeypatch) -> None:
    """Rows that left report how they accepted against the pool; a run keeps the spread of
    those factors with its timing at that batch size, and the next run starts from it (before
    its own rows have shown their rates, each is assumed as slow as the expected slowest)."""
    rules = replace(RULES, batch_start_margin=0.0)  # drafting at once, as it did

    target, draft = Described("t"), Described("d", seed=1)
    s = store(tmp_path)
    for b in (1, 8):
        s.put_curve(target, b, DEFAULT_SIZES, [0.2] * len(DEFAULT_SIZES))
        s.put_curve(draft, b, DEFAULT_SIZES, [0.1] * len(DEFAULT_SIZES))
    m = get_method("ersd")

    def new() -> TreeChooser:
        auto = AutoTree(costs=CurveCache(s, learn=True))
        return TreeChooser(auto, target, ModelDrafter(draft), m, m, 1.0, rules=rules)

    c = new()
    shape = c.choose([1, 2, 3], 8)
    assert shape is not None
    for row, rate in ((1, 0.5), (2, 1.0), (3, 0.0)):
        c._row_tokens[row] = [rate * RULES.row_spread_after, RULES.row_spread_after]
    c._row_tokens[4] = [0.0, 1.0]  # too few drafted tokens to say
    for row in (1, 2, 3, 4, 99):
        c.forget_row(row)
    assert c._row_tokens == {} and c._spreads == [0.5, 1.0, 0.0]
    t, d = c._forward_parts(c.costs_at([1], 8), shape, 8)
    for _ in range(RULES.keep_timing_after):
        c._catchup = 0
        c.observe_times(8, d, t, t + d)
    assert c.keep_timing()
    rows = CostStore(tmp_path, env=lambda: dict(ENV)).get_timing(target, draft, 8)["rows"]
    # pstdev of 0.5, 1, 0 (0.408) over 3 rows, pooled with the default over 8 pseudo-rows
    pooled = ((8 * RULES.default_row_spread**2 + 3 * 0.408248**2) / 11) ** 0.5
    assert rows == pytest.approx([pooled, 3.0], rel=1e-5)
    nxt = new()
    assert nxt._row_spread == (RULES.default_row_spread, 0.0)
    nxt.choose([1, 2, 3], 8)
    assert nxt._row_spread == pytest.approx((pooled, 3.0), rel=1e-5)


def test_generate_measures_a_curve_once_per_process_and_keeps_no_model_alive(
    tmp_path, monkeypatch
) -> None:
    """``ersd.generate(tree="auto")`` without a shared cache measures its curves into the
    process's in-memory cache: the second identical call measures nothing (before this it
    re-measured every call: ~9 s of each llama.cpp call on the Qwen pair), nothing is written to
    the store, a model that is dropped is not kept alive, and a changed store starts afresh."""
    import gc
    import weakref

    from ersd.auto.curves import process_curves

    monkeypatch.setenv("ERSD_COST_STORE", str(tmp_path))
    target, draft = Described("t-proc", 1), Described("d-proc", 2)
    kw = {"max_new_tokens": 6, "tree": "auto", "seed": 0}
    first = ersd.generate(target, draft, [1, 2, 3], **kw)
    second = ersd.generate(target, draft, [1, 2, 3], **kw)
    assert first.auto_finding_out["measure_s"] > 0
    assert second.auto_finding_out["measure_s"] == 0.0
    assert second.tokens == first.tokens
    assert not (tmp_path / "costs.json").exists()  # read-only unless asked
    cache = process_curves()
    assert process_curves() is cache
    ref = weakref.ref(target)
    del target, first, second
    gc.collect()
    assert ref() is None  # the process cache holds its models weakly
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("ERSD_COST_STORE", str(other))
    assert process_curves() is not cache  # another store: a fresh cache
