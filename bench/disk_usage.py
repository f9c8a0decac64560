"""What runs of the test suite (and of cosy) leave on this machine's disk, by place.

    python bench/disk_usage.py [CHECKOUT ...]      # default: this checkout

Places: the filesystem (df), podman's storage (our images, dangling ones, the rest), each checkout's `.venv`,
pip's cache, the temp dir (pytest's basetemps, frontends' temp roots, inductor's cache, anything else over
10 MB), the user caches (~/.cache: cosy's llm.pt exports, vLLM, hub libraries) and build leftovers under
/var/tmp. Sizes are disk usage (`du`), in MB. README "Tests" says what the suite needs and how to reclaim it.
"""
from __future__ import annotations

import argparse
import getpass
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("localhost/cosy-", "localhost/cosy-test-base")  # tests/test_images.py's tags
MB = 2**20


def du(path: Path) -> int:
    """Bytes on disk under `path` (0 if absent): `du -sk`, one filesystem, hard links once."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-skx", str(path)], capture_output=True, text=True).stdout.split()
    return int(out[0]) * 1024 if out else 0


def line(place: str, size: int, detail: str = "") -> None:
    print(f"{place:<52} {size / MB:>9.0f} MB  {detail}")


def filesystem() -> None:
    total, used, free = shutil.disk_usage("/")
    print(f"{'filesystem /':<52} {used / MB:>9.0f} MB used, {free / MB:.0f} MB free of {total / MB:.0f} MB")


def podman() -> None:
    if shutil.which("podman") is None:
        return print("podman: not installed")
    info = subprocess.run(["podman", "info", "--format", "{{.Store.GraphRoot}}"], capture_output=True, text=True)
    root = Path(info.stdout.strip() or "/var/lib/containers/storage")
    listed = subprocess.run(["podman", "images", "-a", "--format", "json"], capture_output=True, text=True).stdout
    images = json.loads(listed or "[]")
    ours = [i for i in images if any(n.startswith(OURS) for n in i.get("Names") or [])]
    dangling = [i for i in images if i.get("Dangling")]
    line(f"podman storage {root}", du(root), f"{len(images)} images (layers included), {len(dangling)} dangling")
    for i in ours:
        line(f"  {', '.join(i['Names'])}", i.get("Size", 0), "(image size; layers shared)")
    if dangling:
        line("  dangling images", sum(i.get("Size", 0) for i in dangling), "(podman image prune)")


def checkouts(paths: list[Path]) -> None:
    for p in paths:
        line(f"venv {p / '.venv'}", du(p / ".venv"))


def pip_cache() -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    where = Path(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else Path.home() / ".cache" / "pip"
    line(f"pip cache {where}", du(where), "(pip cache purge)")


def temp() -> None:
    tmp = Path(tempfile.gettempdir())
    user = getpass.getuser()
    pytest_root = tmp / f"pytest-of-{user}"
    runs = sorted(pytest_root.glob("pytest-*")) if pytest_root.is_dir() else []
    line(f"pytest basetemps {pytest_root}", du(pytest_root), f"{len(runs)} runs kept: {[r.name for r in runs]}")
    fronts = list(tmp.glob("cosy-frontend-*"))
    line(f"frontend temp roots {tmp}/cosy-frontend-*", sum(du(f) for f in fronts), f"{len(fronts)} dirs")
    line(f"inductor cache {tmp}/torchinductor_{user}", du(tmp / f"torchinductor_{user}"))
    known = {pytest_root, tmp / f"torchinductor_{user}", *fronts}
    for p in sorted(tmp.iterdir()):
        if p not in known and (size := du(p)) > 10 * MB:
            line(f"  other {p}", size)


def caches() -> None:
    home = Path.home()
    for p in [*sorted((home / ".cache").glob("*")), home / ".triton", home / ".config" / "vllm"]:
        if p.name != "pip" and p.exists():
            line(f"cache {p}", du(p))
    left = [p for pattern in ("buildah*", "podman*", "storage*") for p in Path("/var/tmp").glob(pattern)]
    line("build leftovers /var/tmp/{buildah,podman,storage}*", sum(du(p) for p in left), f"{len(left)} entries")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkouts", nargs="*", type=Path, default=[ROOT], help="checkouts whose .venv to measure")
    args = p.parse_args(argv)
    filesystem()
    podman()
    checkouts(args.checkouts)
    pip_cache()
    temp()
    caches()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
