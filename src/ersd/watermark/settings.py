"""The watermark's settings (:class:`Watermark`) and its key files.

A key file is private (the library refuses one that other users can read: ``chmod 600``) and holds
either the key alone as hex (the default scheme, 16-64 bytes) or a JSON object::

    {"scheme": "ersd-v1", "key": "<hex, 16-64 bytes>", "context_width": 4, "num_salts": 8,
     "tokenizer": "qwen2.5-coder-1.5b"}
    {"scheme": "vllm-philox", "key": 1234567890123, "context_width": 4, "num_salts": 1}

(``key`` of the vLLM scheme is vLLM's ``--watermark-config`` integer; ``tokenizer`` is optional and
lets the detector refuse text from another tokenizer).  ``ersd watermark keygen`` writes one.
The key never appears in a repr, a log line, an error or a result: they show a fingerprint (the
first 8 hex digits of a keyed-hash of the key) instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
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
DEFAULT_NUM_SALTS = 8
MAX_CONTEXT_WIDTH = 64
MAX_NUM_SALTS = 1024
#: the derived keys of the dual-key baseline (vLLM's ``derive_watermark_key`` domains)
DERIVED_ROLES: tuple[str, ...] = ("key_a", "key_b")


@dataclass(frozen=True)
class Watermark:
    """Watermark settings: a secret key and how the race is keyed by it.

    * ``key`` — ``bytes`` (16-64) for ``"ersd-v1"``, an ``int`` in ``[0, 2**64)`` for
      ``"vllm-philox"``;
    * ``context_width`` (h) — how many previous generated tokens key each race (default 4);
    * ``num_salts`` — samples of one prompt race on salt ``seed % num_salts`` (so different seeds
      give different texts); the detector tries every salt and corrects for it (Šidák);
    * ``salt`` — pin every sample to one salt instead (then seeds differ only where a window
      repeats);
    * ``tokenizer`` — optional name the key is meant for (the detector checks it);
    * ``version`` — of the scheme's definition (1).
    """

    key: bytes | int = field(repr=False)
    context_width: int = DEFAULT_CONTEXT_WIDTH
    scheme: str = "ersd-v1"
    num_salts: int = DEFAULT_NUM_SALTS
    salt: int | None = None
    tokenizer: str | None = None
    version: int = 1

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise WatermarkError(
                f"unknown watermark scheme {self.scheme!r}; use one of {', '.join(SCHEMES)}"
            )
        if self.version != 1:
            raise WatermarkError(f"watermark version {self.version!r} is unknown; use 1")
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
            f"Watermark(scheme={self.scheme!r}, context_width={self.context_width}, "
            f"num_salts={self.num_salts}{salt}, key=<{self.fingerprint}>)"
        )

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


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise WatermarkError(
            f"watermark key file {path} can be read by other users (mode "
            f"{stat.S_IMODE(mode):03o}); a watermark key is a secret: run `chmod 600 {path}`"
        )


def load_watermark(
    path: str | os.PathLike[str],
    *,
    context_width: int | None = None,
    require_private: bool = True,
) -> Watermark:
    """Read a key file (module doc); ``context_width`` overrides the file's."""
    p = Path(path)
    if not p.is_file():
        raise WatermarkError(
            f"watermark key file {p} does not exist or is not a regular file; make one with "
            "`ersd watermark keygen --out FILE`"
        )
    if require_private:
        _check_private(p)
    try:
        text = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise WatermarkError(
            f"watermark key file {p} could not be read as text ({type(e).__name__})"
        ) from None
    fields: dict[str, Any]
    if text.startswith("{"):
        try:
            fields = json.loads(text)
        except json.JSONDecodeError:
            raise WatermarkError(
                f"watermark key file {p} starts like JSON but is not valid JSON; see "
                "docs/watermark.md#key-files for the format"
            ) from None
        if not isinstance(fields, dict) or "key" not in fields:
            raise WatermarkError(f"watermark key file {p}: the JSON object needs a 'key' field")
        unknown = set(fields) - {"scheme", "key", "context_width", "num_salts", "tokenizer"}
        if unknown:
            raise WatermarkError(
                f"watermark key file {p}: unknown field(s) {', '.join(sorted(unknown))}; known: "
                "scheme, key, context_width, num_salts, tokenizer"
            )
    else:
        fields = {"key": text}
    scheme = fields.get("scheme", "ersd-v1")
    raw = fields["key"]
    key: bytes | int
    if scheme == "ersd-v1":
        try:
            key = bytes.fromhex(str(raw))
        except ValueError:
            raise WatermarkError(
                f"watermark key file {p}: the ersd-v1 key must be hex digits (32-128 of them)"
            ) from None
    else:
        key = raw if isinstance(raw, int) and not isinstance(raw, bool) else -1
    wm = Watermark(
        key=key,
        scheme=scheme,
        context_width=fields.get("context_width", DEFAULT_CONTEXT_WIDTH),
        num_salts=fields.get("num_salts", DEFAULT_NUM_SALTS if scheme == "ersd-v1" else 1),
        tokenizer=fields.get("tokenizer"),
    )
    if context_width is not None:
        wm = Watermark(
            key=wm.key,
            scheme=wm.scheme,
            context_width=context_width,
            num_salts=wm.num_salts,
            tokenizer=wm.tokenizer,
        )
    return wm


def write_key_file(
    path: str | os.PathLike[str],
    *,
    scheme: str = "ersd-v1",
    context_width: int = DEFAULT_CONTEXT_WIDTH,
    num_salts: int | None = None,
    tokenizer: str | None = None,
) -> Watermark:
    """Create a new private key file (mode 600, never overwriting) with a fresh random key."""
    key: bytes | int = secrets.token_bytes(32) if scheme == "ersd-v1" else secrets.randbits(64)
    wm = Watermark(
        key=key,
        scheme=scheme,
        context_width=context_width,
        num_salts=num_salts
        if num_salts is not None
        else (DEFAULT_NUM_SALTS if scheme == "ersd-v1" else 1),
        tokenizer=tokenizer,
    )
    body: dict[str, Any] = {
        "scheme": scheme,
        "key": key.hex() if isinstance(key, bytes) else key,
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
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(body, f)
        f.write("\n")
    return wm
