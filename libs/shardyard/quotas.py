"""Teams' queues: GPU quotas per model, cohorts that borrow and lend, fair-share weights. Pure.

The cluster's queue configuration is one YAML file (``examples/queues.yaml``)::

    min_runtime_s: 300         # a job runs this long in an attempt before reclaim may stop it
    starving_after_s: 600      # QUEUE_STARVED: a queue waited this long for its nominal quota
    queues:
      team-a:
        cohort: research       # queues of one cohort lend each other their idle quota
        weight: 1              # fair-share weight
        gpus: {A100: 16, V100: 32}   # nominal quota, per GPU model
        cpu: 256               # cores (absent: no CPU quota)
        memory: 2TiB           # (absent: no memory quota)
        borrow: {A100: 8}      # at most this much beyond nominal, per model (a model absent: no limit)
        lend: {A100: 4}        # at most this much of its idle nominal lent (a model absent: all of it)

Without a file there is one queue, ``default``, without quotas: placement is what it always was.

The quota of a queue ``q`` for a model ``m`` (``Ledger.headroom``): its own idle nominal, ``n(q,m) - u(q,m)``, plus
what it may borrow: the cohort's idle lendable quota (each other member's ``min(lend, n - u)``) less what the
cohort's queues borrow already, capped by ``q``'s borrow limit. CPU and memory quotas are hard: never borrowed.
"""

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shardyard.gpus import canonical_model
from shardyard.units import parse_bytes

DEFAULT_QUEUE = "default"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""Queue and cohort names: as a submission's ``queue`` field allows."""


class QueueSpec(BaseModel):
    """One team's queue."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cohort: str | None = Field(default=None, pattern=NAME_PATTERN, description="queues of one cohort lend idle quota")
    weight: float = Field(default=1.0, gt=0, le=1000, description="fair-share weight")
    gpus: dict[str, int] = Field(default_factory=dict, description="nominal GPUs per model")
    cpu: float | None = Field(default=None, gt=0, description="nominal CPU cores (None: no CPU quota)")
    memory: int | None = Field(default=None, gt=0, description="nominal memory, bytes (None: no memory quota)")
    borrow: dict[str, int] = Field(default_factory=dict, description="most borrowed beyond nominal (absent: no limit)")
    lend: dict[str, int] = Field(default_factory=dict, description="most of its idle nominal lent (absent: all)")

    @field_validator("gpus", "borrow", "lend", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out: dict[str, Any] = {}
        for model, count in value.items():
            if not isinstance(model, str) or not model.strip():
                raise ValueError(f"a GPU model is a name, not {model!r}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"{model}: a GPU count is a whole number >= 0, not {count!r}")
            out[canonical_model(model)] = count
        return out

    @field_validator("memory", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return parse_bytes(value) if isinstance(value, str) else value


class QueuesConfig(BaseModel):
    """The cluster's queues (one per team) and the knobs of reclaim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queues: dict[str, QueueSpec] = Field(min_length=1, max_length=10_000)
    min_runtime_s: float = Field(default=300.0, ge=0, description="guaranteed runtime before a job can be reclaimed")
    starving_after_s: float = Field(default=600.0, gt=0, description="QUEUE_STARVED after this long below nominal")

    @field_validator("queues", mode="after")
    @classmethod
    def _names(cls, value: dict[str, QueueSpec]) -> dict[str, QueueSpec]:
        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(
                    f"queue name {name!r}: letters, digits, '.', '_' and '-', 1-64 long, a letter or digit first"
                )
        return value

    def queue(self, name: str) -> QueueSpec | None:
        return self.queues.get(name)

    def members(self, cohort: str | None) -> list[str]:
        """The queues of ``cohort`` (a queue without one is a cohort of its own: its own name only)."""
        return sorted(name for name, spec in self.queues.items() if cohort is not None and spec.cohort == cohort)

    def models(self) -> list[str]:
        return sorted({model for spec in self.queues.values() for model in (*spec.gpus, *spec.borrow, *spec.lend)})

    def ever(self, name: str, model: str) -> int:
        """The most GPUs of ``model`` queue ``name`` could ever hold: its nominal plus all it could borrow."""
        spec = self.queues[name]
        lendable = sum(
            _lendable(self.queues[peer], model, self.queues[peer].gpus.get(model, 0))
            for peer in self.members(spec.cohort)
            if peer != name
        )
        limit = spec.borrow.get(model)
        return spec.gpus.get(model, 0) + (lendable if limit is None else min(limit, lendable))

    def never_fits(self, name: str, gpus: int, model: str | None, cpu: float, memory: int) -> str | None:
        """Why a gang of ``gpus`` GPUs (of ``model``; None: of any one model), ``cpu`` cores and ``memory`` bytes
        could never run in queue ``name``, whatever the others do: more GPUs than its nominal plus all it could
        borrow, for every model it could use, or more CPU or memory than its quota. None: it could."""
        spec = self.queues[name]
        if spec.cpu is not None and cpu > spec.cpu + 1e-9:
            return f"it needs {cpu:g} CPU cores; queue {name}'s quota is {spec.cpu:g}"
        if spec.memory is not None and memory > spec.memory:
            return f"it needs {memory} bytes of memory; queue {name}'s quota is {spec.memory}"
        models = [model] if model is not None else self.models()
        most = {candidate: self.ever(name, candidate) for candidate in models}
        if any(count >= gpus for count in most.values()):
            return None
        could = ", ".join(f"{candidate}: {count}" for candidate, count in sorted(most.items())) or "no GPU model"
        return f"it needs {gpus} GPUs of one model; queue {name} could ever hold (nominal plus borrowable) {could}"


