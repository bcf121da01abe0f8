"""Lensemble's Pulumi program and its components (run by ``pulumi`` from ``infra/``)."""
