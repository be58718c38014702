"""llama.cpp backend on tiny GGUF models built in code (tests/gguf_tiny.py; nothing is downloaded).

* errors: missing / invalid GGUF (llama_cpp missing: test_llamacpp_missing.py), full context, too many tree sequences;
* numerics: batched logits (a chain of k tokens in one decode, tree forwards) equal one-token reads;
* the tree protocol, checked backend-generically against fresh caches: one forward_tree, trees grown
  over several calls under cached nodes, keep_path of deep branches, crop and re-read, and a random
  walk mixing all of them;
* greedy speculative decoding is token-identical to greedy decoding with llama.cpp (and to
  llama.cpp's own ``Llama.generate``); a χ² test of the first two sampled tokens (T = 1, top-k = 4).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import chi_square_pvalue, encode
from specbound.decoding import SamplingConfig, logits_to_probs, speculative_decode
from specbound.errors import ModelNotAvailable, SpecboundError

pytestmark = pytest.mark.llamacpp          # needs the compiled llama-cpp-python binding
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

from gguf_tiny import write_tiny_llama_gguf  # noqa: E402
from specbound.models.llamacpp import LlamaCppModel  # noqa: E402


def make(path, **kwargs):
    """A model on ONE thread: the tiny model decodes in ~0.2 ms, while two OpenMP threads on a shared
    2-core machine wait on each other (~8 ms per decode under load)."""
    kwargs.setdefault("n_threads", 1)
    return LlamaCppModel(path, **kwargs)


ATOL = 1e-4     # exact mode (the default: f32 K/V, no flash attention): one-token vs batched reads differ ~1e-5


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {
        "target": write_tiny_llama_gguf(root / "target.gguf", seed=0),
        "draft": write_tiny_llama_gguf(root / "draft.gguf", seed=0, noise=0.1, noise_seed=7),
        "f16": write_tiny_llama_gguf(root / "target-f16.gguf", seed=0, file_type="f16"),
    }


@pytest.fixture(scope="module")
def target(paths):
    return make(paths["target"], n_ctx=512, name="tiny-target")


@pytest.fixture(scope="module")
def reference(paths):
    """A second instance of the target: fresh-cache reads to compare with."""
    return make(paths["target"], n_ctx=512, name="tiny-reference", identity=None)


@pytest.fixture(scope="module")
def draft(paths):
    return make(paths["draft"], n_ctx=512, name="tiny-draft", identity=None)


# --------------------------------------------------------------------------- backend-generic checks
# These take any LanguageModel with tree support and a ``fresh(tokens) -> logits [n, V]`` that reads
# ``tokens`` from an empty cache; every tree-node logit must equal the fresh read of its branch.

def fresh_reader(model):
    def fresh(tokens):
        model.reset()
        return model.forward(torch.tensor([list(tokens)]))[0]
    return fresh


def branch_tokens(history: list[int], parents_of: dict[int, int], slot: int) -> list[int]:
    """Tokens on the path to ``slot`` in a cache whose slot tokens are ``history``."""
    path = []
    while slot >= 0:
        path.append(history[slot])
        slot = parents_of[slot]
    return path[::-1]


class Mirror:
    """Slot tokens and parents of a model's cache, tracked on the test side."""

    def __init__(self, prefix):
        self.tokens = list(prefix)
        self.parents = {i: i - 1 for i in range(len(prefix))}
        self.chain = len(prefix)

    def add(self, tokens, parents):
        for tok, p in zip(tokens, parents):
            self.parents[len(self.tokens)] = p
            self.tokens.append(tok)

    def path(self, slot):
        return branch_tokens(self.tokens, self.parents, slot)

    def crop(self, length):
        self.tokens = self.tokens[:length]
        self.parents = {s: p for s, p in self.parents.items() if s < length}
        self.chain = min(self.chain, length)

    def keep(self, base, path):
        kept = list(range(base)) + list(path)
        self.tokens = [self.tokens[s] for s in kept]
        self.parents = {i: i - 1 for i in range(len(kept))}
        self.chain = len(kept)


def assert_nodes_match_fresh(fresh, mirror: Mirror, first_slot: int, logits, atol=ATOL):
    for j in range(logits.shape[1]):
        expected = fresh(mirror.path(first_slot + j))[-1]
        torch.testing.assert_close(logits[0, j], expected, atol=atol, rtol=1e-4,
                                   msg=lambda m, j=j: f"tree node {j} (slot {first_slot + j}): {m}")


def check_one_tree_call(model, fresh, prefix, tree_tokens, rel_parents):
    """One forward_tree of a whole tree (parents relative: -1 = last committed token)."""
    model.reset()
    model.forward(torch.tensor([prefix]))
    base = model.cache_length
    parents = [base - 1 if p < 0 else base + p for p in rel_parents]
    logits = model.forward_tree(torch.tensor([tree_tokens]), parents)
    assert logits.shape == (1, len(tree_tokens), model.vocab_size) and logits.dtype == torch.float32
    assert model.cache_length == base + len(tree_tokens) and model.committed_length == base
    mirror = Mirror(prefix)
    mirror.add(tree_tokens, parents)
    assert_nodes_match_fresh(fresh, mirror, base, logits)


