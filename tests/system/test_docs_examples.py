"""Every Python and shell example of README.md and docs/**/*.md runs, page by page, as written
(tests/harness/markdown_examples.py; its docstring has the directives a page may carry); and the
runner fails where an example fails, and leaves no process behind."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import markdown_examples as examples
import pytest
from helpers import ROOT, alive

COLLECTED = examples.collect(ROOT)


def page_params() -> list:
    """A test per page that runs something (or cannot be read), in its own xdist group: the
    pages spread over make test's workers."""
    params = []
    for page in COLLECTED:
        if isinstance(page, examples.PageError):
            params.append(pytest.param(page, id=page.name))
        elif page.runnable:
            marks = [
                pytest.mark.timeout(page.timeout_s + 60),
                pytest.mark.xdist_group(f"docs-examples:{page.name}"),
            ]
            params.append(pytest.param(page, id=page.name, marks=marks))
    return params


SKIPPED = [
    pytest.param(block, id=block.where)
    for page in COLLECTED
    if isinstance(page, examples.Page)
    for block in page.skipped
]


@pytest.mark.long  # every page's programs: `make test-long` (CI) runs them
@pytest.mark.parametrize("page", page_params())
def test_page_examples_run(page, tmp_path):
    if isinstance(page, examples.PageError):
        pytest.fail(str(page), pytrace=False)
    run = examples.run_page(page, tmp_path)
    if run.failure is not None:
        pytest.fail(run.failure, pytrace=False)
    assert run.executed == len(page.runnable)


@pytest.mark.long
@pytest.mark.parametrize("block", SKIPPED)
def test_skipped_example(block):
    pytest.skip(f"{block.where}: {block.not_run_because}")


def test_a_cluster_block_is_left_to_the_cluster_test_which_runs_it_in_a_copy(tmp_path):
    page = write_page(
        tmp_path,
        """
        <!-- test: cluster -->
        ```sh
        cat compose.yml > seen.txt
        echo "$WHERE" >> seen.txt
        ```
        """,
    )
    assert page.runnable == []
    assert [b.not_run_because for b in page.skipped] == [examples.CLUSTER_REASON]
    repository = tmp_path / "repository"
    repository.mkdir()
    (repository / "compose.yml").write_text("services: {}\n")
    run = examples.run_page(
        page,
        tmp_path / "run",
        cluster=True,
        work_from=repository,
        environment={"WHERE": "in the cluster test"},
    )
    assert run.failure is None
    assert run.executed == len(page.runnable_in_cluster) == 1
    seen = (tmp_path / "run" / "work" / "seen.txt").read_text()
    assert seen == "services: {}\nin the cluster test\n"


def test_the_readme_and_every_docs_page_are_read():
    names = [page.name for page in COLLECTED]
    assert names[0] == "README.md"
    assert names[1:] == sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/**/*.md"))
    assert "docs/index.md" in names


# --------------------------------------------------------------------- the runner itself


def write_page(directory: Path, text: str, name: str = "page.md") -> examples.Page:
    path = directory / "docs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return examples.parse_page(path, directory)


def run(tmp_path: Path, text: str, **kwargs) -> tuple[examples.Page, examples.PageRun]:
    page = write_page(tmp_path, text)
    return page, examples.run_page(page, tmp_path / "run", **kwargs)


def test_reads_the_blocks_and_directives_as_the_site_shows_them(tmp_path):
    page = write_page(
        tmp_path,
        """
        <!-- test: replace "sim a:5555" 127.0.0.1:{port+3} -->
        <!-- test: timeout 30 -->

        ```python title="myenvs.py"
        X = 1
        ```

        <!-- test: skip needs Docker -->

        ```sh
        docker compose up
        ```

        ````markdown
        ```python
        not an example: inside a four-backtick fence
        ```
        ````

        ```
        a bare fence
        ```

        ```text
        console output
        ```

        1. In a list:

            ```py
            print("sim a:5555")
            ```

        <!-- test: background -->
        ```bash
        envserver serve
        ```
        """,
    )
    assert page.timeout_s == 30
    assert page.replacements == (("sim a:5555", "127.0.0.1:{port+3}"),)
    assert [(b.line, b.language, b.title, b.skip, b.background) for b in page.blocks] == [
        (4, "python", "myenvs.py", None, False),
        (10, "shell", None, "needs Docker", False),
        (30, "python", None, None, False),
        (35, "shell", None, None, True),
    ]
    assert [b.line for b in page.runnable] == [30, 35]
    assert page.blocks[2].code == 'print("sim a:5555")\n'  # the list's indentation taken off
    (block,) = [b for b in examples.prepared_blocks(page, 40000) if b.line == 30]
    assert block.code == 'print("127.0.0.1:40003")\n'


