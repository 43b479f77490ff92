"""The supervisor's backoff and `shardyard ps`'s rows, pure (the restarts: tests/e2e/test_supervision.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from shardyard.cli.cluster import ClusterInfo
from shardyard.cli.ps import render, rows
from shardyard.cli.supervisor import (
    BACKOFF_S,
    MAX_BACKOFF_S,
    STOP_OTHERS_S,
    Spec,
    Specs,
    Supervisor,
    Watched,
    fresh_instance,
)


def test_the_backoff_doubles_per_restart_up_to_its_cap() -> None:
    entry = Watched(Spec("queue-0", ["true"], {}, "/dev/null"), pid=1, started=0.0)
    waits = []
    for _ in range(8):
        waits.append(entry.backoff())
        entry.level += 1
    assert waits == [BACKOFF_S * 2**i for i in range(5)] + [MAX_BACKOFF_S] * 3


def test_ps_lists_the_supervisor_then_every_process_with_its_replica_uptime_and_restarts() -> None:
    info = ClusterInfo(
        run_dir="/tmp/x",
        bootstrap="127.0.0.1:1",
        monitor_url="",
        data_root="/tmp/x/data",
        broker="embedded",
        started_at=0.0,
        pids={"broker": os.getpid(), "resource-pool-1": os.getpid(), "node-0": 2**22 + 7},
        metrics_ports={"resource-pool-1": 9101},
        started={"resource-pool-1": 100.0, "broker": 40.0},
        restarts={"resource-pool-1": 2},
        supervisor_pid=os.getpid(),
    )
    found = {row["name"]: row for row in rows(info, now=190.0)}
    assert list(found) == ["supervisor", "broker", "resource-pool-1", "node-0"]
    pool = found["resource-pool-1"]
    assert (pool["service"], pool["replica"], pool["uptime_s"], pool["restarts"], pool["metrics_port"]) == (
        "resource-pool",
        1,
        90.0,
        2,
        9101,
    )
    assert found["node-0"]["running"] is False and found["node-0"]["uptime_s"] is None
    shown = render(list(found.values()))
    assert "resource-pool-1  1" in shown and "1m30s" in shown and "gone" in shown


def test_a_restarted_agent_is_a_new_instance_and_a_service_replica_keeps_its_name() -> None:
    agent = [
        "python",
        "-m",
        "shardyard.node_agent",
        "--node-id",
        "node-1",
        "--instance",
        "node-1-5",
        "--gpus",
        "A100:1",
    ]
    again = fresh_instance(agent, "node-1")
    assert again[:6] == agent[:6] and again[7:] == agent[7:] and again[6] != "node-1-5"
    assert again[6].startswith("node-1-")
    service = ["python", "-m", "shardyard.queue", "--instance", "queue-0"]
    assert fresh_instance(service, "queue-0") == service


def test_when_the_broker_dies_the_others_are_stopped_and_none_starts_before_it(tmp_path: Path) -> None:
    """Real processes: each other one gets SIGTERM (one that ignores it is killed at the deadline), the broker is
    started only once they are gone, and the others are not started while it is down."""
    code = {
        "broker": "import time; time.sleep(60)",
        "queue-0": "import time; time.sleep(60)",
        "node-0": "import signal as s, time; s.signal(s.SIGTERM, s.SIG_IGN); print(flush=True); time.sleep(60)",
    }
    running = {name: subprocess.Popen([sys.executable, "-c", c], stdout=subprocess.PIPE) for name, c in code.items()}
    try:
        assert running["node-0"].stdout is not None and running["node-0"].stdout.readline()  # it ignores SIGTERM now
        specs = Specs(str(tmp_path), "127.0.0.1:1", [Spec(name, ["true"], {}, "/dev/null") for name in running])
        specs.save()
        (tmp_path / "cluster.json").write_text(json.dumps({"pids": {n: p.pid for n, p in running.items()}}))
        supervisor = Supervisor(tmp_path)
        supervisor._broker_down(now=100.0)
        assert running["queue-0"].wait(10) == -15  # SIGTERM
        assert running["broker"].poll() is None
        supervisor.watched["queue-0"].due = 0.0  # found gone, its backoff over
        supervisor.tick()
        assert supervisor.watched["queue-0"].process is None  # not started while the broker is down
        assert not supervisor._others_stopped(now=100.0 + STOP_OTHERS_S - 1)  # node-0 is still there
        assert supervisor._others_stopped(now=100.0 + STOP_OTHERS_S)
        assert running["node-0"].wait(10) == -9  # killed at the deadline
    finally:
        for process in running.values():
            process.kill()
            process.wait()
