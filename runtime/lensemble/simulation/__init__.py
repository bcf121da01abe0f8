"""Running a federation on one machine: the harness behind ``lensemble simulate``.

The DiLoCo core (:mod:`lensemble.federation`) knows nothing of data, models or evaluation; this
package puts them together for a run on one machine and reports on it:

- :mod:`~lensemble.simulation.in_process`: every participant and the coordinator in this process,
  over the deterministic in-process transport;
- :mod:`~lensemble.simulation.local_processes`: one process per role on loopback, over the
  network transport with TLS;
- :mod:`~lensemble.simulation.baselines`: what the federation is judged against: the
  pooled-data oracle and the FedAvg ablation (next to each participant training alone);
- :mod:`~lensemble.simulation.evaluation`: held-out scores of the global model and of every
  baseline;
- :mod:`~lensemble.simulation.summary`: round metrics, the run's result and its JSON summary;
- :mod:`~lensemble.simulation.output`: what a run writes where, and what a new run replaces;
- :mod:`~lensemble.simulation.report`: the report plot.

Evaluation reads every participant's held-out episodes, which only this harness may do: it stands
for each participant evaluating inside its own trust domain.
"""