@pytest.mark.parametrize(
    "text, error",
    [
        ("<!-- test: skip because -->\n\nSome prose.\n\n```sh\ntrue\n```\n", "not right before"),
        ("<!-- test: skip because -->\n```yaml\na: 1\n```\n", "```yaml block, which never runs"),
        ("<!-- test: skip -->\n```sh\ntrue\n```\n", "needs a reason"),
        ("<!-- test: background -->\n```python\npass\n```\n", "before a shell block"),
        ("<!-- test: skipp typo -->\n```sh\ntrue\n```\n", "unknown directive 'skipp'"),
        ("<!-- test: skip\nover two lines -->\n```sh\ntrue\n```\n", "malformed directive"),
        ("<!-- test: replace nowhere x -->\n```sh\ntrue\n```\n", "finds 'nowhere' in no"),
        ("<!-- test: replace true 1:{port+32} -->\n```sh\ntrue\n```\n", "{port+32} is not"),
        ("<!-- test: replace true -->\n```sh\ntrue\n```\n", "takes OLD and NEW"),
        ("<!-- test: timeout soon -->\n```sh\ntrue\n```\n", "a number of seconds"),
        ('```python title="../x.py"\npass\n```\n', "not a relative file name"),
        ("```sh\ntrue\n", "never closed"),
    ],
)
def test_a_directive_or_fence_that_cannot_work_is_an_error_of_the_page(tmp_path, text, error):
    with pytest.raises(examples.PageError, match=r"^docs/page\.md:\d+: ") as raised:
        write_page(tmp_path, text)
    assert error in str(raised.value)


def test_a_failing_python_block_fails_the_page_at_its_line_in_the_markdown(tmp_path):
    page, result = run(
        tmp_path,
        """
        # A page

        ```python
        numbers = [1, 2]
        ```

        Then:

        ```python
        total = sum(numbers)
        ratio = total / 0
        ```

        ```sh
        touch never-made
        ```
        """,
    )
    assert result.executed == 1
    assert result.failure.startswith("docs/page.md:9: the python block failed:")
    assert f'File "{page.path}", line 11, in <module>' in result.failure
    assert "ratio = total / 0" in result.failure  # the page's own line, quoted by the traceback
    assert "ZeroDivisionError: division by zero" in result.failure
    assert not (tmp_path / "run" / "work" / "never-made").exists()


@pytest.mark.parametrize(
    "code",
    ["echo said before; exit 3", "false | true", 'echo "$NOT_SET_ANYWHERE"', "false\necho after"],
    ids=["exit-status", "pipefail", "nounset", "errexit"],
)
def test_a_failing_shell_block_fails_the_page(tmp_path, code):
    _, result = run(tmp_path, f"```python\npass\n```\n\n```bash\n{code}\n```\n")
    assert result.executed == 1
    assert result.failure.startswith("docs/page.md:5: the shell block failed:"), result.failure
    assert "bash exited with status" in result.failure
    assert "after" not in result.failure.split("its output:")[1]
    if code.startswith("echo said"):
        assert "bash exited with status 3; its output:\n  said before" in result.failure


def test_a_skipped_block_does_not_run_and_says_why(tmp_path):
    page, result = run(
        tmp_path,
        """
        <!-- test: skip needs a GPU -->

        ```python
        raise SystemExit(1)
        ```

        ```python
        ran = True
        ```
        """,
    )
    assert [(b.where, b.skip) for b in page.skipped] == [("docs/page.md:3", "needs a GPU")]
    assert (result.failure, result.executed) == (None, 1)


def test_a_port_given_by_one_replacement_is_not_taken_for_a_later_ones_old(tmp_path):
    """docs/guides/dns.md's two replacements, with the port CI once drew: 5555 -> 25556 must not
    become 225557 when 5556 -> 25557 follows (they are made in one pass)."""
    page = write_page(
        tmp_path,
        """
        <!-- test: replace 5555 {port} -->
        <!-- test: replace 5556 {port+1} -->

        ```python
        hosts = ["dns://localhost:5555", "tcp://127.0.0.1:5556"]
        ```
        """,
    )
    (block,) = examples.prepared_blocks(page, 25556)
    assert block.code == 'hosts = ["dns://localhost:25556", "tcp://127.0.0.1:25557"]\n'


