"""The serving loop's progress inside a step and its stop mid-forward (issue 48, item 4), on a
weight-free model whose forward runs a ``torch.nn.ModuleList`` of slow layers (as an HF model's
decoder layers), driven directly through :class:`ersd.serve.engine.ServingLoop` in a thread.
Every wait is capped in count and seconds; the loop is closed in a finally."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from ersd.models.function import FunctionModel
from ersd.request import Request
from ersd.serve.engine import Job, ServingLoop, torch_modules

VOCAB = 16
LAYERS = 10
LAYER_DELAY = 0.05  # a forward: 0.5 s


class SlowLayer(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(LAYER_DELAY)
        return x


class LayeredModel(FunctionModel):
    """A function model whose every forward runs ``LAYERS`` slow layers of ``hf_module``."""

    def __init__(self) -> None:
        self.hf_module = torch.nn.Sequential(
            torch.nn.ModuleList(SlowLayer() for _ in range(LAYERS))
        )

        def fn(seqs: list[list[int]]) -> torch.Tensor:
            x = torch.zeros(len(seqs), VOCAB)
            for layer in self.hf_module[0]:
                x = layer(x)
            return x

        super().__init__(fn, VOCAB)


@pytest.fixture
def loop() -> Iterator[ServingLoop]:
    serving = ServingLoop(LayeredModel(), None, max_batch_size=2, max_queue=4)
    serving.start()
    try:
        yield serving
    finally:
        serving.close(timeout=2)


def _job(events: list[Any], tokens: int = 200) -> Job:
    req = Request(list(range(1, 9)), max_new_tokens=tokens, seed=1, tree=None)
    return Job(req, events.append)


def _until(check: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds / 0.01)):
        if check() or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return bool(check())


def test_layers_report_progress_inside_a_step(loop: ServingLoop) -> None:
    assert loop.progress_inside_steps and loop.progress().phase == "idle"
    events: list[Any] = []
    loop.submit([_job(events, tokens=3)])
    assert _until(lambda: loop.progress().phase == "prefill", 5)
    seen = []
    for _ in range(40):  # 0.4 s inside a 0.5 s forward
        seen.append(loop.progress())
        time.sleep(0.01)
    prefill = [p for p in seen if p.phase == "prefill"]
    assert prefill and prefill[0].prefill_tokens == 8
    # the step runs for longer than a layer, yet progress never lags by more than ~a layer
    assert max(p.step_seconds for p in prefill) > 3 * LAYER_DELAY
    assert max(p.stalled_for for p in prefill) < 3 * LAYER_DELAY
    assert _until(lambda: any(getattr(e, "finish_reason", None) for e in events), 10)


def test_a_step_whose_rows_are_all_cancelled_stops_mid_forward(loop: ServingLoop) -> None:
    events: list[Any] = []
    job = _job(events)
    loop.submit([job])
    assert _until(lambda: loop.progress().phase == "prefill", 5)
    time.sleep(2 * LAYER_DELAY)
    t0 = time.monotonic()
    loop.cancel([job])
    assert _until(lambda: loop.num_running == 0, 5)
    assert time.monotonic() - t0 < LAYERS * LAYER_DELAY / 2  # not the rest of the forward
    assert loop.steps_cancelled == 1 and loop.failures == 0
    assert not events  # nothing delivered for a cancelled prefill
    # the loop goes on: a new request is served in full
    other: list[Any] = []
    loop.submit([_job(other, tokens=2)])
    assert _until(lambda: any(getattr(e, "finish_reason", None) for e in other), 10)


def test_a_live_row_keeps_a_shared_step_going(loop: ServingLoop) -> None:
    """Only a step whose rows were *all* cancelled stops; one live row keeps it."""
    gone: list[Any] = []
    live: list[Any] = []
    a, b = _job(gone), _job(live, tokens=2)
    loop.submit([a, b])
    assert _until(lambda: loop.progress().phase == "prefill", 5)
    loop.cancel([a])
    assert _until(lambda: any(getattr(e, "finish_reason", None) for e in live), 10)
    assert loop.steps_cancelled == 0


def test_models_without_a_torch_module_report_whole_steps() -> None:
    plain = FunctionModel(lambda seqs: torch.zeros(len(seqs), VOCAB), VOCAB)
    assert torch_modules(plain, None) == []
    serving = ServingLoop(plain, None)
    try:
        assert not serving.progress_inside_steps
    finally:
        serving.close(timeout=1)
