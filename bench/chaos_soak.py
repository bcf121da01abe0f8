"""Chaos soak: the Compose stack keeps committing while its participants are killed, frozen, cut.

``lensemble up`` runs ``config/local.yaml`` on the Compose stack (network transport, mutual TLS,
cpu profile: a coordinator and 4 participant containers, quorum 3) with the lean data of the
engine e2e tests and their fault rounds (300 inner steps; ``tests.support.stack``), and as many
rounds as ``--minutes`` holds at ``--round-s`` each. From the opening of round 0, every
``--period-s`` seconds one participant is hit, in turn (kill, freeze, cut; alpine, coastal,
delta, highland; over 12 faults each participant meets each fault once):

- **kill**: every process in the container is SIGKILLed from inside
  (:func:`tests.support.stack.crash`) and the stack's restart policy brings the container back.
  Not ``docker kill``: Docker counts that as a manual stop and never applies the restart
  policy to it. The policy is ``on-failure:3`` and Docker never resets its count, so from a
  container's 4th crash on the policy gives up; the soak then starts the container itself
  (``docker start``, which resets the count) and says so (``restarted_by``).
- **freeze**: ``docker pause`` for ``--hold-s`` seconds, then ``docker unpause``.
- **cut**: ``docker network disconnect`` from its network (its only one: it then reaches
  nothing) for ``--hold-s`` seconds, then ``docker network connect``.

One participant at a time: a fault is injected only once the previous victim is back, that is
listed among the contributors of a round committed after it was healed; a fault that had to
wait for that is late, and the report says by how much. Faults go on until the run ends.

Reported (printed, and as JSON to ``--out``), all from the coordinator's ledger:

- **wall time** ``W``: from ``opened_at`` of the ledger's first attempt (round 0 attempt 0) to
  ``closed_at`` of its last committed attempt (the stack's start-up before it is reported
  apart).
- **goodput** ``= sum(wall_s of every committed attempt) / W``, ``wall_s`` being the ledger's
  time of an attempt from its opening to the new model's hash. A committed round slowed by a
  fault (a straggler cutoff, a liveness timeout) counts in full; what goodput leaves out is
  aborted attempts and the time between attempts (the previous commit's checkpoint write and
  ledger line, the next opening). ``fault-free equivalent`` is stricter: committed rounds x
  the median ``wall_s`` of the committed rounds that excluded nobody, over ``W``.
- **rounds lost** ``= aborted attempts + planned rounds that never committed`` (target 0).
- each attempt's exclusions (participant -> the ledger's reason) beside the faults in progress
  during it, and where the time went: committed, aborted and between-attempt seconds, the
  rounds' ``wall_s`` by what they excluded.
- whether the committed hash chain equals that of ``lensemble simulate`` (in process, no
  network) of the same config with ``--faults drop:<participant>@<round>.<attempt>,...`` built
  from the ledger's ``excluded`` (:func:`tests.support.stack.drops`): the exclusions alone
  must explain the chain.

Needs a Docker engine and the images ``lensemble:0.1.0-cpu`` (``lensemble image build``); it
builds nothing. Run it on an otherwise quiet machine (the containers are limited to 0.5 CPU
each, and their rounds slow down under other load):

    python bench/chaos_soak.py --minutes 30 --out runs/chaos_soak.json
    python bench/chaos_soak.py --minutes 3 --period-s 30 --hold-s 25   # a short trial

The containers ask for 65,536 open files (``ulimits: nofile`` of the Compose file); an engine
whose own hard limit is lower cannot start them (runc: ``error setting rlimit type 7``).
``--nofile 20000`` renders the stack with that limit instead (nothing else changes; the
coordinator budgets its connections below whatever limit it has).

It takes about ``--minutes`` for the stack (plus a minute of start-up, more if faults stretch
rounds past ``--round-s``) and then about half as long again for the in-process reference,
which trains the 4 participants one after another on the host (``--no-reference`` skips it).
Figures and how they were measured: docs/performance.md ("Chaos soak on the Compose stack").
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lensemble.config import load_config  # noqa: E402
from lensemble.render.container import STATE_DIR  # noqa: E402
from tests.support.stack import (  # noqa: E402
    FAULT_ROUNDS,
    Up,
    compose_network,
    container,
    crash,
    docker,
    drops,
    simulated_chain,
    stack,
)

#: The faults, applied in this order, each to the next participant in sorted order.
KINDS = ("kill", "freeze", "cut")
#: An attempt's outcome as ``lensemble up`` shows it (the coordinator's ``round_closed`` event).
ROUND_CLOSED = re.compile(
    r"round (\d+) attempt (\d+) (committed|aborted)[^;]*; contributors ([^;]*)"
)
FIRST_OPENING = "round 0 attempt 0 open"
#: Seconds between samples of the host's load average, and the report's time windows.
LOAD_EVERY_S = 10.0
WINDOW_S = 300.0
#: ``lensemble`` with the Compose file's open-file limit (``ulimits: nofile``) set from its
#: first argument (``--nofile``).
LENSEMBLE_WITH_NOFILE = (
    "import sys; import lensemble.render.compose as compose; "
    "compose.NOFILE = int(sys.argv.pop(1)); sys.argv[0] = 'lensemble'; "
    "from lensemble.cli import main; main()"
)


@dataclass
class Fault:
    """One fault and its outcome; times are seconds since the epoch (the ledger's clock).

    ``back`` is when the victim was first listed among a committed round's contributors after
    ``healed`` (None: the run ended first); ``late_s`` how long the fault waited for the
    previous victim past its turn.
    """

    kind: str
    participant: str
    started: float
    healed: float | None = None
    back: float | None = None
    late_s: float = 0.0
    restarted_by: str | None = None
    error: str | None = None


class Chaos:
    """Injects the faults in turn from a thread of its own while the main thread follows the run."""

    def __init__(
        self,
        project: str,
        participants: list[str],
        *,
        period_s: float,
        hold_s: float,
        restart_wait_s: float,
    ) -> None:
        self.project = project
        self.participants = participants
        self.period_s = period_s
        self.hold_s = hold_s
        self.restart_wait_s = restart_wait_s
        self.faults: list[Fault] = []
        self.first_opening: float | None = None
        self.stop = threading.Event()
        self._opened = threading.Event()
        self._cond = threading.Condition()
        self._contributed: dict[str, float] = {}  # participant -> last committed round's time
        self._active: Fault | None = None
        self.load: list[tuple[float, float]] = []  # (time, 1-minute load average)
        self._thread = threading.Thread(target=self._loop, name="chaos", daemon=True)
        self._sampler = threading.Thread(target=self._sample_load, name="load", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._sampler.start()

    def _sample_load(self) -> None:
        """The host's 1-minute load average every :data:`LOAD_EVERY_S` (what else ran)."""
        while not self.stop.wait(LOAD_EVERY_S):
            self.load.append((time.time(), float(Path("/proc/loadavg").read_text().split()[0])))

    def finish(self) -> None:
        """Stop injecting, heal whatever is still faulted, and wait for the thread."""
        self.stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=300)
        self._sampler.join(timeout=LOAD_EVERY_S + 5)

    def watch(self, line: str) -> None:
        """See one line of ``lensemble up`` (called by :meth:`Up.run` on the main thread)."""
        if self.first_opening is None and FIRST_OPENING in line:
            self.first_opening = time.time()
            self._opened.set()
        match = ROUND_CLOSED.search(line)
        if match and match.group(3) == "committed":
            now = time.time()
            with self._cond:
                for pid in match.group(4).split(","):
                    self._contributed[pid.strip()] = now
                self._cond.notify_all()

    def _loop(self) -> None:
        while not self._opened.wait(1.0):
            if self.stop.is_set():
                return
        due = time.time() + self.period_s
        index = 0
        while not self.stop.wait(max(due - time.time(), 0.0)):
            kind = KINDS[index % len(KINDS)]
            pid = self.participants[index % len(self.participants)]
            fault = Fault(kind, pid, started=time.time())
            if self.faults and self.faults[-1].back is not None:
                fault.late_s = max(self.faults[-1].back - due, 0.0)
            self.faults.append(fault)
            say(f"{fault.kind} {pid}" + (f" ({fault.late_s:.1f} s late)" if fault.late_s else ""))
            self._inject(fault)
            due = fault.started + self.period_s
            self._wait_back(fault)
            index += 1

    def _inject(self, fault: Fault) -> None:
        service = f"participant-{fault.participant}"
        self._active = fault
        try:
            target = container(self.project, service)
            if fault.kind == "kill":
                fault.restarted_by = self._kill(target, service)
            elif fault.kind == "freeze":
                docker("pause", target)
                self.stop.wait(self.hold_s)
                docker("unpause", target)
            else:
                net = compose_network(self.project, f"net-{fault.participant}")
                docker("network", "disconnect", net, target)
                self.stop.wait(self.hold_s)
                docker("network", "connect", net, target)
        except (AssertionError, subprocess.SubprocessError) as err:
            fault.error = str(err).strip().splitlines()[0][:300]
            self._heal(fault)
        fault.healed = time.time()
        say(
            f"{fault.kind} {fault.participant} healed" + (f": {fault.error}" if fault.error else "")
        )
        self._active = None

    def _kill(self, target: str, service: str) -> str:
        """Crash the container; who started it again (``policy`` or ``soak``)."""
        before = docker("inspect", "--format", "{{.State.StartedAt}}", target)
        crash(self.project, service)
        deadline = time.monotonic() + self.restart_wait_s
        while time.monotonic() < deadline and not self.stop.is_set():
            status, started = docker(
                "inspect", "--format", "{{.State.Status}} {{.State.StartedAt}}", target
            ).split()
            if status == "running" and started != before:
                return "policy"
            time.sleep(0.5)
        if docker("inspect", "--format", "{{.State.Status}}", target) == "exited":
            docker("start", target)
            return "soak"
        return "policy"

    def _heal(self, fault: Fault) -> None:
        """Undo a freeze or a cut that may still be in place (best effort, errors ignored)."""
        target = container(self.project, f"participant-{fault.participant}")
        if fault.kind == "freeze":
            subprocess.run(["docker", "unpause", target], capture_output=True, check=False)
        elif fault.kind == "cut":
            net = compose_network(self.project, f"net-{fault.participant}")
            subprocess.run(
                ["docker", "network", "connect", net, target], capture_output=True, check=False
            )

    def _wait_back(self, fault: Fault) -> None:
        healed = fault.healed or fault.started
        with self._cond:
            while not self.stop.is_set():
                seen = self._contributed.get(fault.participant, 0.0)
                if seen > healed:
                    fault.back = seen
                    say(f"{fault.participant} back")
                    return
                self._cond.wait(5.0)

    def heal_all(self) -> None:
        """After :meth:`finish`: undo the fault in progress, if the thread was stopped in one."""
        if self._active is not None:
            self._heal(self._active)


def say(what: str) -> None:
    """Print a progress line with the time of day."""
    print(f"{datetime.now(UTC):%H:%M:%S} {what}", flush=True)


def epoch(iso: str) -> float:
    """Seconds since the epoch of a ledger timestamp (ISO 8601, UTC)."""
    return datetime.fromisoformat(iso).astimezone(UTC).timestamp()


def read_ledger(up: Up) -> list[dict[str, Any]]:
    """The coordinator's ledger: the copy ``lensemble up`` made, else out of its container."""
    path = up.stack / "ledger.jsonl"
    if not path.exists():
        coordinator = container(up.project, "coordinator")
        subprocess.run(
            ["docker", "cp", f"{coordinator}:{STATE_DIR}/ledger.jsonl", str(path)],
            capture_output=True,
            check=False,
            timeout=120,
        )
    return up.ledger if path.exists() else []


def faults_during(faults: list[Fault], start: float, end: float) -> list[str]:
    """``kind participant`` of each fault whose outage (injection to back) overlaps the span."""
    return [
        f"{f.kind} {f.participant}"
        for f in faults
        if f.started < end and (f.back if f.back is not None else math.inf) > start
    ]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def windows(
    attempts: list[dict[str, Any]], load: Sequence[tuple[float, float]]
) -> list[dict[str, Any]]:
    """Per :data:`WINDOW_S` of the run (by opening): rounds, their times, the host's load."""
    start = epoch(attempts[0]["opened_at"])
    rows: list[dict[str, Any]] = []
    for lo in range(0, int(epoch(attempts[-1]["opened_at"]) - start) + 1, int(WINDOW_S)):
        span = [a for a in attempts if lo <= epoch(a["opened_at"]) - start < lo + WINDOW_S]
        stragglers = [a["wall_s"] for a in span if "straggler" in a["excluded"].values()]
        loads = [v for t, v in load if lo <= t - start < lo + WINDOW_S]
        rows.append(
            {
                "from_s": lo,
                "attempts": len(span),
                "clean_median_s": median([a["wall_s"] for a in span if not a["excluded"]]),
                "all_median_s": median([a["wall_s"] for a in span]),
                "straggler_rounds": len(stragglers),
                "straggler_s": sum(stragglers),
                "load_median": median(loads),
            }
        )
    return rows


def summarise(
    ledger: list[dict[str, Any]],
    faults: list[Fault],
    planned: int,
    load: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """The figures of the run (see the module docstring for their definitions)."""
    attempts = [
        {
            "round": r["round"],
            "attempt": r["attempt"],
            "state": r["state"],
            "wall_s": r["wall_s"],
            "opened_at": r["opened_at"],
            "closed_at": r["closed_at"],
            "contributors": r["contributors"],
            "excluded": r["excluded"],
            "faults": faults_during(faults, epoch(r["opened_at"]), epoch(r["closed_at"])),
        }
        for r in ledger
    ]
    committed = [a for a in attempts if a["state"] == "closed"]
    aborted = [a for a in attempts if a["state"] != "closed"]
    if not committed:
        return {"attempts": attempts, "committed_rounds": 0, "planned_rounds": planned}
    start = epoch(attempts[0]["opened_at"])
    wall = epoch(committed[-1]["closed_at"]) - start
    committed_s = sum(a["wall_s"] for a in committed)
    aborted_s = sum(a["wall_s"] for a in aborted)
    clean = [a["wall_s"] for a in committed if not a["excluded"]]
    by_reasons: dict[str, list[float]] = {}
    for a in committed:
        key = ", ".join(sorted(set(a["excluded"].values()))) or "none"
        by_reasons.setdefault(key, []).append(a["wall_s"])
    excess: dict[str, dict[str, float]] = {}
    for a in committed if clean else []:
        key = "+".join(sorted({f.split()[0] for f in a["faults"]})) or "no fault"
        row = excess.setdefault(key, {"rounds": 0, "excess_s": 0.0})
        row["rounds"] += 1
        row["excess_s"] += a["wall_s"] - statistics.median(clean)
    gaps = [epoch(b["opened_at"]) - epoch(a["closed_at"]) for a, b in pairwise(attempts)]
    backs = [f.back - f.healed for f in faults if f.back is not None and f.healed is not None]
    return {
        "planned_rounds": planned,
        "committed_rounds": len(committed),
        "aborted_attempts": len(aborted),
        "rounds_lost": len(aborted) + planned - len(committed),
        "wall_s": wall,
        "goodput": committed_s / wall,
        "committed_s": committed_s,
        "aborted_s": aborted_s,
        "between_attempts_s": wall - committed_s - aborted_s,
        "gap_median_s": median(gaps),
        "gap_max_s": max(gaps, default=None),
        "clean_round_median_s": median(clean),
        "fault_free_equivalent": len(committed) * statistics.median(clean) / wall
        if clean
        else None,
        "excess_over_clean_by_fault": excess,
        "rounds_by_exclusion": {
            k: {
                "rounds": len(v),
                "median_s": median(v),
                "max_s": max(v),
                "sum_s": sum(v),
            }
            for k, v in sorted(by_reasons.items())
        },
        "faults_by_kind": dict(Counter(f.kind for f in faults)),
        "restarted_by": dict(Counter(f.restarted_by for f in faults if f.restarted_by)),
        "fault_errors": [f"{f.kind} {f.participant}: {f.error}" for f in faults if f.error],
        "faults_late": sum(1 for f in faults if f.late_s > 0),
        "fault_late_max_s": max((f.late_s for f in faults), default=0.0),
        "back_after_heal_median_s": median(backs),
        "back_after_heal_max_s": max(backs, default=None),
        "not_back": [f"{f.kind} {f.participant}" for f in faults if f.back is None],
        "windows": windows(attempts, load),
        "attempts": attempts,
    }


def reference(
    work: Path, sets: list[str], ledger: list[dict[str, Any]], timeout: float
) -> dict[str, Any]:
    """The in-process chain with the ledger's exclusions, against the committed one."""
    chain = [r["model_hash"] for r in ledger if r["state"] == "closed"]
    done = [r for r in ledger if r["round"] < len(chain)]  # a failed round is not replayed
    began = time.monotonic()
    try:
        simulated = simulated_chain(
            work / "sim",
            *sets,
            "--set",
            f"federation.rounds={len(chain)}",
            faults=drops(done),
            timeout=timeout,
        )
    except (AssertionError, subprocess.SubprocessError) as err:
        return {"equal": None, "error": str(err)[-2000:], "seconds": time.monotonic() - began}
    first_difference = next(
        (i for i, (a, b) in enumerate(zip(chain, simulated, strict=False)) if a != b), None
    )
    return {
        "equal": chain == simulated,
        "rounds": len(simulated),
        "first_difference": first_difference,
        "drops": sum(len(r["excluded"]) for r in done),
        "seconds": time.monotonic() - began,
    }


def show(summary: dict[str, Any], faults: list[Fault], code: int) -> None:
    """Print the attempts that excluded anyone or aborted, then the figures."""
    print(
        f"{'round':>5} {'att':>3} {'state':<8} {'wall_s':>7}  {'excluded':<38} faults in progress"
    )
    rows = [a for a in summary["attempts"] if a["excluded"] or a["state"] != "closed"]
    for a in rows:
        excluded = ", ".join(f"{p}={why}" for p, why in sorted(a["excluded"].items()))
        print(
            f"{a['round']:>5} {a['attempt']:>3} {a['state']:<8} {a['wall_s']:>7.2f}  "
            f"{excluded:<38} {'; '.join(a['faults'])}"
        )
    print(f"({len(summary['attempts']) - len(rows)} attempts committed with everyone)")
    print()
    print("faults (s since the first opening; back = first committed round with the victim):")
    origin = epoch(summary["attempts"][0]["opened_at"]) if summary["attempts"] else 0.0
    for f in faults:
        healed = f"{f.healed - origin:7.1f}" if f.healed else "      -"
        back = f"{f.back - origin:7.1f}" if f.back else "      -"
        extra = f"  restarted by {f.restarted_by}" if f.restarted_by else ""
        extra += f"  {f.late_s:.1f} s late" if f.late_s else ""
        extra += f"  ERROR {f.error}" if f.error else ""
        print(
            f"  {f.started - origin:7.1f} {f.kind:<6} {f.participant:<9} healed {healed}"
            f" back {back}{extra}"
        )
    print()
    s = summary
    if not s.get("committed_rounds"):
        print(f"no round committed; lensemble up exited {code}")
        return
    if s.get("startup_s") is not None:
        print(f"start-up: {s['startup_s']:.1f} s from lensemble up to round 0's opening")
    print(
        f"run: {s['committed_rounds']} of {s['planned_rounds']} planned rounds committed in "
        f"{s['wall_s']:.1f} s (first opening to last commit); lensemble up exited {code}"
    )
    print(
        f"goodput: {100 * s['goodput']:.2f} % (committed attempts' wall_s {s['committed_s']:.1f} s"
        f" / {s['wall_s']:.1f} s)"
    )
    print(
        f"rounds lost: {s['rounds_lost']} (aborted attempts {s['aborted_attempts']}, "
        f"rounds never committed {s['planned_rounds'] - s['committed_rounds']})"
    )
    print(
        f"time: committed {s['committed_s']:.1f} s, aborted {s['aborted_s']:.1f} s, between "
        f"attempts {s['between_attempts_s']:.1f} s (median gap {s['gap_median_s'] or 0:.2f} s, "
        f"max {s['gap_max_s'] or 0:.2f} s)"
    )
    for key, row in s["rounds_by_exclusion"].items():
        print(
            f"  rounds excluding {key:<24} {row['rounds']:>4}  median {row['median_s']:.2f} s  "
            f"max {row['max_s']:.2f} s  sum {row['sum_s']:.1f} s"
        )
    if s["fault_free_equivalent"] is not None:
        print(
            f"fault-free equivalent: {s['committed_rounds']} x {s['clean_round_median_s']:.2f} s"
            f" = {100 * s['fault_free_equivalent']:.1f} % of the wall time"
        )
    for key, row in sorted(s["excess_over_clean_by_fault"].items()):
        print(
            f"  rounds during {key:<26} {row['rounds']:>4}  {row['excess_s']:+.1f} s against the "
            "median round excluding nobody"
        )
    print(
        f"faults: {s['faults_by_kind']}; restarted by {s['restarted_by']}; "
        f"{s['faults_late']} late (max {s['fault_late_max_s']:.1f} s); victim back after "
        f"healing: median {s['back_after_heal_median_s'] or 0:.1f} s, max "
        f"{s['back_after_heal_max_s'] or 0:.1f} s; not back when the run ended: "
        f"{s['not_back'] or 'none'}"
    )
    print(f"per {WINDOW_S:.0f} s of the run (by opening):")
    for w in s["windows"]:
        load = f"{w['load_median']:.1f}" if w["load_median"] is not None else "-"
        print(
            f"  from {w['from_s']:>5} s: {w['attempts']:>3} attempts, median "
            f"{w['all_median_s']:.2f} s (excluding nobody {w['clean_median_s'] or 0:.2f} s), "
            f"{w['straggler_rounds']} straggler rounds {w['straggler_s']:.1f} s, host load {load}"
        )
    for error in s["fault_errors"]:
        print(f"  fault error: {error}")


def main() -> None:
    """Run the soak, print the table and figures, write ``--out``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="Length of the run.")
    parser.add_argument(
        "--round-s",
        type=float,
        default=7.0,
        help="Expected seconds per round, which sets the rounds (minutes x 60 / round-s).",
    )
    parser.add_argument("--rounds", type=int, default=None, help="Rounds, instead of the above.")
    parser.add_argument("--period-s", type=float, default=30.0, help="Seconds between faults.")
    parser.add_argument(
        "--hold-s",
        type=float,
        default=25.0,
        help="Seconds a freeze or cut lasts (default above network.liveness_timeout_s, 20 s).",
    )
    parser.add_argument(
        "--restart-wait-s",
        type=float,
        default=20.0,
        help="Seconds a killed container may take to be restarted by its policy before the "
        "soak starts it.",
    )
    parser.add_argument(
        "--nofile",
        type=int,
        default=None,
        help="Open-file limit of the containers instead of the Compose file's 65536, for an "
        "engine whose own hard limit is lower (runc then fails: 'error setting rlimit type 7').",
    )
    parser.add_argument("--no-reference", action="store_true", help="Skip the simulate chain.")
    parser.add_argument("--out", type=Path, default=Path("runs/chaos_soak.json"))
    args = parser.parse_args()

    rounds = args.rounds or max(1, math.ceil(args.minutes * 60 / args.round_s))
    sets = [*FAULT_ROUNDS, "--set", f"federation.rounds={rounds}"]
    participants = sorted(load_config(REPO / "config/local.yaml").participant_ids)
    run_deadline = 3 * args.minutes * 60 + 900
    began = time.time()
    print(f"chaos soak: {rounds} rounds, a fault every {args.period_s:.0f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="chaos-soak-") as tmp:
        work = Path(tmp)
        command = ["lensemble"]
        if args.nofile is not None:
            command = [sys.executable, "-c", LENSEMBLE_WITH_NOFILE, str(args.nofile)]
        with stack(work, *sets, prefix="lens-soak", command=command) as up:
            chaos = Chaos(
                up.project,
                participants,
                period_s=args.period_s,
                hold_s=args.hold_s,
                restart_wait_s=args.restart_wait_s,
            )
            chaos.start()
            try:
                code = up.run({}, deadline_s=run_deadline, watch=chaos.watch)
            finally:
                chaos.finish()
                chaos.heal_all()
            ledger = read_ledger(up)
            tail = up.lines[-20:]
        summary = summarise(ledger, chaos.faults, rounds, chaos.load)
        if chaos.first_opening is not None:
            summary["startup_s"] = chaos.first_opening - began
        summary["up_exit_code"] = code
        if code != 0:
            summary["up_tail"] = tail
        show(summary, chaos.faults, code)
        if not args.no_reference and ledger:
            print("\nin-process reference (lensemble simulate with the same exclusions)...")
            summary["reference"] = reference(work, sets, ledger, timeout=run_deadline + 3600)
            ref = summary["reference"]
            if ref["equal"] is None:
                print(f"hash chain: reference failed: {ref['error'][-500:]}")
            else:
                print(
                    f"hash chain: {'EQUAL' if ref['equal'] else 'DIFFERENT'} to the simulation"
                    f" with the same {ref['drops']} exclusions ({ref['rounds']} rounds, "
                    f"{ref['seconds']:.0f} s)"
                    + (
                        f"; first difference at round {ref['first_difference']}"
                        if not ref["equal"]
                        else ""
                    )
                )
    summary["settings"] = {
        "minutes": args.minutes,
        "rounds": rounds,
        "period_s": args.period_s,
        "hold_s": args.hold_s,
        "restart_wait_s": args.restart_wait_s,
        "nofile": args.nofile,
        "sets": sets,
        "started": datetime.fromtimestamp(began, UTC).isoformat(timespec="seconds"),
    }
    summary["faults"] = [asdict(f) for f in chaos.faults]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"summary written to {args.out}")


if __name__ == "__main__":
    main()
