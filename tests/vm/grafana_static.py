"""Check, inside the provisioned VM, the Grafana files that provision.sh installed: where
Grafana reads them, owned by root, every path resolved, no variable left unset.

Run by tests/vm/user_path.sh as root in the guest: `python tests/vm/grafana_static.py`.
Prints one line per check and exits 1 when one fails.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import yaml

PROV = Path("/etc/grafana/provisioning")
REPO = Path(__file__).resolve().parents[2]
DROP_IN = Path("/etc/systemd/system/grafana-server.service.d/lightpipe.conf")


def _root_only_writes(p: Path) -> str | None:
    """Why p is not a root-owned, non-link entry that only root may change (None if it is)."""
    st = p.lstat()
    if stat.S_ISLNK(st.st_mode):
        return f"{p} is a symbolic link"
    if st.st_uid != 0:
        return f"{p} is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"{p} is writable by group or others ({stat.filemode(st.st_mode)})"
    return None


def checks() -> list[tuple[str, str | None]]:
    """(what, None if fine else why not) for every check."""
    out: list[tuple[str, str | None]] = []
    for p in (Path("/etc/grafana"), PROV, PROV / "datasources", PROV / "dashboards"):
        out.append((f"{p}: root's directory", _root_only_writes(p) if p.exists() or p.is_symlink()
                    else f"{p} is missing"))
    ds_file = PROV / "datasources" / "lightpipe.yaml"
    dash_file = PROV / "dashboards" / "lightpipe.yaml"
    for f in (ds_file, dash_file):
        if not f.is_file():
            out.append((f"{f}", "missing"))
            return out
        out.append((f"{f}: root's file", _root_only_writes(f)))
        text = f.read_text()
        out.append((f"{f}: no unset variable", "has ${...}" if "${" in text or "$__env" in text
                    else None))
    ds = yaml.safe_load(ds_file.read_text())["datasources"][0]
    out.append(("datasource URL is the monitor's port 9090",
                None if ds["url"] == "http://127.0.0.1:9090" else f"url {ds['url']}"))
    prov = yaml.safe_load(dash_file.read_text())["providers"][0]
    out.append(("dashboards in the LightPipe folder",
                None if prov.get("folder") == "LightPipe" else f"folder {prov.get('folder')!r}"))
    path = Path(prov["options"]["path"])
    out.append((f"provider path {path} is absolute and a directory",
                None if path.is_absolute() and path.is_dir() else "no such directory"))
    if not path.is_dir():
        return out
    out.append((f"{path}: root's directory", _root_only_writes(path)))
    want = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
    got = sorted(path.glob("*.json"))
    out.append((f"{path} holds the checkout's {len(want)} dashboards",
                None if [p.name for p in got] == [p.name for p in want] and len(want) == 4
                else f"{[p.name for p in got]} vs {[p.name for p in want]}"))
    for w in want:
        g = path / w.name
        if not g.is_file():
            continue
        same = g.read_bytes() == w.read_bytes()
        uids = {p.get("datasource", {}).get("uid") for p in json.loads(g.read_text())["panels"]
                if isinstance(p.get("datasource"), dict)}
        out.append((f"{g}: the checkout's file, root's, panels on datasource {ds['uid']}",
                    _root_only_writes(g) or (None if same else "differs from the checkout")
                    or (None if uids <= {ds["uid"]} else f"datasource uids {uids}")))
    drop = DROP_IN.read_text() if DROP_IN.is_file() else ""
    out.append((f"{DROP_IN}: Grafana listens on 127.0.0.1",
                None if "GF_SERVER_HTTP_ADDR=127.0.0.1" in drop else "not set"))
    return out


def main() -> int:
    bad = 0
    for what, why in checks():
        print(f"{'ok  ' if why is None else 'FAIL'} {what}{'' if why is None else ': ' + why}")
        bad += why is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
