# lsgd: `make demo` runs the main job on real Fashion-MNIST; `make test` runs the suite.
# Both create the virtual environment and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
LSGD   := $(VENV)/bin/lsgd
STAMP  := $(VENV)/.installed
FMNIST_DEB := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: install data demo test bench clean

install: $(STAMP)

# torch and torchvision come together from the registry (the standard build runs on CPU too).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

# Fashion-MNIST: Debian's dataset-fashion-mnist package when apt is usable as root, else
# torchvision's download into data/.
# Jane Austen's novels (dataset=text): `apt-get download r-cran-janeaustenr` + dpkg-deb -x into a
# temporary folder, extracted to $(LSGD_DATA or data)/text/austen/*.txt and checked against the
# SHA-256 in lsgd/data/austen.py; then the BPE tokenizer is trained on the training split.
AUSTEN := $${LSGD_DATA:-data}/text/austen/emma.txt
data: install
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && { [ ! -f $(FMNIST_DEB) ] || [ ! -f $(AUSTEN) ]; }; then \
	  apt-get update -qq || echo "apt-get update failed; using the package lists as they are"; fi
	@if [ ! -f $(FMNIST_DEB) ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist \
	  || echo "apt-get failed; falling back to torchvision's download"; fi
	$(LSGD) data fashion_mnist
	$(LSGD) data text

demo: data
	$(LSGD) train -m experiment=fmnist_demo algo=ddp,local_sgd,slowmo
	$(LSGD) report results/fmnist_demo --out results/fmnist_demo/report
	@echo "report: results/fmnist_demo/report/report.md"

test: data
	$(PY) -m pytest -q tests

bench: install
	$(PY) scripts/bench_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
