"""The method catalog: what the rest of ersd knows about each verification method, in one place.

Plain data (no torch), so :mod:`ersd.theory`, the CLI and the benchmark read it without importing
the methods' code.  The theory lists, the ``ersd theory`` choices, the ``--method`` help, the
report order, plot colours and the benchmark's natural shapes all derive from :data:`CATALOG`;
each :class:`ersd.methods.base.Method` subclass points at its entry (``info = CATALOG[...]``) and
takes its name, summary and shape limit from it.  Adding a method: docs/adding-a-method.md.

Shape templates (:meth:`MethodInfo.shapes`) are tree specs with the budget ``{k}`` or a part of it
``{k/m}`` filled in; a template is skipped when ``m`` does not divide ``k`` or when its
``if k>=N`` condition fails, and ``a|b`` takes the first alternative that applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ersd.errors import UnknownMethodError

#: the benchmark's reference runs, listed before every method in reports
BASELINE_ORDER: tuple[str, ...] = (
    "target-only",
    "target-only-2tok",
    "hf-assisted",
    "hf-prompt-lookup",
)


@dataclass(frozen=True)
class MethodInfo:
    """One verification method as the library, theory, CLI and benchmark see it."""

    name: str  # registry name (``ersd.generate(method=...)``, configs, records)
    display: str  # human name
    summary: str  # one line
    supported_shapes: str  # for error messages
    max_children: int | None  # children per node the method can verify (None: any number)
    child_order: bool  # tries children in a fixed order: has a child-index distribution (theory)
    report_order: int  # position in report tables and figures (after BASELINE_ORDER)
    colour: str  # plot colour
    natural: tuple[str, ...]  # shape templates at budget k, style "natural"
    minimal: tuple[str, ...]  # shape templates at budget k, style "minimal"
    #: every emitted token is the target's own race winner (stream 0) at its context, so a
    #: keyed race watermarks all of them (ersd.watermark); rejection methods emit draft samples.
    #: The one statement of that rule: the watermark (ersd.request), the server (ersd serve) and
    #: the audit (ersd.watermark.audit) read it through :func:`race_winners_only`
    race_output: bool = False
    #: a watermark baseline's scheme: "target-only" (drafts unmarked; corrections and bonus
    #: tokens are the keyed race's winners) or "dual-key" (drafts on key A, the rest on key B);
    #: such methods accept a watermark with a draft (``WATERMARK_BASELINES``)
    watermark: str | None = None
    #: where a baseline comes from (an engine's scheme or a paper)
    source: str = ""

    def shapes(self, k: int, style: str = "natural") -> list[str]:
        """Tree specs of the templates of ``style`` at budget ``k`` (unchecked, may repeat);
        ``chain``: the chain of ``k`` tokens alone."""
        if style == "chain":
            return [f"chain:{k}"]
        out = []
        for template in self.natural if style == "natural" else self.minimal:
            for alt in template.split("|"):
                spec = _expand(alt.strip(), k)
                if spec is not None:
                    out.append(spec)
                    break
        return out


def _expand(template: str, k: int) -> str | None:
    spec, _, cond = template.partition(" if k>=")
    if cond and k < int(cond):
        return None
    for m in re.findall(r"\{k/(\d+)\}", spec):
        if k % int(m):
            return None
        spec = spec.replace(f"{{k/{m}}}", str(k // int(m)))
    return spec.replace("{k}", str(k))


_MULTI_DRAFT = ("chain:{k}", "multi:2x{k/2}", "multi:4x{k/4}")
_MULTI_MINIMAL = ("multi:2x{k/2}|chain:{k}",)

CATALOG: dict[str, MethodInfo] = {
    i.name: i
    for i in (
        MethodInfo(
            name="ersd",
            display="ERSD",
            summary="exponential races shared by drafter and target; drafter invariant",
            supported_shapes="any tree (children are ranks in the drafter's race)",
            max_children=None,
            child_order=True,
            report_order=6,
            colour="#d62728",
            natural=_MULTI_DRAFT,
            minimal=("chain:{k}", "multi:2x{k/2}"),
            race_output=True,
        ),
        MethodInfo(
            name="sd",
            display="SD",
            summary="standard speculative sampling: accept w.p. min(1, p/q), else sample "
            "max(p-q, 0)",
            supported_shapes="chains only (every node has at most one child, e.g. 'chain:4')",
            max_children=1,
            child_order=True,
            report_order=0,
            colour="#7f7f7f",
            natural=("chain:{k}",),
            minimal=("chain:{k}",),
        ),
        MethodInfo(
            name="specinfer",
            display="SpecInfer",
            summary="recursive rejection sampling over i.i.d. drafts (with replacement)",
            supported_shapes="any tree (children are i.i.d. draft lanes)",
            max_children=None,
            child_order=True,
            report_order=1,
            colour="#1f77b4",
            natural=_MULTI_DRAFT,
            minimal=_MULTI_MINIMAL,
        ),
        MethodInfo(
            name="rrs-wor",
            display="RRS-wor",
            summary="recursive rejection sampling over drafts sampled without replacement",
            supported_shapes="any tree (children are Gumbel-top-m draws from the drafter)",
            max_children=None,
            child_order=True,
            report_order=2,
            colour="#17becf",
            natural=_MULTI_DRAFT,
            minimal=_MULTI_MINIMAL,
        ),
        MethodInfo(
            name="spectr",
            display="SpecTr",
            summary="SpecTr k-sequential selection over i.i.d. drafts",
            supported_shapes="any tree (children are i.i.d. draft lanes)",
            max_children=None,
            child_order=False,
            report_order=3,
            colour="#2ca02c",
            natural=_MULTI_DRAFT,
            minimal=_MULTI_MINIMAL,
        ),
        MethodInfo(
            name="spechub",
            display="SpecHub",
            summary="SpecHub: two drafts around the draft's argmax (hub), LP-optimal acceptance",
            supported_shapes="trees whose nodes have one or two children (e.g. 'chain:4', "
            "'batch:2', 'multi:2x3')",
            max_children=2,
            child_order=False,
            report_order=4,
            colour="#9467bd",
            natural=("multi:2x{k/2}", "binary:{k} if k>=3"),
            minimal=_MULTI_MINIMAL,
        ),
        MethodInfo(
            name="gls",
            display="GLS",
            summary="Gumbel list sampling: i.i.d. race drafts, target races on the lanes' minimum",
            supported_shapes="any tree (children are i.i.d. race lanes)",
            max_children=None,
            child_order=False,
            report_order=5,
            colour="#ff7f0e",
            natural=_MULTI_DRAFT,
            minimal=_MULTI_MINIMAL,
        ),
    )
}

#: every method, in listing order (CLI choices, theory tables)
METHOD_NAMES: tuple[str, ...] = tuple(CATALOG)

#: The engines' speculative watermark schemes, implemented in our loop as benchmark baselines
#: (docs/watermark.md, "Comparison with the engines' schemes").  Kept out of :data:`CATALOG`:
#: they are SD / SpecInfer with keyed residual and bonus races, not new verification methods,
#: and with no watermark they sample exactly like SD / SpecInfer with a race for the residual.
#: ``ersd.get_method`` finds them by name.  The third baseline, watermarked autoregressive
#: sampling, needs no method: it is target-only decoding with a watermark (``draft=None``).
WATERMARK_BASELINES: dict[str, MethodInfo] = {
    i.name: i
    for i in (
        MethodInfo(
            name="sd-wm-target",
            display="SD, target-only watermark",
            summary="SD whose corrections and bonus tokens are the keyed race's winners; "
            "accepted drafts unmarked",
            supported_shapes="chains only (every node has at most one child, e.g. 'chain:4')",
            max_children=1,
            child_order=True,
            report_order=7,
            colour="#8c564b",
            natural=("chain:{k}",),
            minimal=("chain:{k}",),
            watermark="target-only",
            source="vLLM 0.32 WatermarkConfig(allow_target_only_watermarking=True): draft tokens "
            "unwatermarked, recovered and bonus tokens from the target's keyed Gumbel race",
        ),
        MethodInfo(
            name="specinfer-wm-target",
            display="SpecInfer, target-only watermark",
            summary="SpecInfer whose corrections and bonus tokens are the keyed race's winners; "
            "accepted drafts unmarked",
            supported_shapes="any tree (children are i.i.d. draft lanes)",
            max_children=None,
            child_order=True,
            report_order=8,
            colour="#e377c2",
            natural=_MULTI_DRAFT,
            minimal=_MULTI_MINIMAL,
            watermark="target-only",
            source="vLLM 0.32 allow_target_only_watermarking, extended to multi-draft trees "
            "(recursive rejection over i.i.d. drafts, the keyed race draws the last residual)",
        ),
        MethodInfo(
            name="sd-dual-key",
            display="SD, dual-key watermark",
            summary="SD whose drafts are key-A race winners over q (accepted w.p. min(1, p/q)) "
            "and whose corrections and bonus tokens are key-B race winners",
            supported_shapes="chains only (every node has at most one child, e.g. 'chain:4')",
            max_children=1,
            child_order=True,
            report_order=9,
            colour="#bcbd22",
            natural=("chain:{k}",),
            minimal=("chain:{k}",),
            watermark="dual-key",
            source="vLLM 0.32 algorithm='dual_key_gumbel' (DualKeyGumbelWatermarker: "
            "derive_watermark_key(key, b'key_a' / b'key_b')); SynthID-Text's speculative "
            "sampling with two watermarking keys (Dathathri et al., Nature 2024)",
        ),
    )
}


def method_info(name: str) -> MethodInfo:
    """The catalog entry of ``name``, or :class:`UnknownMethodError` listing the known names."""
    try:
        return CATALOG[name] if name in CATALOG else WATERMARK_BASELINES[name]
    except (KeyError, TypeError):
        raise UnknownMethodError(
            f"unknown method {name!r}; known methods: {', '.join(sorted(CATALOG))}"
        ) from None


def race_winners_only(method: str | MethodInfo | None) -> bool:
    """Whether every token a method emits with a draft is its target race's winner (the
    catalog's ``race_output``): the condition for a full watermark and for the audit.
    ``method``: a name or a catalog entry; unknown names and ``None`` are ``False``."""
    info = CATALOG.get(method) if isinstance(method, str) else method
    return bool(isinstance(info, MethodInfo) and info.race_output)


def report_order(name: str) -> int:
    """Sort key of a method or benchmark baseline in reports (unknown names last)."""
    if name in BASELINE_ORDER:
        return BASELINE_ORDER.index(name)
    info = CATALOG.get(name)
    return len(BASELINE_ORDER) + (info.report_order if info else len(CATALOG))
