"""Each participant's private data: environments, trajectories and their cache."""