def check_tree_grown_level_by_level(model, fresh, prefix, gen: np.random.Generator, levels=4, width=3):
    """Grow a tree one call per level, attaching each new node under a random cached node of the
    previous level (or the last committed token); every call's logits equal fresh branch reads."""
    model.reset()
    model.forward(torch.tensor([prefix]))
    mirror = Mirror(prefix)
    frontier = [model.cache_length - 1]
    for _ in range(levels):
        parents = [int(gen.choice(frontier)) for _ in range(width)]
        tokens = gen.integers(0, model.vocab_size, size=width).tolist()
        first = model.cache_length
        logits = model.forward_tree(torch.tensor([tokens]), parents)
        mirror.add(tokens, parents)
        assert_nodes_match_fresh(fresh, mirror, first, logits)
        frontier = list(range(first, first + width))
    return mirror


# --------------------------------------------------------------------------- errors and info

def test_missing_and_invalid_gguf(tmp_path):
    with pytest.raises(ModelNotAvailable, match="does not exist"):
        make(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotAvailable, match="not a file"):
        make(tmp_path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(SpecboundError, match="not a GGUF file"):
        make(bad)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 7)
    with pytest.raises(SpecboundError, match="could not load"):
        make(truncated)


def test_info_tokenizer_and_argument_checks(paths, target):
    import hashlib

    info = target.info
    assert info.backend == "llamacpp" and info.kernels == "gguf:all F32" and info.max_positions == 512
    assert info.identity == hashlib.sha256(paths["target"].read_bytes()).hexdigest()
    assert target.vocab_size == 3 + 256 + 31 + 14 and target.supports_trees
    f16 = make(paths["f16"], n_ctx=64, identity=None)
    assert f16.info.kernels == "gguf:MOSTLY_F16" or "F16" in f16.info.kernels
    assert f16.info.identity is None

    tok = target.tokenizer
    ids = tok.encode("the cat is in the hat.")
    assert ids[0] == tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert tok.decode(ids, skip_special_tokens=True).strip() == "the cat is in the hat."
    assert tok("the cat", return_tensors="pt").input_ids.shape == (1, len(tok.encode("the cat")))
    assert tok("the cat", add_special_tokens=False).input_ids == tok.encode("the cat")[1:]
    assert tok.decode(tok.encode("Ünïcode ✓", add_special_tokens=False)) == " Ünïcode ✓" or \
        tok.decode(tok.encode("Ünïcode ✓", add_special_tokens=False)).strip() == "Ünïcode ✓"
    vocab = tok.get_vocab()
    assert vocab["<0x41>"] == 3 + 0x41 and len(vocab) == target.vocab_size

    for bad in (dict(n_batch=0), dict(max_sequences=0), dict(max_sequences=10_000), dict(n_threads=-1),
                dict(load="disk")):
        with pytest.raises(SpecboundError):
            make(paths["target"], n_ctx=64, identity=None, **bad)
    with pytest.raises(SpecboundError, match="token ids outside"):
        target.forward(torch.tensor([[target.vocab_size]]))
    with pytest.raises(SpecboundError, match=r"expected tokens \[1, k\]"):
        target.forward(torch.tensor([[1, 2], [3, 4]]))


def test_context_limit_is_enforced(paths):
    model = make(paths["target"], n_ctx=32, identity=None)
    model.forward(torch.arange(3, 33).unsqueeze(0))           # 30 tokens
    with pytest.raises(SpecboundError, match="context full.*n_ctx=32"):
        model.forward_tree(torch.tensor([[5, 6, 7]]), [29, 29, 29])
    assert model.cache_length == 30
    model.forward_tree(torch.tensor([[5, 6]]), [29, 29])       # exactly full is fine
    assert model.cache_length == 32


# --------------------------------------------------------------------------- numerics

def test_batched_logits_equal_one_token_reads(paths, target):
    gen = np.random.default_rng(0)
    tokens = gen.integers(3, target.vocab_size, size=40).tolist()
    target.reset()
    single = torch.cat([target.forward(torch.tensor([[t]]))[0] for t in tokens])
    for k in (2, 5, 16, 40):
        target.reset()
        chunks = [target.forward(torch.tensor([tokens[i:i + k]]))[0] for i in range(0, len(tokens), k)]
        batched = torch.cat(chunks)
        torch.testing.assert_close(batched, single, atol=ATOL, rtol=1e-4)
        assert torch.equal(batched.argmax(-1), single.argmax(-1))
    # the same through a small n_batch: one forward split over several llama_decode calls
    small = make(paths["target"], n_ctx=128, n_batch=7, identity=None)
    calls = small.decode_calls
    split = small.forward(torch.tensor([tokens]))[0]
    assert small.decode_calls - calls == 6
    torch.testing.assert_close(split, single, atol=ATOL, rtol=1e-4)


