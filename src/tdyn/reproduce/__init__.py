"""Reproductions of the papers' figures and tables: they wire tasks, probes and theory, and judge.

Importing this package imports nothing else: the papers' manifests (:mod:`tdyn.papers`) name the
module that registers each reproduction, imported on lookup.
"""
