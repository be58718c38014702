"""A GGUF model run by llama.cpp (through llama-cpp-python's low-level API) behind :class:`LanguageModel`.

Every forward is one ``llama_decode`` over a batch whose tokens all ask for logits, so a chain of
k tokens or a tree of n nodes is scored in one pass (split only beyond ``n_batch`` tokens). The cache
tree lives in llama.cpp's unified KV cache as one *sequence* per root-to-node path
(:mod:`specbound.models.llamacpp_sequences`); a batch's rows are caches of ONE context (:class:`_Context`).
With f32 weights and the defaults here (f32 K/V, no flash attention) a token's logits are the same
(~1e-5) read alone, in a batch or in a tree; with quantized weights llama.cpp's one-row and batched
kernels differ (greedy outputs can differ from one-token greedy decoding at near-ties). How the tree
maps to the cache, and the numbers: docs/design.md (the llama.cpp backend).

Text in and out (the GGUF's own tokenizer and chat template) is :class:`LlamaCppTokenizer`, in
``models/llamacpp_tokenizer.py``. Requires ``pip install 'specbound[llamacpp]'`` (llama-cpp-python,
built from source on first install).
"""
from __future__ import annotations

import collections
import copy
import ctypes
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelNotAvailable, SpecboundError, positive_int
from .base import CacheTree, LanguageModel, ModelInfo, SlotCacheModel
from .llamacpp_sequences import KVSequences, OutOfSequences
from .llamacpp_tokenizer import LlamaCppTokenizer

__all__ = ["LlamaCppModel", "LlamaCppTokenizer", "available_threads", "gguf_sha256", "load_llama_cpp"]

INITIAL_SEQUENCES = 16     # llama.cpp sequences a context opens with (a chain needs one; trees grow it)
DEFAULT_MAX_CONTEXT = 4096  # n_ctx when none is given: the model's training context, capped here


# How a DRAFT's context is opened (``load_gguf_model(role="draft")``): a draft only proposes, so its
# K/V precision and kernels never change the output law, only how often it is right. f16 K/V halves
# its cache; 64-token batches size llama.cpp's output and compute buffers for 64 rows of logits instead
# of 256 (~0.2 GB less for a 152k vocabulary; prompts are read 64 tokens per decode); reading the file
# instead of mapping it keeps the repacked tensors' file pages out of memory. Measured on the 0.5B
# q4_0 draft: 834 -> ~490 MB resident after load, draft forwards as fast (docs/results/RESULTS.md).
DRAFT_CONTEXT = {"n_batch": 64, "kv_cache_type": "f16", "load": "read"}


INSTALL_HINT = "pip install 'specbound[llamacpp]'"

_LOG_TAIL: collections.deque = collections.deque(maxlen=40)   # recent llama.cpp warnings/errors
_LOG_CALLBACK = None                                            # keeps the ctypes callback alive
VERBOSE = bool(os.environ.get("SPECBOUND_LLAMA_VERBOSE"))
_SHA_CACHE: dict[tuple, str] = {}


def load_llama_cpp():
    """Import the ctypes binding, or raise :class:`ModelNotAvailable` with the install command."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ModelNotAvailable(
            f"the llama.cpp backend needs llama-cpp-python, which is not installed ({exc}); "
            f"install it with: {INSTALL_HINT}  (it compiles llama.cpp, ~10 minutes on 2 cores)"
        ) from None
    _install_log_callback(llama_cpp)
    return llama_cpp


def _install_log_callback(llama_cpp) -> None:
    """Route llama.cpp's log through us: keep warnings/errors for error messages, print only if verbose."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None:
        return

    @llama_cpp.llama_log_callback
    def _callback(level, text, user_data):   # ggml levels: 1 info, 2 warn, 3 error, 4 debug, 5 cont
        message = text.decode("utf-8", "replace") if text else ""
        if level in (2, 3) or (level == 5 and _LOG_TAIL and _LOG_TAIL[-1][0] in (2, 3)):
            _LOG_TAIL.append((level if level != 5 else _LOG_TAIL[-1][0], message))
        if VERBOSE:
            import sys
            print(message, end="", file=sys.stderr, flush=True)

    _LOG_CALLBACK = _callback
    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