def test_llama_cpp_default_numerics_are_close_but_not_exact(paths):
    """With llama.cpp's own defaults (f16 K/V cache, flash attention "auto"), a token read alone and
    inside a batch differ by up to ~1e-3 in the logits (half-precision rounding of K/V or Q), in a
    few rows only; the arg-max agrees unless two logits are that close."""
    model = make(paths["target"], n_ctx=256, flash_attn=None, kv_cache_type=None, identity=None)
    tokens = np.random.default_rng(0).integers(3, model.vocab_size, size=40).tolist()
    single = torch.cat([model.forward(torch.tensor([[t]]))[0] for t in tokens])
    model.reset()
    batched = model.forward(torch.tensor([tokens]))[0]
    diff = (batched - single).abs().max(-1).values
    assert float(diff.max()) < 1e-2
    top2 = single.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2e-2
    assert torch.equal(batched.argmax(-1)[clear], single.argmax(-1)[clear])
    # f16 weights, even in exact mode: llama.cpp multiplies ONE row with a different kernel (activations
    # rounded to f16) than several rows, so k = 1 reads differ by ~4e-3 while all k >= 2 reads agree
    f16 = make(paths["f16"], n_ctx=256, identity=None)
    single = torch.cat([f16.forward(torch.tensor([[t]]))[0] for t in tokens])
    f16.reset()
    whole = f16.forward(torch.tensor([tokens]))[0]
    f16.reset()
    by_four = torch.cat([f16.forward(torch.tensor([tokens[i:i + 4]]))[0] for i in range(0, len(tokens), 4)])
    torch.testing.assert_close(by_four, whole, atol=ATOL, rtol=1e-4)
    assert 1e-4 < float((whole - single).abs().max()) < 2e-2
    # repack=False (no CPU_REPACK buffers) changes nothing for f32/f16 weights
    plain = make(paths["f16"], n_ctx=256, identity=None, repack=False)
    torch.testing.assert_close(plain.forward(torch.tensor([tokens]))[0], whole, atol=ATOL, rtol=1e-4)


# --------------------------------------------------------------------------- tree protocol

def test_one_forward_tree_equals_fresh_branches(target, reference):
    fresh = fresh_reader(reference)
    prefix = [1, 40, 80, 120, 160]
    #            0    1    2    3    4    5    6    7
    tree = [290, 291, 292, 293, 294, 295, 296, 297]
    rel = [-1, -1, 0, 0, 2, 1, 4, 4]          # two roots, node 0 has two children, 4 has two children
    check_one_tree_call(target, fresh, prefix, tree, rel)
    # a chain passed as a tree, and a single node, and siblings with identical tokens
    check_one_tree_call(target, fresh, prefix, [7, 8, 9], [-1, 0, 1])
    check_one_tree_call(target, fresh, prefix, [7], [-1])
    check_one_tree_call(target, fresh, prefix, [9, 9, 9, 9], [-1, -1, 0, 1])


def test_tree_grown_over_several_calls(target, reference):
    fresh = fresh_reader(reference)
    gen = np.random.default_rng(1)
    for trial in range(3):
        check_tree_grown_level_by_level(target, fresh, [1, 5, 9, 13 + trial], gen, levels=4, width=3)
    # attach under ANY cached node, not only the last level: a node of level 1 gets a new child later
    target.reset()
    target.forward(torch.tensor([[1, 2, 3]]))
    mirror = Mirror([1, 2, 3])
    first = target.forward_tree(torch.tensor([[10, 11]]), [2, 2])             # slots 3, 4
    mirror.add([10, 11], [2, 2])
    second = target.forward_tree(torch.tensor([[12, 13]]), [3, 3])            # slots 5, 6 under slot 3
    mirror.add([12, 13], [3, 3])
    third = target.forward_tree(torch.tensor([[14, 15, 16]]), [3, 4, 2])      # under 3 again, 4, committed
    mirror.add([14, 15, 16], [3, 4, 2])
    for slot0, logits in ((3, first), (5, second), (7, third)):
        assert_nodes_match_fresh(fresh, mirror, slot0, logits)
    # a plain forward after a tree reads a chain under the LAST slot (slot 9, token 16)
    chained = target.forward(torch.tensor([[17, 18]]))
    mirror.add([17, 18], [9, 10])
    assert_nodes_match_fresh(fresh, mirror, 10, chained)


def test_keep_path_then_forward_continues_like_a_fresh_cache(target, reference):
    fresh = fresh_reader(reference)
    gen = np.random.default_rng(2)
    prefix = [1, 33, 66, 99]
    mirror = check_tree_grown_level_by_level(target, fresh, prefix, gen, levels=5, width=3)
    base = len(prefix)
    deepest = target.cache_length - 1
    path, slot = [], deepest
    while slot >= base:
        path.append(slot)
        slot = mirror.parents[slot]
    path = path[::-1]
    assert len(path) == 5                                   # a deep branch through all five calls
    target.keep_path(base, path)
    mirror.keep(base, path)
    assert target.cache_length == target.committed_length == base + 5
    assert target.kv_sequence_ranges() == {0: (0, base + 4)}
    nxt = target.forward(torch.tensor([[7, 8, 9]]))
    mirror.add([7, 8, 9], [base + 4, base + 5, base + 6])
    assert_nodes_match_fresh(fresh, mirror, base + 5, nxt)
    # keep_path whose base lies inside the committed chain (path = committed slots + tree slots)
    chain = target.cache_length
    logits = target.forward_tree(torch.tensor([[20, 21, 22]]), [chain - 1, chain - 1, chain])
    target.keep_path(chain - 2, [chain - 2, chain - 1, chain, chain + 2])
    mirror.add([20, 21, 22], [chain - 1, chain - 1, chain])
    expected = mirror.path(chain + 2)
    mirror.keep(chain - 2, [chain - 2, chain - 1, chain, chain + 2])
    assert mirror.tokens == expected and target.cache_length == len(expected)
    torch.testing.assert_close(target.forward(torch.tensor([[3]]))[0, -1], fresh(expected + [3])[-1],
                               atol=ATOL, rtol=1e-4)
    del logits
    # keep_path with an empty path = crop to base; and invalid paths are refused without damage
    with pytest.raises(SpecboundError, match="not a chain"):
        target.keep_path(2, [5])
    target.keep_path(3, [])
    assert target.cache_length == 3
    torch.testing.assert_close(target.forward(torch.tensor([[4]]))[0, -1],
                               fresh(expected[:3] + [4])[-1], atol=ATOL, rtol=1e-4)


