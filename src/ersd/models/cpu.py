"""CPU fast paths for the linear layers of a loaded model: where a 1.5B model's time goes on a CPU.

Speculative decoding pays only if scoring k tokens costs little more than scoring one. On CPUs the
stock ``torch.nn.functional.linear`` (MKL sgemm) repacks the whole weight matrix on every call with
more than one input row, so a float32 forward of 4 tokens costs ~2.6x a forward of 1 (measured on
an AVX2 EPYC, Qwen2.5-Coder-1.5B: 0.50 s vs 1.32 s). Two transforms fix that, both applied in place
to every ``torch.nn.Linear`` of a model:

* :func:`prepack_linears` (``linear="onednn"``): keeps the float32 weights but stores them once in
  oneDNN's own layout, packed for calls of :data:`PACK_ROWS` rows (a draft tree's size), and calls
  the kernel PyTorch's own compiler uses for CPU linears (``mkldnn._linear_pointwise``). Same
  weights, same arithmetic up to float rounding order (differences ~1e-4 on logits of size ~20),
  and the cost of k rows grows slowly with k: a 4-token forward costs 1.33x a 1-token one (0.341
  vs 0.256 s), against 1.9x (0.491 s) with the weights in oneDNN's plain layout
  (``mkldnn_linear``, the fallback where a build cannot pack). This is what a *target* should use
  on CPU: the sampled distribution is the model's own.
* :func:`quantize_int8` (``dtype="int8"``): dynamic int8 quantization (fbgemm; weights int8 per
  output channel, activations quantized per call). About 4x less memory traffic than float32, so a
  one-token forward is 3-5x cheaper. It changes the model's outputs slightly, which is fine for a
  *draft* (any draft keeps every method exact; ERSD's output does not even depend on it) and wrong
  for a target.

Both are CPU-only; CUDA models are left as they are.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

LINEAR_MODES = ("auto", "torch", "onednn")


#: the rows per call oneDNN packs the weights for (:func:`packed_linear_available`): a draft
#: tree's size.  Packed for 8 rows, a 1.5B model's 4-token forward costs 1.33x its 1-token one
#: on an AVX2 EPYC, against 1.9x with the weight only stored in oneDNN's layout (module docstring)
PACK_ROWS = 8


class OneDNNLinear(torch.nn.Module):
    """A float32 ``nn.Linear`` with its weight kept in oneDNN's layout: packed for calls of
    :data:`PACK_ROWS` rows where this torch build can (``mkldnn._linear_pointwise``, the kernel
    PyTorch's own compiler uses for CPU linears), else in oneDNN's plain layout
    (``mkldnn_linear``).  ``packed``: None picks by :func:`packed_linear_available`."""

    def __init__(self, linear: torch.nn.Linear, packed: bool | None = None) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.packed = packed_linear_available() if packed is None else packed
        with torch.no_grad():
            weight = linear.weight.detach().float()
            bias = linear.bias.detach().float() if linear.bias is not None else None
            if self.packed:
                self.weight_onednn = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
                self.bias_onednn = bias.contiguous() if bias is not None else None
            else:
                self.weight_onednn = weight.to_mkldnn()
                self.bias_onednn = bias.to_mkldnn() if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float()
        if self.packed:
            y = torch.ops.mkldnn._linear_pointwise(
                x2.contiguous(), self.weight_onednn, self.bias_onednn, "none", [], ""
            )
        else:
            y = torch._C._nn.mkldnn_linear(
                x2.to_mkldnn(), self.weight_onednn, self.bias_onednn
            ).to_dense()
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        layout = f"packed for {PACK_ROWS} rows" if self.packed else "plain layout"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"oneDNN float32, {layout}"
        )


def onednn_available() -> bool:
    """True when this torch build can run ``mkldnn_linear`` on this CPU (probed once)."""
    global _ONEDNN_OK
    if _ONEDNN_OK is None:
        try:
            probe = OneDNNLinear(torch.nn.Linear(8, 4), packed=False)
            out = probe(torch.ones(2, 8))
            _ONEDNN_OK = bool(out.shape == (2, 4) and torch.isfinite(out).all())
        except (RuntimeError, AttributeError):
            _ONEDNN_OK = False
    return _ONEDNN_OK


_ONEDNN_OK: bool | None = None


def packed_linear_available() -> bool:
    """True when this torch build can pack a float32 weight for a row count and run it
    (``mkldnn._reorder_linear_weight`` / ``mkldnn._linear_pointwise``) and the result matches
    the plain product (probed once)."""
    global _PACKED_OK
    if _PACKED_OK is None:
        try:
            # fixed values, no random init: the global RNG is left alone
            lin = torch.nn.utils.skip_init(torch.nn.Linear, 16, 8)
            with torch.no_grad():
                lin.weight.copy_(torch.linspace(-1, 1, 128).reshape(8, 16))
                lin.bias.copy_(torch.linspace(-0.5, 0.5, 8))
                x = torch.linspace(-2, 2, 48).reshape(3, 16)
                out = OneDNNLinear(lin, packed=True)(x)
                _PACKED_OK = bool(torch.allclose(out, lin(x), atol=1e-4, rtol=1e-4))
        except (RuntimeError, AttributeError):
            _PACKED_OK = False
    return _PACKED_OK


_PACKED_OK: bool | None = None


def linear_backend(model: torch.nn.Module) -> str:
    """``"onednn"`` / ``"int8"`` if :func:`prepack_linears` / :func:`quantize_int8` converted
    ``model``'s linear layers, else ``"torch"``."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    for m in model.modules():
        if isinstance(m, OneDNNLinear):
            return "onednn"
        if isinstance(m, DynamicQuantizedLinear):
            return "int8"
    return "torch"


def linear_layout(model: torch.nn.Module) -> str | None:
    """How a oneDNN model's weights are laid out: ``"packed:N"`` (for N rows per call) or
    ``"plain"``; None for other models.  Part of the model's description, so that a cost curve
    stored for one layout is never read for another (:mod:`ersd.cost_store`)."""
    for m in model.modules():
        if isinstance(m, OneDNNLinear):
            return f"packed:{PACK_ROWS}" if m.packed else "plain"
    return None


def _replace_linears(module: torch.nn.Module, make: Any) -> int:
    count = 0
    for name, child in list(module.named_children()):
        if type(child) is torch.nn.Linear:
            setattr(module, name, make(child))
            count += 1
        else:
            count += _replace_linears(child, make)
    return count


def _untie_output_embeddings(model: Any) -> None:
    """A tied lm_head shares its weight with the input embedding: give the embedding its own copy
    (the lm_head is about to be replaced, and the embedding must keep working)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if head is not None and emb is not None and head.weight is emb.weight:
        emb.weight = torch.nn.Parameter(emb.weight.detach().clone(), requires_grad=False)


def prepack_linears(model: torch.nn.Module) -> int:
    """Replace every float32 CPU ``nn.Linear`` of ``model`` by :class:`OneDNNLinear`; returns how
    many were replaced (0 when oneDNN is unavailable, or the model is not a float32 CPU model)."""
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32 or not onednn_available():
        return 0
    _untie_output_embeddings(model)
    with torch.no_grad():
        return _replace_linears(model, OneDNNLinear)


def quantize_int8(model: torch.nn.Module) -> int:
    """Dynamic int8 quantization (per-channel weights) of every ``nn.Linear``; returns the count.

    The model must be float32 on CPU; its outputs change slightly, so use it for drafts only.
    """
    param = next(model.parameters())
    if param.device.type != "cpu":
        raise ValueError(
            "int8 dynamic quantization runs on CPU only; load the draft with device='cpu'"
        )
    if param.dtype != torch.float32:
        model.float()
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    count = sum(1 for m in model.modules() if type(m) is torch.nn.Linear)
    _untie_output_embeddings(model)
    with warnings.catch_warnings():
        # torch.ao's eager quantization is deprecated in favour of torchao; it is still the one
        # with fbgemm's fast int8 CPU kernels and no extra dependency
        warnings.simplefilter("ignore")
        quantize_dynamic(
            model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
        )
    return count
