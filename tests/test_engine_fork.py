"""The backend's forked vLLM engine (`cosy.vllm_plugin.serve`): the fork is refused (the engine spawned) when
the server runs other threads or has started torch's OpenMP pool, and the forked engine holds none of the
server's sockets and pipes. Each case in a fresh Python process: the test process's own threads would count.
A real backend's engine: test_backend_server.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HAZARDS = """
import json, os, threading, time
import torch, zmq
from cosy.vllm_plugin.serve import engine_context, fork_hazards, native_threads
startup = set(native_threads())  # once the modules are imported, as the server takes it
out = {"fresh": fork_hazards(startup)}
context = zmq.Context()
context.socket(zmq.PAIR).bind("inproc://a")  # libzmq's I/O threads, as vLLM's sockets start them
deadline = time.monotonic() + 5
while fork_hazards(startup) and time.monotonic() < deadline:  # each names itself once it runs
    time.sleep(0.01)
out["zmq"] = fork_hazards(startup)
out["zmq_context"] = type(engine_context(startup)).__name__
stop = threading.Event()
thread = threading.Thread(target=stop.wait, name="poller")
thread.start()
out["python"] = fork_hazards(startup)
out["python_context"] = engine_context(startup).get_start_method(), os.environ["VLLM_WORKER_MULTIPROC_METHOD"]
stop.set()
thread.join()
out["joined"] = fork_hazards(startup)
torch.set_num_threads(2)
torch.rand(4_000_000).exp().sum()  # a parallel region: libgomp starts its pool
out["torch"] = fork_hazards(startup)
print(json.dumps(out))
"""


@pytest.mark.quick
def test_fork_hazards_are_other_threads_and_torchs_pool_not_zmqs_and_make_the_engine_spawned():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", HAZARDS], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=env)
    got = json.loads(out.stdout.splitlines()[-1]) if out.returncode == 0 else out.stderr
    assert got["fresh"] == got["zmq"] == got["joined"] == [], got
    assert got["python"] == ["Python threads poller are running"], got
    assert got["zmq_context"] == "EngineContext"  # forked, letting go of the server's descriptors
    assert got["python_context"] == ["spawn", "spawn"]  # and vLLM's own later choices told so
    assert "cosy: starting vLLM's engine by spawn, not fork (it imports vLLM and torch again): Python threads " \
        "poller are running" in out.stderr
    assert len(got["torch"]) == 1 and "native thread(s) started since start-up" in got["torch"][0], got


SHEDDING = """
import json, os, signal, socket, sys
from cosy.vllm_plugin.serve import EngineContext

def held():
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out

def engine(path):
    with open(path, "w") as f:
        json.dump({"held": held(), "wakeup": signal.set_wakeup_fd(-1)}, f)

if __name__ == "__main__":
    listener = socket.create_server(("127.0.0.1", 0))
    pipe = os.pipe()
    loop_end, server_end = socket.socketpair()
    server_end.setblocking(False)
    signal.set_wakeup_fd(server_end.fileno())  # as an event loop does
    log = open(sys.argv[2], "w")
    process = EngineContext().Process(target=engine, args=(sys.argv[1],))
    process.start()
    process.join()
    print(json.dumps({"held": held(), "listener": listener.fileno(), "pipe": pipe,
                      "pair": [loop_end.fileno(), server_end.fileno()], "log": log.fileno(),
                      "exit": process.exitcode}))
"""


@pytest.mark.quick
def test_a_forked_engine_lets_go_of_the_servers_sockets_and_pipes(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SHEDDING)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "engine.json"), str(tmp_path / "log")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    server = json.loads(out.stdout)
    engine = json.loads((tmp_path / "engine.json").read_text())
    assert server["exit"] == 0
    mine = {int(fd): target for fd, target in engine["held"].items()}
    theirs = {int(fd): target for fd, target in server["held"].items()}
    for fd in (server["listener"], *server["pipe"], *server["pair"]):
        assert theirs[fd] not in mine.values(), (fd, theirs[fd], mine)  # not under any number
        assert mine[fd] == "/dev/null"  # the number stays taken
    assert mine[server["log"]] == theirs[server["log"]] == str(tmp_path / "log")  # a regular file stays
    assert engine["wakeup"] == -1  # the engine's signals no longer wake the server's loop