def _recent_errors(since: int = 0) -> str:
    lines = [m.strip() for level, m in list(_LOG_TAIL)[since:] if level == 3 and m.strip()]
    return ("; llama.cpp said: " + " | ".join(lines[-6:])) if lines else ""


def available_threads() -> int:
    """Cores this process may run on (the affinity mask, not the machine's core count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                      # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def gguf_sha256(path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) for this process."""
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
        _SHA_CACHE[key] = digest.hexdigest()
    return _SHA_CACHE[key]


def _check_gguf_path(path) -> Path:
    path = Path(os.fspath(path)).expanduser()
    if not path.exists():
        raise ModelNotAvailable(f"GGUF file {str(path)!r} does not exist")
    if not path.is_file():
        raise ModelNotAvailable(f"GGUF path {str(path)!r} is not a file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise SpecboundError(f"{str(path)!r} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    return path



def _load_weights(lib, path: Path, name: str, repack: bool, load: str):
    """The model's weights from ``path`` (``load``: "mmap" or "read"; ``repack``: llama.cpp's interleaved
    CPU layout of quantized weights), refused unless it is an attention-only decoder."""
    lib.llama_backend_init()
    mark = len(_LOG_TAIL)
    mparams = lib.llama_model_default_params()
    mparams.use_extra_bufts = bool(repack)       # CPU_REPACK: interleaved weights for faster matmuls
    if load == "read":
        mparams.load_mode = lib.LLAMA_LOAD_MODE_NONE
    weights = lib.llama_model_load_from_file(str(path).encode(), mparams)
    if not weights:
        raise SpecboundError(f"llama.cpp could not load {str(path)!r}{_recent_errors(mark)}")
    problem = None
    if lib.llama_model_is_recurrent(weights) or lib.llama_model_is_hybrid(weights):
        problem = (f"{name}: recurrent/hybrid models cannot roll back their state per token; "
                   "the llama.cpp backend supports attention-only models")
    elif lib.llama_model_has_encoder(weights):
        problem = f"{name}: encoder-decoder models are not supported"
    if problem is not None:
        lib.llama_model_free(weights)
        raise SpecboundError(problem)
    return weights


def _context_params(lib, n_ctx: int, n_batch: int, n_threads: int, flash_attn, kv_cache_type):
    """llama.cpp's context parameters: every token of a batch returns logits, one KV pool for every
    sequence (``kv_unified``: a sequence copy is metadata only), K/V at ``kv_cache_type``."""
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_batch
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads
    cparams.kv_unified = True          # one cell pool shared by all sequences: seq_cp is metadata only
    cparams.no_perf = True
    if flash_attn is not None:
        cparams.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else \
            lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if kv_cache_type is not None:
        types = {"f32": lib.GGML_TYPE_F32, "f16": lib.GGML_TYPE_F16}
        if kv_cache_type not in types:
            raise SpecboundError(f"kv_cache_type must be one of {sorted(types)} or None, got {kv_cache_type!r}")
        cparams.type_k = cparams.type_v = types[kv_cache_type]
    return cparams


def _kernels(lib, weights, kv_cache_type) -> str:
    """The weights' file type and, where not f32, the K/V type: what ``ModelInfo.kernels`` reports."""
    ftype = lib.llama_ftype_name(lib.llama_model_ftype(weights))
    ftype = ftype.decode() if ftype else str(int(lib.llama_model_ftype(weights)))
    kv = {None: ", K/V llama.cpp default", "f16": ", K/V f16"}.get(kv_cache_type, "")
    return f"gguf:{ftype}{kv}"


class _Context:
    """One llama.cpp context — its KV cells, its batch, the parameters it was made with — and the caches
    that read through it (a model, or the rows of a batch: :meth:`LlamaCppModel.fork_rows`): they share
    its passes and open more sequences together. The last cache to close frees it."""

    def __init__(self, lib, cparams):
        self.lib, self.cparams = lib, cparams
        self.ctx = self.mem = self.batch = None
        self.users = 1                     # caches that read through this context
        self.members: list = []            # those caches, in the order they joined

    def open(self, weights, name: str, n_ctx: int, n_batch: int) -> None:
        """Create the context (KV cells) and batch of ``cparams`` over the loaded ``weights``."""
        lib = self.lib
        mark = len(_LOG_TAIL)
        self.ctx = lib.llama_init_from_model(weights, self.cparams)
        if not self.ctx:
            raise SpecboundError(f"llama.cpp could not create a context for {name} "
                                 f"(n_ctx={n_ctx}, n_batch={n_batch}){_recent_errors(mark)}")
        self.mem = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(n_batch, 0, int(self.cparams.n_seq_max))

    def release(self) -> None:
        """One cache stops reading through this context; the last one frees it."""
        self.users -= 1
        if self.users <= 0:
            if self.batch is not None:
                self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.ctx = self.mem = self.batch = None

    def reopen(self, weights, cparams, name: str, n_ctx: int, n_batch: int) -> None:
        """The context again with ``cparams`` (more sequences), its state (KV cells with their sequence ids,
        last outputs) copied across, so later logits are unchanged; SpecboundError leaves it closed."""
        lib = self.lib
        size = int(lib.llama_state_get_size(self.ctx))
        state = (ctypes.c_uint8 * size)()
        written = int(lib.llama_state_get_data(self.ctx, state, size))
        lib.llama_batch_free(self.batch)
        lib.llama_free(self.ctx)                 # before the new one: the two never coexist in memory
        self.ctx = self.mem = self.batch = None
        self.cparams = cparams
        self.open(weights, name, n_ctx, n_batch)
        if int(lib.llama_state_set_data(self.ctx, state, written)) != written:
            lib.llama_batch_free(self.batch)
            lib.llama_free(self.ctx)
            self.ctx = self.mem = self.batch = None
            raise SpecboundError(f"{name}: llama.cpp could not restore its cache after opening more sequences")

    def decode(self, reader, plans: list["_Plan"]) -> list[np.ndarray]:
        """Every planned read of this context in one ``llama_decode`` (split at ``reader.n_batch`` tokens;
        ``reader``: the cache that runs the pass, which counts its calls); the logits each read asked for,
        in its order."""
        lib, vocab_size = self.lib, reader.vocab_size
        entries = [(j, i) for j, p in enumerate(plans) for i in range(len(p.toks))]
        outs = [np.empty((len(p.toks) - p.first_out, vocab_size), dtype=np.float32) for p in plans]
        for done in range(0, len(entries), reader.n_batch):
            chunk = entries[done:done + reader.n_batch]
            batch = self.batch
            batch.n_tokens = len(chunk)
            wanted = []
            for b, (j, i) in enumerate(chunk):
                p = plans[j]
                batch.token[b] = p.toks[i]
                batch.pos[b] = p.positions[i]
                seqs = p.node_seqs[i]
                batch.n_seq_id[b] = len(seqs)
                row = batch.seq_id[b]
                for k, s in enumerate(seqs):
                    row[k] = s
                keep = i >= p.first_out
                batch.logits[b] = 1 if keep else 0
                if keep:
                    wanted.append((j, i - p.first_out))
            mark = len(_LOG_TAIL)
            rc = lib.llama_decode(self.ctx, batch)
            reader.decode_calls += 1
            if rc != 0:
                reason = {1: "no free KV cells for the batch", 2: "aborted", -1: "invalid batch"}.get(
                    rc, "fatal error")
                raise SpecboundError(f"{reader.name}: llama_decode failed ({rc}: {reason}){_recent_errors(mark)}")
            if wanted:
                logits = np.ctypeslib.as_array(lib.llama_get_logits(self.ctx), shape=(len(wanted), vocab_size))
                for r, (j, i) in enumerate(wanted):
                    outs[j][i] = logits[r]
        return outs


class LlamaCppModel(SlotCacheModel):
    """A GGUF model on llama.cpp behind the :class:`LanguageModel` protocol, with tree forwards.

    ``n_ctx``: KV cells (committed tokens + tree nodes; default the training context, capped at
    ``DEFAULT_MAX_CONTEXT``); ``n_threads``: default the cores this process may use; ``n_batch``: most tokens
    per ``llama_decode``; ``max_sequences``: most tree sequences (≈ leaves + 1; default and maximum
    llama.cpp's limit; ``INITIAL_SEQUENCES`` opened at first, doubled when a tree needs more);
    ``flash_attn`` False and ``kv_cache_type`` "f32" make logits batch-independent (~1e-5; None: llama.cpp's
    own choice); ``repack``: llama.cpp's interleaved CPU layout of quantized weights; ``identity``:
    "sha256" of the file, None or a string; ``load``: "mmap" or "read" (the repacked tensors' file pages
    are then not kept resident). Why each default: docs/design.md (the llama.cpp backend). Each cache
    (this model, a :meth:`fork`, the rows of :meth:`fork_rows`) reads through a :class:`_Context` over
    the same weights and keeps its tree's sequences in a :class:`~.llamacpp_sequences.KVSequences`.
    """

    rows_share_passes = True

    def __init__(self, path, n_ctx: int | None = None, n_threads: int | None = None, n_batch: int = 256,
                 max_sequences: int | None = None, flash_attn: bool | None = False, kv_cache_type: str | None = "f32",
                 repack: bool = True, identity: str | None = "sha256", name: str | None = None,
                 seed_tokenizer: bool = True, load: str = "mmap"):
        lib = load_llama_cpp()
        self._lib = lib
        path = _check_gguf_path(path)
        self.path = path
        self.name = name or path.name
        self.n_threads = available_threads() if n_threads is None else positive_int(n_threads, "n_threads")
        self.n_batch = positive_int(n_batch, "n_batch")
        limit = int(lib.llama_max_parallel_sequences())
        # the KV pool is unified, so sequences are metadata: default to llama.cpp's limit (a dynamic draft
        # tree of capacity 64 keeps more than 64 leaves in the draft's cache between expansions)
        self.max_sequences = limit if max_sequences is None else positive_int(max_sequences, "max_sequences")
        if self.max_sequences > limit:
            raise SpecboundError(f"max_sequences must be <= {limit} (llama.cpp's limit), got {self.max_sequences}")
        if n_ctx is not None:
            n_ctx = positive_int(n_ctx, "n_ctx")
        if load not in ("mmap", "read"):
            raise SpecboundError(f"load must be 'mmap' or 'read', got {load!r}")
        self._model = self._context = None

        start = time.perf_counter()
        self._model = _load_weights(lib, path, self.name, repack, load)
        self.n_ctx = n_ctx or min(int(lib.llama_model_n_ctx_train(self._model)), DEFAULT_MAX_CONTEXT)
        self.n_batch = min(self.n_batch, self.n_ctx)      # llama.cpp clamps it the same way
        opened = min(self.max_sequences, INITIAL_SEQUENCES)     # sequences opened so far (grows on demand)
        cparams = _context_params(lib, self.n_ctx, self.n_batch, self.n_threads, flash_attn, kv_cache_type)
        self._users = [1]                  # caches (this model and its rows) that use the weights
        self._kv = KVSequences(0, 1, opened)
        self._open_context(self._params_with(opened, cparams))
        # llama.cpp rounds the cell count up (to a multiple of 256); the limit we enforce stays n_ctx
        self.n_ctx = min(self.n_ctx, int(lib.llama_n_ctx(self._ctx)))
        self.n_batch = min(self.n_batch, int(lib.llama_n_batch(self._ctx)))
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(self._vocab))
        if identity == "sha256":
            identity = gguf_sha256(path)
        self.info = ModelInfo(backend="llamacpp", kernels=_kernels(lib, self._model, kv_cache_type),
                              identity=identity, load_seconds=time.perf_counter() - start, max_positions=self.n_ctx)
        self.tokenizer = LlamaCppTokenizer(self) if seed_tokenizer else None
        self._as_new_row()

    # ------------------------------------------------------------------ the parts' state, by their old names
    _ctx = property(lambda self: None if getattr(self, "_context", None) is None else self._context.ctx,
                    doc="The llama.cpp context this cache reads through (None once closed).")
    _mem = property(lambda self: self._context.mem)
    _ctx_users = property(lambda self: self._context, doc="The shared :class:`_Context` (one for its caches).")
    _sequences = property(lambda self: self._kv.opened)
    _seq_base = property(lambda self: self._kv.base)

    def _own_sequences(self) -> range:
        return self._kv.own()

    # ------------------------------------------------------------------ lifetime
    def _params_with(self, sequences: int, cparams=None):
        """A copy of the context parameters (``cparams``, default this cache's context's) for ``sequences``
        llama.cpp sequences: every token of a batch returns logits, and llama.cpp also reserves one output
        per sequence, so the outputs are max(n_batch, sequences)."""
        source = self._context.cparams if cparams is None else cparams
        params = type(source).from_buffer_copy(source)
        params.n_seq_max = sequences
        params.n_outputs_max = max(self.n_batch, sequences)
        return params

    def _open_context(self, cparams) -> None:
        """A llama.cpp context of ``cparams`` over the loaded weights, used by this cache alone."""
        self._context = _Context(self._lib, cparams)
        self._context.members.append(self)
        try:
            self._context.open(self._model, self.name, self.n_ctx, self.n_batch)
        except SpecboundError:
            self.close()
            raise

    def _as_new_row(self) -> None:
        """Count calls afresh, belong to no batch's scheduler (it sets ``scheduler`` while this cache is one
        of its rows), and empty the cache."""
        self.decode_calls = 0
        self.scheduler = None
        self.batch_priority = 1
        self.reset()

    def close(self) -> None:
        """Free the llama.cpp context and batch, and the weights once no row uses them (also done when
        the object is collected)."""
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if self._ctx:
            self._context.release()
            self._context = None
        if getattr(self, "_model", None):
            users = getattr(self, "_users", [1])
            users[0] -= 1
            if users[0] <= 0:
                lib.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _alive(self) -> None:
        if not self._ctx:
            raise SpecboundError(f"{self.name} is closed")

    # ------------------------------------------------------------------ rows of a batch
    def fork(self) -> "LlamaCppModel":
        """A new row with a llama.cpp context of its own (its KV cells, empty) over the SAME loaded
        weights (nothing is copied or loaded again). Rows of different contexts cannot share a pass:
        a batch forks its rows with :meth:`fork_rows` instead."""
        self._alive()
        row = copy.copy(self)
        row._context = None
        row._users[0] += 1
        opened = min(self.max_sequences, INITIAL_SEQUENCES)
        row._kv = KVSequences(0, 1, opened)
        row._open_context(self._params_with(opened))
        row._as_new_row()
        return row

    def fork_rows(self, n: int) -> list["LlamaCppModel"]:
        """``n`` rows of a batch in ONE new llama.cpp context over the same loaded weights, each a cache of
        its own (its own sequence ids in the context's unified pool of ``n · n_ctx`` cells), so a scheduled
        pass over several rows is ONE ``llama_decode`` over all their tokens (:func:`_read_rows`). A row's
        tokens attend only to its own sequences, so its logits are those it would get alone up to the
        kernels' batch invariance. Row r's ids are r, r + n, r + 2n, …: ``INITIAL_SEQUENCES`` split among
        the rows at first (at least one each), all rows' doubled together when one row's tree needs more, up
        to llama.cpp's limit split evenly (``max_sequences`` of each row)."""
        self._alive()
        n = positive_int(n, "n")
        per_row = min(self.max_sequences, int(self._lib.llama_max_parallel_sequences()) // n)
        if per_row < 1:
            raise SpecboundError(f"{self.name}: a batch of {n} rows needs a llama.cpp sequence per row; llama.cpp "
                                 f"allows {int(self._lib.llama_max_parallel_sequences())}")
        opened = min(per_row, max(1, INITIAL_SEQUENCES // n))
        cparams = self._params_with(n * opened)
        cparams.n_ctx = n * self.n_ctx
        first = copy.copy(self)
        first._context = None
        first._users[0] += 1
        first._open_context(cparams)
        context = first._context
        for r in range(n):
            row = first if r == 0 else copy.copy(first)
            if r:
                row._users[0] += 1
                context.users += 1
                context.members.append(row)
            row._kv = KVSequences(r, n, opened)
            row.max_sequences = per_row
            row._as_new_row()
        return list(context.members)

    # ------------------------------------------------------------------ cache bookkeeping
    def reset(self) -> None:
        self._alive()
        if self._context.users == 1:
            self._lib.llama_memory_clear(self._mem, False)
        else:                                   # a row of a shared context: only its own sequences
            for s in self._kv.own():
                self._lib.llama_memory_seq_rm(self._mem, s, -1, -1)
        self.slots = CacheTree(self.name)
        self._kv.clear()

    @property
    def max_tree_nodes(self) -> int:
        """Tree nodes a read may leave cached: every leaf holds a sequence, the chain one more."""
        return self.max_sequences - 1

    # ------------------------------------------------------------------ forwards
    def forward(self, tokens: torch.Tensor, keep_logits: int | None = None) -> torch.Tensor:
        toks = self.check_tokens(tokens)[0].tolist()
        return self._read(toks, self.slots.chain_parents(len(toks)), extend_chain=self.slots.is_chain,
                          keep_logits=keep_logits)

    def forward_tree(self, tokens: torch.Tensor, parents) -> torch.Tensor:
        toks = self.check_tokens(tokens)[0].tolist()
        parents = self.slots.check_parents(list(parents))
        if len(parents) != len(toks):
            raise SpecboundError(f"{self.name}: {len(toks)} tree tokens but {len(parents)} parents")
        return self._read(toks, parents, extend_chain=False)

    def _read(self, toks: list[int], parents: list[int], extend_chain: bool,
              keep_logits: int | None = None) -> torch.Tensor:
        read = _RowRead(self, toks, parents, extend_chain, keep_logits)
        if self.scheduler is not None:
            return self.scheduler.submit(_read_rows, read, group=id(self._context), priority=self.batch_priority)
        return _read_rows([read])[0]

    # ------------------------------------------------------------------ rollback
    def crop(self, length: int) -> None:
        self._alive()
        old_chain = self.slots.chain
        tree_before = (list(self.slots.parents), list(self.slots.positions))
        length = self.slots.crop(length)             # validates; raises before anything changes
        if length <= old_chain:
            self._kv.collapse_to_chain(self._lib, self._mem, length)
        else:
            self._kv.crop(self._lib, self._mem, old_chain, *tree_before, length)

    def keep_path(self, base_length: int, path) -> None:
        self._alive()
        old_chain = self.slots.chain
        path = [int(s) for s in path]
        end = path[-1] if path else int(base_length) - 1
        end_pos = self.slots.position(end) if 0 <= end < self.slots.length else None
        end_seq = self._kv.primary(self.slots, end) if end >= old_chain and end_pos is not None else self._kv.base
        length = len(self.slots.keep_path(base_length, path))   # validates; raises before anything changes
        if end < old_chain:
            self._kv.collapse_to_chain(self._lib, self._mem, length)
            return
        assert end_pos == length - 1, "a kept path must end at position length - 1"
        self._kv.keep(self._lib, self._mem, end_seq, end_pos, length)

    # ------------------------------------------------------------------ diagnostics
    def kv_sequence_ranges(self) -> dict[int, tuple[int, int]]:
        """(min, max) cached position of every llama.cpp sequence that holds cells (tests, debugging)."""
        return self._kv.ranges(self._lib, self._mem)

    def __repr__(self) -> str:
        return (f"LlamaCppModel({self.name!r}, {self.info.kernels}, n_ctx={self.n_ctx}, "
                f"threads={self.n_threads}, cached={self.cache_length})")


@dataclass
class _RowRead:
    """One row's read (handed to a batch's scheduler when one holds the row): the row, its token ids,
    their tree parents, whether they extend the committed chain, and how many of the last rows' logits
    to return (None: all)."""

    model: LlamaCppModel
    toks: list
    parents: list
    extend_chain: bool
    keep_logits: int | None

    @property
    def tokens(self) -> torch.Tensor:
        """The ids as [1, k] (what the scheduler counts a pass's tokens by)."""
        return torch.tensor([self.toks])


@dataclass
class _Plan:
    """A read checked and planned by its row (:func:`_prepare`): its tokens, each token's
    sequence ids (attention sequence first) and position, the sequence copies made for it, the row's
    tips afterwards, and the first token whose logits are returned."""

    read: _RowRead
    toks: list
    node_seqs: list
    copies: list
    positions: list
    tips: dict
    first_out: int


def _prepare(read: _RowRead) -> _Plan:
    """Check and plan one row's read, and copy the sequences it opens (undone by :func:`_undo`)."""
    row = read.model
    row._alive()
    n = len(read.toks)
    if row.slots.length + n > row.n_ctx:
        raise SpecboundError(
            f"{row.name}: context full: {row.slots.length} cached + {n} new tokens exceed n_ctx={row.n_ctx}; "
            f"create the model with a larger n_ctx (the model was trained for "
            f"{int(row._lib.llama_model_n_ctx_train(row._model))})"
        )
    while True:
        try:
            node_seqs, copies, positions, tips = row._kv.plan(row.slots, read.parents)
            break
        except OutOfSequences:
            if row._kv.opened >= row.max_sequences:
                raise SpecboundError(
                    f"{row.name}: the tree needs more than max_sequences={row.max_sequences} llama.cpp "
                    f"sequences (about one per leaf); create the model with a larger max_sequences "
                    f"(a batch's rows split llama.cpp's {int(row._lib.llama_max_parallel_sequences())})"
                ) from None
            _grow_sequences(row)
    plan = _Plan(read, read.toks, node_seqs, copies, positions, tips,
                 first_out=max(0, n - read.keep_logits) if read.keep_logits else 0)   # only the last rows' logits
    for src, dst, end in copies:
        row._lib.llama_memory_seq_cp(row._mem, src, dst, 0, end)
    return plan


def _grow_sequences(row: LlamaCppModel) -> None:
    """Reopen ``row``'s context with twice the sequences per cache (at most ``max_sequences``), for every
    cache on it (a batch's rows, whose interleaved ids stay valid): later logits are unchanged."""
    context, count = row._context, min(row.max_sequences, 2 * row._kv.opened)
    try:
        context.reopen(row._model, row._params_with(row._kv.stride * count), row.name, row.n_ctx, row.n_batch)
    except SpecboundError:
        row.close()
        raise
    for cache in context.members:
        if cache._context is context:
            cache._kv.opened = count


def _commit(plan: _Plan) -> None:
    """A planned read was decoded: its row's cache holds its nodes."""
    row = plan.read.model
    row.slots.append(plan.read.parents, extend_chain=plan.read.extend_chain)
    row._kv.commit(plan.node_seqs, plan.tips, plan.read.extend_chain)


def _undo(plan: _Plan) -> None:
    """A planned read failed: remove every cell it may have added to its row's cache."""
    row = plan.read.model
    row._kv.undo(row._lib, row._mem, row.slots, plan.node_seqs, plan.copies)


def _read_rows(reads: list[_RowRead]) -> list[torch.Tensor]:
    """The reads of one scheduled pass: the reads of rows of one context (:meth:`LlamaCppModel.fork_rows`)
    as ONE ``llama_decode`` over all their tokens, each context's after another's. A read that cannot
    be planned, or a failed decode, leaves every row's cache as it was."""
    contexts: dict[int, list[int]] = {}
    for j, r in enumerate(reads):
        contexts.setdefault(id(r.model._context), []).append(j)
    results: list = [None] * len(reads)
    for members in contexts.values():
        plans = []
        try:
            for j in members:
                plans.append(_prepare(reads[j]))
            first = reads[members[0]].model
            outs = first._context.decode(first, plans)
        except BaseException:
            for plan in plans:
                _undo(plan)
            raise
        for j, plan, out in zip(members, plans, outs):
            _commit(plan)
            results[j] = torch.from_numpy(out).unsqueeze(0)
    return results
