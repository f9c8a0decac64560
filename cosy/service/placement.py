"""Where a frontend's workers run: their devices (round-robin over GPUs) and an optional private CUDA MPS daemon.

`--device` names one device or several: `cpu`, `cuda` (every visible GPU, `CUDA_VISIBLE_DEVICES` applies),
`cuda:1`, or `cuda:0,cuda:2`; worker i runs on the (i mod n)-th (a restarted worker keeps its device).

MPS (`--enable_mps`) is per app, not host-wide: the control daemon is started with its own pipe and log
directories under the app's temp dir, and only the workers get `CUDA_MPS_PIPE_DIRECTORY` /
`CUDA_MPS_LOG_DIRECTORY` (through `EngineSpec.env`). A CUDA process that starts without them (the LM
backend, another app, a later job) looks for a daemon in the default /tmp/nvidia-mps, finds none, and runs
without MPS, as the driver does when it cannot connect. The daemon is told to quit when the app stops.
The GPU must be in the Default compute mode (MPS servers and plain CUDA processes side by side); a host
that wants every process under one MPS daemon sets that up itself and leaves `--enable_mps` off.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

MPS_CONTROL = "nvidia-cuda-mps-control"


def worker_devices(device: str, visible_gpus: int) -> list[str]:
    """`--device` -> the devices workers take in turn. ValueError (a message for the user) if malformed
    or naming a GPU that is not visible."""
    names = [d.strip() for d in device.split(",") if d.strip()]
    if names == ["cpu"]:
        return names
    if names == ["cuda"]:
        if visible_gpus < 1:
            raise ValueError("--device cuda: no CUDA device is visible")
        return [f"cuda:{i}" for i in range(visible_gpus)]
    out = []
    for name in names:
        kind, _, index = name.partition(":")
        if kind != "cuda" or not index.isdigit():
            raise ValueError(f"--device: {name!r} is not cpu, cuda or cuda:N (several: cuda:0,cuda:1)")
        if int(index) >= visible_gpus:
            raise ValueError(f"--device: {name} is not visible ({visible_gpus} CUDA device(s))")
        out.append(f"cuda:{int(index)}")
    if not out:
        raise ValueError("--device is empty")
    return out


def device_of_worker(devices: str, index: int) -> str:
    """Worker `index`'s device from a comma-separated list (`EngineSpec.device` of the pool)."""
    names = devices.split(",")
    return names[index % len(names)]


class MpsDaemon:
    """A CUDA MPS control daemon private to this app: pipe and log dirs under `root`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.pipe_dir, self.log_dir = self.root / "pipe", self.root / "log"
        self.running = False

    @property
    def env(self) -> dict[str, str]:
        """What the workers need to join this daemon (and only they get)."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run([MPS_CONTROL, *args], input=stdin, capture_output=True, text=True, timeout=30,
                                  env={**os.environ, **self.env})
        except (OSError, subprocess.TimeoutExpired):
            return None

    def start(self) -> bool:
        """Start the daemon (`nvidia-cuda-mps-control -d` with our dirs); False, having said why, if it cannot."""
        smi = _run_quiet("nvidia-smi", "-L")
        if smi is None or smi.returncode != 0 or "GPU" not in smi.stdout:
            _say("--enable_mps: no NVIDIA GPU here; ignored")
            return False
        if not shutil.which(MPS_CONTROL):
            _say(f"--enable_mps: {MPS_CONTROL} not found (install the CUDA MPS tools); ignored")
            return False
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = self._run("-d")
        if started is None or started.returncode != 0:
            why = (started.stderr or started.stdout).strip() if started else "did not run"
            _say(f"--enable_mps: could not start the MPS daemon ({why}); continuing without it")
            return False
        self.running = True
        _say(f"started a CUDA MPS daemon for the workers (pipes in {self.pipe_dir}); it stops with the app")
        return True

    def stop(self) -> None:
        """Tell the daemon to quit (it ends its server once the workers are gone). Safe to call twice."""
        if self.running:
            self.running = False
            self._run(stdin="quit\n")


def _run_quiet(*cmd: str) -> subprocess.CompletedProcess | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
