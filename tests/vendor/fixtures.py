"""Fixture distributions, a loopback package index and fixture third_party/ projects.

Everything here is built by the tests themselves: small sdists and wheels, served by a PEP 691
simple index on 127.0.0.1, so the vendoring workflow runs end to end without the network.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import textwrap
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.cli import CliResult, run_tool

LICENSE_TEXT = b"MIT License\n\nCopyright (c) upstream authors\n"

DEMO_V1 = {
    "PKG-INFO": b"Metadata-Version: 2.4\nName: demo-pkg\nVersion: 1.0\nLicense-Expression: MIT\n",
    "LICENSE": LICENSE_TEXT,
    "demo_pkg/__init__.py": b'GREETING = "hello"\nLOUD = False\n',
    "demo_pkg/util.py": b"def double(x):\n    return 2 * x\n",
}
# 2.0 rewrites the line patch 0001 changes; util.py (patched by 0002) is unchanged.
DEMO_V2 = {
    **DEMO_V1,
    "PKG-INFO": DEMO_V1["PKG-INFO"].replace(b"Version: 1.0", b"Version: 2.0"),
    "demo_pkg/__init__.py": b'GREETING = "hi there"\nLOUD = False\nGENERATION = 2\n',
}


def dep3(description: str = "Make the demo louder", **overrides: str | None) -> str:
    """A DEP-3 header; pass ``Field=None`` to leave a field out."""
    fields: dict[str, str | None] = {
        "Description": description,
        "Origin": "vendor, https://example.invalid/lensemble",
        "Forwarded": "no",
        "Last-Update": "2026-01-31",
    }
    fields.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return "".join(f"{k}: {v}\n" for k, v in fields.items() if v is not None) + "---\n"


PATCH_LOUD = dep3() + textwrap.dedent(
    """\
    diff --git a/demo_pkg/__init__.py b/demo_pkg/__init__.py
    --- a/demo_pkg/__init__.py
    +++ b/demo_pkg/__init__.py
    @@ -1,2 +1,2 @@
    -GREETING = "hello"
    +GREETING = "HELLO"
     LOUD = False
    """
)

PATCH_TRIPLE = dep3("Add triple()") + textwrap.dedent(
    """\
    diff --git a/demo_pkg/util.py b/demo_pkg/util.py
    --- a/demo_pkg/util.py
    +++ b/demo_pkg/util.py
    @@ -1,2 +1,6 @@
     def double(x):
         return 2 * x
    +
    +
    +def triple(x):
    +    return 3 * x
    """
)


def sdist_bytes(
    name: str, version: str, files: dict[str, bytes], *, extra_member: str = ""
) -> bytes:
    """A ``.tar.gz`` with one top-level ``<name>-<version>/`` folder, as build backends make."""
    buf = io.BytesIO()
    top = f"{name.replace('-', '_')}-{version}"
    # gzip stamps the current time into its header unless told otherwise; a fixed mtime keeps
    # the bytes (and so the sha256 a test compares) the same from one call to the next.
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        entries = [(f"{top}/{rel}", data) for rel, data in sorted(files.items())]
        if extra_member:
            entries.append((extra_member, b"x"))
        for path, data in entries:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def wheel_bytes(files: dict[str, bytes]) -> bytes:
    """A wheel (zip) holding ``files`` at their paths."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as whl:
        for rel, data in sorted(files.items()):
            whl.writestr(rel, data)
    return buf.getvalue()


def sdist_name(package: str, version: str) -> str:
    """PEP 625 file name of an sdist."""
    return f"{package.replace('-', '_')}-{version}.tar.gz"


@dataclass
class LoopbackIndex:
    """A PEP 691 simple index on 127.0.0.1 serving in-memory files."""

    base: str = ""
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # package -> name -> bytes
    tampered: dict[str, bytes] = field(default_factory=dict)  # file name -> bytes served instead

    @property
    def simple(self) -> str:
        """The index URL to put in a manifest."""
        return f"{self.base}/simple"

    def add(self, package: str, filename: str, data: bytes) -> str:
        """Publish a file; returns its SHA-256."""
        self.files.setdefault(package, {})[filename] = data
        return hashlib.sha256(data).hexdigest()


def _handler(index: LoopbackIndex) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            parts = [p for p in self.path.split("/") if p]
            if len(parts) == 2 and parts[0] == "simple" and parts[1] in index.files:
                listing = {
                    "meta": {"api-version": "1.1"},
                    "name": parts[1],
                    "versions": [],
                    "files": [
                        {
                            "filename": fn,
                            "url": f"../../files/{fn}",
                            "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                        }
                        for fn, data in index.files[parts[1]].items()
                    ],
                }
                body = json.dumps(listing).encode()
                self._send(200, body, "application/vnd.pypi.simple.v1+json")
                return
            if len(parts) == 2 and parts[0] == "files":
                for published in index.files.values():
                    if parts[1] in published:
                        data = index.tampered.get(parts[1], published[parts[1]])
                        self._send(200, data, "application/octet-stream")
                        return
            self._send(404, b"not found", "text/plain")

    return Handler


@pytest.fixture
def index() -> Iterator[LoopbackIndex]:
    """A loopback package index, shut down after the test."""
    served = LoopbackIndex()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    served.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def write_project(
    root: Path,
    name: str,
    *,
    package: str,
    index_url: str,
    distribution: str = "sdist",
    license_file: str | None = "LICENSE",
    exception: bool = False,
    patches: dict[str, str] | None = None,
) -> Path:
    """Create ``root/third_party/<name>/`` with a manifest and a patch series."""
    project = root / "third_party" / name
    (project / "patches").mkdir(parents=True)
    lines = [
        "[upstream]",
        f'package = "{package}"',
        f'distribution = "{distribution}"',
        f'index_url = "{index_url}"',
        f'import_names = ["{package.replace("-", "_")}"]',
        "",
        "[license]",
        'spdx = "MIT"',
    ]
    if license_file:
        lines.append(f'file = "{license_file}"')
    if exception:
        lines += [
            "",
            "[license.exception]",
            'reason = "releases ship no LICENSE although metadata says MIT"',
            'source = "PKG-INFO License-Expression"',
            "date = 2026-01-31",
            'sync_note = "drop this table once a release ships LICENSE"',
        ]
    (project / "vendor.toml").write_text("\n".join(lines) + "\n")
    for patch_name, text in (patches or {}).items():
        (project / "patches" / patch_name).write_text(text)
    return project


@dataclass
class Workspace:
    """A fixture repository root with one demo project published on a loopback index."""

    root: Path
    index: LoopbackIndex
    project: Path

    def vendor(self, *args: str) -> CliResult:
        """Run ``python -m tools.vendor ARGS --root ROOT``."""
        return run_tool("vendor", *args, "--root", str(self.root))

    @property
    def src(self) -> Path:
        """The demo project's materialised tree."""
        return self.project / "src"

    @property
    def lock(self) -> dict[str, object]:
        """The demo project's lock, parsed."""
        data: dict[str, object] = json.loads((self.project / "vendor.lock.json").read_text())
        return data


@pytest.fixture
def demo(tmp_path: Path, index: LoopbackIndex) -> Workspace:
    """``demo-pkg`` 1.0 and 2.0 on the loopback index; project with patches 0001 and 0002."""
    index.add("demo-pkg", sdist_name("demo-pkg", "1.0"), sdist_bytes("demo-pkg", "1.0", DEMO_V1))
    index.add("demo-pkg", sdist_name("demo-pkg", "2.0"), sdist_bytes("demo-pkg", "2.0", DEMO_V2))
    project = write_project(
        tmp_path,
        "demo_pkg",
        package="demo-pkg",
        index_url=index.simple,
        patches={"0001-greet-loudly.patch": PATCH_LOUD, "0002-add-triple.patch": PATCH_TRIPLE},
    )
    return Workspace(root=tmp_path, index=index, project=project)


@pytest.fixture
def pinned(demo: Workspace) -> Workspace:
    """The demo project pinned to 1.0 and synced."""
    result = demo.vendor("sync", "--update", "demo-pkg==1.0")
    assert result.code == 0, result.err
    return demo
