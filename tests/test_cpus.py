"""CPU budgets (`--cpus` of app.py and launch/backend.py, `cosy.deploy.cpus`): lists, pinning a real app and
its workers, the backend's OpenMP binding, how idle OpenMP threads wait, and clear errors."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from servers import App

from cosy.deploy.backend import Child, parse_args, vllm_command
from cosy.deploy.cpus import (
    OPENMP_WAIT_VARS,
    format_cpus,
    parse_cpus,
    priority_refusal,
    sleep_idle_threads,
    usable_cores,
    worker_threads,
)
from cosy.service.workers import EngineSpec, WorkerPool

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_lists_parse_and_format():
    assert parse_cpus("0-2,5") == [0, 1, 2, 5] == parse_cpus(" 5, 0-2,1")
    assert format_cpus([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8" and format_cpus([3]) == "3"
    for bad, words in (("a", "'a' is not a number"), ("3-1", "not an ascending range"), ("0,,1", "empty item"),
                       ("-1", "is not a number")):
        with pytest.raises(ValueError, match=words):
            parse_cpus(bad)


@pytest.mark.quick
def test_workers_share_omp_num_threads_else_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker_threads(1) == usable_cores() and worker_threads(10**6) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # the operator's total (a container platform's CPU limit)
    assert (worker_threads(1), worker_threads(2), worker_threads(3), worker_threads(16)) == (8, 4, 2, 1)
    for junk in ("", "0", "-2", "two"):
        monkeypatch.setenv("OMP_NUM_THREADS", junk)
        assert worker_threads(1) == usable_cores()


def test_each_worker_process_gets_its_share_of_omp_num_threads(tiny_model_dir, monkeypatch):
    """OMP_NUM_THREADS is the total of a frontend's workers: each is started with its share in its environment
    (its OpenMP and OpenBLAS size their pools from it as they load), as are OPENBLAS_NUM_THREADS and
    MKL_NUM_THREADS where set; the frontend's own environment keeps the operator's values."""
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setenv("MKL_NUM_THREADS", "6")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    pool = WorkerPool(EngineSpec(str(tiny_model_dir)), workers=2).start()
    try:
        workers = psutil.Process().children()
        envs = [w.environ() for w in workers if "spawn_main" in " ".join(w.cmdline())]
        assert len(envs) == 2
        assert [(e.get("OMP_NUM_THREADS"), e.get("MKL_NUM_THREADS"), e.get("OPENBLAS_NUM_THREADS")) for e in envs] \
            == [("2", "3", None)] * 2
        assert [pool.worker_spec(i).threads for i in range(2)] == [2, 2]
    finally:
        pool.close()
    assert (os.environ["OMP_NUM_THREADS"], os.environ["MKL_NUM_THREADS"]) == ("4", "6")


@pytest.mark.quick
def test_onnx_sessions_take_half_of_this_processs_torch_threads():
    """A worker's ONNX sessions (prompt encoding) follow its share of the cores (`torch.set_num_threads`, set
    from `worker_threads` before its engine is built), not the machine's: N workers would each take half."""
    import torch

    from cosy.prompt.onnx_models import default_threads
    before = torch.get_num_threads()
    try:
        got = []
        for n in (1, 2, 6, 16):
            torch.set_num_threads(n)
            got.append(default_threads())
        assert got == [1, 1, 3, 4]
    finally:
        torch.set_num_threads(before)


@pytest.mark.quick
def test_idle_openmp_threads_sleep_unless_the_operator_chose_how_they_wait():
    env = {"PATH": "/bin"}
    sleep_idle_threads(env)
    assert env == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    for name, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "10000"), ("KMP_BLOCKTIME", "5")):
        env = {name: value}
        sleep_idle_threads(env)
        assert env == {name: value}


