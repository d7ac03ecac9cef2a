# The two commands a newcomer needs: `make demo` and `make test` (see README.md).
PY ?= python3
PIP ?= $(PY) -m pip

.PHONY: demo test lint deps system-deps python-deps lab-down

system-deps:
	@command -v systemd-nspawn >/dev/null && command -v debootstrap >/dev/null && command -v ssh >/dev/null \
	  && command -v patch >/dev/null && command -v git >/dev/null \
	  && command -v chromium >/dev/null && command -v promtool >/dev/null \
	  || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      systemd-container debootstrap openssh-client git make patch \
	      chromium prometheus >/dev/null)  # the report in a browser, promtool: tests/features/test_report.py, test_monitoring.py

python-deps:
	$(PIP) install -q -e '.[test]'
	$(PY) -c 'import torch' 2>/dev/null || $(PIP) install -q 'torch==2.13.0'

deps: system-deps python-deps

# The main job on the built-in default, the local lab.
K26 = $(PY) -m k26ops
demo: system-deps
	$(PIP) install -q -e .
	$(K26) lab up
	$(K26) inventory list
	$(K26) facts
	$(K26) check
	$(K26) deploy
	$(K26) status
	$(K26) snapshot --tag k26-baseline-working --force
	$(K26) diagnose log tests/data/logs/shape_mismatch_ddtree_tp8.log
	$(K26) diagnose cuda-graph --host lab1 --yes
	$(K26) deploy --check
	$(K26) rollback --tag k26-baseline-working
	@echo "demo done: the lab is still up (k26ops lab status); stop it with: k26ops lab down"

# The whole suite on TEST_WORKERS pytest-xdist processes (tests/README.md: why 2; `make test
# TEST_WORKERS=0` runs one process). --dist loadfile keeps a module's tests on one worker, so its
# module-scoped lab boots once; each worker boots its own shared `lab`.
TEST_WORKERS ?= 2
test: deps
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Style gates (.ci/run): ruff's formatter and linter, and mypy under its ceiling (tools/mypy_ceiling.py).
lint:
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) tools/mypy_ceiling.py

lab-down:
	$(PY) -m k26ops lab down
