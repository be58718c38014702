"""A short, built-in calibration text for int8 activation statistics (no data set needed).

Quantising a target needs, per linear layer, the largest |activation| each input channel reaches
(:func:`specbound.models.int8.activation_absmax`), to find the few channels whose outliers would
otherwise set every token's int8 scale. Those channels are a property of the model far more than
of the text, so a few hundred tokens of the kinds of text the default pair serves — code, a chat
turn, a word problem — suffice. The texts below were written for specbound; they share nothing
with the benchmark prompt sets (HumanEval, MT-Bench, GSM8K) used to measure fidelity and speed.
"""
from __future__ import annotations

__all__ = ["CALIBRATION_TEXTS", "calibration_batches"]

CALIBRATION_TEXTS = (
    '''import heapq
from collections import defaultdict


def shortest_paths(graph: dict[str, list[tuple[str, float]]], source: str) -> dict[str, float]:
    """Dijkstra's algorithm: the length of the shortest path from source to every reachable node."""
    dist = defaultdict(lambda: float("inf"))
    dist[source] = 0.0
    queue = [(0.0, source)]
    while queue:
        d, node = heapq.heappop(queue)
        if d > dist[node]:
            continue
        for neighbour, weight in graph.get(node, []):
            candidate = d + weight
            if candidate < dist[neighbour]:
                dist[neighbour] = candidate
                heapq.heappush(queue, (candidate, neighbour))
    return dict(dist)


class LRUCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items = {}

    def get(self, key):
        if key not in self.items:
            return None
        value = self.items.pop(key)
        self.items[key] = value
        return value
''',
    '''<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
I am planning a three-day trip to a city I have never visited. How should I decide what to see first, and how
do I avoid spending the whole time in queues?<|im_end|>
<|im_start|>assistant
Start by listing the few places that matter most to you, then group them by neighbourhood so that each day
covers one area on foot. Book timed tickets for the busiest museums in advance, and visit popular sights early
in the morning or late in the afternoon, when tour groups have left. Leave one half-day free: the best
memories of a trip often come from a market or a park you found by chance.<|im_end|>
''',
    '''Question: A bakery sells muffins for $3 each and cookies for $1.50 each. On Saturday it sold 48 muffins and
twice as many cookies as muffins. How much money did the bakery take in on Saturday?
Answer: The bakery sold 2 * 48 = 96 cookies. Muffins brought in 48 * 3 = 144 dollars and cookies brought in
96 * 1.5 = 144 dollars, so the total is 144 + 144 = 288 dollars. The answer is 288.
''',
    '''fn parse_line(line: &str) -> Result<(String, u32), String> {
    let mut parts = line.splitn(2, ',');
    let name = parts.next().ok_or("missing name")?.trim().to_string();
    let age = parts.next().ok_or("missing age")?.trim().parse::<u32>().map_err(|e| e.to_string())?;
    Ok((name, age))
}
SELECT customer_id, COUNT(*) AS orders, SUM(total) AS spent FROM orders WHERE created_at >= '2024-01-01'
GROUP BY customer_id HAVING COUNT(*) > 3 ORDER BY spent DESC LIMIT 10;
''',
)


def calibration_batches(tokenizer, texts=CALIBRATION_TEXTS):
    """The calibration texts as token batches (LongTensors [1, n]) for ``activation_absmax``."""
    import torch

    return [torch.tensor([tokenizer(t)["input_ids"]], dtype=torch.long) for t in texts]
