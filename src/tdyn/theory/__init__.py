"""The papers' closed forms and bounds live in each paper package (``tdyn/papers/<paper>/theory.py``); the
module paths of earlier versions (``tdyn.theory.scan_snap``, …) still import them (the manifests' aliases)."""
