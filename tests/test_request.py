"""One request, validated once (:mod:`ersd.request`): every entry point builds a
:class:`~ersd.request.Request`, errors name their field, one seed range, and every tree kind the
method supports runs through every entry point (``dynamic:K`` batched = solo)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import ersd
from ersd import BatchEngine, ErsdError, GenerationInputError, SamplingParams, TreeShape
from ersd.request import Request
from tests.test_tree_grammar import _calibration_file
from tests.toy import mixed_draft, table_model

V = 30
PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]


@pytest.fixture(scope="module")
def pair() -> tuple[ersd.FunctionModel, ersd.FunctionModel]:
    target = table_model(V, 0)
    return target, mixed_draft(target, table_model(V, 1), 0.6)


def test_request_is_a_checked_normalised_value() -> None:
    assert ersd.Request is Request
    req = Request([1, 2], max_new_tokens=5, seed=3, tree="chain:2", eos_token_id=4)
    assert req.prompt == (1, 2) and req.eos == frozenset({4})
    assert req.verification.name == "ersd" and req.parsed_tree is not None
    assert req.parsed_tree.shape == TreeShape.chain(2)
    assert req.parsed_tree.label == TreeShape.chain(2).spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.seed = 4  # type: ignore[misc]
    again = dataclasses.replace(req, seed=9)  # re-checked, the parsed tree kept
    assert again.seed == 9 and again.tree is req.tree
    assert Request([1], max_new_tokens=1, tree=None).parsed_tree is None


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [1.5]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": 1.0}, "seed"),
        ({"method": "nope"}, "method"),
        ({"tree": "chain:0"}, "tree"),
        ({"tree": "dynamic:x"}, "tree"),
        ({"tree": "optimal:4"}, "tree"),
        ({"method": "sd", "tree": "multi:2x2"}, "tree"),
        ({"eos_token_id": "2"}, "eos_token_id"),
        ({"min_forward_tokens": 0}, "min_forward_tokens"),
        ({"sampling": "hot"}, "sampling"),
    ],
)
def test_errors_name_the_offending_field(change: dict[str, object], param: str) -> None:
    fields: dict[str, object] = {"prompt": [1, 2], "max_new_tokens": 4, **change}
    with pytest.raises(ErsdError) as err:
        Request(**fields)  # type: ignore[arg-type]
    assert err.value.param == param, err.value


@pytest.mark.parametrize(
    ("keywords", "param"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"min_p": 1.0}, "min_p"),
        ({"temperature": 0.5, "sampling": SamplingParams(0.5)}, "sampling"),
    ],
)
def test_sampling_errors_name_their_field(keywords: dict[str, object], param: str) -> None:
    with pytest.raises(ErsdError) as err:
        Request.of([1], max_new_tokens=2, **keywords)  # type: ignore[arg-type]
    assert err.value.param == param


def test_model_checks_name_the_field(pair) -> None:
    target, draft = pair
    with pytest.raises(GenerationInputError) as err:
        Request([V], max_new_tokens=2).resolve(target, ersd.ModelDrafter(draft))
    assert err.value.param == "prompt"
    with pytest.raises(GenerationInputError) as err:
        ersd.generate_batch(target, draft, [[1], [2, V + 3]], max_new_tokens=2)
    assert err.value.param == "prompt" and str(err.value).startswith("prompt 1:")


def test_a_negative_seed_fails_alike_everywhere(pair) -> None:
    """Regression: the server accepted seeds in [-2**63, 2**64) and the library [0, 2**64), so
    a negative seed failed late with n = 1 and was derived away with n > 1."""
    target, draft = pair
    calls = [
        lambda: ersd.generate(target, draft, [1], max_new_tokens=2, seed=-1),
        lambda: ersd.generate_batch(target, draft, [[1], [2]], max_new_tokens=2, seeds=-1),
        lambda: ersd.generate_batch(target, draft, [[1], [2]], max_new_tokens=2, seeds=[0, -1]),
        lambda: BatchEngine(target, draft).add([1], max_new_tokens=2, seed=-1),
    ]
    for call in calls:
        with pytest.raises(GenerationInputError, match=r"seed must lie in \[0, 2\*\*64\)") as err:
            call()
        assert err.value.param == "seed"


def test_engine_takes_a_request_or_its_keywords(pair) -> None:
    target, draft = pair
    engine = BatchEngine(target, draft)
    req = Request([1, 2], max_new_tokens=8, seed=5, method="sd", tree="chain:3")
    a = engine.add(req)
    b = engine.add([1, 2], max_new_tokens=8, seed=5, method="sd", tree="chain:3")
    done: dict[int, ersd.GenerationResult] = {}
    while len(engine):
        done.update({rid: res for rid, _, res in engine.step() if res is not None})
    assert done[a].tokens == done[b].tokens and done[a].tree == done[b].tree
    with pytest.raises(GenerationInputError, match="not both"):
        engine.add(req, seed=3)
    engine.close()


@pytest.mark.parametrize(
    ("method", "tree", "temperature"),
    [("ersd", "dynamic:4", 1.0), ("ersd", "dynamic:5@2", 0.7), ("sd", "dynamic:4", 1.0)],
)
def test_dynamic_trees_batched_equal_solo(pair, method: str, tree: str, temperature: float) -> None:
    target, draft = pair
    kw = dict(max_new_tokens=12, method=method, tree=tree, temperature=temperature)
    batch = ersd.generate_batch(target, draft, PROMPTS, seeds=3, max_batch_size=3, **kw)
    for i, (prompt, res) in enumerate(zip(PROMPTS, batch, strict=True)):
        solo = ersd.generate(target, draft, prompt, seed=ersd.derive_seed(3, i), **kw)
        assert res.tokens == solo.tokens, f"prompt {i}"
        assert res.target_calls == solo.target_calls and res.tree == solo.tree
        assert res.num_draft_tokens == solo.num_draft_tokens


def test_optimal_file_label_names_the_tree_drafted(pair, tmp_path: Path) -> None:
    """Regression: the result's label re-parsed ``optimal:K@FILE`` without the temperature, so
    it named the lowest-temperature profile's tree, not the one drafted."""
    target, draft = pair
    calib = _calibration_file(tmp_path)
    spec = f"optimal:4@{calib}"
    for temperature in (0.4, 0.9):
        drafted = ersd.parse_tree(spec, temperature=temperature)
        res = ersd.generate(
            target, draft, [1, 2], max_new_tokens=6, tree=spec, temperature=temperature
        )
        batch = ersd.generate_batch(
            target, draft, [[1, 2]], max_new_tokens=6, tree=spec, temperature=temperature
        )
        assert res.tree == batch[0].tree == drafted.spec
    assert ersd.parse_tree(spec, temperature=0.4) != ersd.parse_tree(spec, temperature=0.9)
