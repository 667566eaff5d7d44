"""The watermark's settings (:class:`Watermark`) and its key files.

A key file is private (the library refuses one that other users can read, ``chmod 600``, or that
another user owns) and holds either the key alone as hex (the default scheme, 16-64 bytes; version
1 windows, 8 salts: the format of the first releases) or a JSON object::

    {"scheme": "ersd-v1", "key": "<hex, 16-64 bytes>", "version": 2, "context_width": 4,
     "num_salts": 256, "tokenizer": "qwen2.5-coder-1.5b"}
    {"scheme": "vllm-philox", "key": 1234567890123, "context_width": 4, "num_salts": 1}

(``key`` of the vLLM scheme is vLLM's ``--watermark-config`` integer, a JSON number; the ersd-v1
key is a JSON string of hex digits; ``tokenizer`` is optional and lets every reader refuse text
from another tokenizer; ``version`` absent means 1, the windows of the first releases, so old key
files keep detecting old texts).  ``ersd watermark keygen`` writes one (version 2).

**Versions** (the windows that key each race, :mod:`ersd.watermark.keyed`): 1 -- the last ``h``
*generated* tokens, ``-1`` before the first, so the first ``h`` races of every request with one
salt draw the same noise whatever the prompt; 2 (the default) -- the last ``h`` tokens of the
*context*, prompt included, so different prompts open differently.
The key never appears in a repr, a log line, an error or a result: they show a fingerprint (the
first 8 hex digits of a keyed-hash of the key) instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ersd.errors import WatermarkError
from ersd.validation import as_integer

if TYPE_CHECKING:
    from ersd.watermark.prf import WatermarkPRF

#: the keyed-race schemes (:mod:`ersd.watermark.prf`)
SCHEMES: tuple[str, ...] = ("ersd-v1", "vllm-philox")
DEFAULT_CONTEXT_WIDTH = 4
MAX_CONTEXT_WIDTH = 64
#: salts of a new key (``Watermark(...)``, ``ersd watermark keygen``): distinct texts per prompt
DEFAULT_NUM_SALTS = 256
#: salts of a key file that does not say (the first releases' default)
LEGACY_NUM_SALTS = 8
MAX_NUM_SALTS = 4096
#: the window versions (module doc); a key that does not say is version 2 (ersd-v1) or 1
#: (vllm-philox, whose detector scores the generated ids alone); a key file that does not say: 1
VERSIONS: tuple[int, ...] = (1, 2)
#: key files are a few hundred bytes: anything larger than this is not one
MAX_KEY_FILE_BYTES = 64 * 1024
#: the derived keys of the dual-key baseline (vLLM's ``derive_watermark_key`` domains)
DERIVED_ROLES: tuple[str, ...] = ("key_a", "key_b")


@dataclass(frozen=True)
class Watermark:
    """Watermark settings: a secret key and how the race is keyed by it.

    * ``key`` — ``bytes`` (16-64) for ``"ersd-v1"``, an ``int`` in ``[0, 2**64)`` for
      ``"vllm-philox"``;
    * ``context_width`` (h) — how many previous tokens key each race (default 4);
    * ``num_salts`` — samples of one prompt race on salt ``seed % num_salts``, so up to
      ``num_salts`` different texts per prompt (default 256; key files that do not say: 8); the
      detector tries every salt and corrects for it (Šidák: a factor of at most ``num_salts`` on
      the p-value, and a cost linear in it);
    * ``salt`` — pin every sample to one salt instead (then seeds differ only where a window
      repeats);
    * ``tokenizer`` — optional name the key is meant for (the detector checks it);
    * ``version`` — of the windows (module doc): 2, the context's last ``h`` tokens with the
      prompt (default for ``ersd-v1``), or 1, the generated tokens only (default for
      ``vllm-philox``; key files that do not say).
    """

    key: bytes | int = field(repr=False)
    context_width: int = DEFAULT_CONTEXT_WIDTH
    scheme: str = "ersd-v1"
    num_salts: int = DEFAULT_NUM_SALTS
    salt: int | None = None
    tokenizer: str | None = None
    version: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.scheme, str) or self.scheme not in SCHEMES:
            raise WatermarkError(
                f"unknown watermark scheme {self.scheme!r}; use one of {', '.join(SCHEMES)}"
            )
        version = (
            (2 if self.scheme == "ersd-v1" else 1)
            if self.version is None
            else as_integer(self.version)
        )
        if version not in VERSIONS:
            raise WatermarkError(
                f"watermark version {self.version!r} is unknown; use 2 (windows over the context, "
                "prompt included) or 1 (windows over the generated tokens only, the first "
                "releases' scheme; see docs/watermark.md#versions)"
            )
        object.__setattr__(self, "version", version)
        if self.tokenizer is not None and not isinstance(self.tokenizer, str):
            raise WatermarkError(
                f"the watermark's tokenizer must be a name (a string), got "
                f"{type(self.tokenizer).__name__}"
            )
        if self.scheme == "ersd-v1":
            if not isinstance(self.key, bytes | bytearray) or not 16 <= len(self.key) <= 64:
                raise WatermarkError(
                    "the ersd-v1 watermark key must be 16 to 64 bytes (128 to 512 bits); "
                    "make one with `ersd watermark keygen --out FILE` or secrets.token_bytes(32)"
                )
            object.__setattr__(self, "key", bytes(self.key))
        else:
            k = as_integer(self.key)
            if k is None or not 0 <= k < 2**64:
                raise WatermarkError(
                    "the vllm-philox watermark key must be an integer in [0, 2**64) (vLLM's "
                    "--watermark-config key)"
                )
            object.__setattr__(self, "key", k)
        width = as_integer(self.context_width)
        if width is None or not 1 <= width <= MAX_CONTEXT_WIDTH:
            raise WatermarkError(
                f"watermark context width must be an integer in [1, {MAX_CONTEXT_WIDTH}], got "
                f"{self.context_width!r}; 4 is the usual choice (see docs/watermark.md)"
            )
        salts = as_integer(self.num_salts)
        if salts is None or not 1 <= salts <= MAX_NUM_SALTS:
            raise WatermarkError(
                f"num_salts must be an integer in [1, {MAX_NUM_SALTS}], got {self.num_salts!r}"
            )
        object.__setattr__(self, "context_width", width)
        object.__setattr__(self, "num_salts", salts)
        if self.salt is not None:
            s = as_integer(self.salt)
            if s is None or not 0 <= s < salts:
                raise WatermarkError(
                    f"salt must be an integer in [0, num_salts = {salts}), got {self.salt!r}"
                )
            object.__setattr__(self, "salt", s)

    def __repr__(self) -> str:
        salt = "" if self.salt is None else f", salt={self.salt}"
        return (
            f"Watermark(scheme={self.scheme!r}, version={self.version}, "
            f"context_width={self.context_width}, num_salts={self.num_salts}{salt}, "
            f"key=<{self.fingerprint}>)"
        )

    @property
    def prompt_windows(self) -> bool:
        """Whether the first windows hold the prompt's last tokens (version 2)."""
        return self.version == 2

    def initial_window(self, prompt: Sequence[int] = ()) -> tuple[int, ...]:
        """The window of the first generated token after ``prompt``: its last ``h`` tokens
        (``-1``-padded) in version 2, ``h`` times ``-1`` in version 1."""
        h = self.context_width
        tail = [int(t) for t in prompt[max(len(prompt) - h, 0) :]] if self.prompt_windows else []
        return (-1,) * (h - len(tail)) + tuple(tail)

    __str__ = __repr__

    @property
    def fingerprint(self) -> str:
        """8 hex digits that identify the key without revealing it."""
        raw = self.key if isinstance(self.key, bytes) else int(self.key).to_bytes(8, "big")
        return hashlib.blake2b(raw, digest_size=4, person=b"ersd-wm-fprint").hexdigest()

    def salt_for(self, seed: int) -> int:
        """The salt a sample with ``seed`` races on."""
        return self.salt if self.salt is not None else int(seed) % self.num_salts

    def with_salt(self, salt: int | None) -> Watermark:
        return replace(self, salt=salt)

    def derive(self, role: str) -> Watermark:
        """The watermark of a derived key: ``role`` ``"key_a"`` or ``"key_b"`` of the dual-key
        baseline (:mod:`ersd.methods.watermark_baselines`), other settings unchanged.

        ``vllm-philox``: vLLM's ``derive_watermark_key`` (``sha256(role || key as 8 big-endian
        bytes)[:8]``, big-endian), so ``DualKeyGumbelWatermarkDetector`` with the same key scores
        our text; ``ersd-v1``: a domain-separated keyed BLAKE2b of ``role`` under the key (32
        bytes).  One derived key reveals nothing about the other or the master key.
        """
        if role not in DERIVED_ROLES:
            raise WatermarkError(
                f"unknown derived-key role {role!r}; use one of {', '.join(DERIVED_ROLES)}"
            )
        domain = role.encode()
        key: bytes | int
        if self.scheme == "ersd-v1":
            assert isinstance(self.key, bytes)
            key = hashlib.blake2b(
                domain, key=self.key, digest_size=32, person=b"ersd-wm-derive"
            ).digest()
        else:
            digest = hashlib.sha256(domain + int(self.key).to_bytes(8, "big")).digest()
            key = int.from_bytes(digest[:8], "big")
        return replace(self, key=key)

    def prf(self, salt: int) -> WatermarkPRF:
        """The keyed PRF of ``salt`` (:mod:`ersd.watermark.prf`)."""
        from ersd.watermark.prf import ErsdPRF, VllmPRF

        if self.scheme == "ersd-v1":
            assert isinstance(self.key, bytes)
            return ErsdPRF(self.key, salt, self.context_width)
        return VllmPRF(int(self.key), salt, self.context_width)


