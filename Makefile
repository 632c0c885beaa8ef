# lsgd: `make demo` runs the main job on real Fashion-MNIST; `make test` runs the suite.
# Both create the virtual environment and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
LSGD   := $(VENV)/bin/lsgd
STAMP  := $(VENV)/.installed
FMNIST_DEB := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
LOCK   := requirements.lock
UV_VERSION := 0.13.8

.PHONY: install lock debs data browser demo test bench docs clean

install: $(STAMP)

# Exactly the versions in requirements.lock (every file checked against the lock's sha256 hashes),
# then lsgd itself, editable and without dependencies (the lock holds them all). A changed lock or
# pyproject.toml reinstalls. torch and torchvision come together from the registry (the standard
# Linux build runs on CPU too). pyproject.toml keeps compatible ranges for `pip install lsgd`.
# uv (pinned above, the same that writes the lock) installs: it downloads in parallel, and a fresh
# machine's install of the ~3 GB set took 44 s with uv against 90 s and more with pip (measured
# 26 Nov 2026, fresh caches both). `make install INSTALLER=pip` uses pip alone.
# --compile-bytecode and compileall (pip compiles at install by itself): where PYTHONDONTWRITEBYTECODE
# is set, as on CI's machines, nothing is cached at import, and without .pyc files every worker
# process compiles torch's sources again: 3.8-4.4 s per `import lsgd.training.trainer` instead of 1.5-1.7 s,
# which made the suite 24.5 min instead of 15 (measured 26 Nov 2026). The import of lattice_fused has
# numba compile the lattice quantizer's loops into its on-disk cache (lsgd/compression/__pycache__,
# written whatever PYTHONDONTWRITEBYTECODE says): 2.7 s once here, instead of in every worker process
# that starts before the cache exists; later processes load it in 0.4 s.
INSTALLER ?= uv
$(STAMP): $(LOCK) pyproject.toml
	$(PYTHON) -m venv $(VENV)
ifeq ($(INSTALLER),pip)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install --require-hashes -r $(LOCK)
	$(PY) -m pip install --no-deps -e .
else
	$(PY) -m pip install -q "uv==$(UV_VERSION)"
	$(VENV)/bin/uv pip install --python $(PY) --compile-bytecode --require-hashes -r $(LOCK) \
	  || { echo "uv failed: installing with pip"; $(PY) -m pip install --require-hashes -r $(LOCK); }
	$(VENV)/bin/uv pip install --python $(PY) --no-deps -e .
	$(PY) -m compileall -q lsgd
endif
	$(PY) -c "import lsgd.compression.lattice_fused" \
	  || echo "numba did not compile the lattice loops: the lattice quantizer will take its torch path"
	$(PY) -c "import lsgd.algorithms.adasum.kernels as f; f.warm_up()" \
	  || echo "numba did not compile Adasum's dot products: Adasum will take its torch path"
	touch $(STAMP)

# `make lock` resolves pyproject.toml with the dev extra into requirements.lock with uv (pinned below,
# installed into the venv). It keeps every pin that still satisfies pyproject.toml; `make lock UPGRADE=1`
# moves everything to the newest releases. lock-constraints.txt holds torch and torchvision either way.
# Universal (--universal): one file for every OS, CPU and CPython >= 3.11, environment markers picking
# each machine's packages (torch's nvidia-* and triton wheels on Linux only). Its linux x86_64 /
# CPython 3.11 part, the one CI runs, is the same set a lock for that platform alone gives, so CI pays
# nothing for it, and a checkout on another platform still installs known versions (CI tests only
# linux x86_64 / CPython 3.11). CPython 3.10, which requires-python admits, is left out: rdata>=1.0
# needs 3.11, so nothing resolves there.
LOCK_FLAGS := pyproject.toml --extra dev --universal --python-version 3.11 --generate-hashes \
              --constraint lock-constraints.txt
define LOCK_HEADER
# requirements.lock: the exact versions, with sha256 hashes, of lsgd's dependencies and its dev extra.
# `make install` installs exactly these (pip install --require-hashes); CI runs green on them.
# Universal: one file for every platform and CPython >= 3.11, environment markers picking each machine's
# packages; CI installs and tests its linux x86_64 / CPython 3.11 part (the Makefile says why).
# Made by `make lock`; do not edit by hand. Command:
#   uv $(UV_VERSION): uv pip compile $(LOCK_FLAGS)
# Refresh it after changing pyproject.toml's dependencies (`make lock`) or to move to new releases
# (`make lock UPGRADE=1`); then run the whole suite and re-record the goldens if the numbers moved.
endef
export LOCK_HEADER

