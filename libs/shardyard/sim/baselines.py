"""The plain schedulers Shardyard is compared with (S13), and one reference:

- ``fifo``: strict FIFO, no backfill;
- ``priority``: priority order, every job that fits starts (greedy backfill, no reservation);
- ``first-fit``: priority order and greedy like ``priority``, but type-blind: any GPU model will do, first fit in
  node declaration order (a job on slower GPUs runs slower, by its match score);
- ``sjf-oracle``: a reference, not a scheduler anyone can run: shortest remaining run time first, from the trace's
  true durations, greedy.

Each places a gang whole or not at all, one GPU per shard, first fit in node declaration order; all but
``first-fit`` only on nodes of a full match (the job's GPU model, or any model for ``ANY``, with at least its
``min_tflops``). None ages, reserves, preempts, ranks nodes by match, load or fragmentation. A job that could not
fit even on the empty cluster is passed over (it never starts) rather than blocking the queue forever.
"""

from shardyard.sim.cluster import NodeSpec
from shardyard.sim.engine import GroupKey, Shards, Start, State, Waiting
from shardyard.sim.trace import TraceJob


class _Cycle:
    """The free GPUs of one cycle, as this cycle's starts take them (the engine's state stays untouched)."""

    def __init__(self, state: State, *, type_blind: bool = False) -> None:
        self.state = state
        self.taken: dict[str, int] = {}
        self.group_free: dict[GroupKey, int] = dict(state.group_free)
        self.type_blind = type_blind

    def _eligible(self, job: TraceJob) -> tuple[tuple[GroupKey, ...], tuple[NodeSpec, ...], int]:
        return self.state.eligible(_ANY_GPU if self.type_blind else job)

    def never_fits(self, job: TraceJob) -> bool:
        _groups, _nodes, capacity = self._eligible(job)
        return capacity < job.gpus

    def first_fit(self, job: TraceJob) -> Shards | None:
        """Take ``job.gpus`` GPUs from the first eligible nodes with free ones; None (taking nothing) if too few."""
        groups, nodes, _capacity = self._eligible(job)
        if sum(self.group_free[group] for group in groups) < job.gpus:
            return None
        need = job.gpus
        shards: list[tuple[str, tuple[int, ...]]] = []
        for node in nodes:
            used = self.taken.get(node.node_id, 0)
            gpus = self.state.free[node.node_id][used : used + need]
            if not gpus:
                continue
            shards.append((node.node_id, gpus))
            self.taken[node.node_id] = used + len(gpus)
            self.group_free[(node.gpu_model, node.tflops)] -= len(gpus)
            need -= len(gpus)
            if need == 0:
                break
        return tuple(shards)


def fifo(state: State, now_us: int) -> list[Start]:
    """Strict first-come-first-served: jobs start in submission order; the first that does not fit blocks every job
    behind it (no backfill). Priority is ignored."""
    del now_us  # FIFO needs no clock
    cycle = _Cycle(state)
    starts: list[Start] = []
    for waiting in sorted(state.pending.values(), key=_submission_order):
        if cycle.never_fits(waiting.job):
            continue
        shards = cycle.first_fit(waiting.job)
        if shards is None:
            break
        starts.append(Start(waiting.job.job_id, shards))
    return starts


def priority_first(state: State, now_us: int) -> list[Start]:
    """Highest priority first, FIFO among equals; every job that fits starts, so a small low-priority job may take
    the GPUs a blocked bigger one waits for (no reservation)."""
    del now_us  # no aging
    return _greedy(state, sorted(state.pending.values(), key=lambda w: (-w.job.priority, w.order)))


def _greedy(state: State, order: list[Waiting], *, type_blind: bool = False) -> list[Start]:
    cycle = _Cycle(state, type_blind=type_blind)
    starts: list[Start] = []
    for waiting in order:
        if cycle.never_fits(waiting.job):
            continue
        shards = cycle.first_fit(waiting.job)
        if shards is not None:
            starts.append(Start(waiting.job.job_id, shards))
    return starts


def first_fit(state: State, now_us: int) -> list[Start]:
    """Priority order, greedy, type-blind: the first nodes with free GPUs of any model."""
    del now_us
    return _greedy(state, sorted(state.pending.values(), key=lambda w: (-w.job.priority, w.order)), type_blind=True)


def sjf_oracle(state: State, now_us: int) -> list[Start]:
    """Shortest true remaining run time first, greedy (a reference: it reads what no scheduler knows)."""
    del now_us
    return _greedy(state, sorted(state.pending.values(), key=lambda w: (w.remaining_s, w.order)))


_ANY_GPU = TraceJob("any", 0.0, 1, None, 1.0, 0, 0.0)
"""What type-blind placement asks of a node: a GPU, of any model or speed."""


def _submission_order(waiting: Waiting) -> int:
    return waiting.order