class QueuesFileError(ValueError):
    """A queues file that cannot be used, with the line of the first fault (1-based; 0 when it has none)."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}" if line else reason)
        self.line = line
        self.reason = reason


def parse_queues(text: str) -> QueuesConfig:
    """The configuration in a queues file's text; raises :class:`QueuesFileError` naming the line and the reason of
    the first fault (the whole file is refused: no part of a bad file is applied)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        raise QueuesFileError(mark.line + 1 if mark is not None else 0, f"not YAML: {problem}") from None
    if not isinstance(data, dict):
        raise QueuesFileError(1, "the file is a mapping with a 'queues' key (see examples/queues.yaml)")
    try:
        return QueuesConfig.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise QueuesFileError(_line_of(root, first["loc"]), f"{where}: {first['msg']}") from None


def _line_of(node: yaml.Node | None, path: Iterable[Any]) -> int:
    """The 1-based line of the YAML node at ``path`` (or of the deepest part of it that exists)."""
    line = node.start_mark.line + 1 if node is not None else 0
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            break
        found = next(((k, v) for k, v in node.value if k.value == str(part)), None)
        if found is None:
            break
        key, node = found
        line = key.start_mark.line + 1
    return line


def _lendable(spec: QueueSpec, model: str, idle: int) -> int:
    limit = spec.lend.get(model)
    return max(0, idle if limit is None else min(limit, idle))


@dataclass(frozen=True)
class ModelUse:
    """One queue's GPUs of one model: its nominal quota, what it holds, what it borrows beyond nominal, and how much
    of its nominal other queues of its cohort hold (lent)."""

    nominal: int
    used: int
    borrowed: int
    lent: int


