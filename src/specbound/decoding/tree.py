"""THE draft-tree type: one round's proposal as flat arrays (Sequoia's lesson: a tree is arrays).

Node i has token ``tokens[i]`` and parent ``parents[i]`` (−1 = the root, the last committed token);
parents precede children. A chain is a tree of fan-out 1, M batch drafts (Yin et al. 2024, Alg. 4) are
M root branches, a draft tree of capacity P (Pankratov & Alistarh 2026) has at most P nodes, a plain
step is the empty tree. ``draft_probs`` [n+1, V]: for sampled trees, the draft law each node's children
were drawn from (row 0: the root's); sampled trees are verified by recursive rejection over siblings,
deterministic ones by the target walk of :func:`~specbound.decoding.verify.verify`;
``pool_equal_prefixes`` marks batch design A.

What the drafter knows of each node travels with the tree and comes back in the round's feedback
(``scores``, ``confidences``, ``cache_nodes``, ``from_context`` / ``context_match``: docs/design.md,
"One round"); the engine and :func:`verify` never read them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import SpecboundError

__all__ = ["DraftTree"]


@dataclass
class DraftTree:
    tokens: torch.Tensor                      # [n] long
    parents: torch.Tensor                     # [n] long, −1 = root
    draft_probs: torch.Tensor | None = None   # [n+1, V] (sampled trees)
    sampled: bool = False
    pool_equal_prefixes: bool = False
    value: float = float("nan")               # E[X | T] under the target when the drafter knows it (oracle)
    draft_calls: int = 0                      # draft-model passes made to propose this tree
    scores: torch.Tensor | None = None        # [n] float64: draft path probability q(v) of each node
    confidences: torch.Tensor | None = None   # [n] float64: the draft's probability of each node's token
    cache_nodes: list[int] | None = None      # [n]: the drafter's cache id of each node (None: id = index)
    shape: str | None = None                  # which shape drafted it (shape="auto": "chain", "drafts", "sampled")
    from_context: torch.Tensor | None = None  # [n] bool: nodes found in the context (no draft read), not drafted
    context_match: int = 0                    # the matched suffix length those nodes continue
    depths: torch.Tensor = field(init=False)  # [n] long, 1 = child of the root

    def __post_init__(self):
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long).reshape(-1)
        self.parents = torch.as_tensor(self.parents, dtype=torch.long).reshape(-1)
        n = len(self.tokens)
        if len(self.parents) != n:
            raise SpecboundError(f"draft tree has {n} tokens but {len(self.parents)} parents")
        depths = []
        for i, p in enumerate(self.parents.tolist()):
            if not -1 <= p < i:
                raise SpecboundError(f"draft tree node {i} has parent {p}: parents must precede children (−1 = root)")
            depths.append(1 if p < 0 else depths[p] + 1)
        self.depths = torch.tensor(depths, dtype=torch.long)
        for name in ("scores", "confidences"):
            values = getattr(self, name)
            if values is not None:
                values = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
                if len(values) != n:
                    raise SpecboundError(f"draft tree has {n} nodes but {len(values)} {name}")
                setattr(self, name, values)
        if self.from_context is not None:
            self.from_context = torch.as_tensor(self.from_context, dtype=torch.bool).reshape(-1)
            if len(self.from_context) != n:
                raise SpecboundError(f"draft tree has {n} nodes but {len(self.from_context)} from_context flags")
        if self.cache_nodes is not None:
            self.cache_nodes = [int(i) for i in self.cache_nodes]
            if len(self.cache_nodes) != n:
                raise SpecboundError(f"draft tree has {n} nodes but {len(self.cache_nodes)} cache_nodes")
        if self.sampled:
            if self.draft_probs is None or self.draft_probs.ndim != 2 or self.draft_probs.shape[0] != n + 1:
                raise SpecboundError(
                    f"a sampled draft tree needs draft_probs [n+1, V] = [{n + 1}, V] (the laws its children were "
                    f"drawn from), got {None if self.draft_probs is None else tuple(self.draft_probs.shape)}"
                )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def empty(cls) -> "DraftTree":
        """No drafted token: the round is a plain target step."""
        return cls(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))

    @classmethod
    def chain(cls, tokens, draft_probs: torch.Tensor | None = None, draft_calls: int = 0,
              confidences=None, from_context=None, context_match: int = 0) -> "DraftTree":
        """A drafted chain (fan-out 1). ``draft_probs`` [k, V]: the law token j was sampled from
        (None for a deterministic chain, e.g. the arg-max chain at temperature 0)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        k = len(tokens)
        probs = None
        if draft_probs is not None:
            if draft_probs.ndim != 2 or draft_probs.shape[0] != k:
                raise SpecboundError(f"chain draft_probs must be [k, V] = [{k}, V], got {tuple(draft_probs.shape)}")
            probs = torch.cat([draft_probs, draft_probs.new_zeros(1, draft_probs.shape[1])])
        return cls(tokens, torch.arange(-1, k - 1), probs, sampled=draft_probs is not None, draft_calls=draft_calls,
                   confidences=confidences, from_context=from_context, context_match=context_match)

    @classmethod
    def branches(cls, tokens: torch.Tensor, draft_probs: torch.Tensor, pool_equal_prefixes: bool = False,
                 draft_calls: int = 0) -> "DraftTree":
        """M i.i.d. drafted sequences as M root branches (Yin et al. 2024, Alg. 4).

        ``tokens`` [M, k]; ``draft_probs`` [M, k, V] (row j of branch i: the law its token j was drawn
        from; row 0 is the same root law for every branch). Node (depth j+1, branch i) gets index
        j·M + i (level order). ``pool_equal_prefixes`` selects design A (prefix-tree walk).
        """
        if tokens.ndim != 2 or draft_probs.ndim != 3 or draft_probs.shape[:2] != tokens.shape:
            raise SpecboundError(f"branches need tokens [M, k] and draft_probs [M, k, V], got "
                                 f"{tuple(tokens.shape)} and {tuple(draft_probs.shape)}")
        m, k = tokens.shape
        flat = tokens.t().reshape(-1)
        parents = torch.tensor([-1] * m + [(j - 1) * m + i for j in range(1, k) for i in range(m)], dtype=torch.long)
        vocab = draft_probs.shape[-1]
        probs = draft_probs.new_zeros(m * k + 1, vocab)
        probs[0] = draft_probs[0, 0]
        if k > 1:
            probs[1:1 + m * (k - 1)] = draft_probs[:, 1:].transpose(0, 1).reshape(-1, vocab)
        return cls(flat, parents, probs, sampled=True, pool_equal_prefixes=pool_equal_prefixes,
                   draft_calls=draft_calls)

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return int(self.depths.max()) if len(self) else 0

    def children(self) -> list[list[int]]:
        """Children of the root (entry 0) and of node i (entry i+1), in node order."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents.tolist()):
            kids[p + 1].append(i)
        return kids

    def path_to(self, node: int) -> list[int]:
        """Node indices on the path root → ``node``."""
        path, parents = [], self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    def cache_path(self, path: list[int]) -> list[int]:
        """The drafter's cache ids of the nodes on ``path`` (e.g. the accepted path, to keep in the cache)."""
        return list(path) if self.cache_nodes is None else [self.cache_nodes[i] for i in path]

    def is_chain(self) -> bool:
        return bool(torch.equal(self.parents, torch.arange(-1, len(self) - 1)))
