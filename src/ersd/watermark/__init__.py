"""Watermarked ERSD: the race keyed by a secret key and the last ``h`` tokens.

ERSD's race *is* the Gumbel-max (Aaronson) watermark sampler: the emitted token at a context is
``argmin_i E_i / p_i``.  With ``E_i = -log U_i`` and ``U`` a keyed pseudo-random function of
(key, salt, last ``h`` generated tokens, token ``i``) every emitted token -- accepted draft,
correction and bonus alike -- is that keyed race's winner, so the text is marked exactly as
watermarked sampling without speculation would mark it, at ERSD's unwatermarked acceptance, and
the same whatever the drafter, tree, batch or backend.  See docs/watermark.md.

* :class:`Watermark`, :func:`load_watermark`, :func:`write_key_file` -- settings and key files;
* :mod:`ersd.watermark.prf` -- the two keyed PRFs (default BLAKE2b + Philox, vLLM-compatible);
* :mod:`ersd.watermark.keyed` -- the keyed race inside the loop (repeated windows, salts);
* :func:`detect` -- the model-free detector (exact Gamma p-value);
* :func:`detect_dual` -- the two-key detector of the dual-key baseline (``sd-dual-key``);
* :func:`audit` -- with the target at hand, check a transcript token by token.
"""

from __future__ import annotations

from ersd.watermark.audit import AuditReport, audit
from ersd.watermark.detect import Detection, detect, detect_dual
from ersd.watermark.settings import SCHEMES, Watermark, load_watermark, write_key_file

__all__ = [
    "SCHEMES",
    "AuditReport",
    "Detection",
    "Watermark",
    "audit",
    "detect",
    "detect_dual",
    "load_watermark",
    "write_key_file",
]
