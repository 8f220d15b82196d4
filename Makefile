# The README's two commands: `make demo` and `make test`. Both build .venv from the pinned requirements when it is
# missing or older than them; torch and torchvision come from this machine's disk (exact pins, plain pip).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export GRADIO_ANALYTICS_ENABLED := False

.PHONY: demo test bench venv chromium clean gallery-index checkpoints pretrained space

# Python compiles a module the first time a process imports it; with PYTHONDONTWRITEBYTECODE set (these machines set
# it) it keeps nothing, and every test's interpreter would compile torch anew. So the recipes here keep what they
# compile, and pip compiles nothing ahead: the suite imports a small part of what it installs, each module compiled
# once, by the first process to import it (docs/benchmarks.md, "The test suite").
unexport PYTHONDONTWRITEBYTECODE

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) app.py

# The browser tests drive Debian's chromium (Playwright's own browser download fails offline: never use it).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "chromium is missing: install Debian's chromium (sudo apt-get install chromium) for the browser tests"; fi; }

# The venv (pip, mostly unpacking) and chromium (apt, mostly downloading) are built side by side. Then two workers,
# one per core, one test file each at a time (its module fixtures, a served app say, set up once; files that share a
# session's server as one), the files of long tests handed out first (tests/conftest.py)
# (docs/benchmarks.md, "The test suite").
test:
	$(MAKE) --no-print-directory -j 2 venv chromium
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: venv
	$(PY) bench/run_all.py

# Each bundled retrieval checkpoint ships its test split's gallery index and its views' figures
# (checkpoints/NAME/gallery/), so the app's first search needs no embedding; the pretrained backbone (make pretrained)
# ships none. Rebuilt only where missing or stale: its stamp records the sha256 of the weights it was built from
# (memvir/retrieval/shipped_gallery.py).
gallery-index: venv
	$(PY) -m memvir index $(addprefix checkpoints/,$(BUNDLED))

# Retrain the bundled checkpoints with the commands their model cards give (into fresh run folders), copy their Hub
# files in, then index their galleries. They are the widened fair comparison's seed-0 finals (docs/reproduction.md,
# "A converged search"; bench/fair_study.py, profile wide): the app's glyphs preset, MemVir balanced with its
# tuned optimiser, and the baseline with its own (its loss x2 after the warm-up included), each chosen by the same
# search on validation classes; retrained on glyphs v2, without the three mis-drawn images (the studies ran on v1:
# docs/reproduction.md, "The data's version").
BUNDLED := glyphs-norm-softmax-baseline glyphs-norm-softmax-memvir
checkpoints: venv
	rm -rf $(addprefix runs/,$(BUNDLED))
	$(PY) -m memvir train --dataset glyphs --loss norm-softmax --scale 17.1 --memvir-n 0 --memvir-m 50 \
	    --warmup-epochs 2 --epochs 12 --batch-size 128 --lr 0.000702 --class-lr 0.00287 --adam-eps 0.0001 \
	    --loss-scale-after-warmup 2 --seed 0 --eval-every 3 --out runs/glyphs-norm-softmax-baseline
	$(PY) -m memvir train --dataset glyphs --loss norm-softmax --scale 17.1 --memvir-n 4 --memvir-m 10 \
	    --warmup-epochs 2 --epochs 12 --batch-size 128 --lr 0.000702 --class-lr 0.00287 --adam-eps 0.0001 \
	    --memvir-reduction balanced --seed 0 --eval-every 3 --out runs/glyphs-norm-softmax-memvir
	for name in $(BUNDLED); do \
	  cp runs/$$name/config.json runs/$$name/model.safetensors runs/$$name/README.md checkpoints/$$name/ || exit 1; \
	done
	$(MAKE) gallery-index

# The pretrained backbone checkpoints/glyphs-pretrain-convnet/, the stand-in for an ImageNet backbone in the paper's
# setting (docs/method.md, "Pretraining and fine-tuning"): the CPU convnet trained on glyphs-pretrain with plain
# Norm-softmax (no MemVir) and the baseline optimiser the first fair comparison chose on glyphs; the minutes it takes
# are in docs/benchmarks.md. Fine-tune from it with `python -m memvir train --dataset glyphs-few --init
# checkpoints/glyphs-pretrain-convnet ...`. No gallery index: it is a backbone to start from (the app still lists it,
# and indexes its gallery on the first search).
PRETRAINED := glyphs-pretrain-convnet
pretrained: venv
	rm -rf runs/$(PRETRAINED)
	$(PY) -m memvir train --dataset glyphs-pretrain --loss norm-softmax --scale 13.3 --memvir-n 0 --epochs 30 \
	    --batch-size 128 --lr 0.000351 --class-lr 0.00443 --adam-eps 1e-08 --seed 0 --eval-every 10 \
	    --out runs/$(PRETRAINED)
	mkdir -p checkpoints/$(PRETRAINED)
	cp runs/$(PRETRAINED)/config.json runs/$(PRETRAINED)/model.safetensors runs/$(PRETRAINED)/README.md \
	    checkpoints/$(PRETRAINED)/

# Put the app on a Hugging Face Space: `make space SPACE=owner/name` after `hf auth login`. The Hub's upload stores the
# binary files with Xet/LFS as .gitattributes marks them (a plain `git push` of them to a Space is refused); what stays
# here is listed in SPACE_EXCLUDE (tests/app/test_deploy.py checks that the rest is what a Space needs).
SPACE_EXCLUDE := .venv/* runs/* tests/* bench/* .ci/* test-output/* .cache/* */__pycache__/* *.pyc *.pyi
space: venv
	@test -n "$(SPACE)" || { echo "usage: make space SPACE=owner/name (log in first: hf auth login)"; exit 2; }
	HF_HUB_OFFLINE=0 $(VENV)/bin/hf upload $(SPACE) . . --repo-type space \
	    $(foreach pattern,$(SPACE_EXCLUDE),--exclude '$(pattern)')
