"""``shardyard nodes --links`` over what the monitor serves at ``/api/links``: an RTT matrix up to 16 live nodes,
the 20 worst links beyond, slow links marked and listed with why."""

from __future__ import annotations

from shardyard.cli import main as cli
from shardyard.cli import show
from shardyard.cli.render import links_report
from shardyard.monitor.telemetry import Telemetry
from shardyard.monitor.views import ClusterView
from tests.support.clock import FakeClock
from tests.unit.builders import at, node_state
from tests.unit.monitor.test_monitor_links import measured, round_of


def answer(*events: object, nodes: int = 4) -> dict[str, object]:
    clock = FakeClock(at(0))
    view = ClusterView(telemetry=Telemetry(clock=clock))
    for i in range(1, nodes + 1):
        view.apply(node_state(f"n{i}", topology={"zone": "z1", "rack": "r1"}))
    for event in events:
        view.apply(event)
    return view.links_json(clock.now())


def test_a_small_cluster_is_a_matrix_with_slow_links_marked() -> None:
    report = links_report(answer(*[e for e in round_of(0) if {e.node_id, e.peer_id} != {"n2", "n3"}]))

    assert report.splitlines()[:6] == [
        "RTT (ms)",
        "#  NODE  1      2      3      4",
        "1  n1           0.30   0.30   20.0*",
        "2  n2    0.30          -      20.0*",
        "3  n3    0.30   -             20.0*",
        "4  n4    20.0*  20.0*  20.0*",
    ]
    assert report.splitlines()[7:] == [
        "* slow links (3), out of line with the cluster's:",
        "  n1|n4: RTT 20.0 ms, the cluster's 0.30 ms",
        "  n2|n4: RTT 20.0 ms, the cluster's 0.30 ms",
        "  n3|n4: RTT 20.0 ms, the cluster's 0.30 ms",
    ]


def test_a_large_cluster_shows_the_20_worst_links() -> None:
    names = [f"n{i}" for i in range(1, 31)]
    events = [
        measured(a, b, 9.0 if "n30" in (a, b) else 0.3, 0, bandwidth_bytes_per_s=2.5e8)
        for a in names
        for b in names
        if a < b
    ]

    lines = links_report(answer(*events, nodes=30)).splitlines()

    assert lines[0] == "the 20 worst of 435 measured links among 30 live nodes"
    assert lines[1].split() == ["A", "B", "RTT", "MS", "P90", "MS", "BANDWIDTH", "MEASURED", "SLOW"]
    assert lines[2].split() == ["n1", "n30", "9.00", "10.8", "250.0", "MB/s", "00:00:00", "*"]
    assert len([line for line in lines[2:22] if line.endswith("*")]) == 20  # n30's 29 links, the worst of all
    assert lines[23] == "* slow links (29), out of line with the cluster's:"
    assert lines[-1] == "  ... 9 more"


def test_nothing_measured_says_so() -> None:
    assert links_report(answer()) == "no link measured among the 4 live nodes yet"


def test_no_slow_link_says_so() -> None:
    assert links_report(answer(*round_of(0, slow_ms=0.3))).endswith("\n\nno slow link")


def test_the_flag_is_parsed() -> None:
    args = cli.parser().parse_args(["nodes", "--links"])

    assert args.links and args.func is show.cmd_nodes
    assert not cli.parser().parse_args(["nodes"]).links
