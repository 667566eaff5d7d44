"""Keyed BLAKE2b (RFC 7693) of many fixed-length messages at once, in NumPy.

The detector's per-window key is ``blake2b(window, digest_size=16, key=KEY, person=PERSON)``
(:class:`ersd.watermark.prf.ErsdPRF`).  :mod:`hashlib` hashes one message per Python call, which
bounds a detector at a few hundred thousand windows a second; here every message of a batch goes
through the compression function together, one NumPy call per step of the round function over all
of them.  The output is bit for bit :mod:`hashlib`'s (tests compare them on random keys, people
and messages of every length the watermark uses).

Layout: the 16 working words are four ``[4, n]`` rows (``a = v0..v3``, ``b = v4..v7``, ...), so
one call performs a step of four G functions for ``n`` messages; the diagonal step reads rows
``b, c, d`` rotated, as contiguous views of buffers with spare rows (:func:`_compress`).  A
message's zero padding adds nothing, so only its real words are added.  The key block is the same
for every message: its state is computed once per key.  Messages go through in chunks of
:data:`CHUNK` so the working set stays in cache.
"""

from __future__ import annotations

import numpy as np

_IV = (
    0x6A09E667F3BCC908,
    0xBB67AE8584CAA73B,
    0x3C6EF372FE94F82B,
    0xA54FF53A5F1D36F1,
    0x510E527FADE682D1,
    0x9B05688C2B3E6C1F,
    0x1F83D9ABFB41BD6B,
    0x5BE0CD19137E2179,
)
_SIGMA = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
    (14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3),
    (11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4),
    (7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8),
    (9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13),
    (2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9),
    (12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11),
    (13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10),
    (6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5),
    (10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0),
)
_M64 = (1 << 64) - 1
_BLOCK_BYTES = 128
#: messages hashed together per pass (four ``[4, CHUNK]`` uint64 rows stay in L2)
CHUNK = 4096
_S = {r: np.uint64(r) for r in (16, 24, 32, 40, 48, 63, 1)}


def _rotr(x: np.ndarray, r: int, tmp: np.ndarray) -> None:
    """``x = x >>> r`` in place (64-bit rotation; ``tmp`` is scratch of ``x``'s shape)."""
    np.right_shift(x, _S[r], out=tmp)
    np.left_shift(x, _S[64 - r], out=x)
    np.bitwise_or(x, tmp, out=x)


def _add_words(x: np.ndarray, words: list[np.ndarray | None]) -> None:
    """``x[i] += words[i]`` for the rows whose message word is not zero padding."""
    for i, w in enumerate(words):
        if w is not None:
            np.add(x[i], w, out=x[i])


def _g4(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    d: np.ndarray,
    mx: list[np.ndarray | None],
    my: list[np.ndarray | None],
    tmp: np.ndarray,
) -> None:
    """Four G functions at once (rows ``i`` of ``a, b, c, d`` with words ``mx[i], my[i]``)."""
    np.add(a, b, out=a)
    _add_words(a, mx)
    np.bitwise_xor(d, a, out=d)
    _rotr(d, 32, tmp)
    np.add(c, d, out=c)
    np.bitwise_xor(b, c, out=b)
    _rotr(b, 24, tmp)
    np.add(a, b, out=a)
    _add_words(a, my)
    np.bitwise_xor(d, a, out=d)
    _rotr(d, 16, tmp)
    np.add(c, d, out=c)
    np.bitwise_xor(b, c, out=b)
    _rotr(b, 63, tmp)


