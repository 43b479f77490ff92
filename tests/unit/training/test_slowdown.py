"""The test-only slow-down hooks (``shardyard.training.slowdown``): off unless the environment names their folder;
then a node's shards take as many times as long for their own part of each step as its file says, and a node's
network is as many ms slower a round trip as its ``.link`` file says (its shards wait that long at each sync, its
probes take that long more); each file read again at most once a second."""

from pathlib import Path

from shardyard.training.slowdown import SLOWDOWN_DIR_ENV, LinkDelay, Slowdown


class Clock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))


def test_off_without_the_folder() -> None:
    clock = Clock()
    Slowdown({"SHARDYARD_NODE_ID": "node-2"}, clock=lambda: clock.now, sleep=clock.sleep).stretch(0.1)
    assert clock.slept == []


def test_the_files_factor_stretches_the_step_and_is_read_again_each_second(tmp_path: Path) -> None:
    clock = Clock()
    env = {SLOWDOWN_DIR_ENV: str(tmp_path), "SHARDYARD_NODE_ID": "node-2"}
    slow = Slowdown(env, clock=lambda: clock.now, sleep=clock.sleep)
    slow.stretch(0.1)  # no file yet: full speed
    (tmp_path / "node-2").write_text("2\n")
    (tmp_path / "node-1").write_text("5\n")  # another node's
    clock.now = 0.5
    slow.stretch(0.1)  # read within the second: still full speed
    clock.now = 1.0
    slow.stretch(0.1)
    slow.stretch(0.2)
    (tmp_path / "node-2").write_text("1")
    clock.now = 2.5
    slow.stretch(0.1)
    assert clock.slept == [0.1, 0.2]


def test_no_link_delay_without_the_folder(tmp_path: Path) -> None:
    clock = Clock()
    (tmp_path / "node-2.link").write_text("300")
    delay = LinkDelay({"SHARDYARD_NODE_ID": "node-2"}, clock=lambda: clock.now, sleep=clock.sleep)
    assert delay.wait() == 0.0 and delay.between("node-1", "node-2") == 0.0 and clock.slept == []


def test_a_nodes_link_file_slows_its_syncs_and_every_round_trip_to_or_from_it(tmp_path: Path) -> None:
    clock = Clock()
    env = {SLOWDOWN_DIR_ENV: str(tmp_path), "SHARDYARD_NODE_ID": "node-2"}
    delay = LinkDelay(env, clock=lambda: clock.now, sleep=clock.sleep)
    assert delay.wait() == 0.0  # no file yet
    (tmp_path / "node-2.link").write_text("300\n")
    (tmp_path / "node-2").write_text("2")  # the GPU's factor: not the network's
    clock.now = 0.5
    assert delay.wait() == 0.0  # read within the second
    clock.now = 1.0
    assert delay.wait() == 0.3
    assert delay.between("node-1", "node-2") == 0.3 and delay.between("node-2", "node-1") == 0.3
    assert delay.between("node-1", "node-3") == 0.0  # neither end slowed
    (tmp_path / "node-2.link").write_text("0")
    clock.now = 2.0
    assert delay.wait() == 0.0
    assert clock.slept == [0.3]