# uv keeps the pins it can from the file it writes to: it starts from a copy of the current lock.
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "uv==$(UV_VERSION)"
	if [ -f $(LOCK) ]; then cp $(LOCK) $(VENV)/lock.tmp; else rm -f $(VENV)/lock.tmp; fi
	$(VENV)/bin/uv pip compile $(LOCK_FLAGS) --no-header $(if $(UPGRADE),--upgrade) -o $(VENV)/lock.tmp
	{ printf '%s\n' "$$LOCK_HEADER"; cat $(VENV)/lock.tmp; } > $(LOCK)
	rm $(VENV)/lock.tmp

# Debian packages, installed as root with one apt-get when missing (and apt is usable):
# dataset-fashion-mnist (else torchvision's download into data/), iproute2 (ip, tc: launcher.emulate
# and its tests), chromium (the test that opens report.html in a headless browser,
# tests/unit/test_analysis.py: about 40 s and 290 MB on a machine without it; measured 25 Nov 2026,
# chromium 156, 25 packages), slurmctld, slurmd, slurm-client and munge (the real SLURM cluster of
# tests/slurm, whose fixture would otherwise install them inside the suite's time). The package lists are refreshed also when Austen's novels are missing
# (`lsgd data text` fetches them with `apt-get download`). `make test` and `make demo` run this
# beside the venv's install (make -j2): the two downloads overlap.
AUSTEN := $${LSGD_DATA:-data}/text/austen/emma.txt
APT_OK := [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null
debs:
	@missing=""; \
	[ -f $(FMNIST_DEB) ] || missing="$$missing dataset-fashion-mnist"; \
	command -v tc >/dev/null || missing="$$missing iproute2"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	for b in slurmctld slurmd sbatch munged; do command -v $$b >/dev/null || { \
	  missing="$$missing slurmctld slurmd slurm-client munge"; break; }; done; \
	if $(APT_OK) && { [ -n "$$missing" ] || [ ! -f $(AUSTEN) ]; }; then \
	  apt-get update -qq || echo "apt-get update failed; using the package lists as they are"; fi; \
	if [ -n "$$missing" ] && $(APT_OK); then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing \
	  || echo "apt-get install$$missing failed: Fashion-MNIST falls back to torchvision's download;" \
	          "launcher.emulate needs iproute2 (ip, tc); the report.html test needs chromium;" \
	          "tests/slurm need slurm-wlm and munge"; fi

# Fashion-MNIST from Debian's package (or torchvision's download). Jane Austen's novels
# (dataset=text): `apt-get download r-cran-janeaustenr` + dpkg-deb -x into a temporary folder,
# extracted to $(LSGD_DATA or data)/text/austen/*.txt and checked against the SHA-256 in
# lsgd/data/austen.py; then the BPE tokenizer is trained on the training split.
data: install debs
	$(LSGD) data fashion_mnist
	$(LSGD) data text

browser: debs

demo:
	$(MAKE) -j2 data
	$(LSGD) train -m experiment=fmnist_demo algo=ddp,local_sgd,slowmo
	$(LSGD) report results/fmnist_demo --out results/fmnist_demo/report
	@echo "report: results/fmnist_demo/report/report.md (one page: results/fmnist_demo/report/report.html)"

# Two pytest workers (pytest-xdist), each taking whole test files (--dist loadfile: a file's module
# fixtures, such as the golden runs, are made once): most tests wait on processes they start
# (launches, gloo groups, SLURM, the emulated network) and keep under one core busy, so a second
# worker fills the other core. Then the tests marked serial (they time this machine closely: a
# transfer against its bandwidth cap) run alone. `make test PYTEST_WORKERS=0` runs all in one process.
PYTEST_WORKERS ?= 2
test:
	$(MAKE) -j2 data
ifeq ($(PYTEST_WORKERS),0)
	$(PY) -m pytest -q tests
else
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not serial" tests
	$(PY) -m pytest -q -m serial tests
endif

# Every speed goal in one run (under 10 minutes on the 2-core machine): scripts/bench_all.py runs the
# bench scripts one after another and prints a table figure | goal | now | met from their BENCH lines.
bench: install
	$(PY) scripts/bench_all.py

# The documentation site (MkDocs, Material theme, mkdocstrings for the API reference; mkdocs.yml) into
# site/. --strict: a broken link between pages, a missing anchor or a reference to a symbol that no
# longer exists fails the build (tests/unit/test_docs.py builds it the same way).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

clean:
	rm -rf $(VENV) build *.egg-info