def test_replacements_give_free_ports_and_blocks_share_a_namespace(tmp_path):
    _, result = run(
        tmp_path,
        """
        <!-- test: replace tcp://sim-a:5555 tcp://127.0.0.1:{port} -->
        <!-- test: replace sim-b:5555 127.0.0.1:{port+1} -->
        <!-- test: replace "hello world" "bye now" -->

        ```python
        hosts = ["tcp://sim-a:5555", "tcp://sim-b:5555"]
        ```

        ```python
        import json, socket
        ports = [int(host.rsplit(":", 1)[1]) for host in hosts]
        for port in ports:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))  # free
        json.dump({"hosts": hosts, "ports": ports, "said": "hello world"}, open("out.json", "w"))
        ```
        """,
    )
    assert result.failure is None, result.failure
    written = json.loads((tmp_path / "run" / "work" / "out.json").read_text())
    port = result.port
    assert written == {
        "hosts": [f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"],
        "ports": [port, port + 1],
        "said": "bye now",
    }


def test_a_titled_block_is_written_for_later_blocks_in_a_clean_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSERVER_HOSTS", "tcp://nowhere.invalid:1")
    _, result = run(
        tmp_path,
        """
        ```python
        import myenvs  # written before any block runs
        assert myenvs.ANSWER == 42
        assert "ANSWER" not in globals()  # written, not run
        ```

        ```python title="myenvs.py"
        ANSWER = 42
        ```

        ```sh
        test "$(python -c "import myenvs; print(myenvs.ANSWER)")" = 42
        test "$(command -v envserver)" = "$(dirname "$(command -v python)")/envserver"
        test -z "${ENVSERVER_HOSTS:-}" && test "$MPLBACKEND" = Agg
        ```

        ```python
        import importlib.util, os, sys
        assert "ENVSERVER_HOSTS" not in os.environ
        for module in ("helpers", "markdown_examples", "chaos_envs", "tests"):
            assert importlib.util.find_spec(module) is None, module  # not the repository's
        import envserver  # the installed package
        ```
        """,
    )
    assert result.failure is None, result.failure
    assert result.executed == 3


def test_a_background_host_serves_later_blocks_and_is_gone_after_the_page(tmp_path):
    _, result = run(
        tmp_path,
        """
        <!-- test: replace 5555 {port} -->
        <!-- test: replace 5556 {port+1} -->

        <!-- test: background -->
        ```sh
        envserver serve --bind tcp://127.0.0.1:5555 --processes 2
        ```

        ```python
        from envserver import client

        envs = client.make_vec("CartPole-v1", num_envs=2, hosts=["tcp://127.0.0.1:5555"])
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
        envs.close()
        ```

        ```sh
        envserver ping tcp://127.0.0.1:5555 tcp://127.0.0.1:5556 --json > answers.json
        ```
        """,
    )
    assert result.failure is None, result.failure
    answers = json.loads((tmp_path / "run" / "work" / "answers.json").read_text())
    pids = [answer["pid"] for answer in answers]  # the two hosts the parent forked
    assert len(set(pids)) == 2
    assert not [pid for pid in [*pids, *result.background_pids] if alive(pid)]


def test_a_background_block_that_failed_fails_the_page_with_its_output(tmp_path):
    _, result = run(
        tmp_path,
        """
        <!-- test: background -->
        ```sh
        echo $$ > background.pid
        echo "cannot start: port taken" >&2
        exit 3
        ```

        ```python
        import time

        def ended():  # the block's shell: a zombie until the runner reaps it at the page's end
            try:
                pid = int(open("background.pid").read())
            except (OSError, ValueError):
                return False
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"

        deadline = time.monotonic() + 60
        while not ended():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ```
        """,
    )
    assert result.executed == 2
    assert "docs/page.md:2: the background block exited with status 3" in result.failure
    assert "cannot start: port taken" in result.failure


def test_a_page_past_its_timeout_fails_where_it_hung_and_leaves_nothing_running(tmp_path):
    _, result = run(
        tmp_path,
        """
        <!-- test: timeout 3 -->

        <!-- test: background -->
        ```sh
        tail -f /dev/null
        ```

        ```python
        import threading
        threading.Event().wait()
        ```
        """,
    )
    assert "docs/page.md: timed out after 3 s" in result.failure
    assert "docs/page.md:8: the python block failed (interrupted at the page's timeout)" in (
        result.failure
    )
    assert "line 10, in <module>" in result.failure
    assert not [pid for pid in result.background_pids if alive(pid)]


def test_processes_an_example_leaves_behind_fail_the_page_and_are_killed(tmp_path):
    _, result = run(
        tmp_path,
        """
        ```sh
        tail -f /dev/null > /dev/null 2>&1 &
        echo $! > detached.pid
        ```

        ```python
        import subprocess
        own_session = subprocess.Popen(["tail", "-f", "/dev/null"], start_new_session=True)
        open("own-session.pid", "w").write(str(own_session.pid))
        ```
        """,
        leftover_grace_s=1.0,
    )
    work = tmp_path / "run" / "work"
    pids = [int((work / name).read_text()) for name in ("detached.pid", "own-session.pid")]
    assert "processes still running after the page (killed)" in result.failure
    for pid in pids:
        assert f"pid {pid}: tail -f /dev/null" in result.failure
    assert not [pid for pid in pids if alive(pid)]