@pytest.mark.quick
def test_a_frontends_workers_share_their_cores_with_an_embedded_lm_or_a_backend_on_this_machine():
    def shares(url: str | None, split: str = "auto") -> bool:
        spec = EngineSpec(model_dir="unused", llm_base_url=url, llm_split_first_chunk=split)
        return WorkerPool(spec).lm_shares_the_cores()

    assert shares(None) and shares("")  # the LM in each worker, beside the flow's threads
    assert shares("http://127.0.0.1:8000/v1") and shares("http://localhost:8000/v1,http://[::1]:8001/v1")
    assert not shares("http://192.0.2.7:8000/v1")  # a backend elsewhere: the cores are the flow's
    assert shares("http://192.0.2.7:8000/v1", "on")  # compose on one host: the operator says so
    assert shares("http://127.0.0.1:8000/v1", "off")  # split or not, the backend computes on these cores


def test_pin_restricts_the_process_and_names_missing_cpus():
    first = min(os.sched_getaffinity(0))
    code = ("import os, sys; from cosy.deploy.cpus import pin, usable_cores; pin(sys.argv[1]); "
            "print(sorted(os.sched_getaffinity(0)), usable_cores())")
    out = subprocess.run([sys.executable, "-c", code, str(first)], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.split() == [f"[{first}]", "1"], out.stderr
    out = subprocess.run([sys.executable, "-c", code, "4096"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "CPU(s) 4096 are not available here" in out.stderr


@pytest.mark.quick
def test_backend_binds_vllm_openmp_to_its_cpus(tmp_path, monkeypatch):
    for name in OPENMP_WAIT_VARS:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    args, extra = parse_args(["--model_dir", str(tmp_path), "--no_api_key", "--cpus", "1,0"])
    env = vllm_command(args, tmp_path, "m", False, extra)[1]
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "OMP_WAIT_POLICY" not in env  # cores of its own: its threads spin between regions (libgomp's way)
    for sharing in (["--nice", "5"], ["--host", "127.0.0.1"], ["--host", "localhost"]):  # with its frontends
        args, extra = parse_args(["--model_dir", str(tmp_path), "--no_api_key", "--cpus", "1,0", *sharing])
        env = vllm_command(args, tmp_path, "m", False, extra)[1]
        assert env["OMP_WAIT_POLICY"] == "PASSIVE", sharing  # its idle threads leave them the cores
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")  # the operator's choice stays
    env = vllm_command(args, tmp_path, "m", False, extra)[1]
    assert env["GOMP_SPINCOUNT"] == "10000" and "OMP_WAIT_POLICY" not in env
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the model in the engine's process, one process fewer
    args, extra = parse_args(["--model_dir", str(tmp_path), "--no_api_key"])
    assert vllm_command(args, tmp_path, "m", False, extra)[1].get("VLLM_CPU_OMP_THREADS_BIND") == \
        os.environ.get("VLLM_CPU_OMP_THREADS_BIND")  # not given: vLLM's own (auto) binding
    with pytest.raises(SystemExit):
        parse_args(["--model_dir", str(tmp_path), "--no_api_key", "--cpus", "x"])


AUTOGROUP = Path("/proc/self/autogroup")
SHOW_PRIORITY = ("import os; a = open('/proc/self/autogroup').read().split()[-1] "
                 "if os.path.exists('/proc/self/autogroup') else '-'; "
                 "print(os.nice(0), a, os.getsid(0) == os.getpid())")


def test_backend_nice_lowers_vllm_against_other_sessions(tmp_path):
    """--nice reaches vLLM's server in its own session twice: its nice value and its session's autogroup
    (with autogroups a plain `nice` only orders processes within one session)."""
    child = Child([sys.executable, "-c", SHOW_PRIORITY], dict(os.environ), nice=19)
    assert child.returncode() == 0
    nice, group, own_session = " ".join(child.tail).split()
    assert (nice, own_session) == ("19", "True")
    assert group == ("19" if AUTOGROUP.exists() else "-")
    if AUTOGROUP.exists():  # what `nice -n 19 python launch/backend.py` gave vLLM: a new session at 0
        out = subprocess.run(["nice", "-n", "19", sys.executable, "-c", SHOW_PRIORITY], capture_output=True,
                             text=True, start_new_session=True)
        assert out.stdout.split() == ["19", "0", "True"], out.stderr
    args, _ = parse_args(["--model_dir", str(tmp_path), "--no_api_key", "--nice", "19"])
    assert args.nice == 19
    for bad in ("20", "-1"):
        with pytest.raises(SystemExit):
            parse_args(["--model_dir", str(tmp_path), "--no_api_key", "--nice", bad])


# a backend that may not raise priorities (no CAP_SYS_NICE: what a non-root user has), started at nice 10
NO_RAISING = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", "nice", "-n", "10"]
ASK_NICE_5 = """
import os, subprocess, sys
from cosy.deploy.backend import Child, parse_args
try:
    parse_args(["--model_dir", ".", "--no_api_key", "--nice", "5"])
    print("parse_args: accepted")
except SystemExit as e:
    print("parse_args: exit", e.code)
try:
    Child([sys.executable, "-c", "pass"], dict(os.environ), nice=5).returncode()
    print("Child: started")
except (ValueError, subprocess.SubprocessError) as e:
    print("Child:", type(e).__name__, e)
"""


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs util-linux's setpriv")
def test_backend_nice_below_its_own_is_refused_with_the_reason():
    """--nice lower than the backend's own nice value would raise vLLM's priority, which Linux allows only
    with CAP_SYS_NICE (root) or RLIMIT_NICE: refused before anything starts, saying so, not with "Exception
    occurred in preexec_fn" from the child."""
    out = subprocess.run([*NO_RAISING, sys.executable, "-c", ASK_NICE_5], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.splitlines()[0] == "parse_args: exit 2", out.stdout + out.stderr
    assert "--nice 5: this process runs at nice 10" in out.stderr and "CAP_SYS_NICE" in out.stderr, out.stderr
    assert out.stdout.splitlines()[1].startswith("Child: ValueError nice 5: this process runs at nice 10"), out.stdout


@pytest.mark.quick
def test_priority_refusal_names_the_rule():
    assert priority_refusal(5, current=0, lowest=20) is None  # lowering a priority is always allowed
    assert priority_refusal(10, current=10, lowest=20) is None  # and keeping it
    assert priority_refusal(5, current=10, lowest=-20) is None  # CAP_SYS_NICE (root)
    assert priority_refusal(5, current=10, lowest=5) is None  # RLIMIT_NICE 15 (ulimit -e 15)
    why = priority_refusal(5, current=10, lowest=20)
    assert why.startswith("nice 5: this process runs at nice 10") and "ulimit -e" in why and "10 or more" in why
    assert priority_refusal(2, current=10, lowest=6).endswith("ask for 6 or more, or start it at nice 2 or below")


def test_app_and_its_workers_run_on_the_given_cpus(tiny_model_dir, tmp_path):
    cpu = str(min(os.sched_getaffinity(0)))
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(tmp_path / "data"), "--cpus", cpu)
    try:
        app.wait()
        procs = [psutil.Process(app.proc.pid), *psutil.Process(app.proc.pid).children(recursive=True)]
        assert len(procs) >= 2  # the app and at least its worker
        assert {tuple(p.cpu_affinity()) for p in procs} == {(int(cpu),)}
        # each worker's OpenMP loaded with idle threads asleep, off the cores the LM thread or a backend needs
        workers = [p for p in procs if "spawn_main" in " ".join(p.cmdline())]
        assert workers and all(p.environ().get("OMP_WAIT_POLICY") == "PASSIVE" for p in workers)
        assert any(f"running on CPUs {cpu} (1 cores)" in line for line in app.lines)
    finally:
        app.stop()
    bad = subprocess.run([sys.executable, str(ROOT / "app.py"), "--model_dir", str(tiny_model_dir), "--cpus", "4096"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "CPU(s) 4096 are not available here" in bad.stderr
