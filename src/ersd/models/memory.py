"""How much memory the machine has free: used to warn before loading or converting large weights.

The one copy of this helper, shared by :mod:`ersd.models.hf_load` (a hint before loading weights
that would not fit) and :mod:`ersd.models.bundled` (a note before a conversion's peak).  No torch.
"""

from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux ``MemAvailable``, else the free
    physical pages), or ``None`` where neither is known."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None
