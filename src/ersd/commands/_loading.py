"""The model options and the loading of a (target, draft) pair, shared by ``ersd generate``,
``ersd serve`` and ``ersd bench serve``, so that every command takes the same backends, dtypes
and drafter specs (a draft model, ``lookup``, ``suffix:...``, ``lookup+<model>``, ``none``).

    @click.command()
    @model_options(dtype="float32")
    def cmd(models: ModelArgs) -> None:
        pair = load_pair(models)           # ErsdError / click.UsageError on bad input
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

DTYPES = ["float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class ModelArgs:
    """What the model options asked for (one field per option, named like its parameter)."""

    target: str
    draft: str
    draft_layers: int | None = None
    dtype: str = "float32"
    draft_dtype: str | None = None
    linear: str = "auto"
    device: str = "cpu"
    backend: str = "hf"
    threads: int | None = None
    batch_policy: str = "exact"

    @property
    def has_draft(self) -> bool:
        return self.draft.strip().lower() != "none"

    def cli_args(self) -> list[str]:
        """These options as command-line arguments (for a command started in a subprocess)."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out += ["--" + f.name.replace("_", "-"), str(value)]
        return out


_FIELDS = [f.name for f in fields(ModelArgs)]


def model_options(*, dtype: str = "bfloat16", dtype_help: str | None = None) -> Callable[[F], F]:
    """The click options of :class:`ModelArgs`; the command receives them as one ``models``
    argument.  ``dtype`` is the default of ``--dtype`` (``ersd serve`` defaults to float32)."""
    opts = [
        click.option(
            "--target",
            default="qwen2.5-coder-1.5b",
            show_default=True,
            help="Target model: bundled name (see `ersd models list`), local folder, hub id, or "
            "a weight-free stand-in (toy, tiny-qwen2).",
        ),
        click.option(
            "--draft",
            default="qwen2.5-coder-0.5b",
            show_default=True,
            help="Draft model (same vocabulary as the target), 'none' for target-only, or a "
            "drafter: 'lookup' (prompt lookup), 'suffix', 'lookup:n=3,k=8,branches=2', "
            "'lookup+<draft model>' (hybrid); see docs/drafters.md.",
        ),
        click.option(
            "--draft-layers",
            type=int,
            default=None,
            help="Keep only the first K layers of the draft (a layer-truncated draft).",
        ),
        click.option(
            "--dtype",
            default=dtype,
            show_default=True,
            type=click.Choice(DTYPES),
            help=dtype_help
            or "choose by measuring (--config auto), not by CPU flag; float32 for identity checks.",
        ),
        click.option(
            "--draft-dtype",
            default=None,
            type=click.Choice([*DTYPES, "int8"]),
            help="dtype of the draft (default: --dtype). int8 (CPU): dynamic int8 quantization, "
            "the cheapest draft; the draft never changes ERSD's text.",
        ),
        click.option(
            "--linear",
            default="auto",
            show_default=True,
            type=click.Choice(["auto", "onednn", "torch"]),
            help="float32 CPU linear layers: onednn stores weights prepacked (scoring k tokens "
            "costs little more than 1); torch = stock nn.Linear; auto = onednn where available.",
        ),
        click.option("--device", default="cpu", show_default=True),
        click.option(
            "--backend",
            default="hf",
            show_default=True,
            type=click.Choice(["hf", "llamacpp"]),
            help="hf: PyTorch/transformers; llamacpp: the GGUF weights run by llama.cpp (needs "
            "the extra: pip install 'ersd[llamacpp]'; --dtype/--linear/--device do not apply).",
        ),
        click.option("--threads", type=int, default=None, help="llamacpp: CPU threads."),
        click.option(
            "--batch-policy",
            default="exact",
            show_default=True,
            type=click.Choice(["exact", "fast"]),
            help="llamacpp: the target's batch policy. exact: tree rows equal one-token rows, so "
            "ERSD's text is drafter-invariant (unrepacked weights: slower decodes); fast: "
            "llama.cpp's repacked weights (its own speed; ERSD's text then depends on the tree, "
            "use it with --draft none). --config auto picks by measurement. Drafts always run "
            "fast: a draft never changes the text.",
        ),
    ]

    def apply(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs["models"] = ModelArgs(**{name: kwargs.pop(name) for name in _FIELDS})
            return f(*args, **kwargs)

        out: Any = wrapper
        for opt in reversed(opts):
            out = opt(out)
        return out

    return apply


@dataclass
class LoadedPair:
    """A loaded target and its draft (a model, a drafter, or ``None``), and how they loaded."""

    args: ModelArgs
    target: Any
    draft: Any
    seconds: float

    @property
    def dtype(self) -> str:
        """The target's dtype asked for ("gguf" for llama.cpp)."""
        return "gguf" if self.args.backend == "llamacpp" else self.args.dtype

    def summary(self) -> str:
        """``target NAME (dtype[ oneDNN]), draft NAME (dtype), device`` for the load line."""
        a = self.args
        about = self.target.describe()
        onednn = " oneDNN" if about.get("linear") == "onednn" else ""
        if a.backend == "llamacpp":
            draft_dtype, device = "gguf", f"llama.cpp, {self.target.threads} threads"
        else:
            draft_dtype, device = a.draft_dtype or a.dtype, a.device
        device = str(about.get("device", device))
        draft = (
            f", draft {a.draft} ({_draft_dtype(self.draft, draft_dtype)})"
            if self.draft is not None
            else ", no draft"
        )
        dtype = about.get("dtype", self.dtype)
        return f"target {a.target} ({dtype}{onednn}){draft}, {device}"


def _draft_dtype(dmodel: Any, default: str) -> str:
    """The draft's dtype as loaded (a model-free drafter has none: 'model-free'); drafters that
    wrap a model (ModelDrafter, a hybrid's model part) are looked through."""
    if not hasattr(dmodel, "describe") and not hasattr(dmodel, "model"):
        return "model-free"
    for _ in range(3):  # HybridDrafter.model is a ModelDrafter, whose .model is the model
        if hasattr(dmodel, "describe"):
            return str(dmodel.describe().get("dtype", default))
        dmodel = getattr(dmodel, "model", None)
    return default


def load_pair(args: ModelArgs) -> LoadedPair:
    """Load the target and the draft ``args`` name (see :mod:`ersd.drafting.spec` for drafter
    specs); the draft's vocabulary is checked against the target's.  Raises ``ErsdError``
    (bad names, files, vocabularies) or ``click.UsageError`` (options that do not go together).
    """
    import ersd
    from ersd.drafting import parse_drafter

    if args.backend == "llamacpp" and args.draft_layers is not None:
        raise click.UsageError("--draft-layers needs --backend hf")
    if args.backend != "llamacpp" and args.batch_policy != "exact":
        raise click.UsageError("--batch-policy applies to --backend llamacpp only; drop it")
    t0 = time.perf_counter()
    if args.backend == "llamacpp":

        def load_gguf(name: str, exact: bool) -> Any:
            return ersd.load_model(
                name, backend="llamacpp", threads=args.threads, exact=exact, progress=True
            )

        def load_target(name: str) -> Any:
            return load_gguf(name, args.batch_policy == "exact")

        def load_draft_model(name: str) -> Any:  # its rows never reach the text: llama.cpp's speed
            return load_gguf(name, False)
    else:
        overrides: dict[str, Any] = (
            {"num_hidden_layers": args.draft_layers} if args.draft_layers is not None else {}
        )

        def load_target(name: str) -> Any:
            return ersd.load_model(
                name, dtype=args.dtype, device=args.device, linear=args.linear, progress=True
            )

        def load_draft_model(name: str) -> Any:
            dtype = args.draft_dtype or args.dtype
            return ersd.load_model(
                name,
                dtype=dtype,
                device=args.device,
                linear=args.linear,
                progress=True,
                **overrides,
            )

    tmodel = load_target(args.target)
    dmodel = None
    if args.has_draft:

        def load_draft(name: str) -> Any:
            m = load_draft_model(name)
            tmodel.check_compatible(m)
            return m

        # a model name, 'lookup', 'suffix:...' or 'lookup+<model>' (ersd.drafting.spec)
        dmodel = parse_drafter(args.draft, load_model=load_draft, tokenize=tmodel.tokenizer.encode)
    return LoadedPair(args, tmodel, dmodel, time.perf_counter() - t0)
