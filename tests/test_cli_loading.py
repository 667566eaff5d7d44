"""The model options and loading shared by ``ersd generate``, ``ersd serve`` and
``ersd bench serve`` (ersd.commands._loading): one set of options, one loader, every drafter."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import click
import pytest
from click.testing import CliRunner

import ersd
from ersd.cli import main
from ersd.commands._loading import ModelArgs, load_pair, model_options
from ersd.commands.bench import serve_load
from ersd.commands.generate import generate
from ersd.commands.serve import serve


def _options(cmd: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in cmd.params if p.name is not None}


@pytest.mark.parametrize("cmd", [generate, serve, serve_load], ids=lambda c: c.name)
def test_every_model_option_is_on_every_command(cmd: click.Command) -> None:
    opts = _options(cmd)
    for f in fields(ModelArgs):
        assert f.name in opts, f"{cmd.name} lacks --{f.name.replace('_', '-')}"
    backend = opts["backend"]
    assert isinstance(backend.type, click.Choice) and "llamacpp" in backend.type.choices
    assert "lookup" in (opts["draft"].help or "")


def test_serve_and_bench_serve_default_to_float32_generate_to_bfloat16() -> None:
    assert _options(serve)["dtype"].default == "float32"
    assert _options(serve_load)["dtype"].default == "float32"
    assert _options(generate)["dtype"].default == "bfloat16"


def _parse(*args: str) -> ModelArgs:
    seen: list[ModelArgs] = []

    @click.command()
    @model_options(dtype="float32")
    @click.option("--other", default="x")
    def cmd(models: ModelArgs, other: str) -> None:
        seen.append(models)

    res = CliRunner().invoke(cmd, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return seen[0]


def test_cli_args_round_trip() -> None:
    args = _parse("--target", "toy", "--draft", "lookup+toy-draft", "--draft-layers", "3")
    assert args.target == "toy" and args.draft_layers == 3 and args.dtype == "float32"
    assert _parse(*args.cli_args()) == args
    full = ModelArgs("a", "b", 2, "bfloat16", "int8", "torch", "cpu", "llamacpp", 4)
    assert _parse(*full.cli_args()) == full


@pytest.mark.parametrize(
    ("draft", "kind", "label"),
    [
        ("toy-draft", "ModelDrafter", "draft toy-draft (float32)"),
        ("lookup", "LookupDrafter", "draft lookup (model-free)"),
        ("suffix:match=4", "SuffixDrafter", "(model-free)"),
        ("lookup+toy-draft", "HybridDrafter", "draft lookup+toy-draft (float32)"),
        ("none", "NoneType", "no draft"),
    ],
)
def test_load_pair_takes_every_drafter_spec(draft: str, kind: str, label: str) -> None:
    pair = load_pair(ModelArgs("toy", draft, dtype="bfloat16"))  # toy models are float32 anyway
    assert type(pair.draft).__name__ == kind
    assert pair.summary().startswith("target toy (float32)") and label in pair.summary()
    assert "bfloat16" not in pair.summary()  # the dtype as loaded, not as asked


def test_llamacpp_refuses_draft_layers_before_loading() -> None:
    with pytest.raises(click.UsageError, match="--draft-layers needs --backend hf"):
        load_pair(ModelArgs("toy", "toy-draft", draft_layers=2, backend="llamacpp"))


def test_serve_builds_its_app_through_the_shared_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ersd serve --draft lookup+toy-draft` (a drafter spec serve could not take before): the app
    gets the hybrid drafter; uvicorn.Server is replaced so no port is opened (its run() returns
    at once, so the engine loop on the main thread sees the HTTP thread end and stops)."""
    pytest.importorskip("uvicorn")
    import uvicorn

    seen: dict[str, Any] = {}

    class FakeServer:
        started = True
        should_exit = force_exit = False

        def __init__(self, config: Any) -> None:
            seen.update(app=config.app, port=config.port)

        def run(self) -> None:
            seen["ran"] = True

    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    args = ["serve", "--target", "toy", "--draft", "lookup+toy-draft", "--tree", "chain:3"]
    res = CliRunner().invoke(main, [*args, "--port", "8123"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    app = seen["app"]
    assert type(app.state.draft).__name__ == "HybridDrafter"
    config = app.state.config
    assert config.tree.shape == ersd.parse_tree("chain:3") and config.model_name == "toy"
    assert seen["port"] == 8123 and seen["ran"] and "draft lookup+toy-draft" in res.stderr
    res = CliRunner().invoke(main, ["serve", "--target", "toy", "--draft", "lookup:bogus=1"])
    assert res.exit_code == 1 and "bogus" in res.output
    # every tree kind serves: a dynamic tree is parsed once, at start-up
    dyn = ["serve", "--target", "toy", "--draft", "toy-draft", "--tree", "dynamic:4"]
    res = CliRunner().invoke(main, dyn, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    tree = seen["app"].state.config.tree
    assert tree.dynamic is not None and tree.label == "dynamic:4"