def _compress(
    h: np.ndarray, m: list[np.ndarray | None], t: int, final: bool, out_words: int = 8
) -> np.ndarray:
    """BLAKE2b's compression F of ``n`` states ``h`` (``[8, n]`` uint64, or ``[8, 1]`` to share)
    with message words ``m`` (16 entries: ``[n]`` uint64 arrays, ``None`` for zero words) at byte
    counter ``t``: the new ``[out_words, n]`` state.

    Rows ``b, c, d`` live in buffers with spare rows, so the diagonal step's rotated rows are a
    contiguous view after copying one or two rows (not a gather of all four)."""
    n = max([h.shape[1]] + [len(w) for w in m if w is not None])
    a = np.empty((4, n), dtype=np.uint64)
    bx = np.empty((5, n), dtype=np.uint64)  # column: rows 0-3; diagonal (b1 b2 b3 b0): rows 1-4
    cx = np.empty((6, n), dtype=np.uint64)  # column: rows 0-3; diagonal (c2 c3 c0 c1): rows 2-5
    dx = np.empty((5, n), dtype=np.uint64)  # column: rows 1-4; diagonal (d3 d0 d1 d2): rows 0-3
    a[...] = h[0:4]
    bx[0:4] = h[4:8]
    cx[0:4] = np.array(_IV[0:4], dtype=np.uint64).reshape(4, 1)
    d_init = [_IV[4] ^ (t & _M64), _IV[5] ^ (t >> 64), _IV[6], _IV[7]]
    if final:
        d_init[2] ^= _M64
    dx[1:5] = np.array(d_init, dtype=np.uint64).reshape(4, 1)
    tmp = np.empty((4, n), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for r in range(12):
            w = [m[i] for i in _SIGMA[r % 10]]
            _g4(a, bx[0:4], cx[0:4], dx[1:5], w[0:8:2], w[1:8:2], tmp)
            bx[4] = bx[0]
            cx[4:6] = cx[0:2]
            dx[0] = dx[4]
            _g4(a, bx[1:5], cx[2:6], dx[0:4], w[8:16:2], w[9:16:2], tmp)
            bx[0] = bx[4]
            cx[0:2] = cx[4:6]
            dx[4] = dx[0]
    out = np.empty((out_words, n), dtype=np.uint64)
    lo = min(out_words, 4)
    np.bitwise_xor(a[:lo], cx[:lo], out=out[:lo])
    np.bitwise_xor(out[:lo], h[:lo], out=out[:lo])
    if out_words > 4:
        np.bitwise_xor(bx[: out_words - 4], dx[1 : out_words - 3], out=out[4:])
        np.bitwise_xor(out[4:], h[4:out_words], out=out[4:])
    return out


def _words_of(data: bytes) -> list[int]:
    """Little-endian 64-bit words of ``data`` zero-padded to a multiple of 8 bytes."""
    data = data + b"\0" * (-len(data) % 8)
    return [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]


class KeyedBlake2b:
    """``hashlib.blake2b(msg, digest_size=..., key=key, person=person)`` of many messages of one
    length (a whole number of 64-bit words), vectorised (module doc)."""

    def __init__(self, key: bytes, person: bytes = b"", digest_size: int = 64) -> None:
        if not 1 <= len(key) <= 64:
            raise ValueError(f"the BLAKE2b key must be 1 to 64 bytes, got {len(key)}")
        if len(person) > 16:
            raise ValueError(f"the BLAKE2b personalization is at most 16 bytes, got {len(person)}")
        if not 1 <= digest_size <= 64:
            raise ValueError(f"the BLAKE2b digest size is 1 to 64 bytes, got {digest_size}")
        self.digest_size = int(digest_size)
        param = [0] * 8
        param[0] = 0x01010000 ^ (len(key) << 8) ^ self.digest_size
        param[6:8] = _words_of(person.ljust(16, b"\0"))
        h0 = [iv ^ p for iv, p in zip(_IV, param, strict=True)]
        # the key block is the first block of every message (never the last: messages are
        # at least one word long), so its state is computed once
        keyed = compress_int(h0, _words_of(bytes(key).ljust(128, b"\0")), _BLOCK_BYTES, False)
        self._keyed = np.array(keyed, dtype=np.uint64).reshape(8, 1)

    def __repr__(self) -> str:  # never the key
        return f"KeyedBlake2b(digest_size={self.digest_size})"

    def digest_words(self, messages: np.ndarray) -> np.ndarray:
        """The digests of ``messages`` (``[n, w]`` 64-bit words, each row one message of ``8 w``
        bytes, ``w >= 1``, little-endian as ``struct.pack('<wq')``) as ``[n, ceil(digest/8)]``
        little-endian uint64 words (``.tobytes()`` of a row starts with the digest)."""
        msgs = np.asarray(messages)
        if msgs.dtype not in (np.int64, np.uint64):
            msgs = msgs.astype(np.int64)
        if msgs.ndim != 2 or msgs.shape[1] < 1:
            raise ValueError(f"messages must be [n, words >= 1], got shape {msgs.shape}")
        n, w = msgs.shape
        out_words = -(-self.digest_size // 8)
        out = np.empty((n, out_words), dtype=np.uint64)
        length = 8 * w
        blocks = -(-length // _BLOCK_BYTES)
        for lo in range(0, n, CHUNK):
            cols = np.ascontiguousarray(msgs[lo : lo + CHUNK].T).view(np.uint64)  # [w, chunk]
            h = self._keyed
            for k in range(blocks):
                m: list[np.ndarray | None] = [
                    cols[16 * k + j] if 16 * k + j < w else None for j in range(16)
                ]
                final = k == blocks - 1
                t = _BLOCK_BYTES + min(_BLOCK_BYTES * (k + 1), length)
                h = _compress(h, m, t, final, out_words if final else 8)
            out[lo : lo + CHUNK] = h.T
        return out


def _rotr_int(x: int, r: int) -> int:
    return ((x >> r) | (x << (64 - r))) & _M64


_G_INDEX = (
    (0, 4, 8, 12),
    (1, 5, 9, 13),
    (2, 6, 10, 14),
    (3, 7, 11, 15),
    (0, 5, 10, 15),
    (1, 6, 11, 12),
    (2, 7, 8, 13),
    (3, 4, 9, 14),
)


def compress_int(h: list[int], m: list[int], t: int, final: bool) -> list[int]:
    """BLAKE2b's compression F on Python ints, one message block: the scalar form of
    :func:`_compress` (RFC 7693 section 3.2), used for the key block and as a second reference
    in tests."""
    v = [*h, *_IV[:4], _IV[4] ^ (t & _M64), _IV[5] ^ (t >> 64), _IV[6], _IV[7]]
    if final:
        v[14] ^= _M64
    for r in range(12):
        s = _SIGMA[r % 10]
        for i, (ia, ib, ic, id_) in enumerate(_G_INDEX):
            a, b, c, d = v[ia], v[ib], v[ic], v[id_]
            a = (a + b + m[s[2 * i]]) & _M64
            d = _rotr_int(d ^ a, 32)
            c = (c + d) & _M64
            b = _rotr_int(b ^ c, 24)
            a = (a + b + m[s[2 * i + 1]]) & _M64
            d = _rotr_int(d ^ a, 16)
            c = (c + d) & _M64
            b = _rotr_int(b ^ c, 63)
            v[ia], v[ib], v[ic], v[id_] = a, b, c, d
    return [h[i] ^ v[i] ^ v[i + 8] for i in range(8)]
