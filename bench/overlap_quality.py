"""What overlapping communication with training costs in accuracy: the field's variants.

Blocking DiLoCo makes every participant wait, after its inner steps, for its upload, the
coordinator's aggregation and the new model's download. An overlapped variant starts the next
round's inner steps at once, from the newest global model it already holds, which is one round
older than the one blocking DiLoCo would train from. This script measures, in memory and with
the coordinator's own arithmetic (:class:`lensemble.simulation.baselines.DilocoRun`: the
pseudo-gradient, the norm bound and aggregator, the outer step), what that staleness costs the
final model's union error, for each variant:

- ``blocking``: DiLoCo as the runtime runs it; round ``t`` trains from ``G_t``.
- ``delayed``: the one-step-delayed outer update ("naive delayed", Kale, Douillard & Donchev,
  "Eager updates for overlapped communication and computation in DiLoCo", 2025, sec. 3):
  round ``t`` trains from ``G_{t-1}``; the coordinator applies the mean pseudo-gradient to
  ``G_t`` as today.
- ``eager``: the same paper's eager update, written for a coordinator: participant ``m``
  trains round ``t`` from ``G_{t-1}`` moved by its own fresh share of the outer step,
  ``G_{t-1} - lr * (1 + momentum) * delta_m^{t-1} / N`` (Nesterov's first-step weight; the
  paper runs the outer optimizer, momentum included, on every worker).
- ``mix:A``: Streaming DiLoCo's merge (Douillard et al., 2025, sec. 2.3) with a full round of
  overlap: participant ``m`` trains round ``t`` from ``G_{t-1} - A * delta_m^{t-1}``, the newest
  global model plus ``A`` of its own last round's progress (``A`` = the local weight). This is
  the runtime's ``federation.overlap.mode: one_round`` with ``local_weight`` A.

Every variant is deterministic (canonical participant order, the run's seeds). Per variant,
root seed and N it writes one JSON line (final and best-round union error, the curve) to
``--out`` (appended; a (variant, settings, N, seed) already there is skipped) and prints, per
variant and N, each seed's final error over blocking DiLoCo's at the config's defaults.

    nice -n 19 python bench/overlap_quality.py -n 4 -n 8 --seeds 7,1,2,3,4 \\
        --variant blocking: --variant mix:0.75:federation.outer_optimizer.momentum=0 \\
        --out runs/overlap.jsonl

A variant is ``KIND[:A]:PATH=VALUE,...`` (``blocking:`` is the config as it is). One variant for
one seed trains N x H x R inner steps (20 rounds at N = 4: about 8 s on one core).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from federation_payoff import union_error

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import ParticipantData, load_or_collect
from lensemble.federation.diloco import OuterStep, Params, pseudo_gradient
from lensemble.simulation.baselines import DilocoRun

REPO = Path(__file__).resolve().parents[1]
KINDS = ("blocking", "delayed", "eager", "mix")


class OverlappedRun(DilocoRun):
    """:class:`DilocoRun` whose round ``t`` trains from a base one round behind (see module).

    Args:
        config: The run's config.
        datasets: Participant id -> its data.
        outer: The outer step.
        kind: One of :data:`KINDS`.
        local_weight: ``A`` of ``mix`` (unitless); ignored otherwise.
    """

    def __init__(
        self,
        config: LensembleConfig,
        datasets: Mapping[str, ParticipantData],
        outer: OuterStep,
        kind: str,
        local_weight: float = 0.0,
    ) -> None:
        super().__init__(config, datasets, outer)
        self.kind = kind
        self.local_weight = local_weight
        self.previous: Params = self.params  # G_{t-1}
        self.own: dict[str, Params] = {}  # each participant's pseudo-gradient of round t - 1

    def _base(self, pid: str, round_index: int) -> Mapping[str, torch.Tensor]:
        """The model participant ``pid`` trains round ``round_index`` from."""
        if self.kind == "blocking" or round_index == 0:
            return self.params
        own = self.own.get(pid)
        if self.kind == "delayed" or own is None:
            return self.previous
        if self.kind == "eager":
            o = self.outer
            weight = o.lr * ((1 + o.momentum) if o.nesterov else 1.0) / len(self.learners)
        else:
            weight = self.local_weight
        return {k: v - weight * own[k] for k, v in self.previous.items()}

    def train_until(self, rounds: int) -> Params:
        """Run the rounds not run yet, up to ``rounds`` in all; return the global parameters."""
        for round_index in range(self.rounds, rounds):
            deltas: dict[str, Params] = {}
            for pid, learner in sorted(self.learners.items()):
                base = self._base(pid, round_index)
                trained = learner.train_round(base, round_index, self.steps).params
                deltas[pid] = pseudo_gradient(base, trained)
            combined = self._combine(deltas)
            self.own, self.previous = deltas, self.params
            self.params, self.momentum = self.outer.apply(self.params, combined, self.momentum)
        self.rounds = max(self.rounds, rounds)
        return self.params


def parse_variant(text: str) -> tuple[str, str, float, list[str]]:
    """``KIND[:A]:PATH=VALUE,...`` -> (name, kind, local weight, overrides).

    Raises:
        SystemExit: The kind is unknown or ``mix`` lacks its weight.
    """
    kind, _, rest = text.partition(":")
    if kind not in KINDS:
        raise SystemExit(f"--variant {text!r}: the kind must be one of {', '.join(KINDS)}.")
    weight = 0.0
    if kind == "mix":
        value, _, rest = rest.partition(":")
        try:
            weight = float(value)
        except ValueError:
            raise SystemExit(f"--variant {text!r}: write mix:A:... with A a number.") from None
    overrides = [item for item in rest.split(",") if item]
    name = f"{kind}:{weight:g}" if kind == "mix" else kind
    if overrides:
        # The field's last name and its value: "momentum=0,lr=0.5".
        name += " " + ",".join(
            f"{path.rsplit('.', 1)[-1]}={value}"
            for path, _, value in (o.partition("=") for o in overrides)
        )
    return name, kind, weight, overrides


def run_variant(
    config: LensembleConfig,
    datasets: dict[str, ParticipantData],
    kind: str,
    weight: float,
) -> dict[str, Any]:
    """Train one variant for ``federation.rounds``; its curve of union errors, one per round."""
    fed = config.federation
    outer = OuterStep(
        fed.outer_optimizer.lr, fed.outer_optimizer.momentum, fed.outer_optimizer.nesterov
    )
    run = OverlappedRun(config, datasets, outer, kind, weight)
    start = time.perf_counter()
    curve = [union_error(config, run.train_until(r), datasets) for r in range(1, fed.rounds + 1)]
    return {
        "final": curve[-1],
        "best": min(curve),
        "curve": curve,
        "seconds": round(time.perf_counter() - start, 1),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Per variant and N: the mean final error and each seed's final error over blocking's."""
    blocking = {
        (r["n"], r["rounds"], r["seed"]): r["final"] for r in rows if r["variant"] == "blocking"
    }
    lines = [
        "| variant | N | rounds | seeds | mean final error | final / blocking, per seed | worst |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["n"], r["rounds"]), []).append(r)
    for (variant, n, rounds), rs in sorted(
        groups.items(), key=lambda g: (g[0][1], g[0][2], g[0][0])
    ):
        rs.sort(key=lambda r: r["seed"])
        ratios = [
            r["final"] / blocking[(n, rounds, r["seed"])]
            for r in rs
            if (n, rounds, r["seed"]) in blocking
        ]
        shown = ", ".join(f"{x:.3f}" for x in ratios) or "-"
        worst = f"{max(ratios):.3f}" if ratios else "-"
        lines.append(
            f"| {variant} | {n} | {rounds} | {len(rs)} "
            f"| {statistics.fmean(r['final'] for r in rs):.4f} | {shown} | {worst} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run the variants named on the command line and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config" / "local.yaml"))
    parser.add_argument("-n", dest="counts", type=int, action="append", default=[])
    parser.add_argument("--seeds", default="7", help="Comma-separated root seeds.")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="KIND[:A]:PATH=VALUE,... with KIND one of blocking, delayed, eager, mix (mix:A: "
        "local weight A); repeatable",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/overlap_quality.jsonl"))
    parser.add_argument("--table-only", action="store_true", help="Summarise --out and stop.")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(x) for x in args.out.read_text().splitlines()] if args.out.exists() else []
    variants = [parse_variant(v) for v in args.variant or ["blocking:"]]
    seen = {(r["variant"], r["n"], r["rounds"], r["seed"]) for r in done}
    with tempfile.TemporaryDirectory() as tmp:
        for n in [] if args.table_only else args.counts or [4]:
            for seed in (int(s) for s in args.seeds.split(",")):
                datasets: dict[str, ParticipantData] | None = None
                for name, kind, weight, overrides in variants:
                    if (name, n, args.rounds, seed) in seen:
                        continue
                    config = load_config(
                        args.config,
                        [
                            *overrides,
                            f"federation.participant_count={n}",
                            "federation.quorum=0",
                            f"federation.rounds={args.rounds}",
                            f"run.root_seed={seed}",
                            f"run.output_dir={tmp}/data-{n}-{seed}",
                        ],
                    )
                    if datasets is None:  # the data depend on N and the seed only
                        datasets = {p: load_or_collect(config, p) for p in config.participant_ids}
                    row = run_variant(config, datasets, kind, weight)
                    row.update(
                        variant=name, overrides=overrides, n=n, rounds=args.rounds, seed=seed
                    )
                    with args.out.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(row, sort_keys=True) + "\n")
                    done.append(row)
                    print(
                        f"{name} N={n} seed={seed}: final {row['final']:.4f} "
                        f"(best {row['best']:.4f}) [{row['seconds']} s]",
                        flush=True,
                    )
    print(table(done))


if __name__ == "__main__":
    main()
