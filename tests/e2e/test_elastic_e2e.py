"""An elastic job on a real cluster: it prefers 4 shards, the cluster has 2 GPUs, and it runs at 2 (its shards told
a world size of 2) to SUCCEEDED, where a rigid job of 4 would wait for ever. Growing and shrinking are not built
yet (issue 35)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_placement_e2e import document, submit, until
from tests.support.cluster import local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with local_cluster(tmp_path_factory.mktemp("elastic"), ("A100:2",), replicas=1) as run_dir:
        yield run_dir


@pytest.mark.timeout(300)
def test_an_elastic_job_too_large_for_the_free_gpus_starts_at_what_fits_and_succeeds(cluster: Path) -> None:
    job = document(
        "elastic-small",
        shard_count=4,
        elasticity={"min_shards": 1, "max_shards": 4},
        sync_interval=10,
        training={"max_steps": 40, "batch_size": 2},
    )
    job["resource_requirements"]["gpu"]["count"] = 4
    submit(cluster, job)

    done = until(cluster, "elastic-small", lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), 240)

    assert done["state"] == "SUCCEEDED", done["timeline"][-10:]
    assert len(done["placements"]) == 2, done["placements"]
    assert sorted(done["shards"]) == ["0", "1"], done["shards"]