def test_crop_then_reread_equals_fresh(target, reference):
    fresh = fresh_reader(reference)
    gen = np.random.default_rng(3)
    prefix = gen.integers(3, target.vocab_size, size=12).tolist()
    target.reset()
    full = target.forward(torch.tensor([prefix]))[0]
    torch.testing.assert_close(full, fresh(prefix), atol=ATOL, rtol=1e-4)
    target.crop(5)
    again = target.forward(torch.tensor([prefix[5:]]))[0]
    torch.testing.assert_close(again, full[5:], atol=ATOL, rtol=1e-4)
    # crop inside a tree: keep the first tree level, drop the rest, grow again from a kept node
    mirror = check_tree_grown_level_by_level(target, fresh, prefix, gen, levels=3, width=2)
    chain = len(prefix)
    target.crop(chain + 2)
    mirror.crop(chain + 2)
    assert target.cache_length == chain + 2 and target.committed_length == chain
    logits = target.forward_tree(torch.tensor([[50, 51, 52]]), [chain + 1, chain + 1, chain])
    mirror.add([50, 51, 52], [chain + 1, chain + 1, chain])
    assert_nodes_match_fresh(fresh, mirror, chain + 2, logits)
    # crop below the committed chain drops every tree slot
    target.crop(chain - 3)
    assert target.cache_length == target.committed_length == chain - 3
    assert target.kv_sequence_ranges() == {0: (0, chain - 4)}
    out = target.forward(torch.tensor([prefix[chain - 3:]]))[0]
    torch.testing.assert_close(out, full[chain - 3:], atol=ATOL, rtol=1e-4)
    target.crop(0)
    assert target.cache_length == 0
    with pytest.raises(SpecboundError, match="cannot crop"):
        target.crop(1)


def keep_random_path(model, mirror: Mirror, gen: np.random.Generator) -> None:
    """keep_path to a random cached slot, from a random base inside the committed chain (model and mirror)."""
    chain = model.committed_length
    end = int(gen.integers(max(0, chain - 1), model.cache_length))
    base = int(gen.integers(1, chain + 1)) if chain else 0
    path, slot = [], end
    while slot >= base:
        path.append(slot)
        slot = mirror.parents[slot]
    path = path[::-1]
    model.keep_path(base, path)
    mirror.keep(base, path)


@pytest.mark.parametrize("seed,n_batch", [(4, 256), (5, 3), (6, 256)])
def test_random_walk_of_tree_operations(paths, reference, seed, n_batch):
    """Random forwards, tree forwards (under random cached nodes), crops and keep_paths, 60 steps,
    each read checked against a fresh cache: catches any stale or missing KV cell. ``n_batch=3``
    splits most reads over several llama_decode calls."""
    fresh = fresh_reader(reference)
    target = make(paths["target"], n_ctx=512, n_batch=n_batch, identity=None)
    gen = np.random.default_rng(seed)
    target.reset()
    prefix = gen.integers(3, target.vocab_size, size=6).tolist()
    target.forward(torch.tensor([prefix]))
    mirror = Mirror(prefix)
    ops = dict(tree=0, forward=0, crop=0, keep=0)
    for step in range(60):
        op = gen.choice(["tree", "tree", "tree", "forward", "crop", "keep"])
        length, chain = target.cache_length, target.committed_length
        if length > 200:
            op = "keep"
        if op == "tree":
            n = int(gen.integers(1, 6))
            parents = []
            for i in range(n):
                choices = list(range(chain - 1, length + i))
                parents.append(int(gen.choice(choices)))
            tokens = gen.integers(3, target.vocab_size, size=n).tolist()
            logits = target.forward_tree(torch.tensor([tokens]), parents)
            mirror.add(tokens, parents)
            assert_nodes_match_fresh(fresh, mirror, length, logits)
        elif op == "forward":
            tokens = gen.integers(3, target.vocab_size, size=int(gen.integers(1, 4))).tolist()
            logits = target.forward(torch.tensor([tokens]))
            mirror.add(tokens, list(range(length - 1, length - 1 + len(tokens))))
            assert_nodes_match_fresh(fresh, mirror, length, logits)
        elif op == "crop":
            new = int(gen.integers(max(1, chain - 2), length + 1))
            target.crop(new)
            mirror.crop(new)
        else:
            keep_random_path(target, mirror, gen)
        assert target.cache_length == len(mirror.tokens), f"step {step} ({op})"
        ranges = target.kv_sequence_ranges()         # every llama.cpp sequence is a path from position 0
        assert all(lo == 0 and hi < target.cache_length for lo, hi in ranges.values()) and 0 in ranges
        ops[op] += 1
    assert min(ops.values()) >= 5, ops
    # finally the committed chain reads on exactly like a fresh cache
    target.keep_path(target.committed_length, [])
    mirror.crop(target.committed_length)
    out = target.forward(torch.tensor([[5]]))[0, -1]
    torch.testing.assert_close(out, fresh(mirror.tokens + [5])[-1], atol=ATOL, rtol=1e-4)


