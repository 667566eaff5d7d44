"""The server's routes, one module per group: :mod:`.completions` (``/v1/completions``),
:mod:`.chat` (``/v1/chat/completions``), :mod:`.watermark` (``/v1/watermark/detect``) and
:mod:`.health` (``/health``, ``/metrics``, ``/v1/models``).  Each has ``add_routes(app)``;
:func:`ersd.serve.app.create_app` calls them all."""
