"""Every backend runs the same contract (``tests/backend_contract.py``, ``docs/backends.md``).

To add a backend: append one :class:`BackendCase` to ``BACKENDS`` with a factory for a small
model (and a plain reference forward if the backend has one; otherwise a fresh session's prefill
is the reference).  Cases needing downloaded or bundled weights carry ``pytest.mark.realmodel``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ersd
from tests.backend_contract import CHECKS, BackendCase
from tests.toy import table_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def function_reference(model: Any, seq: list[int]) -> torch.Tensor:
    return model.fn([seq])[0]


def hf_reference(model: Any, seq: list[int]) -> torch.Tensor:
    """A plain no-cache forward of the transformers module."""
    with torch.no_grad():
        ids = torch.tensor([seq], device=model.device)
        return model.hf_module(input_ids=ids).logits[0, -1].float()


def hf_tiny(arch: str, seed: int, **kw: Any) -> Any:
    pytest.importorskip("transformers")
    from ersd.models.hf import HFModel
    from tests.hf_tiny import V, tiny_model, word_tokenizer

    tree_attention = kw.pop("tree_attention", "auto")
    model = tiny_model(arch, seed, **kw)
    return HFModel(model, word_tokenizer(V), tree_attention=tree_attention, name=f"tiny-{arch}")


BACKENDS: list[BackendCase] = [
    BackendCase("function", lambda: table_model(40, seed=3), function_reference, atol=0.0),
    BackendCase("toy", lambda: ersd.load_model("toy"), function_reference, atol=0.0),
    BackendCase("hf-llama", lambda: hf_tiny("llama", 0), hf_reference),
    BackendCase("hf-qwen2-sliding", lambda: hf_tiny("qwen2", 2, window=5), hf_reference),
    BackendCase(
        "hf-llama-paths", lambda: hf_tiny("llama", 0, tree_attention="paths"), hf_reference
    ),
    BackendCase("hf-tiny-qwen2", lambda: ersd.load_model("tiny-qwen2"), hf_reference),
    BackendCase(
        "hf-smollm2-135m",
        lambda: ersd.load_model("smollm2-135m"),
        hf_reference,
        atol=2e-3,  # logits of size ~20 in float32
        steps=3,
        marks=(pytest.mark.realmodel,),
    ),
]


@pytest.fixture(scope="module", params=[case.param() for case in BACKENDS])
def backend(request: pytest.FixtureRequest) -> tuple[BackendCase, Any]:
    case: BackendCase = request.param
    return case, case.make()


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_backend_contract(backend: tuple[BackendCase, Any], check: str) -> None:
    case, model = backend
    CHECKS[check](case, model)


def test_docs_backend_examples_run_and_pass_the_contract() -> None:
    """The examples in docs/backends.md run as written; its 60-line backend passes the contract."""
    import re
    from pathlib import Path

    from tests.backend_contract import run_contract

    text = (Path(__file__).parent.parent / "docs" / "backends.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "import ersd" in b]
    assert len(blocks) == 2
    for block in blocks:
        namespace: dict[str, Any] = {"__name__": "backends_doc"}
        exec(compile(block, "docs/backends.md", "exec"), namespace)
    run_contract(BackendCase("next-token", namespace["NextTokenModel"], atol=0.0))
