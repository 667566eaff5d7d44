"""ersd.validation: every validator accepts exactly the documented inputs, normalises them to
plain Python values, and rejects the rest with the documented error class and a fix."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ersd import validation as val
from ersd.errors import (
    ErsdError,
    GenerationInputError,
    InputFileError,
    ModelLoadError,
    SamplingParamsError,
)

V = 10

# --- seed --------------------------------------------------------------------------------------

GOOD_SEEDS = [
    (0, 0),
    (7, 7),
    (2**64 - 1, 2**64 - 1),
    (np.int64(5), 5),
    (np.uint64(2**64 - 1), 2**64 - 1),
    (np.int8(3), 3),
    (torch.tensor(9), 9),
    (torch.tensor(4, dtype=torch.int32), 4),
]
BAD_SEEDS = [
    (-1, "in \\[0, 2\\*\\*64\\), got -1.*not reduced"),
    (2**64, "got 18446744073709551616.*seed % 2\\*\\*64"),
    (np.int64(-3), "got -3"),
    (1.7, "got 1.7 \\(float\\).*not rounded"),
    (2.0, "got 2.0 \\(float\\)"),
    ("3", "got '3' \\(str\\)"),
    (True, "got True \\(bool\\)"),
    (np.bool_(False), "bool"),
    (None, "got None"),
    (torch.tensor(1.0), "Tensor"),
    (torch.tensor([1]), "Tensor"),
    (torch.tensor(True), "Tensor"),
    (np.float64(1.0), "float64"),
]


@pytest.mark.parametrize(("seed", "want"), GOOD_SEEDS, ids=repr)
def test_seed_accepted(seed: Any, want: int) -> None:
    got = val.check_seed(seed)
    assert got == want and type(got) is int


@pytest.mark.parametrize(("seed", "match"), BAD_SEEDS, ids=repr)
def test_seed_rejected(seed: Any, match: str) -> None:
    with pytest.raises(GenerationInputError, match=match):
        val.check_seed(seed)


# --- token ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ids",
    [
        [1, 2, 9],
        (1, 2, 9),
        [np.int64(1), np.int32(2), 9],
        [torch.tensor(1), 2, np.uint8(9)],
        np.array([1, 2, 9]),
        np.array([1, 2, 9], dtype=np.uint16),
        torch.tensor([1, 2, 9]),
        torch.tensor([1, 2, 9], dtype=torch.int32),
    ],
    ids=lambda x: f"{type(x).__name__}",
)
def test_token_ids_accepted(ids: Any) -> None:
    got = val.check_token_ids(ids, V)
    assert got == [1, 2, 9] and all(type(t) is int for t in got)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ("hello", "not a str; tokenize it first"),
        (b"hi", "not a bytes"),
        ([], "is empty"),
        (np.array([], dtype=np.int64), "is empty"),
        ([1, V], "outside \\[0, 10\\): \\[10\\]"),
        ([-1, 2], "outside \\[0, 10\\): \\[-1\\]"),
        ([1, True], "prompt\\[1\\] is True \\(bool\\)"),
        ([1, 2.0], "prompt\\[1\\] is 2.0 \\(float\\)"),
        ([1, "2"], "prompt\\[1\\] is '2' \\(str\\)"),
        ([1, None], "prompt\\[1\\] is None"),
        (np.array([1.0, 2.0]), "dtype float64"),
        (np.array([True, False]), "dtype bool"),
        (torch.tensor([1.0]), "dtype torch.float32"),
        (torch.tensor([True]), "dtype torch.bool"),
        (np.array([[1, 2]]), "shape \\(1, 2\\); pass one row"),
        (torch.tensor([[1, 2]]), "shape \\(1, 2\\)"),
        (torch.tensor(3), "shape \\(\\)"),
        ({1, 2}, "got set"),
        (5, "got int"),
    ],
    ids=repr,
)
def test_token_ids_rejected(ids: Any, match: str) -> None:
    with pytest.raises(GenerationInputError, match=match):
        val.check_token_ids(ids, V)


# --- eos ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eos", "want"),
    [
        (None, set()),
        ([], set()),
        (3, {3}),
        (np.int64(3), {3}),
        (torch.tensor(3), {3}),
        ([1, 2], {1, 2}),
        ((9,), {9}),
        ({2, 4}, {2, 4}),
        (np.array([1, 2]), {1, 2}),
        (torch.tensor([1, 2]), {1, 2}),
    ],
    ids=repr,
)
def test_eos_accepted(eos: Any, want: set[int]) -> None:
    assert val.check_eos_ids(eos, V) == want


@pytest.mark.parametrize(
    ("eos", "match"),
    [
        ("12", "not the string '12'"),
        ("", "not the string ''"),
        (-1, "eos_token_id -1 is outside"),
        (V, "eos_token_id 10 is outside"),
        ([1, V], "outside \\[0, 10\\): \\[10\\]"),
        (True, "got True"),
        (1.0, "got 1.0"),
        ([1, 2.5], "eos_token_id\\[1\\] is 2.5"),
        (np.array([0.5]), "dtype float64"),
    ],
    ids=repr,
)
def test_eos_rejected(eos: Any, match: str) -> None:
    with pytest.raises(GenerationInputError, match=match):
        val.check_eos_ids(eos, V)


# --- max_new_tokens and the context window ----------------------------------------------------


@pytest.mark.parametrize("n", [1, 128, np.int64(5), torch.tensor(2)], ids=repr)
def test_max_new_tokens_accepted(n: Any) -> None:
    assert val.check_max_new_tokens(n) == int(n)


@pytest.mark.parametrize("n", [0, -3, 1.5, 2.0, True, "8", None], ids=repr)
def test_max_new_tokens_rejected(n: Any) -> None:
    with pytest.raises(GenerationInputError, match="max_new_tokens must be an integer >= 1"):
        val.check_max_new_tokens(n)


def test_prompt_must_fit_the_context_window() -> None:
    val.check_prompt_fits(10, None)
    val.check_prompt_fits(10, 11)
    with pytest.raises(GenerationInputError, match="context window is 10 tokens.*at most 9"):
        val.check_prompt_fits(10, 10)


# --- sampling parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({}, (1.0, None, None, None)),
        ({"temperature": 0}, (0.0, None, None, None)),
        ({"temperature": val.MIN_TEMPERATURE}, (val.MIN_TEMPERATURE, None, None, None)),
        ({"temperature": np.float32(0.5)}, (0.5, None, None, None)),
        ({"temperature": 2, "top_k": np.int64(5)}, (2.0, 5, None, None)),
        ({"top_p": 1.0, "min_p": 0.0}, (1.0, None, 1.0, 0.0)),
        ({"top_p": 1, "min_p": 0.99}, (1.0, None, 1.0, 0.99)),
    ],
    ids=repr,
)
def test_sampling_accepted(kwargs: dict[str, Any], want: tuple[Any, ...]) -> None:
    got = val.check_sampling(**kwargs)
    assert got == pytest.approx(want) if None not in want else got == want
    assert all(type(g) in (float, int, type(None)) for g in got)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.5}, "finite number >= 0"),
        ({"temperature": math.nan}, "finite number >= 0"),
        ({"temperature": math.inf}, "finite number >= 0"),
        ({"temperature": 5e-324}, "below the smallest supported.*temperature=0 for greedy"),
        ({"temperature": 1e-300}, "below the smallest supported"),
        ({"temperature": val.MIN_TEMPERATURE / 2}, "below the smallest supported"),
        ({"temperature": "0.7"}, "finite number"),
        ({"temperature": True}, "finite number"),
        ({"temperature": None}, "finite number"),
        ({"top_k": 0}, "top_k must be an integer >= 1 or None"),
        ({"top_k": -2}, "top_k must be"),
        ({"top_k": 2.0}, "top_k must be"),
        ({"top_k": True}, "top_k must be"),
        ({"top_p": 0.0}, "top_p must lie in \\(0, 1\\]"),
        ({"top_p": 1.01}, "top_p must lie"),
        ({"top_p": math.nan}, "top_p must lie"),
        ({"top_p": "0.9"}, "top_p must lie"),
        ({"min_p": 1.0}, "min_p must lie in \\[0, 1\\)"),
        ({"min_p": -0.1}, "min_p must lie"),
        ({"min_p": math.nan}, "min_p must lie"),
        ({"min_p": False}, "min_p must lie"),
    ],
    ids=repr,
)
def test_sampling_rejected(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(SamplingParamsError, match=match):
        val.check_sampling(**kwargs)


# --- layer counts ------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 15, 30, np.int64(4)], ids=repr)
def test_layer_count_accepted(count: Any) -> None:
    assert val.check_layer_count(count, 30) == int(count)


@pytest.mark.parametrize("count", [0, -1, 31, 2.0, True, "6", None], ids=repr)
def test_layer_count_rejected(count: Any) -> None:
    with pytest.raises(ModelLoadError, match="from 1 to 30 \\(the checkpoint has 30 layers\\)"):
        val.check_layer_count(count, 30)


# --- devices -----------------------------------------------------------------------------------


def test_cpu_is_a_device() -> None:
    assert val.check_device("cpu") == "cpu"
    assert val.check_device("cpu:0") == "cpu:0"


@pytest.mark.parametrize(
    ("device", "match"),
    [
        ("gpu", "unknown device 'gpu'; use 'cpu', 'cuda'"),
        ("", "unknown device ''"),
        ("cuda:x", "unknown device"),
        ("meta", "unknown device 'meta'"),
        ("cpu:3", "the CPU has no index"),
        (0, "must be a string"),
        (None, "must be a string"),
    ],
    ids=repr,
)
def test_bad_device_rejected(device: Any, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        val.check_device(device)


def test_cuda_and_mps_only_where_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="sees no CUDA GPU; use --device cpu"):
        val.check_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert val.check_device("cuda") == "cuda"
    assert val.check_device("cuda:1") == "cuda:1"
    with pytest.raises(ModelLoadError, match="only 2 CUDA GPU\\(s\\) visible"):
        val.check_device("cuda:2")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="MPS .* is not available"):
        val.check_device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert val.check_device("mps") == "mps"


def test_devices_of_this_torch_build() -> None:
    """Unpatched: whatever this machine has is accepted, what it lacks is refused."""
    for dev, ok in [
        ("cuda", torch.cuda.is_available()),
        (f"cuda:{torch.cuda.device_count()}", False),
        ("mps", torch.backends.mps.is_available()),
    ]:
        if ok:
            assert val.check_device(dev) == dev
        else:
            with pytest.raises(ModelLoadError):
                val.check_device(dev)


# --- input files -------------------------------------------------------------------------------


def test_input_file(tmp_path: Path) -> None:
    f = tmp_path / "profile.json"
    f.write_text("{}")
    assert val.check_input_file(f, what="rank profile") == f
    assert val.check_input_file(str(f)) == f
    with pytest.raises(InputFileError, match="rank profile .* is a directory"):
        val.check_input_file(tmp_path, what="rank profile")
    with pytest.raises(InputFileError, match="does not exist"):
        val.check_input_file(tmp_path / "nope.json")
    with pytest.raises(InputFileError, match="non-empty path"):
        val.check_input_file("")
    with pytest.raises(InputFileError, match="non-empty path"):
        val.check_input_file(3)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="not a regular file"):
        val.check_input_file(fifo)


def test_every_error_is_an_ersd_error() -> None:
    for cls in (GenerationInputError, SamplingParamsError, ModelLoadError, InputFileError):
        assert issubclass(cls, ErsdError) and issubclass(cls, ValueError)
