"""What the studies share about real (or tiny test) models: is the default pair there, prompts as
token ids, a cache held at a moving context, target laws along a response or over a tree, and the
proxy judge. Reading laws is scoring, not decoding: every sample comes from the engine."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..assets import catalog as asset_catalog, convert as asset_convert, gguf as asset_gguf, models as asset_models
from ..assets.prompts import format_prompt
from ..decoding.drafters import DraftCache
from ..decoding.sampling import SamplingConfig, logits_to_probs
from ..errors import SpecboundError
from ..models.base import LanguageModel

__all__ = ["PromptContext", "default_pair_status", "encode_prompts", "laws_along", "score_responses",
           "torch_threads", "tree_laws", "truncate_at_stop"]


def default_pair_status(precision: str = "fp32") -> tuple[bool, str]:
    """(available, note) for the default target/draft pair at ``precision`` ("fp32": both fp32
    conversions cached; "int8": both int8 conversions cached, or the packages installed so they can be
    quantised from the GGUF files on first use); never raises (so a study can skip its real-model part
    with a note)."""
    try:
        names = (asset_models.DEFAULT_TARGET, asset_models.DEFAULT_DRAFT)
        missing = [name for name in names if not (asset_convert.check_converted(name, precision=precision).usable or (
            precision != "fp32" and asset_gguf.is_installed(asset_catalog.get_packaged_model(name))))]
    except Exception as exc:  # noqa: BLE001 - a damaged cache must not crash the toy parts
        return False, f"could not check the model cache ({type(exc).__name__}: {exc})"
    if missing:
        return False, (f"real models not available on this machine (not converted at {precision}: "
                       f"{', '.join(missing)}; run `specbound assets install` to enable the real-model parts)")
    return True, "ok"


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Temporarily set torch's intra-op threads (None: leave them)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def encode_prompts(model: LanguageModel, prompts) -> list[list[int]]:
    """Token ids of each prompt as the model sees it (chat template for chat/math sets)."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise SpecboundError(f"{model.name} has no tokenizer: pass token ids instead of prompts")
    out = []
    for p in prompts:
        ids = tok(format_prompt(tok, p), add_special_tokens=True)["input_ids"]
        if not ids:
            raise SpecboundError(f"prompt {p.id!r} encodes to no tokens")
        out.append([int(t) for t in ids])
    return out


class PromptContext:
    """Keeps ``model``'s cache at ``context[:-1]`` for a sequence of contexts, re-reading only what
    changed (the longest common prefix stays cached)."""

    def __init__(self, model: LanguageModel):
        self.model = model
        self.held: list[int] = []
        model.reset()

    def set(self, context: list[int]) -> None:
        want = list(context[:-1])
        model, held = self.model, self.held
        model.crop(model.committed_length)
        k = 0
        while k < min(len(held), len(want), model.cache_length) and held[k] == want[k]:
            k += 1
        model.crop(k)
        if len(want) > k:
            model.forward(torch.tensor([want[k:]], dtype=torch.long))
        self.held = want


def _laws(logits: torch.Tensor, sampling: SamplingConfig, name: str) -> np.ndarray:
    probs = logits_to_probs(logits, sampling, name).to(torch.float64)
    return (probs / probs.sum(-1, keepdim=True)).numpy()


def tree_laws(model: LanguageModel, context: list[int], tokens: list[int], parents: list[int],
              sampling: SamplingConfig) -> np.ndarray:
    """Processed laws [n+1, V] (float64) of ``model`` at the root (row 0, after ``context``) and after
    every node of a tree (``parents``: −1 = root), from ONE tree read. The cache must hold a prefix
    of ``context``; its length is restored afterwards."""
    before = model.cache_length
    cache = DraftCache(model)
    try:
        rows = [cache.start(context)[None]]
        if tokens:
            rows.append(cache.read(list(range(len(tokens))), list(tokens), list(parents)))
    finally:
        cache.restore()
        model.crop(min(before, model.cache_length))
    return _laws(torch.cat(rows), sampling, model.name)


def laws_along(model: LanguageModel, prompt_ids: list[int], response: list[int],
               sampling: SamplingConfig | None = None) -> np.ndarray:
    """Processed laws (float64) [L, V] before each of the L response tokens, from one forward pass
    (temperature 1 unless ``sampling`` says otherwise); the cache is reset afterwards."""
    sampling = sampling or SamplingConfig(1.0)
    if not response:
        return np.zeros((0, model.vocab_size))
    model.reset()
    try:
        full = list(prompt_ids) + list(response)
        logits = model.forward(torch.tensor([full[:-1]], dtype=torch.long))[0, len(prompt_ids) - 1:]
    finally:
        model.reset()
    return _laws(logits, sampling, model.name)


def truncate_at_stop(tokens: list[int], stops) -> list[int]:
    """``tokens`` up to and including the first stop token."""
    for i, tok in enumerate(tokens):
        if tok in stops:
            return tokens[:i + 1]
    return tokens


def score_responses(target: LanguageModel, prompt_ids: list[int], responses: list[list[int]]) -> list[float]:
    """Proxy judge: the target's mean log-likelihood per token of each response given the prompt
    (one prompt read, then one read per response; NaN for an empty response)."""
    target.reset()
    first = torch.log_softmax(target.forward(torch.tensor([prompt_ids], dtype=torch.long))[0, -1].double(), -1)
    base = target.cache_length
    scores = []
    for resp in responses:
        if not resp:
            scores.append(float("nan"))
            continue
        logps = [float(first[resp[0]])]
        if len(resp) > 1:
            target.crop(base)
            logits = target.forward(torch.tensor([resp[:-1]], dtype=torch.long))[0].double()
            lp = torch.log_softmax(logits, -1)[torch.arange(len(resp) - 1), torch.tensor(resp[1:])]
            logps += lp.tolist()
        scores.append(float(np.mean(logps)))
    target.reset()
    return scores
