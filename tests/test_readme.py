"""The README, as a newcomer meets it: short, and every command in it runs here as written.

The README's commands use the sidecar's default port and socket, which other tests and other checkouts
on this machine may hold. So each runs in a network namespace of its own (``unshare``: a user namespace
mapping this user to root, so no privilege is needed, and a loopback of its own) with ``XDG_RUNTIME_DIR``
pointing at a fresh directory, which moves the default socket. ``make test``, the other set-up command,
is what CI runs (``.ci/run``), which this file cannot run from inside itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require

from tpuscope import catalog
from tpuscope.testing.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 200  # issue 37: the anchors' READMEs fit on a few screens and send the rest to docs
SET_UP = ["make demo", "make test"]  # the brief: exactly two set-up commands, the demo and the tests
EXAMPLE_WORKLOAD = "mlp"  # examples/train.py's Monitor("mlp")
EXAMPLE_STEPS = 200  # the README's TRAIN_STEPS
# `make demo` trains 300 steps and writes a report: about a minute on 2 cores, more beside other tests.
pytestmark = pytest.mark.long


def command_blocks() -> list[list[str]]:
    """The commands of each ```sh block of the README, each without its trailing comment."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", README.read_text(), re.MULTILINE | re.DOTALL)
    return [[re.sub(r"\s+# .*$", "", line) for line in block.splitlines() if line.strip()] for block in blocks]


class Namespace:
    """A network namespace with only a loopback, held open by a sleeping process; commands join it."""

    def __init__(self, home: Path) -> None:
        require("unshare")
        require("nsenter")
        self.holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", "ip link set lo up && exec sleep infinity"],
            stderr=subprocess.PIPE,
        )
        wait_for(
            lambda: self._up() or self.holder.poll() is not None, 30, "self._up() or self.holder.poll() is not None"
        )
        assert self.holder.poll() is None, self.holder.stderr.read() if self.holder.stderr else ""
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # the venv, as activated
            "XDG_RUNTIME_DIR": str(home),
        }

    def _up(self) -> bool:
        """Whether the loopback is up in the holder's namespace (the holder is then asleep)."""
        try:
            cmdline = Path(f"/proc/{self.holder.pid}/cmdline").read_bytes()
        except FileNotFoundError:
            return False
        return cmdline.startswith(b"sleep")

    def command(self, line: str) -> list[str]:
        """``line`` run by bash inside the namespace."""
        nsenter = ["nsenter", f"--target={self.holder.pid}", "--user", "--net", "--preserve-credentials"]
        return [*nsenter, "bash", "-c", line]

    def run(self, line: str, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(line), cwd=ROOT, env={**self.env, **env}, capture_output=True, text=True, timeout=timeout
        )

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def namespace(short_tmp: Path) -> Iterator[Namespace]:
    space = Namespace(short_tmp)
    try:
        yield space
    finally:
        space.close()


def test_the_readme_is_short_and_gives_the_two_set_up_commands_first() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines: move the detail to docs/"
    blocks = command_blocks()
    assert blocks[0] == SET_UP, blocks[0]
    assert len(blocks) == 2, f"a README command block this file does not run: {blocks[2:]}"


def test_make_test_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert SET_UP[1] in ci


def test_make_demo_runs_and_says_where_to_look(namespace: Namespace) -> None:
    demo = namespace.run(SET_UP[0], timeout=600)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "metrics at http://127.0.0.1:9478/metrics" in demo.stdout, demo.stdout[-3000:]
    report = "run/demo/report/index.html"
    assert f"wrote {report}" in demo.stdout and (ROOT / report).is_file()
    assert re.search(rf"^  {catalog.STEPS.name}\{{workload=\"bench\"\}} 300$", demo.stdout, re.MULTILINE)


def test_the_instrumented_loop_runs_next_to_a_sidecar(namespace: Namespace, short_tmp: Path) -> None:
    """The README's second block in order; its ``tpuscope serve &`` is the sidecar started in the background."""
    serve, *rest = command_blocks()[1]
    background = serve.removesuffix(" &")
    assert background != serve, "the block starts the sidecar in the background"
    env = {**namespace.env, "CHECKPOINT_DIR": str(short_tmp / "checkpoints")}  # a rerun would resume, not train
    log = (short_tmp / "serve.log").open("w")
    sidecar = subprocess.Popen(namespace.command(background), cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        # A person types the next line after the sidecar has started; the socket is there once it listens.
        wait_for(
            (short_tmp / "tpuscope.sock").exists,
            60,
            '(short_tmp / "tpuscope.sock").exists',
            detail=lambda: (short_tmp / "serve.log").read_text(),
        )
        outputs = []
        for line in rest:
            done = subprocess.run(
                namespace.command(line), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            outputs.append(done.stdout)
    finally:
        sidecar.kill()  # SIGTERM would serve on for a final scrape, which nothing here makes (docs/sidecar.md)
        sidecar.wait(timeout=60)
        log.close()
    train, curl, top = outputs
    assert f"step {EXAMPLE_STEPS}: loss" in train, train
    steps = [line for line in curl.splitlines() if line.startswith(f"{catalog.STEPS.name}{{")]
    assert len(steps) == 1 and steps[0].endswith(f" {EXAMPLE_STEPS}.0"), curl
    assert any(line.startswith(f"│ {EXAMPLE_WORKLOAD} ") for line in top.splitlines()), top


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_link_between_the_pages_resolves() -> None:
    """The README's and the docs' relative links (the README's detail moved to docs/) reach a file and heading."""
    pages = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