@dataclass
class Ledger:
    """What each queue holds, per GPU model (and CPU and memory), against the configuration."""

    config: QueuesConfig
    used: dict[str, dict[str, int]] = field(default_factory=dict)
    """queue -> GPU model -> GPUs its running jobs hold."""
    cpu: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    claimed: dict[str, dict[str, int]] = field(default_factory=dict)
    """queue -> GPU model -> idle nominal quota its waiting jobs want: not idle, so not lent."""
    _cohort: dict[tuple[str, str], list[int]] = field(default_factory=dict, repr=False)
    """(cohort, model) -> [the members' idle lendable quota, what they borrow], summed when first asked and kept up
    to date by ``add`` and ``claim``: a cycle asks for a headroom per job, at any number of queues."""

    def add(self, queue: str, model: str, gpus: int) -> None:
        self._change(self.used, queue, model, gpus)

    def claim(self, queue: str, model: str, gpus: int) -> None:
        """A job of ``queue`` waits for ``gpus`` of ``model`` within its nominal quota: the cohort borrows none."""
        self._change(self.claimed, queue, model, gpus)

    def _change(self, table: dict[str, dict[str, int]], queue: str, model: str, gpus: int) -> None:
        spec = self.config.queue(queue)
        totals = None if spec is None or spec.cohort is None else self._cohort.get((spec.cohort, model))
        if totals is not None:
            totals[0] -= self.idle_lendable(queue, model)
            totals[1] -= self.borrowed(queue, model)
        per_model = table.setdefault(queue, {})
        per_model[model] = per_model.get(model, 0) + gpus
        if totals is not None:
            totals[0] += self.idle_lendable(queue, model)
            totals[1] += self.borrowed(queue, model)

    def _cohort_totals(self, cohort: str, model: str) -> list[int]:
        totals = self._cohort.get((cohort, model))
        if totals is None:
            peers = self.config.members(cohort)
            totals = [sum(self.idle_lendable(p, model) for p in peers), sum(self.borrowed(p, model) for p in peers)]
            self._cohort[(cohort, model)] = totals
        return totals

    def add_resources(self, queue: str, cpu: float, memory: int) -> None:
        self.cpu[queue] = self.cpu.get(queue, 0.0) + cpu
        self.memory[queue] = self.memory.get(queue, 0) + memory

    def holds(self, queue: str, model: str) -> int:
        return self.used.get(queue, {}).get(model, 0)

    def nominal(self, queue: str, model: str) -> int:
        spec = self.config.queue(queue)
        return 0 if spec is None else spec.gpus.get(model, 0)

    def borrowed(self, queue: str, model: str) -> int:
        return max(0, self.holds(queue, model) - self.nominal(queue, model))

    def idle_lendable(self, queue: str, model: str) -> int:
        spec = self.config.queues[queue]
        idle = self.nominal(queue, model) - self.holds(queue, model) - self.claimed.get(queue, {}).get(model, 0)
        return _lendable(spec, model, idle)

    def headroom(self, queue: str, model: str) -> int:
        """How many more GPUs of ``model`` queue ``queue`` may take now: its idle nominal, then what it may borrow
        (the cohort's idle lendable quota less what the cohort borrows already, within its borrow limit)."""
        spec = self.config.queue(queue)
        if spec is None:
            return 0
        own = max(0, spec.gpus.get(model, 0) - self.holds(queue, model))
        if spec.cohort is None:
            return own
        pool, taken = self._cohort_totals(spec.cohort, model)
        free_in_cohort = max(0, pool - self.idle_lendable(queue, model) - taken)
        limit = spec.borrow.get(model)
        may = free_in_cohort if limit is None else max(0, min(free_in_cohort, limit - self.borrowed(queue, model)))
        return own + may

    def lent(self, queue: str, model: str) -> int:
        """How much of ``queue``'s idle nominal its cohort's borrowers hold: their borrowing, shared out over the
        lenders in name order (each lends at most its idle lendable quota)."""
        spec = self.config.queue(queue)
        if spec is None:
            return 0  # a queue no file configures lends nothing
        peers = self.config.members(spec.cohort)
        owed = sum(self.borrowed(peer, model) for peer in peers if peer != queue)
        for peer in peers:
            if peer == queue:
                return min(owed, self.idle_lendable(peer, model))
            owed -= min(owed, self.idle_lendable(peer, model))
        return 0

    def use(self, queue: str, model: str) -> ModelUse:
        return ModelUse(
            self.nominal(queue, model), self.holds(queue, model), self.borrowed(queue, model), self.lent(queue, model)
        )

    def over_hard_quota(self, queue: str, cpu: float, memory: int) -> str | None:
        """Why ``cpu`` cores and ``memory`` bytes more would put ``queue`` over its CPU or memory quota; None."""
        spec = self.config.queue(queue)
        if spec is None:
            return None
        if spec.cpu is not None and self.cpu.get(queue, 0.0) + cpu > spec.cpu + 1e-9:
            return f"cpu: {self.cpu.get(queue, 0.0):g} of {spec.cpu:g} cores in use"
        if spec.memory is not None and self.memory.get(queue, 0) + memory > spec.memory:
            return f"memory: {self.memory.get(queue, 0)} of {spec.memory} bytes in use"
        return None


def dominant_share(
    ledger: Ledger,
    queue: str,
    capacity: Mapping[str, int],
    tflops: Mapping[str, float],
    cpu_capacity: float = 0.0,
    memory_capacity: int = 0,
) -> float:
    """Queue ``queue``'s weighted dominant share: the largest of its share of the cluster's GPUs (each GPU weighted
    by its model's TFLOPS, so an H100 counts for more than a V100), of its CPU and of its memory, over its
    weight::

        share(q) = max( sum_m u(q,m) * T(m) / sum_m C(m) * T(m),  cpu(q) / CPU,  mem(q) / MEM ) / w(q)

    Between queues, the one with the lowest share goes first."""
    spec = ledger.config.queue(queue)
    weight = spec.weight if spec is not None else 1.0
    total = sum(count * tflops.get(model, 1.0) for model, count in capacity.items())
    held = sum(count * tflops.get(model, 1.0) for model, count in ledger.used.get(queue, {}).items())
    shares = [held / total if total > 0 else 0.0]
    if cpu_capacity > 0:
        shares.append(ledger.cpu.get(queue, 0.0) / cpu_capacity)
    if memory_capacity > 0:
        shares.append(ledger.memory.get(queue, 0) / memory_capacity)
    share = max(shares) / weight
    return share if math.isfinite(share) else 0.0
