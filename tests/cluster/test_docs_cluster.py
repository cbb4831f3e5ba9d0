"""The docs' examples that need Docker, run as written: each page with blocks marked
``<!-- test: cluster -->`` (docs/deployment/compose.md) runs whole, in a copy of the repository's
tracked files, as ``make test``'s tests/system/test_docs_examples.py runs the others.

Each page's commands run under a Compose project of their own (``COMPOSE_PROJECT_NAME``) and the
image the cluster tests build (``envserver:cluster-test``, built from the copy first); whatever
the page leaves is removed at the end, and nothing of the project may be left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import markdown_examples as examples
import pytest
from helpers import ROOT

from envserver import PROTOCOL_VERSION

pytestmark = pytest.mark.cluster

if shutil.which("docker") is None:
    pytest.skip("the cluster tests need docker (see make test-cluster)", allow_module_level=True)

#: What the Compose page's commands print, and how many times: the rollouts' JSON summaries, the
#: trainer script's line (3 hosts, then the 2 of the CURVE cluster), the CURVE hosts' answers.
SAID = {
    '"env_id": "CartPole-v1"': 2,
    "RemoteVectorEnv(CartPole-v1, num_envs=8, hosts=3)": 1,
    "RemoteVectorEnv(CartPole-v1, num_envs=8, hosts=2)": 1,
    f"(protocol {PROTOCOL_VERSION}), pid 1,": 2,
}

PAGES = [
    page
    for page in examples.collect(ROOT)
    if isinstance(page, examples.Page) and page.runnable_in_cluster
]


def tracked_copy(destination: Path) -> Path:
    """The repository's tracked files (what a clone holds) copied to ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def project_leftovers(project: str) -> list[str]:
    """The containers, volumes and networks of a Compose project still there."""
    label = f"label=com.docker.compose.project={project}"
    left = []
    for kind in (["ps", "-a"], ["volume", "ls"], ["network", "ls"]):
        listed = subprocess.run(
            ["docker", *kind, "-q", "--filter", label], capture_output=True, text=True, check=True
        )
        left += listed.stdout.split()
    return left


def test_the_docs_pages_have_cluster_examples():
    assert [page.name for page in PAGES] == ["docs/deployment/compose.md"]


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(page, id=page.name, marks=pytest.mark.timeout(page.timeout_s + 300))
        for page in PAGES
    ],
)
def test_page_examples_run_on_docker(page, tmp_path):
    project = f"envserver-docs-{uuid.uuid4().hex[:8]}"
    environment = {"COMPOSE_PROJECT_NAME": project, "ENVSERVER_IMAGE": "envserver:cluster-test"}
    if "ENVSERVER_BASE_IMAGE" in os.environ:
        environment["ENVSERVER_BASE_IMAGE"] = os.environ["ENVSERVER_BASE_IMAGE"]
    repository = tracked_copy(tmp_path / "repository")
    # The image of this tree, as the other cluster tests build it (the page's `up` would take
    # any image of that name as it is).
    subprocess.run(
        ["docker", "compose", "build"],
        cwd=repository,
        env={**os.environ, **environment},
        check=True,
        capture_output=True,
        timeout=900,
    )
    run_directory = tmp_path / "run"
    try:
        run = examples.run_page(
            page, run_directory, cluster=True, work_from=repository, environment=environment
        )
    finally:
        files = ["-f", "docker-compose.yml", "-f", "deploy/compose.curve.yml"]
        subprocess.run(
            ["docker", "compose", "-p", project, *files, "down", "-v", "--remove-orphans"],
            cwd=run_directory / "work",
            capture_output=True,
            timeout=300,
        )
    assert run.failure is None, run.failure
    assert run.executed == len(page.runnable_in_cluster)
    # This engine and Compose pair may end `docker compose run` with 0 whatever the command did
    # (docs/deployment/compose.md says so): what each command printed is checked too.
    output = (run_directory / "state" / "output.log").read_text()
    assert "Traceback" not in output, output[-5000:]
    for printed, times in SAID.items():
        assert output.count(printed) == times, (printed, output[-5000:])
    assert project_leftovers(project) == []
