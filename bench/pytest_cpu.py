"""CPU seconds per test: a pytest plugin, and the table it makes. Where `suite_cpu.py` says which kind of
process the suite's CPU goes to, this says which test (with its fixtures' set-up and tear-down) spent it.

    TEST_CPU_OUT=/tmp/cpu PYTHONPATH=bench .venv/bin/python -m pytest -p pytest_cpu -n 2 --dist loadscope
    python bench/pytest_cpu.py /tmp/cpu [--top 40]

Around each test (set-up, call, tear-down) the plugin reads the CPU time (user + system) of its pytest process
and of every process under it: the apps, workers, CLIs and vLLM backends the test or its fixtures start,
including the time of those already ended and waited for. A session backend started by one test is counted
there. Not counted: containers (podman runs them outside the tree) and processes that outlive their parent
(their time is lost, so a test that kills a process tree can read low or below 0). Each pytest-xdist worker
writes its rows to TEST_CPU_OUT/<worker>.json at its end.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

_rows: list[tuple[str, float, float]] = []  # (test id, wall s, CPU s)


def tree_cpu() -> float:
    """CPU seconds of this process and every live one under it, each with its waited-for children."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            c = p.cpu_times()
            total += c.user + c.system + c.children_user + c.children_system
        except psutil.Error:  # ended while listed
            pass
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, cpu = time.monotonic(), tree_cpu()
    yield
    _rows.append((item.nodeid, time.monotonic() - wall, tree_cpu() - cpu))


def pytest_sessionfinish(session):
    out = os.environ.get("TEST_CPU_OUT")
    if out and _rows:
        Path(out).mkdir(parents=True, exist_ok=True)
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(out) / f"{name}.json").write_text(json.dumps(_rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="TEST_CPU_OUT of a run")
    p.add_argument("--top", type=int, default=30, help="how many modules and tests to list")
    args = p.parse_args()
    rows = [(f.stem, *row) for f in sorted(args.folder.glob("*.json")) for row in json.loads(f.read_text())]
    for worker in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == worker]
        print(f"{worker}: {len(mine)} tests, {sum(r[2] for r in mine):.0f} s wall, {sum(r[3] for r in mine):.0f} CPU s")
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for _, test, wall, cpu in rows:
        m = modules[test.split("::")[0]]
        m[0], m[1], m[2] = m[0] + cpu, m[1] + wall, m[2] + 1
    print(f"\n{'CPU s':>7} {'wall s':>7} tests  module")
    for name, (cpu, wall, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{cpu:7.1f} {wall:7.1f} {n:5d}  {name}")
    print(f"\n{'CPU s':>7} {'wall s':>7}  test")
    for _, test, wall, cpu in sorted(rows, key=lambda r: -r[3])[:args.top]:
        print(f"{cpu:7.1f} {wall:7.1f}  {test}")
    print(f"\nall: {sum(r[3] for r in rows):.0f} CPU s in {len(rows)} tests")


if __name__ == "__main__":
    main()
