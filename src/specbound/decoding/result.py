"""What every decoder returns: tokens plus the metrics users need (no log parsing)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .verify import RoundEnd


@dataclass
class DecodeMetrics:
    new_tokens: int = 0
    target_calls: int = 0          # target forward passes after the prompt (verification passes)
    draft_calls: int = 0           # draft forward passes after the prompt
    rejections: int = 0            # rounds that ended at a rejected drafted token
    accepted_per_step: list[int] = field(default_factory=list)   # accepted drafted tokens (X) per round
    drafted_per_step: list[int] = field(default_factory=list)    # drafted tokens (tree nodes) per round
    depth_per_step: list[int] = field(default_factory=list)      # depth of the draft tree per round
    position_accepted: list[int] = field(default_factory=list)   # per draft depth: times accepted
    position_reached: list[int] = field(default_factory=list)    # per draft depth: times tested
    plain_steps: int = 0           # rounds without a draft (one target call, one token)
    context_drafted: int = 0       # drafted tokens found in the context (no draft read), of drafted_per_step
    context_accepted: int = 0      # ... and of those, accepted
    prefill_time: float = 0.0      # reading the prompt (both models), calibration excluded
    calibration_time: float = 0.0  # first run of a pair only: measuring t(k), d(k); not in total_time
    draft_time: float = 0.0
    target_time: float = 0.0
    verify_time: float = 0.0
    total_time: float = 0.0        # prefill + decoding (what the second run of a pair takes)
    # Relaxed (biased) decoding only, Yin et al. 2024 §5 / Thm 4: sum over the verified positions of the
    # exact TV distance between that step's output law and the target law given the same prefix
    # (Σ[b·draft − target]_+ for Decoding-OPT); 0 for lossless decoding. Its mean bounds the TV bias of
    # the whole sequence (hybrid argument) and equals it for one token. ``bias_positions`` counts the
    # positions summed; expected_bias / new_tokens is the per-token bias proxy.
    expected_bias: float = 0.0
    bias_positions: int = 0
    interrupted: bool = False      # the run was stopped early (Ctrl-C); tokens so far are kept

    @property
    def tau(self) -> float:
        """Tokens generated per target call (τ); 1.0 for autoregressive decoding."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def context_share(self) -> float:
        """The share of drafted tokens that came from the context (cost no draft read)."""
        drafted = sum(self.drafted_per_step)
        return self.context_drafted / drafted if drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted_per_step) / len(self.accepted_per_step) if self.accepted_per_step else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / r if r else float("nan") for a, r in zip(self.position_accepted, self.position_reached)]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time if self.total_time > 0 else float("inf")

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens per second after the prompt (prefill excluded): the rate a speed-up prediction describes."""
        seconds = self.total_time - self.prefill_time
        return self.new_tokens / seconds if seconds > 0 else float("inf")

    def record_round(self, drafted: int, depth: int, accepted: int, tested: int, rejected: bool,
                     step_bias: list[float] | None = None) -> None:
        """One round: ``drafted`` nodes of depth ``depth``, ``accepted`` of them on the accepted path,
        ``tested`` depths checked (accepted + 1 when the round ended at a rejection); ``step_bias``
        (relaxed rules only) the exact TV bias of each tested position."""
        self.drafted_per_step.append(drafted)
        self.depth_per_step.append(depth)
        self.accepted_per_step.append(accepted)
        self.rejections += int(rejected)
        self.plain_steps += int(drafted == 0)
        grow = tested - len(self.position_reached)
        if grow > 0:
            self.position_reached.extend([0] * grow)
            self.position_accepted.extend([0] * grow)
        for i in range(tested):
            self.position_reached[i] += 1
        for i in range(accepted):
            self.position_accepted[i] += 1
        if step_bias is not None:
            self.expected_bias += float(sum(step_bias))
            self.bias_positions += len(step_bias)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(tau=self.tau, mean_accepted=self.mean_accepted,
                   acceptance_per_position=self.acceptance_per_position,
                   tokens_per_second=self.tokens_per_second,
                   decode_tokens_per_second=self.decode_tokens_per_second)
        return out


@dataclass
class RoundRecord:
    """One round as the verifier saw it: committed length before it, tree size and depth, X, how it
    ended (:class:`~specbound.decoding.verify.RoundEnd`: recovered, bonus, budget), the tree value E[X | T] when the drafter knows it
    (oracle; NaN otherwise) and, per tested depth, the acceptance probability given the drafted tokens."""

    committed: int
    size: int
    depth: int
    accepted: int
    ended: RoundEnd
    value: float
    accept_probs: list[float]


@dataclass
class DecodeResult:
    tokens: list[int]                 # generated token ids (prompt excluded)
    prompt: list[int]
    metrics: DecodeMetrics
    method: str = "speculative"
    lossless: bool = True             # False for deliberately biased (relaxed) decoding
    sampling: str = ""
    rounds: list[RoundRecord] = field(default_factory=list)
    costs: object = None              # the CostModel the drafter sized its drafts with (None: fixed shapes)

    def as_dict(self) -> dict:
        return {"method": self.method, "lossless": self.lossless, "sampling": self.sampling,
                "prompt": self.prompt, "tokens": self.tokens, "metrics": self.metrics.as_dict()}
