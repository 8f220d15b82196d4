# The README's two commands: `make demo` and `make test`. Both build .venv from the pinned requirements when it is
# missing or older than them; torch and torchvision come from this machine's disk (exact pins, plain pip).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export GRADIO_ANALYTICS_ENABLED := False

.PHONY: demo test bench venv clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m memvir train --dataset glyphs --epochs 3 --out runs/demo

test: venv
	$(PY) -m pytest -q

bench: venv
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache
