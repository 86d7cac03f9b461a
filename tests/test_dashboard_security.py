"""The dashboard refuses foreign Host headers, never follows a symlink out of the runs root,
and answers bad ids in callbacks with a message instead of a 500.

Everything runs against a real ``perfscope dashboard`` process on loopback, spoken to over
HTTP with hand-set ``Host`` headers (what a DNS-rebinding page in a browser would send), on
real runs with real symlinks.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfscope.dashboard.app import host_allowed
from perfscope.dashboard.app.data import inside_root
from tests.conftest import PERFSCOPE, subprocess_env
from tests.data.runs.builders import manual_run

SECRET = "TOPSECRET-4f2a"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    port: int
    root: Path
    good: str
    leak_summary: str
    leak_manifest: str
    leak_table: str
    inner_link: str

    def request(
        self, method: str, path: str, *, host: str | None = None, body: Any = None
    ) -> tuple[int, str]:
        """One HTTP request to the server with ``Host: host`` (default: 127.0.0.1:port)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Host": host if host is not None else f"127.0.0.1:{self.port}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def callback(
        self, outputs: list[str], inputs: dict[str, Any], state: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        """Invoke one Dash callback over HTTP as the browser does; (status, response)."""
        status, text = self.request("GET", "/_dash-dependencies")
        assert status == 200
        deps = json.loads(text)
        key = outputs[0] if len(outputs) == 1 else ".." + "...".join(outputs) + ".."
        dep = next(d for d in deps if d["output"].split("@")[0] == key)
        state = state or {}

        def spec(items: list[dict[str, Any]], values: dict[str, Any]) -> list[dict[str, Any]]:
            return [
                {
                    "id": i["id"],
                    "property": i["property"],
                    "value": values.get(f"{i['id']}.{i['property']}"),
                }
                for i in items
            ]

        outs = [{"id": o.split(".")[0], "property": o.split(".", 1)[1]} for o in outputs]
        body = {
            "output": dep["output"],
            "outputs": outs if len(outs) > 1 else outs[0],
            "inputs": spec(dep["inputs"], inputs),
            "state": spec(dep["state"], state),
            "changedPropIds": list(inputs),
        }
        status, text = self.request("POST", "/_dash-update-component", body=body)
        return status, (json.loads(text)["response"] if status == 200 else text)


def _make_runs(root: Path, outside: Path) -> dict[str, str]:
    good = manual_run(root, name="good", n_requests=3)
    names = {"good": good.name}
    # summary.json -> a file outside the runs root holding a secret.
    outside.mkdir()
    (outside / "secret.json").write_text(
        json.dumps({"schema": "perfscope.summary/1", "secret": SECRET}), encoding="utf-8"
    )
    leak = manual_run(root, name="leaksummary", n_requests=3)
    (leak / "summary.json").unlink()
    (leak / "summary.json").symlink_to(outside / "secret.json")
    names["leak_summary"] = leak.name
    # manifest.json -> outside.
    mleak = manual_run(root, name="leakmanifest", n_requests=3)
    manifest = json.loads((mleak / "manifest.json").read_text())
    manifest["name"] = SECRET
    (outside / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    (mleak / "manifest.json").unlink()
    (mleak / "manifest.json").symlink_to(outside / "manifest.json")
    names["leak_manifest"] = mleak.name
    # requests.parquet -> outside (a copy of a real table).
    tleak = manual_run(root, name="leaktable", n_requests=3)
    shutil.copy(tleak / "requests.parquet", outside / "requests.parquet")
    (tleak / "requests.parquet").unlink()
    (tleak / "requests.parquet").symlink_to(outside / "requests.parquet")
    (tleak / "summary.json").unlink()  # so loading must read the tables
    names["leak_table"] = tleak.name
    # summary.json -> another run's summary, inside the root: allowed.
    inner = manual_run(root, name="innerlink", n_requests=3)
    (inner / "summary.json").unlink()
    (inner / "summary.json").symlink_to(good / "summary.json")
    names["inner_link"] = inner.name
    return names


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("dash-security")
    root = base / "runs"
    names = _make_runs(root, base / "outside")
    port = _free_port()
    proc = subprocess.Popen(
        [*PERFSCOPE, "dashboard", "--runs-dir", str(root), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(PERFSCOPE_CACHE_DIR=str(base / "cache")),
    )
    srv = Server(port=port, root=root, **names)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if srv.request("GET", "/api/runs")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"dashboard did not start: {proc.communicate()}")
            time.sleep(0.3)
        yield srv
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


# ---------------------------------------------------------------------- Host header


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:{port}", "127.0.0.1.nip.io:{port}", "localhost.evil.com", ""],
)
@pytest.mark.parametrize(
    "path", ["/", "/api/runs", "/api/runs/{good}/summary.json", "/_dash-dependencies"]
)
def test_a_foreign_host_header_is_refused(server: Server, host: str, path: str) -> None:
    status, body = server.request(
        "GET", path.format(good=server.good), host=host.format(port=server.port)
    )
    assert status in (400, 403), (status, body[:200])
    assert server.good not in body


def test_a_rebinding_page_cannot_call_callbacks(server: Server) -> None:
    status, text = server.request(
        "POST", "/_dash-update-component", host=f"evil.example:{server.port}", body={}
    )
    assert status == 403
    assert server.good not in text


@pytest.mark.parametrize(
    "host", ["localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "LOCALHOST", "127.0.0.2"]
)
def test_loopback_host_headers_are_served(server: Server, host: str) -> None:
    status, body = server.request("GET", "/api/runs", host=host.format(port=server.port))
    assert status == 200
    assert server.good in body


def test_host_allowlist_parsing() -> None:
    assert host_allowed("localhost:8050") and host_allowed("[::1]:8050")
    assert host_allowed("127.0.0.1") and host_allowed("localhost.")
    assert not host_allowed("evil.example") and not host_allowed("")
    assert not host_allowed("127.0.0.1.evil.example:80")
    assert host_allowed("10.1.2.3:8050", {"10.1.2.3"})
    assert not host_allowed("10.1.2.4:8050", {"10.1.2.3"})


# ---------------------------------------------------------------------- symlinks


def test_a_summary_symlinked_outside_the_root_is_not_served(server: Server) -> None:
    status, body = server.request("GET", f"/api/runs/{server.leak_summary}/summary.json")
    assert status == 404
    assert SECRET not in body
    status, listing = server.request("GET", "/api/runs")
    assert status == 200 and SECRET not in listing
    row = next(r for r in json.loads(listing) if r["run_id"] == server.leak_summary)
    assert "outside the runs directory" in row["status"]


def test_a_manifest_symlinked_outside_makes_the_run_broken(server: Server) -> None:
    status, listing = server.request("GET", "/api/runs")
    assert SECRET not in listing
    row = next(r for r in json.loads(listing) if r["run_id"] == server.leak_manifest)
    assert row["state"] == "broken" and "outside the runs directory" in row["status"]
    status, out = server.callback(
        ["page-content.children"],
        {"url.pathname": f"/run/{server.leak_manifest}", "url.search": ""},
    )
    assert status == 200
    text = json.dumps(out)
    assert SECRET not in text and "outside the runs directory" in text


def test_a_table_symlinked_outside_is_not_read(server: Server) -> None:
    status, out = server.callback(
        ["page-content.children"], {"url.pathname": f"/run/{server.leak_table}", "url.search": ""}
    )
    assert status == 200
    assert "requests.parquet points outside the runs directory" in json.dumps(out)
    status, out = server.callback(
        ["detail-requests.data"],
        {
            "detail-requests.page_current": 0,
            "detail-requests.page_size": 10,
            "detail-requests.sort_by": [],
        },
        {"detail-run-id.data": server.leak_table},
    )
    assert status == 200 and out["detail-requests"]["data"] == []


def test_a_symlink_inside_the_root_is_followed(server: Server) -> None:
    status, body = server.request("GET", f"/api/runs/{server.inner_link}/summary.json")
    assert status == 200
    good = json.loads((server.root / server.good / "summary.json").read_text())
    assert json.loads(body)["run_id"] == good["run_id"]


def test_inside_root_resolves_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "x").write_text("x")
    (root / "out").symlink_to(tmp_path / "x")
    (root / "in").symlink_to(root)
    (root / "loop").symlink_to(root / "loop")
    assert not inside_root(root, root / "out")
    assert inside_root(root, root / "in")
    assert not inside_root(root, root / "loop")
    assert not inside_root(root, root / ".." / "x")


# ---------------------------------------------------------------------- bad ids in callbacks


@pytest.mark.parametrize(
    ("row_id", "run_id"),
    [
        ("abc", "{good}"),
        ([1], "{good}"),
        ({"x": 1}, "{good}"),
        (10**30, "{good}"),
        (999, "{good}"),
        (1, "../../etc"),
        (1, None),
        (1, "no-such-run"),
    ],
)
def test_request_drill_down_answers_a_bad_id_with_a_message(
    server: Server, row_id: Any, run_id: str | None
) -> None:
    rid = run_id.format(good=server.good) if isinstance(run_id, str) else run_id
    status, out = server.callback(
        ["detail-request-view.children"],
        {"detail-requests.active_cell": {"row": 0, "column": 0, "row_id": row_id}},
        {"detail-run-id.data": rid},
    )
    assert status == 200, out
    view = json.dumps(out["detail-request-view"]["children"])
    assert "invalid" in view or "not in this run" in view or "no run" in view


@pytest.mark.parametrize(
    "inputs",
    [
        {"page": "x", "size": 10, "sort": []},
        {"page": 0, "size": [3], "sort": []},
        {"page": 0, "size": 10, "sort": "ttft"},
        {"page": 0, "size": 10, "sort": [{"column_id": ["x"]}]},
    ],
)
def test_request_table_answers_bad_paging_without_a_500(
    server: Server, inputs: dict[str, Any]
) -> None:
    status, out = server.callback(
        ["detail-requests.data"],
        {
            "detail-requests.page_current": inputs["page"],
            "detail-requests.page_size": inputs["size"],
            "detail-requests.sort_by": inputs["sort"],
        },
        {"detail-run-id.data": server.good},
    )
    assert status == 200, out
    assert isinstance(out["detail-requests"]["data"], list)


@pytest.mark.parametrize("sweep", [["x"], "../../etc/passwd", "no-such-sweep", 7])
def test_sweep_selection_answers_a_bad_id_with_a_message(server: Server, sweep: Any) -> None:
    status, out = server.callback(["sweeps-body.children"], {"sweeps-select.value": sweep})
    assert status == 200, out
    assert "sweep" in json.dumps(out["sweeps-body"]["children"])


@pytest.mark.parametrize("ids", [["../x", "no-such-run"], [["x"], {"y": 1}], "not-a-list"])
def test_compare_answers_bad_ids_with_a_message(server: Server, ids: Any) -> None:
    status, out = server.callback(
        ["compare-body.children"], {"compare-runs.value": ids, "compare-baseline.value": None}
    )
    assert status == 200, out
    assert "compare-body" in out
