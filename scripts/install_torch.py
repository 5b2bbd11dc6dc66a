"""Install a torch that imports and computes, on any machine: `make setup`'s torch step.

Run by scripts/setup.sh with the venv's own Python, after the lock is installed:

    VENV/bin/python scripts/install_torch.py [--version 2.13.0] [--source auto]

Sources, tried in this order by `--source auto` (LIGHTPIPE_TORCH_SOURCE sets the default):

1. ``local``: what this machine's pip finds for torch==VERSION when that is a CPU build:
   a wheel file on local disk named by pip's configuration (recorded as ``local-file``), or
   PyPI's wheel where that is a CPU build, as on Linux aarch64 and macOS (``pypi-cpu``).
   Installed without dependencies: the lock holds them.
2. ``cpu-index``: PyTorch's CPU wheel index (LIGHTPIPE_TORCH_INDEX, default
   https://download.pytorch.org/whl/cpu), what PyTorch's install page gives CPU-only users:
   ~190 MB to download. First probed with one HTTP request bounded by
   LIGHTPIPE_TORCH_PROBE_TIMEOUT_S (5 s), so an unreachable index fails over in seconds.
3. ``pypi``: PyPI's torch with its dependencies. On Linux x86_64 that is a CUDA build, and
   its NVIDIA libraries come too (measured 2026-12-07: ~3.4 GB to download, ~5.2 GB in the
   venv, ~2 min on a 100 MB/s link). It imports and runs on the CPU.

The source taken is printed and written to VENV/lightpipe-torch-source.json (read by
`lightpipe doctor`). Exit 0 when torch imports and computes; 1 when no source gave one;
2 on a bad argument.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_VERSION = "2.13.0"
DEFAULT_INDEX = "https://download.pytorch.org/whl/cpu"
SOURCES = ("auto", "local", "cpu-index", "pypi")
SOURCE_FILE = "lightpipe-torch-source.json"
# A torch wheel's requirements that make it a CUDA build (PyPI's Linux x86_64 wheels).
CUDA_REQUIREMENT_PREFIXES = ("nvidia-", "cuda-", "triton")
# What the check computes, and the numbers it must give: a matrix product and a gradient.
CHECK_CODE = (
    "import json, torch\n"
    "a = torch.arange(6, dtype=torch.float64).reshape(2, 3)\n"
    "x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)\n"
    "y = (a @ x).pow(2).sum()\n"
    "y.backward()\n"
    "ok = float(y.detach()) == 740.0 and x.grad.tolist() == [156.0, 224.0, 292.0]\n"
    "print(json.dumps({'ok': ok, 'version': torch.__version__, 'cuda': torch.version.cuda}))\n"
)


def log(message: str) -> None:
    """One line on stderr, as setup.sh's own lines."""
    print(f"setup: {message}", file=sys.stderr, flush=True)


