"""The images and the compose stack, for real: podman builds both CPU images (`deploy/Containerfile`) on a base
made from Debian's packages, podman-compose starts `compose.yaml` on the loopback with a tiny random model, and
the deployment's promises are checked through its HAProxy: PAI and gradio_client, a voice saved through one
frontend and used through the other, the backend restarted under running frontends, a frontend killed
mid-stream and one stopped mid-stream (its drain), `down` then `up` keeping the saved voices, the stack's
Prometheus (its image built from Debian's package) answering queries for the frontends' priority and streaming
series, and the key in no inspect output, image history or log.

The tests of this module run in order on one stack. The module leaves the machine as it found it, but for one
copy of each image (the tagged one, the next run's build cache): before the build and after the last test,
`remove_leftovers` removes the project's containers, pods, volumes and networks and every image of ours that
no tag names any more (an older build under the same tag, with its layers), so an interrupted run is cleaned
by the next. podman here needs runc, cgroupfs and no default ulimits
(../shared/ENVIRONMENT.md "Containers"): a containers.conf with exactly that is written unless CONTAINERS_CONF
is set. pip inside the build uses this machine's package sources (`pip config list`, mounted read-only).
"""
from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import soundfile as sf
import yaml
from conftest import ASSETS
from gradio_client import Client, handle_file
from servers import free_port

from cosy.deploy import haproxy

ROOT = Path(__file__).resolve().parents[1]
BASE = "localhost/cosy-test-base:bookworm"
IMAGES = {role: f"localhost/cosy-{role}:cpu-test" for role in ("backend", "frontend")}
PROMETHEUS_IMAGE = "localhost/cosy-prometheus:test"  # deploy/monitoring/Containerfile
PROJECT = "cosyimgtest"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
LONG_TEXT = "今天天气很好，我们一起去公园散步，看看花草树木，听听鸟儿唱歌。" * 6
DRAIN = 8  # s, COSY_DRAIN_TIMEOUT: compose's 30 s default would make the drain test synthesize for 30 s
GRACE = int(yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["frontend2"]["stop_grace_period"]
            .removesuffix("s"))  # what compose allows a frontend between SIGTERM and SIGKILL
TOOLS = ("podman", "mmdebstrap", "runc")
pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS),
                                reason=f"needs {', '.join(TOOLS)} (the README's test command installs them)")


def podman_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env:
        conf = tmp / "containers.conf"
        conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\n'
                        'runtime = "runc"\n')
        env["CONTAINERS_CONF"] = str(conf)
    return env


