"""``ersd bench serve``: the load test against a real ``ersd serve`` subprocess on the toy models
(loopback, a free port, a few 4-token requests; the server is stopped by the command itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ersd.bench.serve_load import LoadSettings, ServeLoadError, load_prompts, table_row
from ersd.cli import main

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

TOY = ["--target", "toy", "--draft", "toy-draft", "--tree", "chain:2"]


def test_bench_serve_smoke_on_the_toy_models(tmp_path: Path) -> None:
    out = tmp_path / "serve.jsonl"
    args = ["bench", "serve", *TOY, "--concurrency", "1,2", "--requests", "2", "--max-tokens", "4"]
    res = CliRunner().invoke(main, [*args, "--startup-timeout", "300", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["concurrency"], r["mode"]) for r in rows] == [
        (1, "ersd chain:2"),
        (1, "target-only"),
        (2, "ersd chain:2"),
        (2, "target-only"),
    ]
    for r in rows:
        assert r["model"] == "toy" and r["max_tokens"] == 4
        # the toy models never emit EOS: every request runs to max_tokens
        assert r["requests"] == 2 * r["concurrency"] and r["tokens"] == 4 * r["requests"]
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["wall_s"])
        assert 0 < r["ttft_mean_s"] <= r["latency_mean_s"] and r["itl_mean_s"] >= 0
        assert table_row(r) in res.stdout
    assert res.stdout.strip().splitlines()[-1] == str(out)


def test_a_server_that_cannot_start_is_a_clean_error(tmp_path: Path) -> None:
    args = ["bench", "serve", "--target", "no-such-model", "--draft", "none"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert "server exited" in res.stderr and "no-such-model" in res.stderr, res.stderr


def test_an_unreachable_url_is_a_clean_error(tmp_path: Path) -> None:
    args = ["bench", "serve", "--url", "http://127.0.0.1:9", "--warmup", "1"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 1 and "127.0.0.1:9" in res.stderr and "server is up" in res.stderr


@pytest.mark.parametrize("levels", ["0", "a,b", "", "1,-4"])
def test_bad_concurrency_is_refused(levels: str) -> None:
    res = CliRunner().invoke(main, ["bench", "serve", "--concurrency", levels])
    assert res.exit_code == 2 and "e.g. 1,4,8" in res.stderr


def test_settings_and_prompts() -> None:
    with pytest.raises(ServeLoadError, match="e.g. 1,4,8"):
        LoadSettings(concurrency=[])
    texts = load_prompts(45)  # more than the 40 bundled: cycled
    assert len(texts) == 45 and texts[40] == texts[0] and len(set(texts)) == 40


def test_library_rows_run_the_same_requests_in_process(tmp_path: Path) -> None:
    """--library: the concurrency-1 level through the library first (same prompts, seeds,
    settings), then the server's rows."""
    out = tmp_path / "serve.jsonl"
    args = ["bench", "serve", *TOY, "--concurrency", "1", "--requests", "2", "--max-tokens", "4"]
    res = CliRunner().invoke(main, [*args, "--library", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["mode"] for r in rows] == [
        "library ersd chain:2",
        "library target-only",
        "ersd chain:2",
        "target-only",
    ]
    for r in rows:
        assert r["concurrency"] == 1 and r["requests"] == 2 and r["tokens"] == 8
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["wall_s"])
        assert 0 < r["ttft_mean_s"] <= r["latency_mean_s"]


def test_bench_serve_with_a_watermark_runs_both_modes_and_times_detection(tmp_path: Path) -> None:
    """--watermark-key-file: the server watermarks and allows opting out; every level runs
    watermarked and ``"watermark": false`` side by side, the order reversed in the second round;
    the ratio and /v1/watermark/detect's throughput are printed and recorded."""
    key = tmp_path / "wm.key"
    key.write_text("9d" * 32)
    key.chmod(0o600)
    out = tmp_path / "serve.jsonl"
    args = ["bench", "serve", *TOY, "--concurrency", "1", "--requests", "2", "--max-tokens", "4"]
    args += ["--watermark-key-file", str(key), "--repeats", "2", "--no-baseline"]
    res = CliRunner().invoke(main, [*args, "--detect-texts", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    levels = [r for r in rows if "mode" in r]
    assert [(r["repeat"], r["mode"]) for r in levels] == [
        (0, "ersd chain:2 (watermarked)"),
        (0, "ersd chain:2 (no watermark)"),
        (1, "ersd chain:2 (no watermark)"),
        (1, "ersd chain:2 (watermarked)"),
    ]
    (ratio,) = [r for r in rows if r.get("kind") == "watermark_ratio"]
    by = {(r["repeat"], r["mode"].endswith("(watermarked)")): r["tokens_per_s"] for r in levels}
    assert ratio["ratios"] == pytest.approx([by[(i, True)] / by[(i, False)] for i in (0, 1)])
    (det,) = [r for r in rows if r.get("kind") == "detect_throughput"]
    assert det["texts"] == 2 and det["tokens"] > 0 and det["tokens_per_s"] > 0
    assert "watermarked / unwatermarked tokens/s at concurrency 1" in res.stdout
    assert "/v1/watermark/detect:" in res.stdout
