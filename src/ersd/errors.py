"""Exceptions raised by ersd. Every message says what was wrong and how to fix it."""

from __future__ import annotations


class ErsdError(ValueError):
    """Base class of every error ersd raises on bad input.

    ``param``: the name of the offending request field (``seed``, ``temperature``, ``tree``, ...)
    where one is to blame, else ``None``; a server maps it to its error's ``param`` without
    reading the message.
    """

    def __init__(self, *args: object, param: str | None = None) -> None:
        super().__init__(*args)
        self.param = param


class InvalidTreeSpecError(ErsdError):
    """A tree specification string or path list could not be parsed or is not a valid tree."""


class UnsupportedTreeError(ErsdError):
    """A verification method was given a tree shape it cannot verify."""


class UnknownMethodError(ErsdError):
    """The method name is not in the registry."""


class SamplingParamsError(ErsdError):
    """Temperature, top-k, top-p or min-p out of range."""


class InvalidLogitsError(ErsdError):
    """A model returned NaN/inf logits or logits of the wrong shape."""


class VocabularyMismatchError(ErsdError):
    """Draft and target models do not share a vocabulary."""


class GenerationInputError(ErsdError):
    """Bad arguments to generate(): empty prompt, max_new_tokens < 1, token ids out of range..."""


class ModelLoadError(ErsdError):
    """A model could not be found, prepared or loaded."""


class InputFileError(ErsdError):
    """A file given as input (rank profile, calibration, config) is missing, a directory or
    unreadable."""


class WatermarkError(ErsdError):
    """A watermark setting, key file or detection input is invalid (the key is never shown)."""
