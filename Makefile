# `make demo` and `make test` each create .venv if missing and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-core

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/tdyn reproduce scan-snap/fig4 --out runs/demo/scan-snap-fig4 --force
	$(BIN)/tdyn reproduce real/attention-maps --quick --out runs/demo/real-attention-maps --force
	@echo "demo outputs: runs/demo/scan-snap-fig4 (results.json, loss.csv, fig4.png), runs/demo/real-attention-maps"

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache
