"""llama.cpp's own decoding, as peers for benchmarks, and a t(k) timer for llama.cpp models.

llama-cpp-python (0.3.x) speculates through ``Llama(draft_model=...)``: any
:class:`llama_cpp.llama_speculative.LlamaDraftModel` proposes tokens, ``Llama.generate`` evaluates them
in one batch and keeps the proposal up to the first mismatch with its own samples (lossless for any
sampler, but it accepts less than rejection sampling at T > 0). The binding ships only prompt lookup
(``LlamaPromptLookupDecoding``); :class:`DraftModelProposer` plugs in a draft MODEL (greedy drafts from
a second GGUF, its cache kept between calls). llama.cpp's C++ ``common/speculative`` is not exposed.
Sampling differs: ``Llama`` applies top-k, typical, top-p and min-p BEFORE the temperature (specbound
after) and always runs a repeat-penalty stage (a no-op at 1); top-p differs when T != 1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import SpecboundError
from ..models.llamacpp import LlamaCppModel, available_threads, load_llama_cpp

__all__ = [
    "DraftModelProposer", "ForwardCosts", "PeerResult", "llama_generate", "measure_llama_forward_costs",
    "open_llama",
]


@dataclass
class PeerResult:
    """Tokens and timing of one llama.cpp peer run (prefill included in ``seconds``)."""

    tokens: list[int]
    seconds: float
    method: str
    target_evals: int = 0          # Llama.eval calls (one batch each, possibly split into n_batch)
    drafted: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("inf")


def open_llama(path, n_ctx: int = 2048, n_threads: int | None = None, n_batch: int = 512, seed: int = 0,
               draft_model=None, **kwargs):
    """A high-level ``llama_cpp.Llama`` with quiet logs and the process's available cores."""
    llama_cpp = load_llama_cpp()
    threads = n_threads or available_threads()
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                           n_threads=threads, n_threads_batch=threads, seed=seed, verbose=False,
                           draft_model=draft_model, **kwargs)


def _count_evals(llm):
    """Wrap ``llm.eval`` to count target passes; returns a list holding the count."""
    counter = [0]
    original = llm.eval

    def counted(tokens):
        counter[0] += 1
        return original(tokens)

    llm.eval = counted
    return counter


def llama_generate(llm, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                   top_p: float | None = None, stop_token_ids=()) -> PeerResult:
    """Plain (or, if ``llm`` was opened with ``draft_model=``, llama-cpp-python-speculative) generation.

    ``temperature=0`` is greedy. Otherwise the sampler is exactly T + optional top-k/top-p (min-p,
    typical and penalties switched off) with the seed given to :func:`open_llama`.
    """
    prompt = [int(t) for t in (prompt_ids.reshape(-1).tolist() if isinstance(prompt_ids, torch.Tensor)
                               else prompt_ids)]
    if not prompt:
        raise SpecboundError("prompt_ids is empty")
    stops = {int(t) for t in stop_token_ids}
    llm.reset()
    llm._sampler = None
    counter = _count_evals(llm)
    proposer = llm.draft_model
    drafted = [0]
    if proposer is not None:
        def counting_proposer(input_ids, **kw):
            out = proposer(input_ids, **kw)
            drafted[0] += len(out)
            return out
        llm.draft_model = counting_proposer
    tokens: list[int] = []
    first = None
    t0 = time.perf_counter()
    try:
        for token in llm.generate(prompt, temp=float(temperature), top_k=int(top_k or 0),
                                  top_p=1.0 if top_p is None else float(top_p), min_p=0.0, typical_p=1.0,
                                  repeat_penalty=1.0, reset=True):
            if first is None:
                first = time.perf_counter() - t0       # prompt read + first token: the prefill
            tokens.append(int(token))
            if len(tokens) >= max_new_tokens or int(token) in stops:
                break
    finally:
        seconds = time.perf_counter() - t0
        del llm.eval                                   # back to the class method
        llm.draft_model = proposer
    method = "llama.cpp" if proposer is None else f"llama.cpp+{type(proposer).__name__}"
    return PeerResult(tokens, seconds, method, target_evals=counter[0], drafted=drafted[0],
                      extra={"first_token_seconds": first or 0.0})


