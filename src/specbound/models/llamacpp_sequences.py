"""Where one cache tree lives in llama.cpp's KV cache: the llama.cpp sequence ids of each path.

llama.cpp lets a token attend to the cells that share its FIRST sequence id and whose position is not
larger than its own, so a sequence here is one root-to-node path of the tree: the committed chain plus
the tree nodes down to the sequence's *tip*. :class:`KVSequences` keeps, for one cache (a model, or one
row of a batch's shared context), which of its sequence ids hold which path, plans the ids of a read
(:meth:`~KVSequences.plan`, nothing in llama.cpp changes there) and cuts llama.cpp's cells back on
crop, keep_path and failed reads. The mapping in full: docs/design.md (the llama.cpp backend).
"""
from __future__ import annotations

from .base import CacheTree

__all__ = ["KVSequences", "OutOfSequences"]


class OutOfSequences(Exception):
    """A read needs a sequence id and every one opened so far is in use."""


class KVSequences:
    """The llama.cpp sequence ids of ONE cache and the tree slots each one covers.

    The ids are ``base``, ``base + stride``, … (``opened`` of them): a batch's rows interleave theirs
    in one context, so opening more keeps every id in use valid. ``tips`` maps each sequence holding
    cells to the deepest slot of its path (-1: empty); ``slot_seqs`` lists, per tree slot, the
    sequences through it (the first is the one it attends with). Sequence ``base`` holds the chain.
    """

    def __init__(self, base: int, stride: int, opened: int):
        self.base, self.stride, self.opened = base, stride, opened
        self.slot_seqs: list[list[int]] = []
        self.tips: dict[int, int] = {base: -1}

    def clear(self) -> None:
        """An empty cache (llama.cpp's cells are removed by the caller)."""
        self.slot_seqs = []
        self.tips = {self.base: -1}

    def own(self) -> range:
        """The llama.cpp sequence ids of this cache (all of the context's unless it is a batch's row)."""
        return range(self.base, self.base + self.stride * self.opened, self.stride)

    def primary(self, slots: CacheTree, slot: int) -> int:
        """A sequence through ``slot`` (cached): its cells at positions <= pos(slot) are slot's path."""
        chain = slots.chain
        return self.base if slot < chain else self.slot_seqs[slot - chain][0]

    def plan(self, slots: CacheTree, parents: list[int]):
        """Sequence ids of each new node (attention sequence first), sequences to copy before the
        decode ((source, new sequence, end position)), each node's position, and the tips afterwards.
        A node whose parent is some sequence's tip extends it; otherwise it opens a free sequence, a copy
        of its parent's path up to the deepest cached node. :class:`OutOfSequences` when none is free."""
        base = slots.length
        tips = dict(self.tips)
        tip_owner = {}
        for s, t in sorted(tips.items(), reverse=True):
            tip_owner[t] = s                                       # prefer the smallest id per tip
        free = sorted(set(self.own()) - set(tips))
        node_seqs: list[list[int]] = []
        copies: list[tuple[int, int, int]] = []                    # (source, new sequence, end position)
        positions: list[int] = []
        for i, p in enumerate(parents):
            slot = base + i
            pos = 0 if p < 0 else (positions[p - base] if p >= base else slots.position(p)) + 1
            s = tip_owner.pop(p, None)
            if s is None:
                if not free:
                    raise OutOfSequences
                s = free.pop(0)
                a = p
                while a >= base:                                  # nodes of this call on the parent's path
                    node_seqs[a - base].append(s)
                    a = parents[a - base]
                # a is now the deepest cached node of the path (or -1 on an empty cache)
                if a >= 0:
                    copies.append((self.primary(slots, a), s, slots.position(a) + 1))
            tips[s] = slot
            tip_owner[slot] = s
            node_seqs.append([s])
            positions.append(pos)
        return node_seqs, copies, positions, tips

    def commit(self, node_seqs: list[list[int]], tips: dict[int, int], extend_chain: bool) -> None:
        """A planned read succeeded: its nodes' sequences and the new tips."""
        if not extend_chain:
            self.slot_seqs.extend(node_seqs)
        self.tips = tips

    def undo(self, lib, mem, slots: CacheTree, node_seqs, copies) -> None:
        """Remove every cell a failed read may have added (new sequences, extensions of old ones)."""
        new = {dst for _, dst, _ in copies} | ({s for seqs in node_seqs for s in seqs} - set(self.tips))
        for s in new:
            lib.llama_memory_seq_rm(mem, s, -1, -1)
        for s, tip in self.tips.items():
            lib.llama_memory_seq_rm(mem, s, (slots.position(tip) + 1) if tip >= 0 else 0, -1)

    def collapse_to_chain(self, lib, mem, length: int) -> None:
        """Keep only the committed slots 0..length-1, in this cache's first sequence (every sequence
        holding cells is one of ``tips``; other rows' sequences are left alone)."""
        base = self.base
        for s in self.tips:
            lib.llama_memory_seq_rm(mem, s, length if s == base else -1, -1)
        self.slot_seqs = []
        self.tips = {base: length - 1}

    def crop(self, lib, mem, old_chain: int, parents: list[int], positions: list[int], length: int) -> None:
        """Cut every sequence back to its deepest slot below ``length`` and free duplicates, given the tree
        as it was (``old_chain`` committed slots, the tree slots' ``parents`` and ``positions``)."""
        def parent(slot):
            return slot - 1 if slot < old_chain else parents[slot - old_chain]

        def position(slot):
            return slot if slot < old_chain else positions[slot - old_chain]

        tips = {}
        for s, tip in self.tips.items():
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
        self.tips = {s: t for t, s in owner.items()}
        self.slot_seqs = [[s for s in seqs if s in live] for seqs in self.slot_seqs[:length - old_chain]]

    def keep(self, lib, mem, end_seq: int, end_pos: int, length: int) -> None:
        """Keep sequence ``end_seq`` up to ``end_pos`` as the new chain of ``length`` slots, in sequence
        ``base``; drop every other sequence of this cache."""
        base = self.base
        lib.llama_memory_seq_rm(mem, end_seq, end_pos + 1, -1)
        for s in self.tips:                           # every other sequence of this cache
            if s != end_seq:
                lib.llama_memory_seq_rm(mem, s, -1, -1)
        if end_seq != base:
            lib.llama_memory_seq_cp(mem, end_seq, base, -1, -1)
            lib.llama_memory_seq_rm(mem, end_seq, -1, -1)
        self.slot_seqs = []
        self.tips = {base: length - 1}

    def ranges(self, lib, mem) -> dict[int, tuple[int, int]]:
        """(min, max) cached position of every sequence of this cache that holds cells."""
        ranges = {}
        for s in self.own():
            hi = int(lib.llama_memory_seq_pos_max(mem, s))
            if hi >= 0:
                ranges[s] = (int(lib.llama_memory_seq_pos_min(mem, s)), hi)
        return ranges