def check_watermark(value: Any) -> Watermark | None:
    """``None`` or a :class:`Watermark`; anything else is a :class:`WatermarkError`."""
    if value is None or isinstance(value, Watermark):
        return value
    raise WatermarkError(
        f"watermark must be an ersd.Watermark (e.g. ersd.load_watermark('key.json')) or None, "
        f"got {type(value).__name__}"
    )


def _check_private(path: Path, st: os.stat_result) -> None:
    mode = st.st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise WatermarkError(
            f"watermark key file {path} can be read by other users (mode "
            f"{stat.S_IMODE(mode):03o}); a watermark key is a secret: run `chmod 600 {path}`"
        )
    uid = getattr(os, "geteuid", None)
    if uid is not None and st.st_uid != uid():
        raise WatermarkError(
            f"watermark key file {path} belongs to another user (uid {st.st_uid}, you are "
            f"{uid()}); a watermark key is a secret that its owner controls: copy it to a file "
            "of your own (mode 600) or run as its owner"
        )


def read_bounded(path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of a file (or ``-``: standard input); a longer one is refused
    with a :class:`WatermarkError` naming ``what`` and the limit (``/dev/zero`` stops at once)."""
    import sys

    try:
        if os.fspath(path) == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as exc:
        raise WatermarkError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise WatermarkError(
            f"{what} {path} is larger than {limit:,} bytes, more than it can hold; "
            "give a smaller input (split a long text and score the parts)"
        )
    return data


def parse_json(text: str | bytes, what: str) -> Any:
    """``json.loads`` whose failures are one :class:`WatermarkError` naming ``what``: invalid
    JSON, nesting too deep for the parser, integers too long to convert."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WatermarkError(
            f"{what} is not valid JSON ({exc.msg} at character {exc.pos})"
        ) from None
    except RecursionError:
        raise WatermarkError(f"{what}: JSON nested too deeply to read") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        why = str(exc).split(":")[0][:100]
        raise WatermarkError(f"{what}: unreadable JSON value ({why})") from None


