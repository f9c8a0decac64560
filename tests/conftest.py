"""Shared fixtures: the golden data copied into the repo, and random model directories built on demand."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden"
GOLDEN_CV3 = FIXTURES / "golden-cv3"
STATE_DICT_LIST = FIXTURES / "cosyvoice2-state-dict.txt"
STATE_DICT_LIST_CV3 = FIXTURES / "cosyvoice3-state-dict.txt"
ASSETS = Path(__file__).parent.parent / "assets"


# Where the run's processes (this one, the xdist workers, every server they start) write what is not a test's
# own tmp_path: temp files (vLLM's sockets, gradio, the frontends' temp roots, inductor's cache, Chromium's
# profile, mmdebstrap), the user caches (pip, vLLM, hub libraries) and cosy's llm.pt export cache. All of it lies
# under the run's basetemp, which pytest removes when the run passes (tmp_path_retention_policy = "failed"
# in pyproject.toml) and keeps for three runs when it fails: nothing piles up from run to run.
SANDBOX_ENV = {"TMPDIR": "tmp", "XDG_CACHE_HOME": "cache", "COSY_CACHE": "cache/cosy",
               "VLLM_CONFIG_ROOT": "config/vllm", "PIP_CACHE_DIR": "cache/pip"}


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin has set up
def pytest_configure(config):
    """Point SANDBOX_ENV into the basetemp, once, in the first process (workers inherit it)."""
    if os.environ.get("COSY_TEST_SANDBOX") or hasattr(config, "workerinput"):
        return
    root = config._tmp_path_factory.getbasetemp() / "sandbox"
    for name, sub in SANDBOX_ENV.items():
        (root / sub).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(root / sub)
    os.environ["COSY_TEST_SANDBOX"] = str(root)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    # pytest-xdist's workers share the cores: each one's torch (and the CLIs it runs) gets its share of them.
    # Two workers of two OpenMP threads each on two cores spin at every parallel region's barrier: the quick
    # tier took 217 s that way, 76 s with one thread each (same machine, one after the other)
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // workers)))


def reference_entries(section: str, path: Path = STATE_DICT_LIST) -> list[tuple[str, tuple[int, ...], str]]:
    """(key, shape, dtype) in file order for one section ('llm', 'flow', 'hift') of the official list
    (`path`: CosyVoice2's by default, STATE_DICT_LIST_CV3 for CosyVoice3)."""
    out, current = [], None
    for line in path.read_text().splitlines():
        if line.startswith("###"):
            current = line.split()[1]
        elif current == section and line.strip() and not line.startswith("#"):
            key, dims, dtype = re.fullmatch(r"(\S+) \(([\d, ]*)\) (\S+)", line.strip()).groups()
            out.append((key, tuple(int(d) for d in dims.split(",") if d.strip()), dtype))
    return out


def reference_shapes(section: str, path: Path = STATE_DICT_LIST) -> dict[str, tuple[int, ...]]:
    return {key: shape for key, shape, _ in reference_entries(section, path)}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from cosy.verify.random_model import write_random_model
    return write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=1)


@pytest.fixture(scope="session")
def tiny_cv3_model_dir(tmp_path_factory) -> Path:
    """A tiny random CosyVoice3 directory from our builder (`python -m cosy.random_model --family cosyvoice3`)."""
    from cosy.verify.random_model import write_random_model
    return write_random_model(tmp_path_factory.mktemp("tiny_cv3"), "tiny", seed=2, family="cosyvoice3")


@pytest.fixture(scope="session")
def full_model_dir(tmp_path_factory) -> Path:
    from cosy.verify.random_model import write_random_model
    return write_random_model(tmp_path_factory.mktemp("full"), "full", seed=0)


# Bias of the peaked model's LM head (its llm_decoder weight zeroed): every step has this distribution; the
# largest logit is eos (6561), masked while min_len holds (tests/test_backend_server.py's RAS test)
PEAKED_BIAS = {10: 4.5, 20: 4.3, 30: 4.1, 40: 3.9, 50: 3.7, 60: 3.5, 70: 3.3, 80: 3.1, 6561: 9.0}


