"""Draw the dashboard's panels from a live Prometheus, where no Grafana runs.

    python -m tools.dashboard_plot --prometheus http://127.0.0.1:PORT --minutes 15

Every panel of :data:`tools.dashboard.ROWS` becomes one matplotlib axis; each of its queries is
run through Prometheus's ``/api/v1/query_range`` over the last ``--minutes`` and drawn as one
line per series, labelled as the dashboard's legend would label it. The image in the README was
drawn this way from a real Compose run with the ``monitoring`` profile.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tools.dashboard import ROWS, PanelSpec

_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def query_range(base: str, expr: str, start: float, end: float, step: float) -> list[Any]:
    """The ``matrix`` result of one range query (a list of ``{metric, values}``)."""
    params = urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"--prometheus must be an http(s) URL, not {base!r}")
    url = f"{base}/api/v1/query_range?{params}"
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (http(s) only)
        body = json.loads(response.read())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
    return list(body["data"]["result"])


def _label(legend: str, metric: dict[str, str]) -> str:
    return _LEGEND.sub(lambda m: metric.get(m.group(1), ""), legend).strip() or "value"


def _scale(spec: PanelSpec) -> tuple[float, str]:
    if spec.unit == "bytes":
        return 1 / 2**20, "MiB"
    if spec.unit == "percentunit":
        return 100.0, "%"
    return 1.0, {"s": "seconds", "ops": "per second"}.get(spec.unit, "")


def plot(base: str, start: float, end: float, out: Path) -> int:
    """Draw every panel into ``out``; returns the number of series drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [spec for _, row in ROWS for spec in row]
    columns = 3
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
    step = max(1.0, (end - start) / 400)
    drawn = 0
    for ax, spec in zip(axes.flat, panels, strict=False):
        factor, unit = _scale(spec)
        for query in spec.queries:
            for series in query_range(base, query.expr, start, end, step):
                xs = [(float(t) - start) / 60 for t, _ in series["values"]]
                ys = [float(v) * factor for _, v in series["values"]]
                ax.step(xs, ys, where="post", label=_label(query.legend, series["metric"]))
                drawn += 1
        if spec.budget is not None:
            ax.axhline(spec.budget * factor, color="red", linestyle="--", label="budget")
        ax.set_title(spec.title, fontsize=10)
        ax.set_xlabel("minutes", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("Lensemble federation: the dashboard's panels from Prometheus query results")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    return drawn


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--prometheus URL --minutes N --out PNG``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="base URL of Prometheus")
    parser.add_argument("--minutes", type=float, default=15.0, help="window ending now")
    parser.add_argument(
        "--out", type=Path, default=Path("docs/images/dashboard-from-prometheus.png")
    )
    args = parser.parse_args(argv)
    end = time.time()
    drawn = plot(args.prometheus.rstrip("/"), end - 60 * args.minutes, end, args.out)
    print(f"wrote {args.out}: {drawn} series")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