def run(cmd: list[str], env: dict, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check and r.returncode:
        raise AssertionError(f"{' '.join(cmd[:4])} ... exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def pip_sources() -> tuple[list[str], list[str]]:
    """(build args, volume args) that give the build's pip this machine's package sources: index, extra
    indexes, find-links, constraints and CA bundle (`pip config list`, PIP_* overriding), each local path
    mounted read-only where the config names it."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    conf = {}
    for line in listed.splitlines():
        m = re.fullmatch(r"[\w:.-]+?\.([\w-]+)='(.*)'", line.strip())
        if m:
            conf[m[1]] = m[2]
    for key in ("index-url", "extra-index-url", "find-links", "constraint", "cert"):
        env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            conf[key] = env
    args, mounts = [], set()
    for key in ("index-url", "extra-index-url", "find-links"):
        if key in conf:
            args += ["--build-arg", f"PIP_{key.upper().replace('-', '_')}={conf[key]}"]
    for key in ("extra-index-url", "find-links", "index-url", "constraint", "cert"):
        for item in conf.get(key, "").split():
            path = item.removeprefix("file://")
            if path.startswith("/") and Path(path).exists():
                mounts.add(path if key in ("constraint", "cert") else str(Path(path).parent)
                           if path.endswith("/simple") else path)
    if "constraint" in conf:  # the Containerfile has no constraint arg: pip reads it from a mounted pip.conf
        pip_conf = Path("/etc/pip.conf")
        if pip_conf.exists() and conf["constraint"] in pip_conf.read_text():
            mounts.add(str(pip_conf))
    return args, [a for m in sorted(mounts) for a in ("-v", f"{m}:{m}:ro")]


class Stack:
    """The compose project: `compose(*args)`, `container(service)`, `url` (HAProxy on the loopback)."""

    def __init__(self, env: dict, tmp: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = secrets.token_hex(24)
        key_file = tmp / "secrets" / "llm_api_key"
        key_file.parent.mkdir()
        key_file.write_text(self.key + "\n")
        key_file.chmod(0o644)  # read by the containers' uid 10001 (the folder above it is the test's own)
        from cosy.verify.random_model import write_random_model
        model = write_random_model(tmp / "model", "tiny", seed=1)
        subprocess.run(["chmod", "-R", "a+rX", str(model)], check=True)
        self.env = {**env, "COSY_MODEL_DIR": str(model), "COSY_LLM_API_KEY_FILE": str(key_file),
                    "COSY_PORT": str(self.port), "COSY_HAPROXY_IMAGE": BASE, "COSY_DRAIN_TIMEOUT": str(DRAIN),
                    "COSY_BACKEND_IMAGE": IMAGES["backend"], "COSY_FRONTEND_IMAGE": IMAGES["frontend"],
                    "COSY_PROMETHEUS_IMAGE": PROMETHEUS_IMAGE, "COSY_PROMETHEUS_PORT": str(free_port())}
        self.prometheus = f"http://127.0.0.1:{self.env['COSY_PROMETHEUS_PORT']}"
        exe = Path(sys.executable).parent / "podman-compose"
        self.compose_cmd = [str(exe) if exe.exists() else "podman-compose", "-p", PROJECT, "-f",
                            str(ROOT / "compose.yaml")]

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return run([*self.compose_cmd, *args], self.env, timeout, check)

    def podman(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return run(["podman", *args], self.env, timeout, check)

    @staticmethod
    def container(service: str) -> str:
        return f"{PROJECT}_{service}_1"

    def state(self, service: str) -> dict:
        return json.loads(self.podman("inspect", self.container(service)).stdout)[0]["State"]

    def ready(self, service: str, port: int) -> bool:
        """The image's own health check, run in the container (podman here has no systemd to time them)."""
        path = "/health" if service == "backend" else "/ready"
        r = self.podman("exec", self.container(service), "python3", "-m", "cosy.deploy.healthcheck",
                        f"http://127.0.0.1:{port}{path}", check=False)
        return r.returncode == 0

    def wait_ready(self, services: tuple[str, ...] = ("frontend1", "frontend2"), timeout: float = 600) -> float:
        start = time.monotonic()
        while not all(self.ready(s, 8000 if s == "backend" else 50000) for s in services):
            if time.monotonic() - start > timeout:
                logs = {s: self.podman("logs", "--tail", "30", self.container(s), check=False).stderr
                        for s in ("backend", *services)}
                raise AssertionError(f"not ready in {timeout:.0f} s: {logs}")
            time.sleep(2)
        deadline = time.monotonic() + 60  # HAProxy's checks (2 s, rise 2) then see them
        while httpx.get(f"{self.url}/ready", timeout=10).status_code != 200 and time.monotonic() < deadline:
            time.sleep(1)
        return time.monotonic() - start


PROJECT_LABEL = f"label=io.podman.compose.project={PROJECT}"
IMAGE_LABELS = [f"label=org.opencontainers.image.title=cosy-{role}"  # deploy/Containerfile, deploy/monitoring's
                for role in (*IMAGES, "prometheus")]


def remove_leftovers(env: dict) -> dict[str, int]:
    """Remove what this module's runs leave: the compose project's containers, pods, volumes and networks, and
    our images that no tag names (dangling: untagged and no image built on them; removing one can leave its
    parent dangling, hence the loop). The tagged images and the layers under them stay. What went, by kind."""
    def listed(*args: str, field: str = "ID") -> list[str]:
        return run(["podman", *args, "--format", f"{{{{.{field}}}}}"], env, check=False).stdout.split()

    removed = {}
    for kind, listing, field, remove in (
            ("containers", ["ps", "-a"], "ID", ["rm", "-f"]), ("pods", ["pod", "ps"], "ID", ["pod", "rm", "-f"]),
            ("volumes", ["volume", "ls"], "Name", ["volume", "rm", "-f"]),
            ("networks", ["network", "ls"], "Name", ["network", "rm", "-f"])):
        found = listed(*listing, "--filter", PROJECT_LABEL, field=field)
        if found:
            run(["podman", *remove, *found], env, check=False)
        removed[kind] = len(found)
    removed["images"] = 0
    while True:
        dangling = sorted({i for label in IMAGE_LABELS
                           for i in listed("images", "-a", "--filter", "dangling=true", "--filter", label)})
        if not dangling or run(["podman", "rmi", *dangling], env, check=False).returncode:
            break
        removed["images"] += len(dangling)
    return removed


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = podman_env(tmp_path_factory.mktemp("podman"))
    print(f"\nbefore the build, removed what an earlier run left: {remove_leftovers(env)}")
    yield env
    print(f"\nafter the module, removed: {remove_leftovers(env)}")


@pytest.fixture(scope="module")
def images(env, tmp_path_factory):
    """Both CPU images, built at once on a Debian base (made by mmdebstrap when this machine has none);
    the build before under the same tags goes (`remove_leftovers`)."""
    if run(["podman", "image", "exists", BASE], env, check=False).returncode:
        rootfs = tmp_path_factory.mktemp("base") / "rootfs.tar"
        run(["mmdebstrap", "--variant=minbase", "--include=python3,python3-venv,haproxy,ca-certificates",
             "bookworm", str(rootfs)], env, timeout=900)
        run(["podman", "import", str(rootfs), BASE], env)
    build_args, mounts = pip_sources()

    def build(role: str) -> float:
        start = time.monotonic()
        run(["podman", "build", "--format", "docker", "--network=host", *mounts, *build_args,
             "--build-arg", f"BASE={BASE}", "--build-arg", f"ROLE={role}", "--build-arg", "DEVICE=cpu",
             "-f", "deploy/Containerfile", "-t", IMAGES[role], "."], env, timeout=1800)
        return time.monotonic() - start

    def build_prometheus() -> float:  # Debian's package on the same base; apt reaches the base's mirror
        start = time.monotonic()
        run(["podman", "build", "--format", "docker", "--network=host", "--build-arg", f"BASE={BASE}",
             "-f", "deploy/monitoring/Containerfile", "-t", PROMETHEUS_IMAGE, "."], env, timeout=1800)
        return time.monotonic() - start

    with ThreadPoolExecutor(2) as pool:
        seconds = dict(zip(IMAGES, pool.map(build, IMAGES)))
    seconds["prometheus"] = build_prometheus()
    print(f"\nthe builds before under the same tags, removed: {remove_leftovers(env)}")
    for label in IMAGE_LABELS:  # one copy of each image: the tagged one and the layers under it
        left = run(["podman", "images", "-a", "--filter", "dangling=true", "--filter", label, "-q"], env).stdout
        assert not left.split(), f"dangling images of ours left: {left}"
    sizes = {role: json.loads(run(["podman", "image", "inspect", tag], env).stdout)[0]["Size"]
             for role, tag in IMAGES.items()}
    print(f"\nimages built (s): {seconds}; sizes (MB): { {r: s // 10**6 for r, s in sizes.items()} }")
    return sizes


@pytest.fixture(scope="module")
def stack(env, images, tmp_path_factory):
    s = Stack(env, tmp_path_factory.mktemp("compose"))
    s.compose("down", "-v", check=False)  # what an interrupted run left
    start = time.monotonic()
    s.compose("up", "-d")
    s.wait_ready(("backend", "frontend1", "frontend2"))
    print(f"\ncompose up to ready: {time.monotonic() - start:.0f} s")
    yield s
    s.compose("down", "-v", timeout=180)


def upload_voice(url: str) -> tuple[str, str]:
    with open(ASSETS / "zero_shot_prompt.wav", "rb") as f:
        r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("p.wav", f)},
                       data={"text": ZS_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["id"], r.headers[haproxy.SERVER_HEADER]


def speak(url: str, ref: str, text: str = "你好，欢迎使用。") -> tuple[str, int]:
    """One non-streamed PAI synthesis: (frontend that served it, wav bytes)."""
    body = {"input": {"mode": "fast_replication", "text": text, "reference_audio_id": ref},
            "output_format": "wav", "stream": False}
    r = httpx.post(f"{url}/api/v1/audio/speech", json=body, timeout=300)
    assert r.status_code == 200, r.text[:500]
    return r.headers[haproxy.SERVER_HEADER], len(r.content)


class Stream(threading.Thread):
    """A PAI SSE synthesis in the background (LONG_TEXT by default): `.server`, `.events`, `.error` (a cut
    connection); `.leave()` closes it early, as a client that has heard enough."""

    def __init__(self, url: str, ref: str, text: str = LONG_TEXT):
        super().__init__(daemon=True)
        self.url, self.ref, self.text, self.server, self.events, self.error = url, ref, text, None, [], None
        self.first, self.left = threading.Event(), threading.Event()
        self.start()

    def leave(self) -> None:
        self.left.set()
        self.join(60)

    def run(self) -> None:
        body = {"input": {"mode": "fast_replication", "text": self.text, "reference_audio_id": self.ref},
                "output_format": "pcm"}
        try:
            with httpx.stream("POST", f"{self.url}/api/v1/audio/speech", json=body, timeout=300) as r:
                self.server = r.headers.get(haproxy.SERVER_HEADER)
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        self.events.append(json.loads(line[5:]))
                        self.first.set()
                    if self.left.is_set():
                        break
        except httpx.HTTPError as e:
            self.error = e
        self.first.set()


def test_pai_and_gradio_client_through_haproxy_and_a_voice_shared_by_both_frontends(stack):
    ref, saved_on = upload_voice(stack.url)
    served = {speak(stack.url, ref)[0] for _ in range(6)}  # leastconn alternates idle frontends
    assert served == {"fe1", "fe2"}, (saved_on, served)  # the voice saved on one is used on the other
    s = Stream(stack.url, ref, "今天天气很好，我们一起去公园散步吧。看看花草树木，听听鸟儿唱歌。")
    s.join(300)
    audio = b"".join(base64.b64decode(e["output"]["audio"]["data"] or "") for e in s.events)
    assert s.error is None and len(s.events) >= 2 and s.events[-1]["output"]["finish_reason"] == "stop"
    assert len(audio) > 24000  # pcm16 at 24 kHz: over half a second
    client = Client(stack.url + "/", verbose=False)
    wav = client.predict("你好。", ZS_TEXT, handle_file(str(ASSETS / "zero_shot_prompt.wav")), 0, 1.0,
                         api_name="/zero_shot")
    assert sf.info(wav).samplerate == 24000 and sf.info(wav).frames > 0
    stack.ref = ref


def prometheus_query(stack: Stack, query: str) -> list[dict]:
    r = httpx.get(f"{stack.prometheus}/api/v1/query", params={"query": query}, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "success", r.text[:500]
    return r.json()["data"]["result"]


def test_prometheus_scrapes_the_backend_and_both_frontends_and_has_the_new_series(stack):
    """After a few requests (streams at their default class, whole files asking for bulk), the stack's
    Prometheus answers its HTTP API's queries for the priority and streaming series of both frontends, scraped
    with the key, and for vLLM's; its alerting rules are loaded."""
    for _ in range(2):
        Stream(stack.url, stack.ref, "你好，欢迎使用。").join(300)
    for _ in range(2):
        body = {"input": {"mode": "fast_replication", "text": "你好。", "reference_audio_id": stack.ref,
                          "priority": "bulk"}, "stream": False}
        assert httpx.post(f"{stack.url}/api/v1/audio/speech", json=body, timeout=300).status_code == 200
    wanted = {"cosy_stream_first_packet_seconds_count": {"priority": "interactive", "api": "pai"},
              "cosy_streams_total": {"priority": "interactive", "api": "pai"},
              "cosy_stream_underrun_seconds_count": {"priority": "interactive", "api": "pai"},
              "cosy_queue_wait_seconds_count": {"priority": "bulk", "api": "pai"},
              "cosy_backend_share_count": {"priority": "bulk", "api": "pai"}}
    deadline, missing = time.monotonic() + 120, dict(wanted)
    while missing and time.monotonic() < deadline:  # scraped every 5 s
        for name, labels in list(missing.items()):
            selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
            if sum(float(s["value"][1]) for s in prometheus_query(stack, f"{name}{{{selector}}}")) > 0:
                del missing[name]
        time.sleep(2)
    assert not missing, f"Prometheus has no samples of {sorted(missing)}"
    up = {(s["metric"]["job"], s["metric"]["instance"]): s["value"][1] for s in prometheus_query(stack, "up")}
    assert up == {("cosy-backend", "backend:8000"): "1", ("cosy-frontend", "frontend1:50000"): "1",
                  ("cosy-frontend", "frontend2:50000"): "1"}, up
    assert prometheus_query(stack, "vllm:num_requests_running"), "no vLLM series: the backend's scrape failed"
    assert {s["metric"]["priority"] for s in prometheus_query(stack, "cosy_queue_waiting_by_priority")} == {
        "interactive", "default", "bulk"}
    rules = httpx.get(f"{stack.prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
    assert {g["name"] for g in rules} == {"cosy-streams", "cosy-queue", "cosy-targets"}
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules


def test_backend_restarted_and_the_frontends_serve_again_without_a_restart_of_theirs(stack):
    before = {s: stack.state(s)["StartedAt"] for s in ("frontend1", "frontend2")}
    stack.podman("restart", stack.container("backend"), timeout=180)
    deadline, served = time.monotonic() + 300, set()
    while served != {"fe1", "fe2"}:
        assert time.monotonic() < deadline, f"only {served} served in 300 s after the backend's restart"
        try:
            served.add(speak(stack.url, stack.ref)[0])
        except AssertionError:
            time.sleep(3)  # 503 while the backend starts: /ready follows it
    assert {s: stack.state(s)["StartedAt"] for s in before} == before


def test_frontend_killed_mid_stream_then_stopped_mid_stream(stack):
    """SIGKILL cuts the killed frontend's stream and the next request goes to the other; SIGTERM (`podman
    stop` with compose's grace period) lets a running stream finish or end with a ShuttingDown event once
    COSY_DRAIN_TIMEOUT is over, never cut."""
    streams = [Stream(stack.url, stack.ref), Stream(stack.url, stack.ref)]
    for s in streams:
        assert s.first.wait(120) and s.server in ("fe1", "fe2"), s.error
    assert {s.server for s in streams} == {"fe1", "fe2"}
    victim = next(s for s in streams if s.server == "fe1")
    stack.podman("kill", stack.container("frontend1"))
    victim.join(60)
    assert victim.error is not None or victim.events[-1]["output"]["finish_reason"] != "stop"
    assert {speak(stack.url, stack.ref)[0] for _ in range(3)} == {"fe2"}
    survivor = next(s for s in streams if s is not victim)
    heard = len(survivor.events)
    deadline = time.monotonic() + 60
    while len(survivor.events) == heard and survivor.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    # the other frontend's stream went on (or had ended well)
    assert survivor.error is None and (len(survivor.events) > heard
                                       or survivor.events[-1]["output"]["finish_reason"] == "stop")
    survivor.leave()  # not to its end: LONG_TEXT on a random LM is minutes of audio

    s = Stream(stack.url, stack.ref)
    assert s.first.wait(120) and s.server == "fe2"
    start = time.monotonic()
    stack.podman("stop", "-t", str(GRACE), stack.container("frontend2"), timeout=90)
    stopped = time.monotonic() - start
    s.join(60)
    state = stack.state("frontend2")
    assert s.error is None, f"the stream was cut: {s.error!r}"
    last = s.events[-1]
    assert last["output"]["finish_reason"] == "stop" or "shutting down" in last["error"]["message"], last
    assert stopped < DRAIN + 10 and state["ExitCode"] == 0, (stopped, state)  # the drain's limit, not the grace


def test_down_then_up_keeps_the_saved_voices(stack):
    stack.compose("down", timeout=180)
    start = time.monotonic()
    stack.compose("up", "-d")
    stack.wait_ready()
    print(f"\ncompose up again to ready: {time.monotonic() - start:.0f} s")
    listed = httpx.get(f"{stack.url}/api/v1/audio/reference_audio", timeout=30).json()
    assert stack.ref in json.dumps(listed)
    assert speak(stack.url, stack.ref)[1] > 44


def test_the_key_is_in_no_inspect_history_or_log(stack):
    texts = []
    for service in ("backend", "frontend1", "frontend2", "proxy", "prometheus"):
        name = stack.container(service)
        texts += [stack.podman("inspect", name).stdout, stack.podman("logs", name).stdout,
                  stack.podman("logs", name).stderr]
    for tag in IMAGES.values():
        texts += [stack.podman("history", "--no-trunc", tag).stdout, stack.podman("image", "inspect", tag).stdout]
    assert all(t for t in texts[:2])  # the outputs are there to search
    assert not [t for t in texts if stack.key in t]
