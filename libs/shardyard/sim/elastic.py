"""Growing and shrinking elastic gangs, beside the placement core's decisions (the ``shardyard`` policies). Pure:
each returns ``Resize`` actions for the engine.

- **shrink** (``shrinks``): while jobs wait, every elastic gang holding more than its preferred size (``gpus``) on
  nodes a waiting job could use (its model and TFLOPS) gives that surplus back at once, before the core weighs
  preemption: GPUs lent while nobody waited go back before anyone is stopped. It keeps its GPUs on the nodes where
  it holds the most.
- **grow** (``grows``): once no job is left waiting after the core's decisions, the elastic gangs grow towards
  their ``max_shards`` into free GPUs of nodes that can host them (model and TFLOPS, as for placement), oldest gang
  first: its own nodes first, then the others in declaration order.

The core itself starts an elastic job smaller when its preferred size does not fit (``placement.elastic``).
"""

from collections.abc import Iterable, Mapping

from shardyard.sim.engine import Resize, Shards, Start, State
from shardyard.sim.gang import Gang


def shrinks(state: State) -> list[Resize]:
    """The surplus of the elastic gangs given back, while jobs wait (see the module's doc)."""
    if not state.pending:
        return []
    above = [
        gang
        for job_id in state.elastic
        if (gang := state.running[job_id]).gpus > gang.job.gpus and gang.preempted_by is None
    ]
    if not above:
        return []
    wanted = {group for waiting in state.pending.values() for group in state.eligible(waiting.job)[0]}
    resizes = []
    for gang in above:
        nodes = (state.by_id[node_id] for node_id, _gpus in gang.shards)
        if any((node.gpu_model, node.tflops) in wanted for node in nodes):
            resizes.append(Resize(gang.job.job_id, keep(gang.shards, gang.job.gpus)))
    return resizes


def keep(shards: Shards, size: int) -> Shards:
    """``size`` of ``shards``' GPUs: on the nodes holding the most of them first (ties: in shard order), the
    lowest indices of each; in shard order."""
    kept: dict[str, tuple[int, ...]] = {}
    left = size
    for node_id, gpus in sorted(shards, key=lambda shard: -len(shard[1])):
        if left <= 0:
            break
        kept[node_id] = tuple(sorted(gpus))[:left]
        left -= len(kept[node_id])
    return tuple((node_id, kept[node_id]) for node_id, _gpus in shards if node_id in kept)


def grows(state: State, actions: Iterable[Start | object]) -> list[Resize]:
    """The elastic gangs grown into the GPUs left free after ``actions`` (the cycle's decisions), when they leave
    no job waiting (see the module's doc)."""
    if not state.elastic:
        return []
    starts = [action for action in actions if isinstance(action, Start)]
    if len(starts) < len(state.pending):
        return []  # a job is left waiting: nothing grows
    taken: dict[str, set[int]] = {}
    group_free = dict(state.group_free)
    for start in starts:
        for node_id, gpus in start.shards:
            taken.setdefault(node_id, set()).update(gpus)
            node = state.by_id[node_id]
            group_free[(node.gpu_model, node.tflops)] -= len(gpus)
    resizes = []
    for job_id in state.elastic:
        gang = state.running[job_id]
        if gang.preempted_by is None and gang.gpus < (gang.job.max_shards or 0):
            grown = _grown(state, gang, taken, group_free)
            if grown is not None:
                resizes.append(Resize(job_id, grown))
    return resizes


def _grown(
    state: State, gang: Gang, taken: dict[str, set[int]], group_free: dict[tuple[str, float], int]
) -> Shards | None:
    """``gang``'s shards with as many free GPUs added as it may grow by, taking them (None: none free)."""
    groups, nodes, _total = state.eligible(gang.job)
    want = (gang.job.max_shards or 0) - gang.gpus
    if not any(group_free[group] > 0 for group in groups):
        return None
    held = dict(gang.shards)
    order = [node for node in nodes if node.node_id in held] + [node for node in nodes if node.node_id not in held]
    added: dict[str, tuple[int, ...]] = {}
    for node in order:
        if want <= 0:
            break
        free = _free(state.free[node.node_id], taken.get(node.node_id, ()))[:want]
        if free:
            added[node.node_id] = free
            taken.setdefault(node.node_id, set()).update(free)
            group_free[(node.gpu_model, node.tflops)] -= len(free)
            want -= len(free)
    if not added:
        return None
    grown = [(node_id, gpus + added.pop(node_id, ())) for node_id, gpus in gang.shards]
    return (*grown, *added.items())


def _free(free: tuple[int, ...], taken: Iterable[int] | Mapping[int, object]) -> tuple[int, ...]:
    used = set(taken)
    return tuple(gpu for gpu in free if gpu not in used) if used else free