class DraftModelProposer:
    """A draft MODEL behind llama-cpp-python's ``draft_model=`` hook: greedy proposals of
    ``num_pred_tokens`` tokens from a second GGUF (a :class:`LlamaCppModel`), which keeps its KV
    cache between calls and only reads what changed (longest common prefix with the last call)."""

    def __init__(self, draft: LlamaCppModel, num_pred_tokens: int = 4):
        self.draft = draft
        self.num_pred_tokens = int(num_pred_tokens)
        self.history: list[int] = []

    def __call__(self, input_ids, /, **_ignored) -> np.ndarray:
        ids = [int(t) for t in np.asarray(input_ids).reshape(-1)]
        common = 0
        for a, b in zip(self.history, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)            # re-read at least the last token for its logits
        self.draft.crop(common)
        self.history = ids[:common]
        logits = self.draft.forward(torch.tensor([ids[common:]]))[0, -1]
        self.history = list(ids)
        out = []
        for i in range(self.num_pred_tokens):
            token = int(torch.argmax(logits))
            out.append(token)
            if i + 1 < self.num_pred_tokens:
                logits = self.draft.forward(torch.tensor([[token]]))[0, -1]
                self.history.append(token)
        return np.asarray(out, dtype=np.intc)


@dataclass
class ForwardCosts:
    """Seconds to read k new tokens after a cached prefix: median and spread over repeats."""

    ks: tuple[int, ...]
    median: tuple[float, ...]
    q25: tuple[float, ...]
    q75: tuple[float, ...]
    minimum: tuple[float, ...]
    maximum: tuple[float, ...]
    repeats: int
    prefix_length: int
    threads: int

    def table(self) -> str:
        rows = ["k | median ms | IQR ms | min–max ms | × t(1)"]
        for k, m, a, b, lo, hi in zip(self.ks, self.median, self.q25, self.q75, self.minimum, self.maximum):
            rows.append(f"{k} | {1e3 * m:.1f} | {1e3 * a:.1f}–{1e3 * b:.1f} | {1e3 * lo:.1f}–{1e3 * hi:.1f} | "
                        f"{m / self.median[0]:.2f}")
        return "\n".join(rows)


def measure_llama_forward_costs(model: LlamaCppModel, ks=tuple(range(1, 65)), repeats: int = 5,
                                prefix=None, prefix_length: int = 64, seed: int = 0,
                                tree: bool = False) -> ForwardCosts:
    """t(k) of a llama.cpp model: median (and quartiles, min, max) of ``repeats`` timed reads of k
    tokens after a fixed cached prefix, the cache cropped back after each read. Repeats are
    interleaved over k (k = 1..K, then again) so slow phases of a shared machine hit all k alike.
    ``tree=True`` times ``forward_tree`` with every node under the last committed token instead.
    """
    gen = np.random.default_rng(seed)
    vocab = model.vocab_size
    if prefix is None:
        prefix = gen.integers(0, vocab, size=prefix_length).tolist()
    prefix = [int(t) for t in prefix]
    ks = tuple(int(k) for k in ks)
    model.reset()
    model.forward(torch.tensor([prefix]))
    base = model.cache_length
    model.forward(torch.tensor([[prefix[-1]]]))     # warm-up
    model.crop(base)
    times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            tokens = torch.tensor([gen.integers(0, vocab, size=k).tolist()])
            t0 = time.perf_counter()
            if tree:
                model.forward_tree(tokens, [base - 1] * k)
            else:
                model.forward(tokens)
            times[k].append(time.perf_counter() - t0)
            model.crop(base)
    stats = {k: np.asarray(v) for k, v in times.items()}
    return ForwardCosts(
        ks, tuple(float(np.median(stats[k])) for k in ks), tuple(float(np.quantile(stats[k], 0.25)) for k in ks),
        tuple(float(np.quantile(stats[k], 0.75)) for k in ks), tuple(float(stats[k].min()) for k in ks),
        tuple(float(stats[k].max()) for k in ks), repeats, len(prefix), model.n_threads,
    )
