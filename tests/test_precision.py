"""Issue 47: the configuration choice by measurement (a fake cost store) and honest bfloat16
(the identity check before a run, the margin report after it).

The choice is tested on stand-in stores and records: which candidate wins must follow the stored
curves and the recorded identity checks, never the CPU.  The identity check and the margin
report run on SmolLM2 (``realmodel``): float32 and bfloat16 on this machine, compared, and a
deliberately width-dependent stand-in model that the check must catch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ersd.config_choice import Described, choose_config, choose_llamacpp, describe_as, fast_twin
from ersd.cost_store import CostStore, model_key
from ersd.costs import DEFAULT_SIZES
from ersd.precision import IdentityCheck, IdentityRecords, check_tree_identity

ENV = {"cpu": "fake", "torch_threads": 1}


def _describe(name: str, dtype: str) -> dict[str, Any]:
    return {"backend": "hf", "name": name, "dtype": dtype, "device": "cpu"}


def _stores(tmp_path: Path) -> tuple[CostStore, IdentityRecords]:
    return CostStore(tmp_path, env=lambda: ENV), IdentityRecords(tmp_path, env=lambda: ENV)


def _put_curves(store: CostStore, dtype: str, draft_dtype: str, t: float, d: float) -> None:
    tm, dm = Described(_describe("T", dtype)), Described(_describe("D", draft_dtype))
    store.put_curve(tm, 1, DEFAULT_SIZES, [t * (1 + 0.1 * i) for i in range(len(DEFAULT_SIZES))])
    store.put_curve(dm, 1, DEFAULT_SIZES, [d] * len(DEFAULT_SIZES))


def _record(records: IdentityRecords, dtype: str, diff: float) -> None:
    key = model_key(Described(_describe("T", dtype)))
    records.put(key, IdentityCheck(diff == 0.0, diff, 6, dtype))


def _choose(store: CostStore, records: IdentityRecords) -> Any:
    return choose_config("T", "D", store=store, records=records, describe=_describe)


def test_nothing_stored_gives_the_invariant_default_and_says_so(tmp_path: Path) -> None:
    store, records = _stores(tmp_path)
    c = _choose(store, records)
    assert (c.dtype, c.draft_dtype, c.tree, c.measured) == ("float32", "int8", "chain:6", False)
    assert "ersd models calibrate" in c.reason and "bfloat16 <- bfloat16 left out" in c.reason


def test_faster_bf16_is_chosen_only_when_it_keeps_the_identity(tmp_path: Path) -> None:
    store, records = _stores(tmp_path)
    _put_curves(store, "float32", "int8", t=0.30, d=0.06)
    _put_curves(store, "bfloat16", "bfloat16", t=0.10, d=0.03)  # 3x cheaper target
    # not checked: bf16 is not eligible however fast
    c = _choose(store, records)
    assert c.dtype == "float32" and c.measured
    assert (
        c.table["bfloat16 <- bfloat16"]["predicted_tokens_per_second"]
        > (c.table["float32 <- int8"]["predicted_tokens_per_second"])
    )
    # checked and width-dependent (as on an AMX Xeon): still float32
    _record(records, "bfloat16", 0.56)
    c = _choose(store, records)
    assert c.dtype == "float32" and "differ from one-token rows by 0.56" in c.reason
    # checked and bit-identical: the faster one wins
    _record(records, "bfloat16", 0.0)
    c = _choose(store, records)
    assert (c.dtype, c.draft_dtype) == ("bfloat16", "bfloat16") and c.measured


def test_the_cheaper_measured_configuration_wins_either_way(tmp_path: Path) -> None:
    store, records = _stores(tmp_path)
    _record(records, "bfloat16", 0.0)
    _put_curves(store, "float32", "int8", t=0.10, d=0.02)
    _put_curves(store, "bfloat16", "bfloat16", t=0.30, d=0.10)  # bf16 slower (an AVX2 CPU)
    assert _choose(store, records).dtype == "float32"


def test_float32_rounding_differences_keep_it_eligible_larger_ones_do_not(tmp_path: Path) -> None:
    store, records = _stores(tmp_path)
    _put_curves(store, "float32", "int8", t=0.30, d=0.06)
    _record(records, "float32", 5e-5)  # rounding order (measured on an AMX Xeon)
    c = _choose(store, records)
    assert c.table["float32 <- int8"]["eligible"] and c.measured
    _record(records, "float32", 0.3)
    c = _choose(store, records)
    assert not c.table["float32 <- int8"]["eligible"] and not c.measured


def test_measurements_of_another_machine_are_not_used(tmp_path: Path) -> None:
    store, records = _stores(tmp_path)
    _put_curves(store, "float32", "int8", t=0.30, d=0.06)
    _put_curves(store, "bfloat16", "bfloat16", t=0.10, d=0.03)
    _record(records, "bfloat16", 0.0)
    other = {"cpu": "another", "torch_threads": 1}
    c = choose_config(
        "T",
        "D",
        store=CostStore(tmp_path, env=lambda: other),
        records=IdentityRecords(tmp_path, env=lambda: other),
        describe=_describe,
    )
    assert not c.measured and c.dtype == "float32"


def test_a_stored_profile_picks_the_tree_too(tmp_path: Path) -> None:
    store, records = _stores(tmp_path)
    _put_curves(store, "float32", "int8", t=0.30, d=0.06)
    tm, dm = Described(_describe("T", "float32")), Described(_describe("D", "int8"))
    store.put_profile(tm, dm, "ersd", 1.0, [[0.95, 0.03]] * 8, 500)
    sharp = _choose(store, records)
    store.put_profile(tm, dm, "ersd", 1.0, [[0.2, 0.1]] * 8, 500)
    weak = _choose(store, records)
    # a draft that is nearly always right: a deep chain; a weak one: a shallow tree
    assert sharp.tree != weak.tree
    assert (
        sharp.table["float32 <- int8"]["predicted_tokens_per_second"]
        > (weak.table["float32 <- int8"]["predicted_tokens_per_second"])
    )


# --- on SmolLM2 -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_prompt() -> list[int]:
    pytest.importorskip("transformers")
    import ersd

    m = ersd.load_model("smollm2-135m", dtype="float32")
    return m.tokenizer.encode("The quick brown fox jumps over the lazy dog, and then it")


@pytest.mark.realmodel
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_describe_as_predicts_the_loaded_models_description(dtype: str) -> None:
    pytest.importorskip("transformers")
    import ersd

    info = ersd.load_model("smollm2-135m", dtype=dtype).describe()
    info.pop("tree_attention")
    assert describe_as("smollm2-135m", dtype) == info


@pytest.mark.realmodel
@pytest.mark.usefixtures("one_torch_thread")
def test_identity_check_tells_float32_from_bfloat16(smollm_prompt: list[int]) -> None:
    """Measured on SmolLM2: float32 (prepacked) tree rows equal one-token rows up to rounding
    order; bfloat16 ones do not, by far more -- the check must say so before a run."""
    import ersd

    f32 = check_tree_identity(ersd.load_model("smollm2-135m", dtype="float32"), smollm_prompt)
    bf16 = check_tree_identity(ersd.load_model("smollm2-135m", dtype="bfloat16"), smollm_prompt)
    assert f32.max_abs_diff <= 1e-3
    assert bf16.max_abs_diff > 100 * max(f32.max_abs_diff, 1e-6)
    assert not bf16.identical and "can differ" in bf16.summary()


class _WidthDependent:
    """A model whose scoring adds 1e-2 to every row of a call of more than two rows (a kernel
    whose rounding depends on the batch width): the check must catch it."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def start(self, prompt: list[int]) -> Any:
        inner = self.model.start(prompt)

        class S:
            def score(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
                rows = inner.score(tokens, parents)
                return rows + 1e-2 if len(tokens) >= 2 else rows

            def commit(self, tokens: list[int], path: list[int]) -> None:
                inner.commit(tokens, path)

        return S()


@pytest.mark.realmodel
@pytest.mark.usefixtures("one_torch_thread")
def test_identity_check_catches_a_width_dependent_kernel(smollm_prompt: list[int]) -> None:
    import ersd

    model = ersd.load_model("smollm2-135m", dtype="float32")
    honest = check_tree_identity(model, smollm_prompt)
    broken = check_tree_identity(_WidthDependent(model), smollm_prompt)
    assert broken.max_abs_diff >= 1e-2 - 1e-4 > honest.max_abs_diff


@pytest.mark.realmodel
@pytest.mark.usefixtures("one_torch_thread")
def test_margin_report_on_bf16_and_float32(smollm_prompt: list[int]) -> None:
    """The per-text report: the smallest race margin and whether it was within reach of the
    measured numeric error.  In bfloat16 (error ~0.5) a 48-token text at T = 1 has near ties
    within reach; with a zero error no flip is possible whatever the margins."""
    import ersd
    from ersd.precision import race_margins

    model = ersd.load_model("smollm2-135m", dtype="bfloat16")
    check = check_tree_identity(model, smollm_prompt)
    res = ersd.generate(model, None, smollm_prompt, max_new_tokens=48, seed=3)
    rep = race_margins(model, smollm_prompt, res.tokens, error=check.max_abs_diff, seed=3)
    assert rep.min_margin >= 0 and rep.threshold == pytest.approx(2 * check.max_abs_diff)
    assert rep.flip_possible and "lucky" in rep.summary()
    exact = race_margins(model, smollm_prompt, res.tokens, error=0.0, seed=3)
    assert not exact.flip_possible and exact.min_margin == pytest.approx(rep.min_margin)


# --- the CLI ----------------------------------------------------------------------------------


def test_config_auto_refuses_the_options_it_sets() -> None:
    from click.testing import CliRunner

    from ersd.cli import main

    res = CliRunner().invoke(main, ["generate", "--config", "auto", "--dtype", "bfloat16", "hi"])
    assert res.exit_code == 2 and "--config auto chooses --dtype itself" in res.output
    res = CliRunner().invoke(main, ["generate", "--config", "auto", "--draft", "none", "hi"])
    assert res.exit_code == 2 and "nothing to choose: drop --config auto" in res.output
    res = CliRunner().invoke(main, ["generate", "--batch-policy", "fast", "hi"])
    assert res.exit_code == 2 and "--batch-policy applies to --backend llamacpp only" in res.output


@pytest.mark.realmodel
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_generate_says_before_the_run_whether_identity_holds(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity line comes before any generated text; bfloat16 is flagged, its JSON carries
    the margin report; the check is recorded and read by the next run and by --config auto."""
    import json

    from click.testing import CliRunner

    from ersd.cli import main

    monkeypatch.setenv("ERSD_COST_STORE", str(tmp_path))
    args = ["generate", "--target", "smollm2-135m", "--draft", "smollm2-135m", "--dtype", dtype]
    args += ["--tree", "chain:3", "--max-new-tokens", "16", "--seed", "5", "--compare"]
    args += ["--json", "Hi there"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "[identity: " in res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["identity"]["dtype"] == dtype
    if not out["identical_to_target_only"]:  # a difference needs a race within reach of a flip
        assert out["margins"]["flip_possible"], out["margins"]
    if dtype == "bfloat16":
        assert "WARNING" in res.stderr and out["margins"]["threshold"] > 0.1
        assert isinstance(out["margins"]["flip_possible"], bool)
    else:
        assert "WARNING" not in res.stderr
        assert out["identity"]["max_abs_diff"] <= 1e-3
    recorded = json.loads((tmp_path / "identity.json").read_text())
    assert any(f'"dtype": "{dtype}"' in key for key in recorded)
    if dtype == "bfloat16":
        # recorded as not keeping the identity: --config auto leaves bf16 out, and says why
        res = CliRunner().invoke(
            main,
            [
                "generate",
                "--target",
                "smollm2-135m",
                "--draft",
                "smollm2-135m",
                "--config",
                "auto",
                "--max-new-tokens",
                "12",
                "--compare",
                "--json",
                "Hi",
            ],
        )
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout.strip().splitlines()[-1])
        # the chosen configuration keeps the identity: its text is target-only sampling's
        assert out["identical_to_target_only"] or out["margins"]["flip_possible"]
        assert out["identity"]["max_abs_diff"] <= 1e-3
        assert "config auto: target float32, draft int8" in res.stderr
        assert "bfloat16 <- bfloat16 left out: its tree rows differ" in res.stderr


# --- llama.cpp: the exact batch policy only where a draft repays it ---------------------------


def _gguf(policy: str, name: str = "T") -> dict[str, Any]:
    info = {"backend": "llamacpp", "name": name, "dtype": "gguf", "threads": 2}
    info.update(batch_policy=policy, repack=policy == "fast", kv_cache="q8_0")
    return fast_twin(info) if policy == "fast" else info


def _llama_store(tmp_path: Path, exact: float | None, fast: float | None, draft: float) -> Any:
    store = CostStore(tmp_path, env=lambda: ENV)
    sizes = len(DEFAULT_SIZES)
    if exact is not None:  # a tree of n tokens costs a little more than one (the exact policy)
        curve = [exact * (1 + 0.05 * i) for i in range(sizes)]
        store.put_curve(Described(_gguf("exact")), 1, DEFAULT_SIZES, curve)
    if fast is not None:
        store.put_curve(Described(_gguf("fast")), 1, DEFAULT_SIZES, [fast] * sizes)
    store.put_curve(Described(_gguf("fast", "D")), 1, DEFAULT_SIZES, [draft] * sizes)
    return store


def _choose_llama(store: Any) -> Any:
    return choose_llamacpp(Described(_gguf("exact")), Described(_gguf("fast", "D")), store=store)


def test_llamacpp_unmeasured_keeps_the_exact_policy_and_says_how_to_measure(
    tmp_path: Path,
) -> None:
    for exact, fast in ((None, None), (0.10, None), (None, 0.05)):
        c = _choose_llama(_llama_store(tmp_path / f"{exact}-{fast}", exact, fast, 0.02))
        assert c.candidate.batch_policy == "exact" and c.tree == "auto" and not c.measured
        assert "ersd models calibrate --backend llamacpp --target T --draft D" in c.reason


def test_llamacpp_fast_target_only_wins_where_no_draft_repays_the_exact_policy(
    tmp_path: Path,
) -> None:
    # the 2-core Sapphire Rapids: exact decodes 1.5x the fast ones, a draft a third of a target
    c = _choose_llama(_llama_store(tmp_path, exact=0.15, fast=0.10, draft=0.05))
    assert c.candidate.batch_policy == "fast" and c.tree == "none" and c.measured
    assert "no draft repays" in c.reason
    rows = c.table
    assert rows["llama.cpp fast policy, target-only"]["predicted_tokens_per_second"] == 10.0
    # a nearly free draft and exact forwards almost as cheap: drafting under the exact policy wins
    c = _choose_llama(_llama_store(tmp_path / "b", exact=0.105, fast=0.10, draft=0.005))
    assert c.candidate.batch_policy == "exact" and c.tree == "auto" and c.measured
    # the same costs on another machine are not used
    other = CostStore(tmp_path, env=lambda: {"cpu": "another", "torch_threads": 1})
    assert not _choose_llama(other).measured


def test_llamacpp_a_stored_profile_decides_whether_drafting_pays(tmp_path: Path) -> None:
    store = _llama_store(tmp_path, exact=0.11, fast=0.10, draft=0.01)
    t, d = Described(_gguf("exact")), Described(_gguf("fast", "D"))
    store.put_profile(t, d, "ersd", 1.0, [[0.05, 0.02]] * 8, 100)  # the draft rarely agrees
    assert _choose_llama(store).candidate.batch_policy == "fast"
    store.put_profile(t, d, "ersd", 1.0, [[0.95, 0.02]] * 8, 100)  # it nearly always agrees
    assert _choose_llama(store).candidate.batch_policy == "exact"


def _llamacpp_or_skip() -> None:
    import importlib.util
    import os

    if importlib.util.find_spec("llama_cpp") is None and not os.environ.get(
        "ERSD_REQUIRE_LLAMACPP"
    ):
        pytest.skip("llama-cpp-python is not installed (pip install 'ersd[llamacpp]')")


@pytest.mark.realmodel
def test_llamacpp_config_auto_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ersd models calibrate` stores both policies under the keys the choice reads (the fast
    twin's description is the fast model's own); with curves where the fast policy wins,
    `ersd generate --config auto` runs it target-only and its tokens are the fast model's
    target-only race sampling."""
    import json

    from click.testing import CliRunner

    import ersd
    from ersd.cli import main

    _llamacpp_or_skip()
    monkeypatch.setenv("ERSD_COST_STORE", str(tmp_path))
    exact = ersd.load_model("smollm2-135m", backend="llamacpp", threads=1)
    fast = ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, exact=False)
    assert fast_twin(exact.describe()) == fast.describe()
    base = ["--backend", "llamacpp", "--target", "smollm2-135m", "--draft", "smollm2-135m"]
    res = CliRunner().invoke(
        main, ["models", "calibrate", *base, "--threads", "1", "--temperatures", ""]
    )
    assert res.exit_code == 0, res.output
    c = choose_llamacpp(exact, fast, store=CostStore.default())
    assert c.measured, c.reason
    # now make the fast policy the clear winner and generate
    store = CostStore.default()
    store.put_curve(exact, 1, DEFAULT_SIZES, [1.0] * len(DEFAULT_SIZES))
    store.put_curve(fast, 1, DEFAULT_SIZES, [0.01] * len(DEFAULT_SIZES))
    args = ["generate", *base, "--threads", "1", "--config", "auto", "--json"]
    res = CliRunner().invoke(main, [*args, "--max-new-tokens", "12", "--seed", "3", "def f(x):"])
    assert res.exit_code == 0, res.output
    assert "fast batch policy, target-only" in res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    ids = fast.tokenizer.encode("def f(x):")
    ref = ersd.generate(fast, None, ids, max_new_tokens=12, seed=3, temperature=1.0)
    assert out["tokens"] == ref.tokens
    res = CliRunner().invoke(main, [*args, "--batch-policy", "fast", "hi"])
    assert res.exit_code == 2 and "--config auto chooses --batch-policy itself" in res.output
