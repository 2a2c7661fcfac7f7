"""Reproductions of the papers' figures and tables: they wire tasks, probes and theory, and judge.

Importing this package imports nothing else: ``registry.MODULES`` is the explicit table of which
module registers which reproduction, imported on lookup.
"""
