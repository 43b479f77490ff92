"""``shardyard simulate``: replay a job trace against a declared cluster in simulated time and compare Shardyard's
placement core with plain FIFO and priority scheduling.

- ``trace``      the CSV trace format: ``TraceJob`` rows, strict parsing (``TraceError``), writing
- ``cluster``    the cluster declaration ``A100:8x4,V100:8x8`` -> ``NodeSpec`` per node
- ``generate``   a seeded synthetic trace (Poisson arrivals, skewed gang sizes, log-normal durations)
- ``engine``     the discrete-event loop: arrivals, completions, releases after preemption, degraded-wait wake-ups,
                 and the actions a policy returns (start, stop, resize)
- ``state``      what a policy reads in a cycle: free GPUs, pending jobs, running gangs
- ``gang``       a running gang and its attempt as a timeline of sizes: the work model of elastic jobs
- ``elastic``    growing and shrinking elastic gangs beside the core's decisions
- ``lost_work``  periodic checkpoints, preemption notices and restarts: what each preemption loses, by part
- ``policies``   the policies the engine can ask: the real core (``shardyard.placement.cycle.schedule``) and
                 the two baselines of ``baselines``
- ``report``     per-policy figures (JCT, queueing delay, makespan, utilisation, lost work, ETTR) as a table or
                 JSON, and the verdict line (the shardyard policy against the others)
- ``plots``      ``--plot``: the JCT and wait CDFs and the GPUs busy over time as PNGs (matplotlib, optional)
- ``cli``        the ``simulate`` subcommand
"""
