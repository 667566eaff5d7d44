"""``ersd.transformers``: ersd as Hugging Face ``transformers``' decoding loop.

``model.generate(**inputs, custom_generate=ersd.transformers.generate, draft_model=draft, ...)``;
see :mod:`ersd.integrations.transformers` and docs/transformers.md.  Importing this module does
not import transformers (only calling its functions does).
"""

from ersd.integrations.transformers import (
    export_folder,
    generate,
    generate_from_folder,
    sampling_from,
    wrap_module,
)

__all__ = ["export_folder", "generate", "generate_from_folder", "sampling_from", "wrap_module"]
