# The README's two commands: `make demo` and `make test`. Both build .venv from the pinned requirements when it is
# missing or older than them; torch and torchvision come from this machine's disk (exact pins, plain pip).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export GRADIO_ANALYTICS_ENABLED := False

.PHONY: demo test bench venv chromium clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) app.py

# The browser tests drive Debian's chromium (Playwright's own browser download fails offline: never use it).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "chromium is missing: install Debian's chromium (sudo apt-get install chromium) for the browser tests"; fi; }

test: venv chromium
	$(PY) -m pytest -q

bench: venv
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache
