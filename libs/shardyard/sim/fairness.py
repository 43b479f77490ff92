"""How fairly a simulated run shared the cluster between queues: each queue's share of its entitlement while it
had jobs waiting, and Jain's index over those. Pure.

A queue is entitled to its nominal quota, per GPU model, as far as it wants it: of model ``m`` it is owed
``o(q,m) = min(n(q,m), h(q,m) + w(q,m))``, its nominal or what it holds plus what its waiting jobs of that model ask
for, whichever is less. A job whose gang is larger than the queue's nominal of every model it can use is owed
nothing: it runs on borrowed idle quota or not at all, as the scheduler places it. Waiting jobs that take any model
are owed what is left of the queue's nominal on every model (at the cheapest model's TFLOPS).

While a queue has jobs waiting, it is satisfied to ``got / owed``, both TFLOPS-weighted (an H100 counts for more
than a V100), where ``got`` is what it holds of what it is owed (holding more is borrowing idle quota: no one is owed
that). A queue's figure ``x(q)`` is that satisfaction averaged over the time it waited (1 if it never did), and
Jain's index over the queues with a quota, ``(sum x)^2 / (n * sum x^2)``, is 1 when every waiting queue got what it
was owed alike and falls towards 1/n as one queue takes what the others are owed.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shardyard.quotas import QueuesConfig
from shardyard.sim.cluster import NodeSpec

ANY = ""
"""The model key of GPUs asked for by jobs that take any model."""


@dataclass(frozen=True)
class Entitlements:
    nominal: Mapping[str, Mapping[str, int]]
    """Queue -> model -> its nominal quota (capped by the cluster's GPUs of the model)."""
    tflops: Mapping[str, float]
    """Model -> its TFLOPS (the cluster's nodes')."""

    @classmethod
    def of(cls, config: QueuesConfig, nodes: Iterable[NodeSpec]) -> "Entitlements":
        gpus: dict[str, int] = {}
        tflops: dict[str, float] = {}
        for node in nodes:
            gpus[node.gpu_model] = gpus.get(node.gpu_model, 0) + node.gpus
            tflops.setdefault(node.gpu_model, node.tflops)
        nominal = {
            name: {m: min(n, gpus[m]) for m, n in spec.gpus.items() if m in gpus and n > 0}
            for name, spec in config.queues.items()
        }
        return cls(nominal, tflops)


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index of ``values`` (1 when all are equal; 1.0 for none)."""
    xs = list(values)
    squares = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * squares) if squares > 0 else 1.0


@dataclass
class ShareLog:
    """Per queue over simulated time: the GPUs it holds and its waiting jobs ask for, per model (the engine tells
    it), integrated into the time it waited and how satisfied it was meanwhile."""

    owed: Entitlements
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    asked: dict[str, dict[str, int]] = field(default_factory=dict)
    """Queue -> model (``ANY`` for any) -> GPUs its waiting jobs ask for."""
    waited_us: dict[str, int] = field(default_factory=dict)
    satisfied_us: dict[str, float] = field(default_factory=dict)
    _last_us: int | None = None

    def advance(self, now_us: int) -> None:
        """Count the time since the last call with the holdings and waits as they were."""
        last, self._last_us = self._last_us, now_us
        if last is None or now_us <= last:
            return
        span = now_us - last
        for queue, asked in self.asked.items():
            if not any(asked.values()) or not self.owed.nominal.get(queue):
                continue
            satisfied = self.satisfaction(queue)
            self.waited_us[queue] = self.waited_us.get(queue, 0) + span
            self.satisfied_us[queue] = self.satisfied_us.get(queue, 0.0) + span * satisfied

    def satisfaction(self, queue: str) -> float:
        """What ``queue`` holds of what it is owed now, over what it is owed (TFLOPS-weighted; 1 if owed nothing)."""
        nominal, held, asked = self.owed.nominal[queue], self.held.get(queue, {}), self.asked[queue]
        tflops = self.owed.tflops
        owed = got = left = 0.0
        for model, n in nominal.items():
            h = held.get(model, 0)
            o = min(n, h + asked.get(model, 0))
            owed += o * tflops[model]
            got += min(h, o) * tflops[model]  # gangs of jobs that take any model count here, as held
            left += (n - o) * tflops[model]
        if asked.get(ANY):
            owed += min(left, asked[ANY] * min(tflops[m] for m in nominal))  # owed, and waiting: not held
        return got / owed if owed > 0 else 1.0

    def hold(self, queue: str, model: str, gpus: int) -> None:
        held = self.held.setdefault(queue, {})
        held[model] = held.get(model, 0) + gpus

    def ask(self, queue: str, model: str | None, gpus: int) -> None:
        """A waiting job of ``gpus`` GPUs (negative: it left the queue). Only a gang that fits in the queue's
        nominal quota of one model is owed anything: a larger one runs on borrowed idle quota or not at all."""
        nominal = self.owed.nominal.get(queue, {})
        largest = nominal.get(model, 0) if model is not None else max(nominal.values(), default=0)
        if abs(gpus) > largest:
            return
        asked = self.asked.setdefault(queue, {})
        key = model or ANY
        asked[key] = asked.get(key, 0) + gpus

    def shares(self, queues: Iterable[str]) -> dict[str, float]:
        """``x(q)`` of each of ``queues`` that has a quota."""
        return {
            q: self.satisfied_us[q] / self.waited_us[q] if self.waited_us.get(q) else 1.0
            for q in queues
            if self.owed.nominal.get(q)
        }
