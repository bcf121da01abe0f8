"""Cost of the Kubernetes path per environment: Helm render, Kustomize build, schema validation.

Median of 5 runs after one warm-up, in milliseconds, with the object count and the size of the
final manifests. Also the whole ``lensemble render k8s`` process (start-up included).

    python bench/k8s_render.py
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNS = 5
ENVS = ("local", "staging", "sovereign-prod")


def median_ms(fn: Callable[[], Any]) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1000 * statistics.median(samples)


def main() -> None:
    # No options: --help prints what this bench measures.
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    import kubernetes_validate
    import kubernetes_validate.utils as kv_utils

    from lensemble.config import load_config
    from lensemble.render.helm_values import render_helm_values
    from lensemble.render.k8s import dump_manifests, render_chart, render_k8s
    from lensemble.render.k8s_policy import violations

    exe = shutil.which("lensemble") or sys.exit("lensemble is not installed (pip install -e .)")
    print(
        f"{'env':15} {'objects':>7} {'bytes':>7} {'helm ms':>8} {'helm+kustomize ms':>18} "
        f"{'validate ms':>12} {'validate cached ms':>19} {'policy ms':>10} {'CLI process ms':>15}"
    )
    original = kv_utils.schema_contents
    for env in ENVS:
        cfg = load_config(REPO / "config" / f"{env}.yaml")
        values = render_helm_values(cfg)
        docs = render_k8s(cfg, env).manifests

        def validate(docs: list[dict[str, Any]] = docs) -> None:
            for doc in docs:
                if "." not in doc["apiVersion"].split("/")[0]:
                    kubernetes_validate.validate(doc, "1.33", strict=True)

        kv_utils.schema_contents = original
        plain = median_ms(validate)
        kv_utils.schema_contents = functools.cache(original)
        cached = median_ms(validate)
        kv_utils.schema_contents = original
        cli = [exe, "render", "k8s", "--config", f"config/{env}.yaml"]
        process = median_ms(
            lambda cli=cli: subprocess.run(cli, cwd=REPO, capture_output=True, check=True)
        )
        print(
            f"{env:15} {len(docs):7d} {len(dump_manifests(docs)):7d} "
            f"{median_ms(lambda v=values: render_chart(v)):8.1f} "
            f"{median_ms(lambda c=cfg, e=env: render_k8s(c, e)):18.1f} "
            f"{plain:12.1f} {cached:19.1f} "
            f"{median_ms(lambda d=docs, c=cfg: violations(d, c)):10.2f} "
            f"{process:15.1f}"
        )


if __name__ == "__main__":
    main()
