"""Sub-commands of the ``ersd`` CLI, one module each (loaded lazily by :mod:`ersd.cli`)."""
