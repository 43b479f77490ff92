"""Queues in one placement cycle: which GPU models a job's queue has quota for, the fair-share order between queues,
and the borrowed gangs a queue may reclaim. Pure; a cycle without ``Snapshot.quotas`` has none of this.

- **Quota.** A job may use a GPU model only while its queue's headroom there (``Ledger.headroom``: idle nominal
  quota, then what its cohort lends now) covers the whole gang, and its CPU and memory quotas hold it. A model
  without headroom fails the ``quota`` group filter (``filters``), so placing and explaining agree; a job with no
  model left waits ``QUOTA_EXCEEDED``.
- **Fair share.** Within a queue, jobs keep their queue order (priority, then LAS or aging). Between queues, the next
  job comes from the queue with the lowest weighted dominant share (``quotas.dominant_share``), worked out again
  each time a job of that queue is placed.
- **Reclaim.** A job that would stay within its queue's nominal quota of a model may preempt gangs of other queues
  that borrow that model: borrowers only, lowest priority first, then the most recently started, each once it has
  run ``min_runtime_s``, and no more of a borrower than it borrows. Priority preemption stays within a queue.
- **Room in the quota.** A job its queue has no headroom for (``QUOTA_EXCEEDED``) may preempt gangs of its own
  queue that it outranks (as priority preemption would, lower priority or under LAS a later queue past the minimum
  run time) until its queue's headroom holds the gang (``freeing``). Without it, a wide job starves behind its own
  queue's small ones: each that ends gives its GPUs to the next small job, never enough at once to the wide one (the
  one-queue core's reservation keeps them for it; a quota has no nodes to reserve).
"""

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime

from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import PendingJob, Place, RunningJob, epoch_us
from shardyard.quotas import Ledger, QueuesConfig, dominant_share


