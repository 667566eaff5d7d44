"""The method catalog is the one source of method names, shape limits and shapes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ersd import UnknownMethodError, UnsupportedTreeError, parse_tree
from ersd.bench.trees import natural_shapes
from ersd.cli import main
from ersd.methods import CATALOG, METHOD_NAMES, METHODS
from ersd.methods.catalog import BASELINE_ORDER, method_info, report_order
from ersd.theory import ACCEPTANCE_METHODS


def test_registry_and_theory_follow_the_catalog() -> None:
    assert tuple(METHODS) == METHOD_NAMES == ACCEPTANCE_METHODS
    for name, method in METHODS.items():
        assert method.info is CATALOG[name] and method.name == name
        assert method.summary == CATALOG[name].summary
    with pytest.raises(UnknownMethodError, match="known methods"):
        method_info("nope")


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_shape_limits_and_natural_shapes(name: str) -> None:
    info, method = CATALOG[name], METHODS[name]
    limit = info.max_children
    too_wide = parse_tree(f"batch:{(limit or 8) + 1}")
    if limit is None:
        method.check_shape(too_wide)
    else:
        with pytest.raises(UnsupportedTreeError, match=f"'{name}'"):
            method.check_shape(too_wide)
    for k in range(1, 17):
        for style in ("natural", "minimal"):
            specs = natural_shapes(name, k, style)
            assert specs or (name == "spechub" and k == 1)
            for spec in specs:
                shape = parse_tree(spec)
                assert shape.num_nodes == k
                assert limit is None or shape.max_children <= limit


def test_report_order_lists_baselines_then_methods() -> None:
    names = [*BASELINE_ORDER, *METHOD_NAMES, "unknown"]
    ordered = sorted(names, key=report_order)
    assert ordered[: len(BASELINE_ORDER)] == list(BASELINE_ORDER)
    assert ordered[-1] == "unknown"
    assert ordered[-2] == "ersd"  # ERSD is reported after every baseline method


def _flat(text: str) -> str:
    return "".join(text.split())  # help text wraps anywhere, even inside "rrs-wor"


def test_cli_help_and_choices_come_from_the_catalog() -> None:
    gen = CliRunner().invoke(main, ["generate", "--help"])
    assert gen.exit_code == 0 and ",".join(METHOD_NAMES) in _flat(gen.output)
    theory = CliRunner().invoke(main, ["theory", "--methods", "ersd,nope"])
    assert theory.exit_code != 0 and ",".join(METHOD_NAMES) in _flat(theory.output)