def assert_pool_equals_solo(spec, requests: list, solo_engine, prepare=None) -> None:
    """Every request through a one-worker pool of `spec`, all at once (a thread each): each one's audio equals
    `solo_engine`'s for it alone (float rounding: 1e-4). `prepare`: the worker's prepare hook."""
    import numpy as np

    from cosy.service.workers import WorkerPool
    solo = [np.concatenate([c.numpy() for c in solo_engine.synthesize(r)]) for r in requests]
    pool = WorkerPool(spec, workers=1)
    pool.worker_prepare = prepare
    pool.start()
    try:
        got: dict = {}

        def run(i: int, r) -> None:
            got[i] = np.concatenate(list(pool.synthesize(r)))
        threads = [threading.Thread(target=run, args=(i, r)) for i, r in enumerate(requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i in range(len(requests)):
            assert got[i].shape == solo[i].shape and np.abs(got[i] - solo[i]).max() < 1e-4, i
    finally:
        pool.close()


def finalizers_inside(make_garbage, call, within: float) -> bool:
    """Whether `call()` survives the garbage collector finalizing `make_garbage()`'s cycle inside it: for each
    threshold 1..29 a fresh cycle is made with the collector off, then the collector turned on at that
    threshold lands its collection on one of `call`'s allocations (a lock `call` holds while a finalizer
    wants it hangs the thread). Runs on a daemon thread; False if it has not finished within `within` s."""
    import gc
    threshold = gc.get_threshold()

    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            for k in range(1, 30):
                gc.collect(0)
                gc.disable()
                make_garbage()
                gc.set_threshold(k)
                gc.enable()
                call()
            gc.set_threshold(*threshold)
            gc.collect()
        except BaseException as e:  # raised again in the test's thread
            errors.append(e)

    worker = threading.Thread(target=sweep, daemon=True)
    try:
        worker.start()
        worker.join(within)
    finally:
        gc.set_threshold(*threshold)
        gc.enable()
    if errors:
        raise errors[0]
    return not worker.is_alive()


def copy_lm_files(src: Path, dst: Path) -> Path:
    """A model dir at `dst` with only what the backend reads from `src` (the yaml, llm.pt, the Qwen dir)."""
    import shutil

    from cosy.model.files import LLM, QWEN_DIR, YAML
    dst.mkdir(exist_ok=True)
    for name in (YAML, LLM):
        shutil.copy2(src / name, dst / name)
    shutil.copytree(src / QWEN_DIR, dst / QWEN_DIR)
    return dst


@pytest.fixture(scope="session")
def peaked_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with the LM's logits a constant: PEAKED_BIAS over -5 (only the LM files are copied)."""
    import torch

    from cosy.model.files import LLM
    md = copy_lm_files(tiny_model_dir, tmp_path_factory.mktemp("peaked"))
    sd = torch.load(md / LLM, weights_only=True)
    bias = torch.full(sd["llm_decoder.bias"].shape, -5.0)
    bias[list(PEAKED_BIAS)] = torch.tensor(list(PEAKED_BIAS.values()))
    sd["llm_decoder.weight"].zero_()
    sd["llm_decoder.bias"].copy_(bias)
    torch.save(sd, md / LLM)
    return md


# Every backend fixture (tests/servers.py Backend) and its model dir: the name of a session fixture, or a path.
# The session backends stop after the last test that may use them (pytest_runtest_teardown); the others
# (their modules' fixtures) stop when their module ends.
SHARED_BACKENDS = {"backend": "tiny_model_dir", "cv3_backend": "tiny_cv3_model_dir", "second_backend": "tiny_model_dir",
                   "golden_backend": GOLDEN / "model", "peaked_backend": "peaked_model_dir"}


# The modules whose tests use a session backend (SHARED_BACKENDS): the README's parallel run keeps them on one
# worker, so that each backend is launched once (checked against the fixtures at collection)
BACKEND_MODULES = {"test_app", "test_backend_cv3", "test_backend_server", "test_batch_shards", "test_bistream",
                   "test_cv3_e2e", "test_deployment", "test_faults", "test_lifecycle", "test_lm_client", "test_router"}


def _scope(module: str) -> str:
    return "backends" if module in BACKEND_MODULES else module


def pytest_collection_modifyitems(config, items):
    """The longest scopes first (the backends' modules, then the image build), so that in the parallel run
    the other worker fills the time with the rest; a module that uses a session backend must be listed."""
    using = {item.module.__name__ for item in items if set(SHARED_BACKENDS) & set(item.fixturenames)}
    assert using <= BACKEND_MODULES, f"add {sorted(using - BACKEND_MODULES)} to BACKEND_MODULES (tests/conftest.py)"
    items.sort(key=lambda item: {"backends": 0, "test_images": 1}.get(_scope(item.module.__name__), 2))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """The README's run (`-n 2 --dist loadscope`, pytest-xdist): every module whole on one worker (its
    module-scoped servers start once), and the backends' modules together on one."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(Path(nodeid.split("::", 1)[0]).stem)

    config.option.loadscopereorder = False  # our order (pytest_collection_modifyitems), not by test count
    return ByModule(config, log)


@pytest.fixture(scope="session")
def launched_backends(request, tmp_path_factory) -> dict:
    """Every backend in SHARED_BACKENDS that a collected test needs, launched at once when the first is asked
    for, and waited for together: vLLM's start-up (about a minute of imports on a slow CPU) then overlaps
    instead of running once per backend, and no later test runs beside a start-up. All stop together after
    the last test of the backends' modules (`pytest_runtest_teardown`), or at the session's end. One that
    failed to start fails the tests that need it, with its log."""
    from servers import READY_TIMEOUT, Backend
    needed = {name for item in request.session.items for name in SHARED_BACKENDS
              if name in getattr(item, "fixturenames", ())}
    launched = {}
    for name in sorted(needed):
        folder = tmp_path_factory.mktemp(name)
        launched[name] = Backend(_model_dir(request, name), folder / "cache", folder / "backend.log")
        launched[name].launch()
    # they share the cores: five at once took 295 s on 2 cores, 316 s two at a time (one alone: 50 s), so
    # the time allowed grows with their number (a backend that exits is seen at once, whatever the deadline)
    deadline = time.monotonic() + READY_TIMEOUT * len(launched)
    for b in launched.values():
        try:
            b.wait(max(deadline - time.monotonic(), 1.0))
        except RuntimeError:
            pass  # raised again, with the log, to the fixture that asks for it
    _LAUNCHED.update(launched)
    yield launched
    stop_launched_backends()


_LAUNCHED: dict = {}  # what launched_backends started in this process and has not stopped yet


def stop_launched_backends() -> None:
    """Stop the session backends of this process, all at once (each takes a few seconds to drain)."""
    stopping = [threading.Thread(target=b.stop) for b in _LAUNCHED.values()]
    for t in stopping:
        t.start()
    for t in stopping:
        t.join()
    _LAUNCHED.clear()


def pytest_runtest_teardown(item, nextitem):
    """After this process's last test that may use a session backend (their modules run first, one after the
    other: pytest_collection_modifyitems), stop them, not at the session's end: else the rest of the run
    shares the cores and memory with idle vLLM servers (each about 2 % of a core and 2 GB, measured)."""
    if _LAUNCHED and _scope(item.module.__name__) == "backends" and (
            nextitem is None or _scope(nextitem.module.__name__) != "backends"):
        stop_launched_backends()


def launched_backend(request, name: str):
    """The context of backend `name` (a SHARED_BACKENDS fixture): the one `launched_backends` launched, else a
    new one; stopped on exit."""
    from servers import running_backend
    launched = request.getfixturevalue("launched_backends").get(name)
    folder = None if launched else request.getfixturevalue("tmp_path_factory").mktemp(name)
    return running_backend(_model_dir(request, name), folder, launched)


def _model_dir(request, name: str) -> Path:
    model = SHARED_BACKENDS[name]
    return model if isinstance(model, Path) else request.getfixturevalue(model)


@pytest.fixture(scope="session")
def backend(request):
    """One real vLLM backend on the tiny model for the whole session (~40 s to start on the CPU):
    `.url` (".../v1"), `.api_key`, `.port`, `.model_name`, `.stop()`, `.start()` (same port)."""
    with launched_backend(request, "backend") as b:
        yield b


@pytest.fixture(scope="session")
def cv3_backend(request):
    """One real vLLM backend on the tiny CosyVoice3 model for the whole session (as `backend`)."""
    with launched_backend(request, "cv3_backend") as b:
        yield b


from http_stack import stack  # noqa: E402,F401 -- the HTTP API tests' module-scoped server fixture


def assert_linear(fn, make, small: int, big: int) -> None:
    """fn(make(big)) costs about big/small times fn(make(small)), not its square (a quadratic scan or a
    backtracking pattern), each timed as the fastest of three calls (the least disturbed by other work on a
    shared machine); the bounds leave room for that noise: 3x the linear ratio, and a floor of 5 ms."""
    def fastest(arg) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            fn(arg)
            best = min(best, time.perf_counter() - start)
        return best
    t_small = fastest(make(small))
    t_big = fastest(make(big))
    assert t_big < 3 * (big / small) * t_small + 0.005, (t_small, t_big)


@contextmanager
def small_disk(path: Path, size: str):
    """`path` (made here) as a tmpfs of `size` (e.g. "64k"), a real filesystem that fills up; unmounted after.
    Skips the test where mounting is not allowed (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)
from golden_engines import cv2, cv3  # noqa: E402,F401 -- the golden models as engines, one per module
from manifests import parsers  # noqa: E402,F401 -- the deployment tests' argparse parsers, one per module