def test_too_many_sequences_is_a_clear_error_and_leaves_the_cache_intact(paths, reference):
    fresh = fresh_reader(reference)
    model = make(paths["target"], n_ctx=128, max_sequences=4, identity=None)
    model.forward(torch.tensor([[1, 2, 3]]))
    model.forward_tree(torch.tensor([[4, 5, 6, 7]]), [2, 2, 2, 2])            # 4 leaves = 4 sequences
    with pytest.raises(SpecboundError, match="max_sequences=4"):
        model.forward_tree(torch.tensor([[8]]), [2])                          # a fifth leaf
    assert model.cache_length == 7
    logits = model.forward_tree(torch.tensor([[9, 10]]), [3, 7])             # extends existing leaves
    torch.testing.assert_close(logits[0, 0], fresh([1, 2, 3, 4, 9])[-1], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(logits[0, 1], fresh([1, 2, 3, 4, 9, 10])[-1], atol=ATOL, rtol=1e-4)
    model.keep_path(3, [5])
    torch.testing.assert_close(model.forward(torch.tensor([[11]]))[0, -1], fresh([1, 2, 3, 6, 11])[-1],
                               atol=ATOL, rtol=1e-4)


def test_sequences_grow_on_demand_with_the_cache_intact(paths, reference, monkeypatch):
    """A context opens with few sequences (small logits buffers) and doubles them when a tree needs
    more; the copied state must read on exactly as a cache that had them all from the start."""
    import specbound.models.llamacpp as backend

    fresh = fresh_reader(reference)
    monkeypatch.setattr(backend, "INITIAL_SEQUENCES", 2)
    model = make(paths["target"], n_ctx=128, max_sequences=16, identity=None)
    assert model._sequences == 2
    model.forward(torch.tensor([[1, 2, 3]]))
    model.forward_tree(torch.tensor([[4, 5]]), [2, 2])                       # 2 leaves: all opened
    logits = model.forward_tree(torch.tensor([[6, 7, 8, 9, 10]]), [2, 2, 2, 3, 4])   # 3 more leaves
    assert model._sequences == 8                                             # 2 -> 4 -> 8
    for i, path in enumerate([[6], [7], [8], [4, 9], [5, 10]]):
        torch.testing.assert_close(logits[0, i], fresh([1, 2, 3] + path)[-1], atol=ATOL, rtol=1e-4)
    with pytest.raises(SpecboundError, match="max_sequences=16"):
        model.forward_tree(torch.tensor([list(range(11, 23))]), [2] * 12)    # 5 + 12 leaves > 16
    assert model._sequences == 16 and model.cache_length == 10               # the failed read left nothing
    model.keep_path(3, [3, 8])                                               # slots of tokens 4, 9
    torch.testing.assert_close(model.forward(torch.tensor([[11]]))[0, -1], fresh([1, 2, 3, 4, 9, 11])[-1],
                               atol=ATOL, rtol=1e-4)
    # the file read instead of mapped: the same weights, the same logits
    read = make(paths["target"], n_ctx=128, identity=None, load="read")
    torch.testing.assert_close(read.forward(torch.tensor([[1, 2, 3, 4, 9]]))[0, -1], fresh([1, 2, 3, 4, 9])[-1],
                               atol=ATOL, rtol=1e-4)


# --------------------------------------------------------------------------- decoding

def greedy_loop(model, prompt, n):
    model.reset()
    logits = model.forward(torch.tensor([prompt]))[0, -1]
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = model.forward(torch.tensor([[out[-1]]]))[0, -1]
    return out


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_greedy_speculative_decoding_is_token_identical(target, draft, gamma):
    accepted = 0
    for seed in range(3):
        prompt = [1] + np.random.default_rng(seed).integers(3, target.vocab_size, size=5).tolist()
        ref = greedy_loop(target, prompt, 40)
        out = speculative_decode(target, draft, prompt, 40, gamma=gamma, temperature=0.0, seed=seed)
        assert out.tokens == ref
        accepted += sum(out.metrics.accepted_per_step)
    assert accepted > 0                           # the draft agrees sometimes, so rollbacks are mixed in


def test_keep_logits_returns_the_last_rows_only(target):
    target.reset()
    full = target.forward(torch.tensor([[1, 5, 9, 13, 17]]))[0]
    target.reset()
    last = target.forward(torch.tensor([[1, 5, 9, 13, 17]]), keep_logits=2)[0]
    assert last.shape == (2, target.vocab_size) and target.cache_length == 5
    torch.testing.assert_close(last, full[-2:], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("drafting", [dict(tree=6), dict(tree=6, tree_drafter="sampled"), dict(tree="auto"),
                                      dict(drafts=3, gamma=3), dict(drafts=3, gamma=3, design="A"),
                                      dict(tree=5, tree_drafter="oracle")], ids=str)
def test_greedy_tree_and_batch_decoding_on_llama_cpp_are_token_identical(target, draft, drafting):
    # every drafter of the one engine on this backend: trees grown level by level, M root branches
    for seed in range(2):
        prompt = [1] + np.random.default_rng(10 + seed).integers(3, target.vocab_size, size=5).tolist()
        ref = greedy_loop(target, prompt, 30)
        out = speculative_decode(target, draft, prompt, 30, temperature=0.0, seed=seed, **drafting)
        assert out.tokens == ref, drafting


def test_plain_batched_decoding_of_a_llama_cpp_target_is_each_request_alone(target):
    """B sequences of one llama.cpp context, one llama_decode per step (bench --batch's llama.cpp row at
    B > 1): every request's greedy tokens are those of the request decoded alone, prompts of different
    lengths together."""
    from specbound.decoding.batch import autoregressive_decode_batch

    rng = np.random.default_rng(7)
    prompts = [[1] + rng.integers(3, target.vocab_size, size=n).tolist() for n in (3, 9, 5)]
    out = autoregressive_decode_batch(target, prompts, 12, temperature=0.0)
    assert [r.tokens for r in out.results] == [greedy_loop(target, p, 12) for p in prompts]
    assert out.target_passes < 3 * 12                       # the three rows shared their passes


def test_greedy_equals_llama_cpp_own_generate(paths, target):
    from specbound.experiments.llamacpp_peers import llama_generate, open_llama

    llm = open_llama(paths["target"], n_ctx=256, n_threads=1, type_k=0, type_v=0)   # f32 K/V like ours
    for seed in range(2):
        prompt = [1] + np.random.default_rng(10 + seed).integers(3, target.vocab_size, size=6).tolist()
        peer = llama_generate(llm, prompt, 30, temperature=0.0)
        assert peer.tokens == greedy_loop(target, prompt, 30)


def _exact_first_two_law(model, prompt, config):
    """Law of (x1, x2) under the processed law of the model's own logits, by enumerating x1."""
    vocab = model.vocab_size
    model.reset()
    first = logits_to_probs(model.forward(torch.tensor([prompt]))[0, -1].double(), config)
    base = model.cache_length
    law = np.zeros((vocab, vocab))
    for tok in torch.nonzero(first).flatten().tolist():
        second = logits_to_probs(model.forward(torch.tensor([[tok]]))[0, -1].double(), config)
        law[tok] = first[tok].item() * second.numpy()
        model.crop(base)
    return law / law.sum()


@pytest.mark.montecarlo
@pytest.mark.slow
def test_first_two_tokens_follow_the_target_law_with_top_k(target, draft):
    """χ² of (x1, x2) over 2000 speculative runs (γ = 2, T = 1, top-k = 4) against the exact law.

    The law has 16 cells (4 × 4); with 2000 samples each cell's expected count is 2000·p (cells
    below 5 are pooled by chi_square_pvalue). Fixed seeds 0..1999: the test is deterministic and
    fails only for a real bias (threshold p > 1e-3).
    """
    config = SamplingConfig(1.0, top_k=4)
    prompt = [1, 270, 300, 264]
    law = _exact_first_two_law(target, prompt, config)
    support = law[law > 0]
    assert len(support) == 16 and support.min() * 2000 > 5, "law too peaked for this sample size"
    runs = 2000
    samples = np.array([speculative_decode(target, draft, prompt, 2, gamma=2, temperature=1.0, top_k=4,
                                           seed=i).tokens for i in range(runs)])
    assert chi_square_pvalue(encode(samples, target.vocab_size), law) > 1e-3


def test_peers_speculative_hooks_keep_greedy_output(paths, target, draft):
    """llama-cpp-python's own speculative path (draft_model= hook) with prompt lookup and with a
    draft MODEL proposer: greedy output equals plain greedy; forward-cost timer runs."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from specbound.experiments.llamacpp_peers import (
        DraftModelProposer, llama_generate, measure_llama_forward_costs, open_llama,
    )

    prompt = [1] + [270, 300, 264, 280] * 3
    plain = llama_generate(open_llama(paths["target"], n_ctx=256, n_threads=1, type_k=0, type_v=0), prompt, 24)
    assert plain.tokens == greedy_loop(target, prompt, 24) and plain.method == "llama.cpp"
    for proposer in (LlamaPromptLookupDecoding(num_pred_tokens=4), DraftModelProposer(draft, num_pred_tokens=3)):
        llm = open_llama(paths["target"], n_ctx=256, n_threads=1, type_k=0, type_v=0, draft_model=proposer)
        out = llama_generate(llm, prompt, 24)
        assert out.tokens == plain.tokens, type(proposer).__name__
        assert out.drafted > 0
        if isinstance(proposer, DraftModelProposer):     # the noisy copy agrees often: fewer target passes
            assert out.target_evals < plain.target_evals
    costs = measure_llama_forward_costs(target, ks=(1, 2, 8), repeats=3, prefix_length=16)
    assert costs.ks == (1, 2, 8) and all(lo <= m <= hi for lo, m, hi in zip(costs.minimum, costs.median,
                                                                               costs.maximum))
    assert "k | median ms" in costs.table()


# --------------------------------------------------------------------------- a batch's rows in one context

def _joint_read(rows_and_reads):
    """One shared pass over several rows: [(row, tokens, parents or None for a chain)] -> logits."""
    from specbound.models.llamacpp import _read_rows, _RowRead

    reads = []
    for row, tokens, parents in rows_and_reads:
        chain = parents is None
        if chain:
            parents = row.slots.chain_parents(len(tokens))
        reads.append(_RowRead(row, list(tokens), list(parents), chain and row.slots.is_chain, None))
    return _read_rows(reads)


@pytest.mark.parametrize("seed", [11, 12])
def test_rows_of_one_context_read_together_like_fresh_caches(paths, reference, seed):
    """Three rows of ONE llama.cpp context (``fork_rows``): random tree reads, chain reads, crops,
    keep_paths and resets, the reads of every step's rows in ONE llama_decode. Every logit equals a
    fresh read of its row's branch, each row's sequences stay inside its own id range, and one row's
    rollback never touches another's cells."""
    fresh = fresh_reader(reference)
    model = make(paths["target"], n_ctx=256, n_batch=16, identity=None)
    rows = model.fork_rows(3)
    assert len({id(r._ctx_users) for r in rows}) == 1 and rows[0]._ctx is rows[2]._ctx is not model._ctx
    ranges = [set(r._own_sequences()) for r in rows]
    assert not (ranges[0] & ranges[1]) and not (ranges[1] & ranges[2])
    gen = np.random.default_rng(seed)
    mirrors = []
    for row in rows:
        prefix = gen.integers(3, row.vocab_size, size=int(gen.integers(2, 9))).tolist()
        mirrors.append(Mirror(prefix))
    calls = sum(r.decode_calls for r in rows)
    prefills = _joint_read([(r, m.tokens, None) for r, m in zip(rows, mirrors)])
    assert sum(r.decode_calls for r in rows) == calls + 1        # three prompts, one llama_decode
    for m, logits in zip(mirrors, prefills):
        torch.testing.assert_close(logits[0], fresh(m.tokens), atol=ATOL, rtol=1e-4)
    ops = dict(tree=0, forward=0, crop=0, keep=0, reset=0)
    for step in range(40):
        reads = []
        for j, (row, mirror) in enumerate(zip(rows, mirrors)):
            op = gen.choice(["tree", "tree", "forward", "crop", "keep", "idle", "reset"] if step % 7 == 6 else
                            ["tree", "tree", "forward", "crop", "keep", "idle"])
            length, chain = row.cache_length, row.committed_length
            if length > 150:
                op = "keep"
            if op in ("tree", "forward") and length == 0:
                op = "forward"
            if op == "tree":
                n = int(gen.integers(1, 5))
                parents = [int(gen.choice(range(chain - 1, length + i))) for i in range(n)]
                tokens = gen.integers(3, row.vocab_size, size=n).tolist()
                reads.append((j, tokens, parents))
            elif op == "forward":
                tokens = gen.integers(3, row.vocab_size, size=int(gen.integers(1, 4))).tolist()
                reads.append((j, tokens, None))
            elif op == "crop" and length:
                new = int(gen.integers(max(1, chain - 2), length + 1))
                row.crop(new)
                mirror.crop(new)
            elif op == "keep" and length:
                keep_random_path(row, mirror, gen)
            elif op == "reset":
                row.reset()
                mirrors[j] = Mirror([])
            if op != "idle":
                ops[op] += 1
        if reads:
            starts = [rows[j].cache_length for j, _, _ in reads]
            outs = _joint_read([(rows[j], tokens, parents) for j, tokens, parents in reads])
            for (j, tokens, parents), first, logits in zip(reads, starts, outs):
                if parents is None:
                    parents = list(range(first - 1, first - 1 + len(tokens)))
                mirrors[j].add(tokens, parents)
                assert_nodes_match_fresh(fresh, mirrors[j], first, logits)
        for j, (row, mirror) in enumerate(zip(rows, mirrors)):
            assert row.cache_length == len(mirror.tokens), f"step {step}, row {j}"
            seqs = row.kv_sequence_ranges()
            assert all(lo == 0 and hi < row.cache_length for lo, hi in seqs.values()), (step, j, seqs)
            assert (row._seq_base in seqs) == (row.cache_length > 0)
        held = [set(r.kv_sequence_ranges()) for r in rows]       # all of the context's sequences with cells
        every = set(range(int(model._lib.llama_max_parallel_sequences())))
        used = {s for s in every if int(model._lib.llama_memory_seq_pos_max(rows[0]._mem, s)) >= 0}
        assert used == held[0] | held[1] | held[2], step        # no cell outside some row's own paths
    assert ops.pop("reset") >= 1 and min(ops.values()) >= 5, ops
    for r in rows:
        r.close()


def test_a_batch_s_rows_open_more_sequences_together(paths, reference, monkeypatch):
    """Rows of one context start with a share of INITIAL_SEQUENCES and interleaved ids (row r: r, r + n,
    …), so when one row's tree needs more, the context doubles everyone's without renaming an id in use:
    both rows read on exactly as fresh caches; a closed row stays closed."""
    import specbound.models.llamacpp as backend

    fresh = fresh_reader(reference)
    monkeypatch.setattr(backend, "INITIAL_SEQUENCES", 2)
    rows = make(paths["target"], n_ctx=128, max_sequences=16, identity=None).fork_rows(2)
    assert [r._sequences for r in rows] == [1, 1] and [r.max_sequences for r in rows] == [16, 16]
    _joint_read([(rows[0], [1, 2, 3], None), (rows[1], [9, 8], None)])
    out = _joint_read([(rows[0], [4, 5, 6], [2, 2, 2]), (rows[1], [7, 7], [1, 1])])     # 3 and 2 leaves
    assert [r._sequences for r in rows] == [4, 4] and rows[0]._ctx == rows[1]._ctx
    for i, path in enumerate([[4], [5], [6]]):
        torch.testing.assert_close(out[0][0, i], fresh([1, 2, 3] + path)[-1], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(out[1][0, 1], fresh([9, 8, 7])[-1], atol=ATOL, rtol=1e-4)
    assert set(rows[0].kv_sequence_ranges()) <= {0, 2, 4, 6} and set(rows[1].kv_sequence_ranges()) <= {1, 3, 5, 7}
    rows[1].keep_path(2, [3])
    rows[0].close()
    out = rows[1].forward_tree(torch.tensor([[10, 11, 12, 13, 14]]), [2] * 5)     # 5 leaves: 4 -> 8
    assert rows[1]._sequences == 8 and rows[0]._ctx is None
    torch.testing.assert_close(out[0, 4], fresh([9, 8, 7, 14])[-1], atol=ATOL, rtol=1e-4)
    with pytest.raises(SpecboundError, match="closed"):
        rows[0].forward(torch.tensor([[1]]))


def test_a_failed_joint_read_leaves_every_row_intact(paths, reference):
    fresh = fresh_reader(reference)
    model = make(paths["target"], n_ctx=128, max_sequences=4, identity=None)
    rows = model.fork_rows(2)
    assert [r.max_sequences for r in rows] == [4, 4]
    _joint_read([(rows[0], [1, 2, 3], None), (rows[1], [9, 8], None)])
    _joint_read([(rows[0], [4, 5, 6, 7], [2, 2, 2, 2]), (rows[1], [6], None)])   # row 0: 4 leaves
    with pytest.raises(SpecboundError, match="max_sequences=4"):
        _joint_read([(rows[1], [7, 7], [2, 2]), (rows[0], [8], [2])])            # row 0: a fifth leaf
    assert rows[0].cache_length == 7 and rows[1].cache_length == 3
    out = _joint_read([(rows[0], [9], [3]), (rows[1], [10], None)])
    torch.testing.assert_close(out[0][0, 0], fresh([1, 2, 3, 4, 9])[-1], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(out[1][0, 0], fresh([9, 8, 6, 10])[-1], atol=ATOL, rtol=1e-4)
    with pytest.raises(SpecboundError, match="needs a llama.cpp sequence per row"):
        model.fork_rows(int(model._lib.llama_max_parallel_sequences()) + 1)
    rows[0].close()                                  # the context lives while a row uses it
    torch.testing.assert_close(rows[1].forward(torch.tensor([[11]]))[0, 0], fresh([9, 8, 6, 10, 11])[-1],
                               atol=ATOL, rtol=1e-4)
    rows[1].close()
    with pytest.raises(SpecboundError, match="closed"):
        rows[1].forward(torch.tensor([[1]]))


def test_a_dynamic_tree_stops_reading_where_the_draft_cache_is_full(paths, target, monkeypatch):
    """llama.cpp keeps one sequence per cached leaf (256 at most). A best-first tree reads nodes that can
    later fall out of its top P, so its reads can outnumber P many times over (seen: 327 read for P = 64 at
    T = 1 on a real draft, which failed mid-proposal). It stops reading at the draft's ``max_tree_nodes``;
    the output is still the target's. Without the stop the same decode fails on a 4-sequence draft."""
    from specbound.decoding.engine import autoregressive_decode
    from specbound.models.llamacpp import LlamaCppModel

    small = make(paths["draft"], n_ctx=512, max_sequences=4, identity=None)
    assert small.max_tree_nodes == 3
    plain = autoregressive_decode(target, [1, 2, 3], 24, temperature=0.0)
    out = speculative_decode(target, small, [1, 2, 3], 24, tree=32, temperature=0.0)
    assert out.tokens == plain.tokens and out.metrics.target_calls < 24
    monkeypatch.setattr(LlamaCppModel, "max_tree_nodes", property(lambda self: None))
    with pytest.raises(SpecboundError, match="max_sequences=4"):
        speculative_decode(target, make(paths["draft"], n_ctx=512, max_sequences=4, identity=None), [1, 2, 3], 24,
                           tree=32, temperature=0.0)
