"""A GGUF model run by llama.cpp (through llama-cpp-python's low-level API) behind :class:`LanguageModel`.

Every forward is one ``llama_decode`` over a batch whose tokens all ask for logits, so a chain of
k tokens or a tree of n nodes is scored in one pass (split only beyond ``n_batch`` tokens).

How the cache tree maps to llama.cpp's KV cache (one unified cache, ``kv_unified``):

* every cache slot is one KV cell, at the slot's position (parent position + 1);
* llama.cpp lets a token attend to the cells that share its FIRST sequence id and whose position is
  not larger than its own. A *sequence* here is therefore one root-to-node path of the tree: the
  committed chain plus the tree nodes down to the sequence's *tip*. A cell belongs to every
  sequence whose path runs through it; sequence 0 always holds the committed chain;
* a new node whose parent is the tip of some sequence extends that sequence (no copy). Otherwise
  it opens a new sequence: the parent's path up to its deepest *cached* node Q is copied with
  ``llama_memory_seq_cp(src, new, 0, pos(Q) + 1)`` (only cell metadata changes, no tensor copy) and
  the nodes of the same call between Q and the parent get the new id as an extra sequence id;
* ``crop`` cuts every sequence back to its deepest kept node (``seq_rm`` over a position range) and
  frees duplicate sequences; ``keep_path`` keeps one sequence through the path's end, cut at the
  end's position (``seq_rm`` + ``seq_keep``), and renames it to sequence 0. A kept path already
  sits at positions 0..L-1, so later reads continue at position L.

Numerics. With f32 weights and the defaults here (f32 K/V, no flash attention) a token's logits
are the same (~1e-5) whether it is read alone, in a batch or in a tree. llama.cpp's CPU kernels
are not batch-invariant otherwise: with f16 weights one-row matmuls round activations to f16
(~4e-3 logit differences between k = 1 and k >= 2 reads on the tiny test model), and with
quantized weights (Qwen2.5-Coder-1.5B Q4_K_M) the one-row, small-batch and large-batch kernels
differ by up to ~0.6 in the logits (median ~0.4 per row), flipping the arg-max at ~0-1.3 % of
positions of real code (near-ties). These are llama.cpp's own numbers: llama-cpp-python's ``Llama``
returns bit-identical logits for the same batch shapes. The verify pass is lossless relative to
the logits llama.cpp computes for that batch; greedy outputs can differ from one-token greedy
decoding at such near-ties.

Text in and out (the GGUF's own tokenizer and chat template) is :class:`LlamaCppTokenizer`, in
``models/llamacpp_tokenizer.py``; a model carries one as ``model.tokenizer`` (unless built with
``seed_tokenizer=False``).

Requires ``pip install 'specbound[llamacpp]'`` (llama-cpp-python, built from source on first install).
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
from .llamacpp_tokenizer import LlamaCppTokenizer

__all__ = ["LlamaCppModel", "LlamaCppTokenizer", "available_threads", "gguf_sha256", "load_llama_cpp"]

INITIAL_SEQUENCES = 16     # llama.cpp sequences a context opens with (a chain needs one; trees grow it)


# How a DRAFT's context is opened (``load_gguf_model(role="draft")``): a draft only proposes, so its
# K/V precision and kernels never change the output law, only how often it is right. f16 K/V halves
# its cache; 64-token batches size llama.cpp's output and compute buffers for 64 rows of logits instead
# of 256 (~0.2 GB less for a 152k vocabulary; prompts are read 64 tokens per decode); reading the file
# instead of mapping it keeps the repacked tensors' file pages out of memory. Measured on the 0.5B
# q4_0 draft: 834 -> ~490 MB resident after load, draft forwards as fast (docs/results/RESULTS.md).
DRAFT_CONTEXT = {"n_batch": 64, "kv_cache_type": "f16", "load": "read"}


class _OutOfSequences(Exception):
    """A read needs a sequence id and every one opened so far is in use."""


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


class LlamaCppModel(SlotCacheModel):
    """A GGUF model behind the :class:`LanguageModel` protocol, with tree forwards.

    Args:
        path: the ``.gguf`` file.
        n_ctx: KV cells (= maximum cache slots: committed tokens + tree nodes); default: the model's
            training context, capped at 4096.
        n_threads: threads for decoding; default: the cores available to this process.
        n_batch: most tokens per ``llama_decode`` (longer reads are split; each token returns logits).
        max_sequences: most tree sequences (≈ leaves of the cached tree + 1); default and maximum: llama.cpp's
            limit (``llama_max_parallel_sequences``, 256 in 0.3.36). The context opens with
            ``INITIAL_SEQUENCES`` of them (llama.cpp sizes its output and compute buffers for
            max(n_batch, sequences) rows of logits: 256 sequences hold ~0.3 GB for a 152k vocabulary)
            and doubles them when a tree needs more (:meth:`_grow_sequences`: the state is copied, the
            logits do not change); a batch's rows (:meth:`fork_rows`) get their share at once.
        flash_attn: True / False (default) / None (= llama.cpp's choice, "auto": on for CPU).
        kv_cache_type: "f32" (default) / "f16" / None (= llama.cpp's default, f16).
            The defaults make numerics batch-independent: logits of a token read alone or inside a
            batch or tree agree to ~1e-5. llama.cpp's own defaults (f16 K/V, CPU flash attention)
            round K/V or Q to half precision, which turns last-bit differences between the one-token
            and the batched matmul kernels into ~1e-3 logit noise (rare argmax flips at near-ties).
        repack: let llama.cpp repack quantized weights into its interleaved CPU layout (default, as
            llama.cpp does); False keeps the file's layout (other kernels, other rounding).
        identity: "sha256" (hash the file, default), None, or a string to use as is.
        name: for reports; default: the file name.
        load: "mmap" (default, as llama.cpp: the file is mapped) or "read" (the file is read into
            llama.cpp's buffers: with repacked weights the mapped pages of the repacked tensors would
            otherwise stay resident beside their repacked copy — ~0.26 GB for the 0.5B q4_0 draft).
    """

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
        self._model = self._ctx = None
        self._batch = None

        start = time.perf_counter()
        lib.llama_backend_init()
        mark = len(_LOG_TAIL)
        mparams = lib.llama_model_default_params()
        mparams.use_extra_bufts = bool(repack)       # CPU_REPACK: interleaved weights for faster matmuls
        if load == "read":
            mparams.load_mode = lib.LLAMA_LOAD_MODE_NONE
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise SpecboundError(f"llama.cpp could not load {str(path)!r}{_recent_errors(mark)}")
        if lib.llama_model_is_recurrent(self._model) or lib.llama_model_is_hybrid(self._model):
            raise SpecboundError(f"{self.name}: recurrent/hybrid models cannot roll back their state per token; "
                                 "the llama.cpp backend supports attention-only models")
        if lib.llama_model_has_encoder(self._model):
            raise SpecboundError(f"{self.name}: encoder-decoder models are not supported")
        train_ctx = int(lib.llama_model_n_ctx_train(self._model))
        self.n_ctx = n_ctx or min(train_ctx, 4096)
        self.n_batch = min(self.n_batch, self.n_ctx)      # llama.cpp clamps it the same way

        cparams = lib.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        self._sequences = min(self.max_sequences, INITIAL_SEQUENCES)     # opened so far (grows on demand)
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
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
        self._cparams = self._params_with(self._sequences, cparams)
        self._users = [1]                  # contexts (this model and its rows) that use the weights
        self._open_context()
        # llama.cpp rounds the cell count up (to a multiple of 256); the limit we enforce stays n_ctx
        self.n_ctx = min(self.n_ctx, int(lib.llama_n_ctx(self._ctx)))
        self.n_batch = min(self.n_batch, int(lib.llama_n_batch(self._ctx)))
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(self._vocab))

        ftype = lib.llama_ftype_name(lib.llama_model_ftype(self._model))
        ftype = ftype.decode() if ftype else str(int(lib.llama_model_ftype(self._model)))
        kv = {None: ", K/V llama.cpp default", "f16": ", K/V f16"}.get(kv_cache_type, "")
        if identity == "sha256":
            identity = gguf_sha256(path)
        self.info = ModelInfo(backend="llamacpp", kernels=f"gguf:{ftype}{kv}", identity=identity,
                              load_seconds=time.perf_counter() - start, max_positions=self.n_ctx)
        self.tokenizer = LlamaCppTokenizer(self) if seed_tokenizer else None
        self.decode_calls = 0
        self.scheduler = None          # a batch's pass scheduler while this model is one of its rows
        self.batch_priority = 1
        self.reset()

    # ------------------------------------------------------------------ lifetime
    def _params_with(self, sequences: int, cparams=None):
        """A copy of the context parameters (``cparams``, default this model's) for ``sequences`` llama.cpp
        sequences: every token of a batch returns logits, and llama.cpp also reserves one output per
        sequence, so the outputs are max(n_batch, sequences)."""
        source = self._cparams if cparams is None else cparams
        params = type(source).from_buffer_copy(source)
        params.n_seq_max = sequences
        params.n_outputs_max = max(self.n_batch, sequences)
        return params

    def _create_context(self) -> None:
        """Create the llama.cpp context (KV cells) and batch of ``self._cparams`` over the loaded weights."""
        lib = self._lib
        mark = len(_LOG_TAIL)
        self._ctx = lib.llama_init_from_model(self._model, self._cparams)
        if not self._ctx:
            self.close()
            raise SpecboundError(f"llama.cpp could not create a context for {self.name} "
                                 f"(n_ctx={self.n_ctx}, n_batch={self.n_batch}){_recent_errors(mark)}")
        self._mem = lib.llama_get_memory(self._ctx)
        self._batch = lib.llama_batch_init(self.n_batch, 0, int(self._cparams.n_seq_max))

    def _open_context(self) -> None:
        """A llama.cpp context of this model's parameters, used by this cache alone."""
        self._create_context()
        self._ctx_users = [1]              # objects (this model, rows) that read through this context
        self._siblings = [self]            # the caches on this context (a batch's rows): they grow together
        # this cache's sequence ids: _seq_base, _seq_base + _seq_stride, ... (_sequences of them); a batch's
        # rows interleave theirs, so opening more keeps every id in use valid
        self._seq_base, self._seq_stride = 0, 1

    def close(self) -> None:
        """Free the llama.cpp context and batch, and the weights once no row uses them (also done when
        the object is collected)."""
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if getattr(self, "_ctx", None):
            users = getattr(self, "_ctx_users", [1])
            users[0] -= 1
            if users[0] <= 0:              # the last row of a shared context frees it
                if getattr(self, "_batch", None) is not None:
                    lib.llama_batch_free(self._batch)
                lib.llama_free(self._ctx)
            self._ctx = None
            self._batch = None
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
        if not getattr(self, "_ctx", None):
            raise SpecboundError(f"{self.name} is closed")

    # ------------------------------------------------------------------ rows of a batch
    def fork(self) -> "LlamaCppModel":
        """A new row with a llama.cpp context of its own (its KV cells, empty) over the SAME loaded
        weights (nothing is copied or loaded again). Rows of different contexts cannot share a pass:
        a batch forks its rows with :meth:`fork_rows` instead."""
        self._alive()
        row = copy.copy(self)
        row._ctx = row._batch = None
        row._users[0] += 1
        row._sequences = min(self.max_sequences, INITIAL_SEQUENCES)
        row._cparams = self._params_with(row._sequences)
        row._open_context()
        row.decode_calls = 0
        row.scheduler = None
        row.batch_priority = 1
        row.reset()
        return row

    def fork_rows(self, n: int) -> list["LlamaCppModel"]:
        """``n`` rows of a batch in ONE new llama.cpp context over the same loaded weights: each row a
        cache of its own — its own range of sequence ids (llama.cpp's limit split evenly) in the
        context's unified KV pool of ``n · n_ctx`` cells — so a scheduled pass over several rows is ONE
        ``llama_decode`` over all their tokens (:func:`_read_rows`; ``rows_share_passes``). A row's
        tokens attend only to its own sequences, so its logits are those it would get alone up to the
        kernels' batch invariance (f32 weights: ~1e-5; quantized weights: llama.cpp's one-row and
        multi-row kernels differ, as for a tree read — see the module's numerics). Row r's sequence ids
        are r, r + n, r + 2n, …: ``INITIAL_SEQUENCES`` split among the rows at first (at least one
        each), all rows' doubled together when one row's tree needs more, up to llama.cpp's limit split
        evenly (``max_sequences`` of each row)."""
        self._alive()
        n = positive_int(n, "n")
        per_row = min(self.max_sequences, int(self._lib.llama_max_parallel_sequences()) // n)
        if per_row < 1:
            raise SpecboundError(f"{self.name}: a batch of {n} rows needs a llama.cpp sequence per row; llama.cpp "
                                 f"allows {int(self._lib.llama_max_parallel_sequences())}")
        opened = min(per_row, max(1, INITIAL_SEQUENCES // n))
        first = copy.copy(self)
        first._ctx = first._batch = None
        first._cparams = self._params_with(n * opened)
        first._cparams.n_ctx = n * self.n_ctx
        first._users[0] += 1
        first._open_context()
        rows = first._siblings
        for r in range(n):
            row = first if r == 0 else copy.copy(first)
            if r:
                row._users[0] += 1
                row._ctx_users[0] += 1
                rows.append(row)
            row._seq_base, row._seq_stride = r, n
            row.max_sequences, row._sequences = per_row, opened
            row.decode_calls = 0
            row.scheduler = None
            row.batch_priority = 1
            row.reset()
        return list(rows)

    rows_share_passes = True

    # ------------------------------------------------------------------ cache bookkeeping
    def reset(self) -> None:
        self._alive()
        if self._ctx_users[0] == 1:
            self._lib.llama_memory_clear(self._mem, False)
        else:                                   # a row of a shared context: only its own sequences
            for s in self._own_sequences():
                self._lib.llama_memory_seq_rm(self._mem, s, -1, -1)
        self.slots = CacheTree(self.name)
        self._slot_seqs: list[list[int]] = []   # per tree slot: sequences through it (first = for attention)
        self._tips: dict[int, int] = {self._seq_base: -1}   # sequence -> deepest slot of its path (-1: empty)

    @property
    def max_tree_nodes(self) -> int:
        """Tree nodes a read may leave cached: every leaf holds a sequence, the chain one more."""
        return self.max_sequences - 1

    def _own_sequences(self) -> range:
        """The llama.cpp sequence ids of this cache (all of the context's unless it is a batch's row)."""
        return range(self._seq_base, self._seq_base + self._seq_stride * self._sequences, self._seq_stride)

    def _primary(self, slot: int) -> int:
        """A sequence through ``slot`` (cached): its cells at positions <= pos(slot) are slot's path."""
        chain = self.slots.chain
        return self._seq_base if slot < chain else self._slot_seqs[slot - chain][0]

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

    def _plan(self, parents: list[int]):
        """Sequence ids of each new node (attention sequence first), sequences to copy before the
        decode, and the tips afterwards. Nothing in llama.cpp changes here."""
        base = self.slots.length
        tips = dict(self._tips)
        tip_owner = {}
        for s, t in sorted(tips.items(), reverse=True):
            tip_owner[t] = s                                       # prefer the smallest id per tip
        free = sorted(set(self._own_sequences()) - set(tips))
        node_seqs: list[list[int]] = []
        copies: list[tuple[int, int, int]] = []                    # (source, new sequence, end position)
        positions: list[int] = []
        for i, p in enumerate(parents):
            slot = base + i
            pos = 0 if p < 0 else (positions[p - base] if p >= base else self.slots.position(p)) + 1
            s = tip_owner.pop(p, None)
            if s is None:
                if not free:
                    raise _OutOfSequences
                s = free.pop(0)
                a = p
                while a >= base:                                  # nodes of this call on the parent's path
                    node_seqs[a - base].append(s)
                    a = parents[a - base]
                # a is now the deepest cached node of the path (or -1 on an empty cache)
                if a >= 0:
                    copies.append((self._primary(a), s, self.slots.position(a) + 1))
            tips[s] = slot
            tip_owner[slot] = s
            node_seqs.append([s])
            positions.append(pos)
        return node_seqs, copies, positions, tips

    def _read(self, toks: list[int], parents: list[int], extend_chain: bool,
              keep_logits: int | None = None) -> torch.Tensor:
        read = _RowRead(self, toks, parents, extend_chain, keep_logits)
        if self.scheduler is not None:
            return self.scheduler.submit(_read_rows, read, group=id(self._ctx_users), priority=self.batch_priority)
        return _read_rows([read])[0]

    def _prepare(self, read: "_RowRead") -> "_Plan":
        """Check and plan one read, and copy the sequences it opens (undone by :meth:`_undo`)."""
        self._alive()
        toks = read.toks
        n = len(toks)
        if self.slots.length + n > self.n_ctx:
            raise SpecboundError(
                f"{self.name}: context full: {self.slots.length} cached + {n} new tokens exceed n_ctx={self.n_ctx}; "
                f"create the model with a larger n_ctx (the model was trained for "
                f"{int(self._lib.llama_model_n_ctx_train(self._model))})"
            )
        while True:
            try:
                node_seqs, copies, positions, tips = self._plan(read.parents)
                break
            except _OutOfSequences:
                if not self._can_grow():
                    raise SpecboundError(
                        f"{self.name}: the tree needs more than max_sequences={self.max_sequences} llama.cpp "
                        f"sequences (about one per leaf); create the model with a larger max_sequences "
                        f"(a batch's rows split llama.cpp's {int(self._lib.llama_max_parallel_sequences())})"
                    ) from None
                self._grow_sequences()
        plan = _Plan(read, toks, node_seqs, copies, positions, tips,
                     first_out=max(0, n - read.keep_logits) if read.keep_logits else 0)   # only the last rows' logits
        for src, dst, end in copies:
            self._lib.llama_memory_seq_cp(self._mem, src, dst, 0, end)
        return plan

    def _can_grow(self) -> bool:
        """More sequences can be opened: this cache has not reached max_sequences."""
        return self._sequences < self.max_sequences

    def _grow_sequences(self) -> None:
        """Reopen the context with twice the sequences per cache (at most ``max_sequences``), its state
        (KV cells with their sequence ids, last outputs) copied across, for every cache on it (a batch's
        rows, whose interleaved ids stay valid): later logits are unchanged."""
        lib = self._lib
        size = int(lib.llama_state_get_size(self._ctx))
        state = (ctypes.c_uint8 * size)()
        written = int(lib.llama_state_get_data(self._ctx, state, size))
        count = min(self.max_sequences, 2 * self._sequences)
        cparams = self._params_with(self._seq_stride * count)
        live = [c for c in self._siblings if c._ctx is not None]
        lib.llama_batch_free(self._batch)
        lib.llama_free(self._ctx)                 # before the new one: the two never coexist in memory
        for c in live:
            c._ctx = c._batch = None
        self._cparams = cparams
        self._create_context()
        if int(lib.llama_state_set_data(self._ctx, state, written)) != written:
            self.close()
            raise SpecboundError(f"{self.name}: llama.cpp could not restore its cache after opening more sequences")
        for c in live:
            c._ctx, c._mem, c._batch, c._cparams, c._sequences = self._ctx, self._mem, self._batch, cparams, count

    def _decode(self, plans: list["_Plan"]) -> list[np.ndarray]:
        """Every planned read of this context in one ``llama_decode`` (split at ``n_batch`` tokens);
        the logits each read asked for, in its order."""
        lib = self._lib
        entries = [(j, i) for j, p in enumerate(plans) for i in range(len(p.toks))]
        outs = [np.empty((len(p.toks) - p.first_out, self.vocab_size), dtype=np.float32) for p in plans]
        for done in range(0, len(entries), self.n_batch):
            chunk = entries[done:done + self.n_batch]
            batch = self._batch
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
            rc = lib.llama_decode(self._ctx, batch)
            self.decode_calls += 1
            if rc != 0:
                reason = {1: "no free KV cells for the batch", 2: "aborted", -1: "invalid batch"}.get(
                    rc, "fatal error")
                raise SpecboundError(f"{self.name}: llama_decode failed ({rc}: {reason}){_recent_errors(mark)}")
            if wanted:
                logits = np.ctypeslib.as_array(lib.llama_get_logits(self._ctx), shape=(len(wanted), self.vocab_size))
                for r, (j, i) in enumerate(wanted):
                    outs[j][i] = logits[r]
        return outs

    def _commit(self, plan: "_Plan") -> None:
        self.slots.append(plan.read.parents, extend_chain=plan.read.extend_chain)
        if not plan.read.extend_chain:
            self._slot_seqs.extend(plan.node_seqs)
        self._tips = plan.tips

    def _undo(self, plan: "_Plan") -> None:
        """Remove every cell a failed read may have added (new sequences, extensions of old ones)."""
        lib, mem = self._lib, self._mem
        new = {dst for _, dst, _ in plan.copies} | ({s for seqs in plan.node_seqs for s in seqs} - set(self._tips))
        for s in new:
            lib.llama_memory_seq_rm(mem, s, -1, -1)
        for s, tip in self._tips.items():
            lib.llama_memory_seq_rm(mem, s, (self.slots.position(tip) + 1) if tip >= 0 else 0, -1)

    # ------------------------------------------------------------------ rollback
    def _collapse_to_chain(self, length: int) -> None:
        """Keep only the committed slots 0..length-1, in this cache's first sequence (every sequence
        holding cells is one of ``_tips``; other rows' sequences are left alone)."""
        lib, mem, base = self._lib, self._mem, self._seq_base
        for s in self._tips:
            lib.llama_memory_seq_rm(mem, s, length if s == base else -1, -1)
        self._slot_seqs = []
        self._tips = {base: length - 1}

    def crop(self, length: int) -> None:
        self._alive()
        old_chain = self.slots.chain
        tree_before = (list(self.slots.parents), list(self.slots.positions))
        length = self.slots.crop(length)             # validates; raises before anything changes
        if length <= old_chain:
            self._collapse_to_chain(length)
            return
        parents, positions = tree_before
        lib, mem = self._lib, self._mem

        def parent(slot):
            return slot - 1 if slot < old_chain else parents[slot - old_chain]

        def position(slot):
            return slot if slot < old_chain else positions[slot - old_chain]

        tips = {}
        for s, tip in self._tips.items():
            kept = tip
            while kept >= length:
                kept = parent(kept)
            if kept != tip:
                lib.llama_memory_seq_rm(mem, s, position(kept) + 1, -1)
            tips[s] = kept
        owner: dict[int, int] = {}
        for s in sorted(tips):                        # one sequence per distinct tip (0 first)
            if tips[s] in owner:
                lib.llama_memory_seq_rm(mem, s, -1, -1)
            else:
                owner[tips[s]] = s
        live = set(owner.values())
        self._tips = {s: t for t, s in owner.items()}
        self._slot_seqs = [[s for s in seqs if s in live] for seqs in self._slot_seqs[:length - old_chain]]

    def keep_path(self, base_length: int, path) -> None:
        self._alive()
        old_chain = self.slots.chain
        path = [int(s) for s in path]
        end = path[-1] if path else int(base_length) - 1
        end_pos = self.slots.position(end) if 0 <= end < self.slots.length else None
        end_seq = self._primary(end) if end >= old_chain and end_pos is not None else self._seq_base
        kept = self.slots.keep_path(base_length, path)   # validates; raises before anything changes
        length = len(kept)
        if end < old_chain:
            self._collapse_to_chain(length)
            return
        lib, mem = self._lib, self._mem
        assert end_pos == length - 1, "a kept path must end at position length - 1"
        base = self._seq_base
        lib.llama_memory_seq_rm(mem, end_seq, end_pos + 1, -1)
        for s in self._tips:                          # every other sequence of this cache
            if s != end_seq:
                lib.llama_memory_seq_rm(mem, s, -1, -1)
        if end_seq != base:
            lib.llama_memory_seq_cp(mem, end_seq, base, -1, -1)
            lib.llama_memory_seq_rm(mem, end_seq, -1, -1)
        self._slot_seqs = []
        self._tips = {base: length - 1}

    # ------------------------------------------------------------------ diagnostics
    def kv_sequence_ranges(self) -> dict[int, tuple[int, int]]:
        """(min, max) cached position of every llama.cpp sequence that holds cells (tests, debugging)."""
        lib, mem = self._lib, self._mem
        ranges = {}
        for s in self._own_sequences():
            hi = int(lib.llama_memory_seq_pos_max(mem, s))
            if hi >= 0:
                ranges[s] = (int(lib.llama_memory_seq_pos_min(mem, s)), hi)
        return ranges

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
    """A read checked and planned by its row (:meth:`LlamaCppModel._prepare`): its tokens, each token's
    sequence ids (attention sequence first) and position, the sequence copies made for it, the row's
    tips afterwards, and the first token whose logits are returned."""

    read: _RowRead
    toks: list
    node_seqs: list
    copies: list
    positions: list
    tips: dict
    first_out: int


def _read_rows(reads: list[_RowRead]) -> list[torch.Tensor]:
    """The reads of one scheduled pass: the reads of rows of one context (:meth:`LlamaCppModel.fork_rows`)
    as ONE ``llama_decode`` over all their tokens, each context's after another's. A read that cannot
    be planned, or a failed decode, leaves every row's cache as it was."""
    contexts: dict[int, list[int]] = {}
    for j, r in enumerate(reads):
        contexts.setdefault(id(r.model._ctx_users), []).append(j)
    results: list = [None] * len(reads)
    for members in contexts.values():
        plans = []
        try:
            for j in members:
                plans.append(reads[j].model._prepare(reads[j]))
            outs = reads[members[0]].model._decode(plans)
        except BaseException:
            for plan in plans:
                plan.read.model._undo(plan)
            raise
        for j, plan, out in zip(members, plans, outs):
            plan.read.model._commit(plan)
            results[j] = torch.from_numpy(out).unsqueeze(0)
    return results
