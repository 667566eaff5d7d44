"""The validators of ersd.validation are wired into the entry points (not only unit-tested)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ersd
from ersd import GenerationInputError, InvalidTreeSpecError, ModelLoadError, SamplingParamsError
from tests.toy import table_model

V = 12


@pytest.fixture
def target() -> ersd.FunctionModel:
    return table_model(V, seed=0)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.7, "3", True, None])
def test_generate_refuses_bad_seeds(target, seed) -> None:
    with pytest.raises(GenerationInputError, match="seed must"):
        ersd.generate(target, None, [1], max_new_tokens=2, seed=seed)


@pytest.mark.parametrize("seed", [-1, 2**64, 2.5])
def test_generate_batch_refuses_bad_seeds(target, seed) -> None:
    with pytest.raises(GenerationInputError, match="seeds? must"):
        ersd.generate_batch(target, None, [[1]], max_new_tokens=2, seeds=seed)
    with pytest.raises(GenerationInputError, match="seed must"):
        ersd.generate_batch(target, None, [[1]], max_new_tokens=2, seeds=[seed])


def test_numpy_and_torch_integers_are_accepted_and_give_the_same_text(target) -> None:
    ref = ersd.generate(target, None, [1, 2], max_new_tokens=5, seed=3).tokens
    for prompt, seed in (
        (np.array([1, 2]), np.int64(3)),
        (torch.tensor([1, 2]), torch.tensor(3)),
        ([np.int32(1), torch.tensor(2)], 3),
    ):
        assert ersd.generate(target, None, prompt, max_new_tokens=5, seed=seed).tokens == ref


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        ([1, True], "bool"),
        ([1, 2.0], "not an integer"),
        ([[1, 2]], "not an integer"),
        (np.array([1.0, 2.0]), "integer token ids"),
        (np.array([[1, 2]]), "1-d"),
    ],
)
def test_bad_token_ids(target, prompt, match: str) -> None:
    with pytest.raises(GenerationInputError, match=match):
        ersd.generate(target, None, prompt, max_new_tokens=2)


@pytest.mark.parametrize("eos", ["12", 1.0, [1, 2.5], True])
def test_bad_eos_ids(target, eos) -> None:
    with pytest.raises(GenerationInputError, match="eos_token_id"):
        ersd.generate(target, None, [1], max_new_tokens=2, eos_token_id=eos)


@pytest.mark.parametrize("n", [0, 1.5, True, "8"])
def test_bad_max_new_tokens(target, n) -> None:
    with pytest.raises(GenerationInputError, match="max_new_tokens"):
        ersd.generate(target, None, [1], max_new_tokens=n)


@pytest.mark.parametrize("temperature", [5e-324, 1e-6, float("nan"), -1.0])
def test_bad_temperatures(target, temperature: float) -> None:
    with pytest.raises(SamplingParamsError, match="temperature"):
        ersd.generate(target, None, [1], max_new_tokens=2, temperature=temperature)


@pytest.mark.parametrize("device", ["gpu", "cuda:7", "cpu:3"])
def test_load_model_refuses_devices_torch_cannot_serve(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has 8 GPUs")  # never on the CPU machines CI runs on
    with pytest.raises(ModelLoadError, match="device"):
        ersd.load_model("tiny-qwen2", backend="hf", device=device)


def test_profile_path_that_is_a_directory(tmp_path, target) -> None:
    with pytest.raises(InvalidTreeSpecError, match="directory"):
        ersd.generate(target, target, [1], max_new_tokens=2, tree=f"optimal:4@{tmp_path}")