def pip(*args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
    """This venv's pip, its output captured."""
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def torch_works(timeout_s: float = 300.0) -> dict[str, object] | None:
    """{'version', 'cuda'} when torch imports here and computes the right numbers; else None."""
    try:
        proc = subprocess.run([sys.executable, "-c", CHECK_CODE], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        log(f"torch check: no answer in {timeout_s:.0f} s")
        return None
    if proc.returncode != 0:
        log(f"torch check: {last_line(proc.stderr)}")
        return None
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if not result.get("ok"):
        log("torch check: torch imports but computes wrong numbers")
        return None
    return result


def _marker_applies(requirement: str) -> bool:
    """Whether a requirement's environment marker holds here (pip's own packaging decides)."""
    if ";" not in requirement:
        return True
    try:
        from packaging.markers import Marker
    except ImportError:  # (a venv without packaging: pip's vendored copy)
        from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    try:
        return bool(Marker(requirement.split(";", 1)[1]).evaluate({"extra": ""}))
    except Exception:  # a marker this packaging cannot read: count the requirement
        return True


def resolve(version: str) -> dict[str, object] | None:
    """What pip, with this machine's own configuration, would install for torch==VERSION.

    {'url', 'version', 'cuda_requirements'}; None when pip finds nothing. Only metadata is
    fetched (a dry run), not the wheel.
    """
    with tempfile.TemporaryDirectory(prefix="lightpipe-torch-") as tmp:
        report = Path(tmp) / "report.json"
        proc = pip("install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
                   "--report", str(report), f"torch=={version}", timeout_s=600)
        if proc.returncode != 0 or not report.is_file():
            log(f"pip finds no torch=={version} here: {last_line(proc.stderr)}")
            return None
        data = json.loads(report.read_text(encoding="utf-8"))
    items = data.get("install") or []
    if not items:
        return None
    item = items[0]
    requires = item.get("metadata", {}).get("requires_dist") or []
    cuda = [r.split(";")[0].strip() for r in requires
            if r.lower().startswith(CUDA_REQUIREMENT_PREFIXES) and _marker_applies(r)]
    return {"url": item.get("download_info", {}).get("url", ""),
            "version": item.get("metadata", {}).get("version", version),
            "cuda_requirements": cuda}


def index_reachable(index: str, timeout_s: float) -> str | None:
    """None when INDEX answers for torch within TIMEOUT_S; else why not, in a few words.

    The request runs in a thread that is given up after TIMEOUT_S: urllib's timeout covers
    the connection and each read, not the name lookup, which a broken resolver can hold.
    """
    url = index.rstrip("/") + "/torch/"
    answer: list[str | None] = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                resp.read(1024)
                answer.append(None if resp.status == 200 else f"HTTP {resp.status}")
        except urllib.error.HTTPError as exc:
            answer.append(f"HTTP {exc.code}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            answer.append(str(getattr(exc, "reason", exc)))

    t0 = time.monotonic()
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    elapsed_s = time.monotonic() - t0
    if not answer:
        return f"timed out after {elapsed_s:.1f} s"
    return None if answer[0] is None else f"{answer[0]} after {elapsed_s:.1f} s"


def host_of(url: str) -> str:
    if url.startswith("file://"):
        return url[len("file://"):]
    return url.split("/")[2] if "://" in url else url


def install_local(version: str, found: dict[str, object]) -> str | None:
    """Install the CPU build pip finds here; its detail, or None when it is not a CPU build."""
    if found["cuda_requirements"]:
        return None
    proc = pip("install", "--quiet", "--no-deps", "--force-reinstall", f"torch=={version}")
    if proc.returncode != 0:
        log(f"installing the local torch failed: {last_line(proc.stderr)}")
        return None
    return str(found["url"])


def install_cpu_index(version: str, index: str, probe_timeout_s: float) -> str | None:
    why = index_reachable(index, probe_timeout_s)
    if why is not None:
        log(f"PyTorch's CPU index {index} is unreachable ({why})")
        return None
    proc = pip("install", "--quiet", "--no-deps", "--force-reinstall", "--index-url", index,
               "--timeout", "30",
               "--retries", "1", f"torch=={version}")
    if proc.returncode != 0:
        log(f"installing torch from {index} failed: {last_line(proc.stderr)}")
        return None
    return index


def install_pypi(version: str) -> str | None:
    log(f"taking PyPI's torch=={version} with its dependencies: on Linux x86_64 a CUDA build "
        "with NVIDIA's libraries (~3.4 GB to download, ~5.2 GB in the venv)")
    proc = pip("install", "--quiet", "--no-deps", "--force-reinstall", f"torch=={version}")
    if proc.returncode == 0:  # (then its requirements: NVIDIA's libraries, triton)
        proc = pip("install", "--quiet", f"torch=={version}")
    if proc.returncode != 0:
        log(f"installing PyPI's torch failed: {last_line(proc.stderr)}")
        return None
    return "PyPI, with dependencies"


def write_source(venv: Path, record: dict[str, object]) -> None:
    """VENV/lightpipe-torch-source.json, written atomically."""
    path = venv / SOURCE_FILE
    fd, tmp = tempfile.mkstemp(dir=venv, prefix=f".{SOURCE_FILE}.")
    os.fchmod(fd, 0o644)  # (readable by `lightpipe doctor` run as any user)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def read_source(venv: Path) -> dict[str, object]:
    try:  # (not through a link; bounded)
        fd = os.open(venv / SOURCE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, encoding="utf-8") as fh:
            data = json.loads(fh.read(65536))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--source", default=os.environ.get("LIGHTPIPE_TORCH_SOURCE", "auto"))
    parser.add_argument("--index", default=os.environ.get("LIGHTPIPE_TORCH_INDEX", DEFAULT_INDEX))
    parser.add_argument("--probe-timeout-s", type=float,
                        default=float(os.environ.get("LIGHTPIPE_TORCH_PROBE_TIMEOUT_S", "5")))
    parser.add_argument("--reinstall", action="store_true",
                        help="install again even when a working torch==VERSION is here")
    args = parser.parse_args(argv)
    if args.source not in SOURCES:
        print(f"install_torch: source {args.source!r} (LIGHTPIPE_TORCH_SOURCE or --source): "
              f"one of {', '.join(SOURCES)}", file=sys.stderr)
        raise SystemExit(2)
    if not args.index.startswith(("https://", "http://", "file://")):
        print(f"install_torch: index {args.index!r} (LIGHTPIPE_TORCH_INDEX): "
              "an http(s):// or file:// URL", file=sys.stderr)
        raise SystemExit(2)
    if not 0 < args.probe_timeout_s <= 120:
        print(f"install_torch: probe timeout {args.probe_timeout_s} s "
              "(LIGHTPIPE_TORCH_PROBE_TIMEOUT_S): between 0 and 120", file=sys.stderr)
        raise SystemExit(2)
    return args


def installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    venv = Path(sys.prefix)
    have = installed_version()
    if have is not None and have.split("+")[0] == args.version and not args.reinstall:
        works = torch_works()
        if works is not None:
            record = read_source(venv) or {"source": "already-installed",
                                           "detail": "found in the venv"}
            record.update(torch=works["version"], cuda=works["cuda"])
            write_source(venv, record)
            build = f"CUDA {works['cuda']}" if works["cuda"] else "CPU"
            log(f"torch {works['version']} ({build} build) installed already, "
                f"from {record.get('source')}")
            return 0
        log(f"torch {have} is installed but does not work: installing again")
    tried: list[str] = []
    order = ["local", "cpu-index", "pypi"] if args.source == "auto" else [args.source]
    found: dict[str, object] | None = None
    for source in order:
        t0 = time.monotonic()
        detail: str | None = None
        if source == "local":
            found = resolve(args.version)
            if found is not None:
                detail = install_local(args.version, found)
                if detail is None and found["cuda_requirements"]:
                    log(f"pip's torch=={args.version} here ({host_of(str(found['url']))}) is a "
                        "CUDA build: looking for a CPU build")
        elif source == "cpu-index":
            detail = install_cpu_index(args.version, args.index, args.probe_timeout_s)
        else:
            detail = install_pypi(args.version)
        tried.append(source)
        if detail is None:
            continue
        works = torch_works()
        if works is None:
            log(f"torch from {source} does not import and compute here")
            continue
        taken = source
        if source == "local":  # (a file on this disk, or PyPI's own CPU build for this platform)
            taken = "local-file" if detail.startswith("file://") else "pypi-cpu"
        record = {"source": taken, "detail": detail, "torch": works["version"],
                  "cuda": works["cuda"], "python": platform.python_version(),
                  "machine": platform.machine(), "seconds": round(time.monotonic() - t0, 1)}
        write_source(venv, record)
        build = f"CUDA {works['cuda']}" if works["cuda"] else "CPU"
        log(f"torch {works['version']} ({build} build) from {taken}: {detail} "
            f"({record['seconds']} s)")
        return 0
    log(f"no working torch=={args.version} from {', '.join(tried)}; set LIGHTPIPE_TORCH_INDEX to "
        "a reachable mirror of PyTorch's CPU index, or LIGHTPIPE_TORCH_SOURCE=pypi")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
