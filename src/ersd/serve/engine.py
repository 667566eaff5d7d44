"""The serving loop: one thread drives a :class:`~ersd.batch.BatchEngine` for every request
(``ersd serve``: the main thread, see :meth:`ServingLoop.run`).

Requests are split into jobs (one per choice).  The HTTP side :meth:`ServingLoop.submit`\\ s jobs
and :meth:`~ServingLoop.cancel`\\ s them (a finished stop string, a client gone); the loop thread
admits waiting jobs between steps up to ``max_batch_size`` rows, drops cancelled ones, steps the
engine and hands every step's record to the job's ``deliver`` callback (thread-safe: the HTTP
side passes ``loop.call_soon_threadsafe``).  A bounded waiting queue refuses work when full.

Failure isolation: if a step raises, every row of that step is rebuilt from its prompt plus the
tokens it already delivered (race keys depend only on the seed and the context, so the rebuilt
row continues with exactly the tokens the old one would have produced) and stepped once alone;
a row that fails alone gets an error, the others rejoin the batch.  One bad request never stops
the others or the loop.

Work that needs the served models outside the batch (the model-weighted watermark detector's
forward over a text) is handed to the loop with :meth:`ServingLoop.call` and runs on the loop's
thread between two steps: a model is never run by two threads at once (a llama.cpp context, the
HF adapter's caches and the progress hooks assume one), and the forward gets the main thread's
speed under ``ersd serve``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from ersd.batch import BatchEngine
from ersd.errors import ErsdError
from ersd.request import Request
from ersd.results import StepRecord

log = logging.getLogger("ersd.serve")


@dataclass(frozen=True)
class Progress:
    """What the loop is doing (``/health``): ``phase`` is ``idle``, ``waiting`` (work queued,
    between steps), ``prefill`` (a step that feeds ``prefill_tokens`` new prompt tokens) or
    ``decode``; ``step_seconds``: how long the current step has run; ``stalled_for``: seconds
    without progress while there is work (a step's end, or a layer of a forward inside it)."""

    phase: str
    step_seconds: float
    prefill_tokens: int
    stalled_for: float


class StepCancelled(Exception):
    """Raised inside a forward (by a progress hook) when every row of the step was cancelled:
    the forward stops at the next layer instead of prefilling for nobody."""


def torch_modules(*models: Any) -> list[Any]:
    """The ``torch.nn.Module`` of each model that has one (an HF adapter's ``hf_module``, also
    behind a drafter's ``.model``); llama.cpp and function models have none."""
    found: list[Any] = []
    for model in models:
        for m in (model, getattr(model, "model", None)):
            module = getattr(m, "hf_module", None)
            usable = module is not None and hasattr(module, "register_forward_hook")
            if usable and all(module is not f for f in found):
                found.append(module)
    return found


def progress_points(module: Any) -> list[Any]:
    """Where a forward reports progress: every layer of the module's layer lists (the children
    of each ``torch.nn.ModuleList``), else the module itself."""
    import torch

    points = [
        child
        for sub in module.modules()
        if isinstance(sub, torch.nn.ModuleList)
        for child in sub.children()
    ]
    return points or [module]


class QueueFullError(Exception):
    """The waiting queue is full: the client should retry later (HTTP 429)."""


class ShuttingDownError(Exception):
    """The server is shutting down and takes no new work (HTTP 503)."""


@dataclass
class Failed:
    """A job ended with an error (``status``: the HTTP status it corresponds to)."""

    message: str
    status: int = 500


Event = StepRecord | Failed


@dataclass(eq=False)
class Job:
    """One sequence (one choice of an HTTP request): its :class:`Request`, delivery callback."""

    request: Request
    deliver: Callable[[Event], None]
    tokens: list[int] = field(default_factory=list)  # tokens delivered so far
    cancelled: bool = False
    finished: bool = False

    def continued(self) -> Request:
        """The request that continues this job from what it delivered (race keys depend only on
        the seed and the context, so it goes on with exactly the tokens the job would have; the
        delivered tokens count as generated, so a watermark's windows go on too)."""
        if not self.tokens:
            return self.request
        return replace(
            self.request,
            prompt=(*self.request.prompt, *self.tokens),
            max_new_tokens=self.request.max_new_tokens - len(self.tokens),
            resumed=self.request.resumed + len(self.tokens),
        )


class ServingLoop:
    """Continuous batching over a :class:`BatchEngine` in one background thread."""

    def __init__(
        self,
        target: Any,
        draft: Any,
        *,
        max_batch_size: int = 8,
        max_queue: int = 64,
        on_step: Callable[[list[StepRecord], float], None] | None = None,
    ) -> None:
        self.engine = BatchEngine(target, draft)
        self.target = target
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.on_step = on_step  # metrics hook: (records of a step, its seconds)
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()  # see call()
        self._running: dict[int, Job] = {}  # engine row id -> job (loop thread only)
        self._closing = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._looping = False
        self.steps = 0
        self.failures = 0
        #: monotonic time the loop last made progress (a step, a layer inside a step's forward,
        #: or found nothing to do)
        self.heartbeat = time.monotonic()
        self._step_started: float | None = None  # monotonic start of the step in progress
        self._prefill_tokens = 0  # new prompt tokens the step in progress feeds
        self._fresh_tokens = 0  # prompt tokens of rows admitted since the last step
        self._stepping: list[Job] = []  # the jobs of the step in progress
        self.steps_cancelled = 0  # steps stopped inside a forward: all their rows cancelled
        self._hooks = [
            point.register_forward_hook(self._layer_done)
            for module in torch_modules(target, draft)
            for point in progress_points(module)
        ]
        #: whether forwards report progress layer by layer (an HF model), so that a long
        #: prefill shows as progress and a prefill whose clients all left stops mid-forward
        self.progress_inside_steps = bool(self._hooks)

    # -- called from the HTTP side ---------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._pending)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def start(self) -> None:
        """Run the loop in a background thread (embedding the app, tests)."""
        self._thread = threading.Thread(target=self._run, name="ersd-engine", daemon=True)
        self._thread.start()

    def run(self, keep_going: Callable[[], bool] | None = None) -> None:
        """Run the loop in the calling thread until :meth:`close` (or until ``keep_going()``
        turns false, checked twice a second while idle).  ``ersd serve`` runs it on the main
        thread and the HTTP server in a thread: on this CPU a torch forward in a worker thread
        was measured ~1.6x slower than the same forward on the main thread (docs/serve.md)."""
        self._run(keep_going)

    def submit(self, jobs: Sequence[Job]) -> None:
        """Queue the jobs of one request, all or none."""
        with self._cond:
            if self._closing:
                raise ShuttingDownError("the server is shutting down; retry on another instance")
            # rows free now (or at the next step) take work before the queue counts
            free = max(self.max_batch_size - len(self._running), 0)
            if len(self._pending) + len(jobs) > self.max_queue + free:
                raise QueueFullError(
                    f"the server's queue is full ({len(self._running)} sequences running, "
                    f"{len(self._pending)} waiting, bound {self.max_queue}); retry shortly"
                )
            self._pending.extend(jobs)
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn()`` on the loop's thread between two steps (module doc); the future holds
        its result or its exception.  Raises :class:`ShuttingDownError` once closing."""
        future: Future[Any] = Future()
        with self._cond:
            if self._closing:
                raise ShuttingDownError("the server is shutting down; retry on another instance")
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    def _run_calls(self) -> None:
        """The calls handed in by :meth:`call` (loop thread, between steps)."""
        while True:
            with self._cond:
                if not self._calls:
                    return
                fn, future = self._calls.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as exc:  # handed to the caller, never kills the loop
                future.set_exception(exc)
            self.heartbeat = time.monotonic()

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Drop jobs (finished by a stop string, or their client left); rows free at the next
        step."""
        with self._cond:
            for job in jobs:
                job.cancelled = True
            self._cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking work, let running and waiting jobs finish for up to ``timeout`` seconds,
        then end the rest with an error (HTTP 503: their streams get an error event and
        ``[DONE]``) and stop the loop, in its thread or in the thread that called :meth:`run`.
        Safe to call twice (``ersd serve`` calls it on SIGTERM, the app again on shutdown)."""
        with self._cond:
            self._closing = True
        deadline = time.monotonic() + timeout
        while (self._pending or self._running) and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=max(timeout, 1.0) + 30.0)
        else:  # run() on another thread: wait for its current step to end
            until = time.monotonic() + 30.0
            while self._looping and time.monotonic() < until:
                time.sleep(0.02)
        for job in list(self._pending) + list(self._running.values()):
            self._fail(job, "the server shut down before this request finished", 503)
        with self._cond:
            calls, self._calls = list(self._calls), deque()
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(ShuttingDownError("the server shut down before this ran"))
        self._pending.clear()
        self._running.clear()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # -- the loop thread -------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the loop is running (in its thread or in the thread that called :meth:`run`)."""
        return self._looping

    def progress(self) -> Progress:
        """A snapshot of what the loop is doing (see :class:`Progress`)."""
        started = self._step_started
        now = time.monotonic()
        if started is not None:
            phase = "prefill" if self._prefill_tokens else "decode"
        else:
            phase = "waiting" if (self._pending or self._running) else "idle"
        return Progress(
            phase=phase,
            step_seconds=0.0 if started is None else max(now - started, 0.0),
            prefill_tokens=self._prefill_tokens if started is not None else 0,
            stalled_for=self.stalled_for(),
        )

    def _layer_done(self, module: Any, args: Any, output: Any) -> None:
        """A forward hook: a layer finished, so the step makes progress; when every row of the
        step was cancelled (its clients left) the forward stops here."""
        self.heartbeat = time.monotonic()
        stepping = self._stepping
        if stepping and all(job.cancelled for job in stepping):
            raise StepCancelled("every request of this step was cancelled")

    def stalled_for(self) -> float:
        """Seconds the loop has gone without progress while it has work (0 when idle): a step
        that never returns, or a loop that died, shows here (``/health``)."""
        if not (self._pending or self._running):
            return 0.0
        return max(time.monotonic() - self.heartbeat, 0.0)

    def _run(self, keep_going: Callable[[], bool] | None = None) -> None:
        self._looping = True
        try:
            self._loop(keep_going)
        finally:
            self._looping = False

    def _loop(self, keep_going: Callable[[], bool] | None) -> None:
        while True:
            self.heartbeat = time.monotonic()
            with self._cond:
                while not (self._stop or self._pending or self._running or self._calls):
                    if keep_going is not None and not keep_going():
                        return
                    self._cond.wait(timeout=0.5 if keep_going is not None else None)
                    self.heartbeat = time.monotonic()
                if self._stop:
                    return
                self._pending = deque(j for j in self._pending if not j.cancelled)
                admit: list[Job] = []
                while self._pending and len(self._running) + len(admit) < self.max_batch_size:
                    admit.append(self._pending.popleft())
            try:
                self._run_calls()
                for rid, job in list(self._running.items()):
                    if job.cancelled:
                        self.engine.cancel(rid)
                        del self._running[rid]
                for job in admit:
                    self._add(self.engine, job)
                if self._running:
                    self._step()
            except Exception:  # a bug outside the engine step: log it, keep the loop alive
                log.exception("serving loop error")
                time.sleep(0.1)

    def _add(self, engine: BatchEngine, job: Job) -> int | None:
        try:
            rid = engine.add(job.continued())
        except ErsdError as exc:
            self._fail(job, str(exc), 400)
            return None
        except Exception as exc:
            log.exception("could not start a request")
            self._fail(job, f"internal error starting the request: {exc}", 500)
            return None
        if engine is self.engine:
            self._running[rid] = job
            self._fresh_tokens += len(job.request.prompt) + len(job.tokens)
        return rid

    def _step(self) -> None:
        t0 = time.perf_counter()
        self._prefill_tokens, self._fresh_tokens = self._fresh_tokens, 0
        self._stepping = list(self._running.values())
        self._step_started = time.monotonic()
        try:
            out = self.engine.step()
        except StepCancelled:
            self._drop_cancelled_step()
            return
        except Exception:
            self._stepping = []  # the rows are stepped again alone: none is stopped mid-forward
            log.exception("an engine step failed; isolating the failing request(s)")
            self.failures += 1
            self._recover()
            return
        finally:
            self._stepping, self._step_started, self._prefill_tokens = [], None, 0
        self.steps += 1
        for rid, rec, res in out:
            job = self._running[rid]
            self._deliver(job, rec)
            if res is not None:
                del self._running[rid]
        if self.on_step is not None:
            self.on_step([rec for _, rec, _ in out], time.perf_counter() - t0)

    def _drop_cancelled_step(self) -> None:
        """A forward stopped by :class:`StepCancelled`: every row of the step was cancelled, so
        all of them leave the engine (its state for them is discarded, as in :meth:`_recover`)."""
        self.steps_cancelled += 1
        log.info(
            "stopped a step mid-forward (%d prompt tokens to prefill): its clients all left",
            self._prefill_tokens,
        )
        for rid in list(self._running):
            self.engine.cancel(rid)
        self._running.clear()

    def _deliver(self, job: Job, rec: StepRecord) -> None:
        job.tokens.extend(rec.tokens)
        if rec.finish_reason is not None:
            job.finished = True
        try:
            job.deliver(rec)
        except Exception:
            log.debug("could not deliver a step record", exc_info=True)

    def _fail(self, job: Job, message: str, status: int) -> None:
        if job.finished:
            return
        job.finished = True
        try:
            job.deliver(Failed(message, status))
        except Exception:
            log.debug("could not deliver a failure", exc_info=True)

    def _recover(self) -> None:
        """Rebuild every row of a failed step and step each once alone (see the module doc)."""
        jobs = list(self._running.values())
        for rid in list(self._running):
            self.engine.cancel(rid)
        self._running.clear()
        for job in jobs:
            if job.cancelled:
                continue
            probe = BatchEngine(self.target, self.engine.drafter)
            if self._add(probe, job) is None:
                continue
            try:
                out = probe.step()
            except Exception as exc:
                log.exception("request failed alone; ending it with an error")
                self._fail(job, f"internal error while generating: {exc}", 500)
                continue
            for _, rec, _ in out:
                self._deliver(job, rec)
            if not job.finished:
                self._add(self.engine, job)