_KEY_FIELDS = ("scheme", "key", "version", "context_width", "num_salts", "tokenizer")


def load_watermark(
    path: str | os.PathLike[str],
    *,
    context_width: int | None = None,
    require_private: bool = True,
) -> Watermark:
    """Read a key file (module doc); ``context_width`` overrides the file's."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise WatermarkError(
            f"watermark key file {p} does not exist or is not a regular file; make one with "
            "`ersd watermark keygen --out FILE`"
        )
    if require_private:
        _check_private(p, st)
    data = read_bounded(p, MAX_KEY_FILE_BYTES, "watermark key file")
    try:
        # utf-8-sig: an editor's byte-order mark is not part of the key
        text = data.decode("utf-8-sig").strip()
    except UnicodeDecodeError:
        raise WatermarkError(f"watermark key file {p} is not UTF-8 text") from None
    fields: dict[str, Any]
    if text.startswith("{"):
        fields = parse_json(text, f"watermark key file {p}")
        if not isinstance(fields, dict) or "key" not in fields:
            raise WatermarkError(f"watermark key file {p}: the JSON object needs a 'key' field")
        unknown = set(fields) - set(_KEY_FIELDS)
        if unknown:
            raise WatermarkError(
                f"watermark key file {p}: unknown field(s) {', '.join(sorted(unknown))}; known: "
                f"{', '.join(_KEY_FIELDS)}"
            )
    else:
        fields = {"key": text}
    scheme = fields.get("scheme", "ersd-v1")
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise WatermarkError(
            f"watermark key file {p}: unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}"
        )
    raw = fields["key"]
    key: bytes | int
    if scheme == "ersd-v1":
        if not isinstance(raw, str):
            raise WatermarkError(
                f"watermark key file {p}: the ersd-v1 key must be a string of hex digits "
                f'(32-128 of them, e.g. "key": "5c3a..."), got a JSON {type(raw).__name__}'
            )
        try:
            key = bytes.fromhex(raw)
        except ValueError:
            raise WatermarkError(
                f"watermark key file {p}: the ersd-v1 key must be hex digits (32-128 of them)"
            ) from None
    else:
        if not isinstance(raw, int) or isinstance(raw, bool):
            raise WatermarkError(
                f"watermark key file {p}: the vllm-philox key must be a JSON integer in "
                f"[0, 2**64) (vLLM's --watermark-config key), got a JSON {type(raw).__name__}"
            )
        key = raw
    for name in ("context_width", "num_salts", "version"):
        v = fields.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise WatermarkError(
                f"watermark key file {p}: {name} must be a JSON integer, got {v!r:.40}"
            )
    try:
        wm = Watermark(
            key=key,
            scheme=scheme,
            version=fields.get("version", 1),
            context_width=fields.get("context_width", DEFAULT_CONTEXT_WIDTH),
            num_salts=fields.get("num_salts", LEGACY_NUM_SALTS if scheme == "ersd-v1" else 1),
            tokenizer=fields.get("tokenizer"),
        )
    except WatermarkError as exc:
        raise WatermarkError(f"watermark key file {p}: {exc}") from None
    if context_width is not None:
        wm = replace(wm, context_width=context_width)
    return wm


def write_key_file(
    path: str | os.PathLike[str],
    *,
    scheme: str = "ersd-v1",
    context_width: int = DEFAULT_CONTEXT_WIDTH,
    num_salts: int | None = None,
    tokenizer: str | None = None,
    version: int | None = None,
) -> Watermark:
    """Create a new private key file (mode 600, never overwriting) with a fresh random key
    (``version``: the scheme's default, 2 for ersd-v1; the file always says which)."""
    key: bytes | int = secrets.token_bytes(32) if scheme == "ersd-v1" else secrets.randbits(64)
    wm = Watermark(
        key=key,
        scheme=scheme,
        version=version,
        context_width=context_width,
        num_salts=num_salts
        if num_salts is not None
        else (DEFAULT_NUM_SALTS if scheme == "ersd-v1" else 1),
        tokenizer=tokenizer,
    )
    body: dict[str, Any] = {
        "scheme": scheme,
        "key": key.hex() if isinstance(key, bytes) else key,
        "version": wm.version,
        "context_width": wm.context_width,
        "num_salts": wm.num_salts,
    }
    if tokenizer is not None:
        body["tokenizer"] = tokenizer
    try:
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise WatermarkError(
            f"{path} exists; a key file is never overwritten (remove it first if you mean to)"
        ) from None
    except OSError as exc:  # no such folder, no permission, a read-only disk
        raise WatermarkError(
            f"cannot create the key file {path}: {exc.strerror or exc} (does its folder exist "
            "and can you write there?)"
        ) from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(body, f)
        f.write("\n")
    return wm


def _vocab_fingerprint(tokenizer: Any) -> str | None:
    hf = getattr(tokenizer, "hf_tokenizer", tokenizer)
    get_vocab = getattr(hf, "get_vocab", None)
    if not callable(get_vocab):
        return None
    items = sorted((str(k), int(v)) for k, v in get_vocab().items())
    return hashlib.blake2b(json.dumps(items).encode(), digest_size=16).hexdigest()


def check_tokenizer(watermark: Watermark, tokenizer: Any, name: str | None = None) -> None:
    """Refuse ``tokenizer`` (loaded from ``name``) unless it is the key's (``watermark.tokenizer``,
    when the key names one): the same name, or the same vocabulary -- a bundled name, its
    folder and its hub id are one tokenizer.  Every reader of a key (detect, audit, generate,
    serve) calls this, so text tokenized otherwise is refused rather than scored as unmarked."""
    want = watermark.tokenizer
    if want is None or (name is not None and name == want):
        return
    hint = (
        f"the key file is for tokenizer {want!r}"
        + (f", not {name!r}" if name is not None else "")
        + ": text tokenized otherwise has other windows and never matches"
    )
    try:
        from ersd.models.hf_load import load_tokenizer

        theirs = _vocab_fingerprint(load_tokenizer(want))
    except Exception:  # the key's tokenizer is not available here to compare with
        raise WatermarkError(
            f"{hint}; {want!r} could not be loaded to compare vocabularies: use that tokenizer"
        ) from None
    mine = _vocab_fingerprint(tokenizer)
    if theirs is None or mine is None or theirs != mine:
        raise WatermarkError(f"{hint} (the vocabularies differ); use tokenizer {want!r}")