class QuotaCycle:
    """The queues' use of the cluster, as one cycle sees it and changes it."""

    def __init__(self, config: QueuesConfig, index: ClusterIndex, running: Sequence[RunningJob]) -> None:
        self.config = config
        self.ledger = Ledger(config)
        self.capacity: dict[str, int] = {}
        self.tflops: dict[str, float] = {}
        self.cpu_capacity = 0.0
        self.memory_capacity = 0
        self._model_of: dict[str, str] = {}
        for node_id, slot in index.slots.items():
            view = slot.view
            self._model_of[node_id] = view.gpu_model
            self.capacity[view.gpu_model] = self.capacity.get(view.gpu_model, 0) + view.gpu_total
            self.tflops.setdefault(view.gpu_model, DEFAULT_TFLOPS.get(view.gpu_model, view.tflops))
            self.cpu_capacity += max(0.0, view.total_cpu_cores)
            self.memory_capacity += max(0, view.total_memory_bytes)
        self.running = running
        self._policy = index.policy
        self._gpus_of: dict[str, dict[str, int]] = {}
        """Job id -> GPU model -> the GPUs its gang holds (running gangs only)."""
        for gang in running:
            held = self.models_held(gang.shards)
            self._gpus_of[gang.job_id] = held
            shard_count = len(gang.shards)
            for model, gpus in held.items():
                self.ledger.add(gang.queue, model, gpus)
            self.ledger.add_resources(gang.queue, gang.cpu_per_shard * shard_count, gang.memory_per_shard * shard_count)

    def models_held(self, shards: Iterable[tuple[str, Sequence[int]]]) -> dict[str, int]:
        held: dict[str, int] = {}
        for node_id, gpus in shards:
            model = self._model_of.get(node_id)
            if model is not None:
                held[model] = held.get(model, 0) + len(gpus)
        return held

    # --- quota ---------------------------------------------------------------------------------------------------
    def allowed(self, job: PendingJob) -> frozenset[str]:
        """The GPU models ``job``'s queue has quota for now, for the whole gang (none when it is over its CPU or
        memory quota, or the configuration has no such queue)."""
        spec = job.spec
        if self.config.queue(spec.queue) is None:
            return frozenset()
        if self.ledger.over_hard_quota(spec.queue, spec.cpu_cores, spec.memory_bytes) is not None:
            return frozenset()
        return frozenset(model for model in self.capacity if self.ledger.headroom(spec.queue, model) >= spec.gpu_count)

    def why(self, job: PendingJob, models: Iterable[str]) -> str:
        """What holds ``job`` back, for its pending message: its queue, and each model it could use."""
        spec = job.spec
        if self.config.queue(spec.queue) is None:
            return f"queue {spec.queue} is not in the queues file"
        hard = self.ledger.over_hard_quota(spec.queue, spec.cpu_cores, spec.memory_bytes)
        if hard is not None:
            return f"queue {spec.queue} is at its {hard}"
        parts = []
        for model in sorted(models):
            use = self.ledger.use(spec.queue, model)
            headroom = self.ledger.headroom(spec.queue, model)
            parts.append(
                f"{model}: holds {use.used} of nominal {use.nominal}, may take {headroom} more now"
                f" (borrowing {use.borrowed})"
            )
        listed = "; ".join(parts) or "no GPU model it can use"
        return f"queue {spec.queue} over quota for {spec.gpu_count} GPUs: {listed}"

    def placed(self, job: PendingJob, place: Place) -> None:
        """A gang placed this cycle counts against its queue at once (the next decisions see it)."""
        spec = job.spec
        for model, gpus in self.models_held((s.node_id, s.gpu_indices) for s in place.placements).items():
            self.ledger.add(spec.queue, model, gpus)
        self.ledger.add_resources(spec.queue, spec.cpu_cores, spec.memory_bytes)

    # --- fair share ----------------------------------------------------------------------------------------------
    def share(self, queue: str) -> float:
        return dominant_share(self.ledger, queue, self.capacity, self.tflops, self.cpu_capacity, self.memory_capacity)

    def turns(self, queued: Sequence[PendingJob]) -> Iterator[PendingJob]:
        """``queued`` (in queue order), interleaved by fair share: each next job from the queue whose next job fits
        within its nominal quota, then with the lowest share now. Lazily: the caller decides each job (and
        ``placed`` or ``unplaced`` counts it) before asking for the next."""
        lines: dict[str, deque[PendingJob]] = {}
        for job in queued:
            lines.setdefault(job.spec.queue, deque()).append(job)
        heap = [self._turn(queue, line[0]) for queue, line in lines.items()]
        heapq.heapify(heap)
        while heap:
            *_key, queue = heapq.heappop(heap)
            line = lines[queue]
            yield line.popleft()
            if line:
                heapq.heappush(heap, self._turn(queue, line[0]))

    def _turn(self, queue: str, head: PendingJob) -> tuple[bool, float, str]:
        """A queue's place in line: a job that would borrow comes after those that fit in their nominal quota (the
        lender's quota is not idle while its own jobs want it), then by share."""
        return not self.within_nominal(head), self.share(queue), queue

    def within_nominal(self, job: PendingJob) -> set[str]:
        """The GPU models whose nominal quota of ``job``'s queue holds its gang (with what the queue holds now)."""
        queue, need = job.spec.queue, job.spec.gpu_count
        wanted = [job.spec.gpu_model] if job.spec.gpu_model and job.spec.min_match is None else self.capacity
        return {m for m in wanted if self.ledger.holds(queue, m) + need <= self.ledger.nominal(queue, m)}

    def unplaced(self, job: PendingJob) -> None:
        """A job not placed this cycle that fits in its queue's nominal quota claims it: the cohort borrows none of
        it in the rest of the cycle (borrowing is of idle quota only)."""
        for model in self.within_nominal(job):
            self.ledger.claim(job.spec.queue, model, job.spec.gpu_count)

    def freeing(
        self, job: PendingJob, models: Iterable[str], own: Iterable[RunningJob]
    ) -> tuple[str, list[RunningJob]]:
        """The fewest of ``own`` (gangs of ``job``'s queue it outranks, in victim order) whose GPUs of one of
        ``models`` give the queue headroom for the gang there, with that model: the one that frees the fewest GPUs.
        ("", []) when no model's headroom is short, or all of ``own`` would not do."""
        queue, need = job.spec.queue, job.spec.gpu_count
        gangs = list(own)
        best: tuple[int, str, list[RunningJob]] | None = None
        for model in sorted(models):
            if self.ledger.headroom(queue, model) >= need:
                return "", []  # quota is not what holds the job back there
            chosen, freed = [], 0
            for gang in gangs:
                gpus = self._gpus_of.get(gang.job_id, {}).get(model, 0)
                if gpus == 0:
                    continue
                chosen.append(gang)
                freed += gpus
                self.ledger.add(queue, model, -gpus)
                if self.ledger.headroom(queue, model) >= need:
                    break
            room = self.ledger.headroom(queue, model) >= need
            self.ledger.add(queue, model, freed)
            if room and (best is None or freed < best[0]):
                best = (freed, model, chosen)
        return ("", []) if best is None else (best[1], best[2])

    # --- reclaim -------------------------------------------------------------------------------------------------
    def victims(
        self,
        job: PendingJob,
        models: Iterable[str],
        same_queue: Callable[[], Iterator[RunningJob]],
        now: datetime,
    ) -> Iterator[RunningJob]:
        """The gangs ``job`` may preempt, in the order they are taken: first the borrowers it may reclaim from on
        ``models`` it may use (see the module's doc), then ``same_queue``'s, by priority preemption."""
        queue = job.spec.queue
        within = self.within_nominal(job) & set(models)
        if within:
            yield from self._reclaimable(queue, within, now)
        yield from (gang for gang in same_queue() if gang.queue == queue)

    def _reclaimable(self, queue: str, models: set[str], now: datetime) -> Iterator[RunningJob]:
        left = {(q, m): self.ledger.borrowed(q, m) for q in self.config.queues for m in models}
        now_us, floor_s = epoch_us(now), self.config.min_runtime_s
        borrowers = sorted(
            (
                gang
                for gang in self.running
                if gang.queue != queue
                and gang.preemptible
                and gang.preempted_by is None
                and (now_us - gang.started_us) / 1e6 >= floor_s
                and any(left.get((gang.queue, m), 0) > 0 for m in self._gpus_of.get(gang.job_id, {}))
            ),
            key=self._borrower_key(now),
        )
        for gang in borrowers:
            held = {m: n for m, n in self._gpus_of.get(gang.job_id, {}).items() if m in models}
            if not any(left.get((gang.queue, m), 0) > 0 for m in held):
                continue
            for model, gpus in held.items():
                left[(gang.queue, model)] = left.get((gang.queue, model), 0) - gpus
            yield gang

    def _borrower_key(self, now: datetime) -> Callable[[RunningJob], tuple[int, float, int, str]]:
        """The order a queue's borrowed GPUs are taken back in: the lowest priority first; among equals, with
        ``Policy.victims`` "lost-work", the gangs that lose least (which of a queue's gangs hold what it borrowed is
        a choice: the cheapest to stop), then the newest."""
        restart_s, by_loss = self._policy.restart_s, self._policy.victims == "lost-work"

        def key(gang: RunningJob) -> tuple[int, float, int, str]:
            lost = gang.lost_gpu_s(now, restart_s) if by_loss else 0.0
            return (gang.priority, lost, -gang.started_us, gang.job_id)

        return key


def queue_models(eligible: Mapping[tuple[str, float], float]) -> set[str]:
    """The GPU models of a candidate's eligible groups."""
    return {model for model, _tflops in eligible}
