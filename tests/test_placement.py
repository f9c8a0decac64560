"""Worker placement without a GPU: the devices workers get (round-robin), and the app's private MPS daemon:
its command line and environment, that only the workers get its pipe dir, and that it is told to quit.
The MPS tools are stand-in executables on PATH that record how they were called (no GPU here to run the
real ones); the flags' parsing is the real frontend's."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys

import pytest

from cosy.frontend.server import parse_args
from cosy.service.placement import MpsDaemon, device_of_worker, worker_devices
from cosy.service.workers import EngineSpec, WorkerPool

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


def test_cuda_means_every_visible_gpu_and_workers_take_them_in_turn():
    assert worker_devices("cuda", 3) == ["cuda:0", "cuda:1", "cuda:2"]
    assert worker_devices("cuda:1", 2) == ["cuda:1"]
    assert worker_devices("cuda:0, cuda:2", 4) == ["cuda:0", "cuda:2"]
    assert worker_devices("cpu", 0) == ["cpu"]
    pool = WorkerPool(EngineSpec("m", device="cuda:0,cuda:1", max_batch=2), workers=5)
    assert [pool.worker_spec(i).device for i in range(5)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert pool.worker_spec(3).max_batch == 2 and pool.spec.device == "cuda:0,cuda:1"  # the rest as given
    assert device_of_worker("cpu", 7) == "cpu"


@pytest.mark.parametrize("device,visible,why", [("cuda", 0, "no CUDA device"), ("cuda:2", 2, "not visible"),
                                                 ("gpu0", 1, "not cpu, cuda or cuda:N"),
                                                 ("cpu,cuda:0", 1, "not cpu, cuda or cuda:N")])
def test_bad_devices_are_refused_with_a_reason(device, visible, why):
    with pytest.raises(ValueError, match=why):
        worker_devices(device, visible)


def test_frontend_flags_refuse_a_half_dtype_the_device_cannot_run(capsys):
    args = parse_args(["--device", "cpu", "--dtype", "bfloat16"])
    assert (args.device, args.dtype, args.tf32) == ("cpu", "bfloat16", True)
    assert parse_args(["--device", "cpu", "--no_tf32"]).tf32 is False
    for argv in (["--device", "cpu", "--dtype", "float16"], ["--device", "cuda:15"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
    err = capsys.readouterr().err
    assert "--dtype float16 needs a CUDA device" in err and "--device: cuda:15 is not visible" in err


def _tool(bin_dir, name: str, log, body: str = "") -> None:
    """An executable `name` that appends {argv, env, stdin} as one JSON line to `log`."""
    path = bin_dir / name
    path.write_text(f"""#!{sys.executable}
import json, os, sys
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
with open({str(log)!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv, "stdin": stdin,
                        "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                        "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
{body}
""")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_gpu_tools(tmp_path, monkeypatch):
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    _tool(bin_dir, "nvidia-smi", log, 'print("GPU 0: NVIDIA H200 (UUID: GPU-0)")')
    _tool(bin_dir, "nvidia-cuda-mps-control", log)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_mps_daemon_is_the_apps_own_and_stops_with_it(tmp_path, fake_gpu_tools):
    mps = MpsDaemon(tmp_path / "app-temp" / "mps")
    assert mps.start()
    smi, start = fake_gpu_tools()
    assert smi["argv"][1:] == ["-L"]
    assert start["argv"][1:] == ["-d"]  # the control daemon, pointed at our own dirs
    assert start["pipe"] == str(tmp_path / "app-temp" / "mps" / "pipe") and os.path.isdir(start["pipe"])
    assert start["log"] == str(tmp_path / "app-temp" / "mps" / "log") and os.path.isdir(start["log"])
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ  # this process (and what it starts later) stays outside
    assert mps.env == {"CUDA_MPS_PIPE_DIRECTORY": start["pipe"], "CUDA_MPS_LOG_DIRECTORY": start["log"]}
    mps.stop()
    mps.stop()  # once only
    calls = fake_gpu_tools()
    assert len(calls) == 3 and calls[2]["stdin"] == "quit\n" and calls[2]["pipe"] == start["pipe"]


def test_workers_get_the_mps_env_and_nothing_else_does(tmp_path, fake_gpu_tools):
    """build_service passes the daemon's env into the spec; worker_main applies it before CUDA starts."""
    from cosy.service import process
    mps = MpsDaemon(tmp_path / "mps")
    mps.start()
    pool = WorkerPool(EngineSpec("m", env=mps.env), workers=2)
    assert all(pool.worker_spec(i).env == mps.env for i in range(2))

    class Conn:  # the worker's end of the pipe: it reports the failure to build the engine
        sent = []

        def send(self, msg):
            self.sent.append(msg)

    saved, handlers = dict(os.environ), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGUSR1)}
    try:  # run here, not in a process, to look at the environment it leaves
        process.worker_main(pool.worker_spec(0), Conn())
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == mps.env["CUDA_MPS_PIPE_DIRECTORY"]
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for s, h in handlers.items():
            signal.signal(s, h)
    assert Conn.sent[0][0] == "failed"  # no model "m": the worker said so


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="would start a real MPS daemon")
def test_enable_mps_without_a_gpu_says_so_and_goes_on(tmp_path, capsys):
    assert not MpsDaemon(tmp_path).start()
    assert "--enable_mps: no NVIDIA GPU here; ignored" in capsys.readouterr().err
