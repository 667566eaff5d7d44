"""Issue 47 on llama.cpp: the identity check before a run sees what the batch policies do.

The exact policy must come out bit-identical (tree rows = one-token rows); the fast policy with a
prompt long enough for llama.cpp's tiled attention kernel (>= 64 tokens in the first call) must
not -- the same check that flags bfloat16 on PyTorch.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

import ersd
from ersd.precision import check_tree_identity

if importlib.util.find_spec("llama_cpp") is None and not os.environ.get("ERSD_REQUIRE_LLAMACPP"):
    pytest.skip(
        "llama-cpp-python is not installed (pip install 'ersd[llamacpp]'); set "
        "ERSD_REQUIRE_LLAMACPP=1 to make this a failure",
        allow_module_level=True,
    )

pytestmark = pytest.mark.realmodel

TEXT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"


@pytest.mark.parametrize("cache", ["q8_0", "bf16", "fast"])
def test_identity_check_tells_the_batch_policies_apart(cache: str) -> None:
    exact = cache != "fast"
    kw: dict = {"kv_cache": cache} if exact else {"exact": False, "repack": False}
    m = ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=512, **kw)
    prompt = (m.tokenizer.encode(TEXT) * 10)[:100]
    check = check_tree_identity(m, prompt)
    if exact:
        assert check.identical and check.max_abs_diff == 0.0
        assert "exact policy" in check.dtype
    else:
        assert not check.identical and check.max_abs_diff > 1e-3
