# Spark Runbook. Two commands for a newcomer: `make runbook` and `make test`; `make check` is the developer's
# quick loop (no lab, under 5 minutes).
PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
PROFILE ?= env/lab.env
ARGS    ?=
LAB_VLLM_VENV := .lab/vllm-venv
APT_PACKAGES := openssh-server iperf3 ethtool iputils-ping sshfs busybox-static docker.io rsync \
  nfs-ganesha nfs-ganesha-vfs libnfs-utils openmpi-bin perftest docker-registry sudo nfs-kernel-server

.PHONY: install runbook rehearse test check test-unit test-lab lab-up lab-down lab-status lab-deps lab-vllm lab-ray jupyter browser-deps test-browser clean-results

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m ipykernel install --sys-prefix --name runbook --display-name "Python (runbook)" >/dev/null
	touch $@

# Debian packages the lab needs inside its nodes (root). Real Sparks need none of this.
lab-deps:
	@missing=""; for b in sshd iperf3 ethtool ping sshfs busybox dockerd rsync ganesha.nfsd nfs-cat mpirun ib_write_bw docker-registry sudo visudo exportfs; do \
	  command -v $$b >/dev/null 2>&1 || [ -x /usr/sbin/$$b ] || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then echo "lab-deps: installing (missing:$$missing)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; fi

# CPU build of vLLM for the lab only (about 3 min, 2.5 GB); never needed on real Sparks. --vision adds
# the torchvision that vLLM's multimodal models import (the lab's tiny LLaVA vision test).
lab-vllm: $(LAB_VLLM_VENV)/.installed-vision
$(LAB_VLLM_VENV)/.installed-vision: runbook/lab/install_vllm.sh
	bash runbook/lab/install_vllm.sh --vision $(LAB_VLLM_VENV)
	touch $@

# PyPI's Ray for EXECUTOR=ray on the lab (5 s, 242 MB): .lab/ray-site beside the venv, installed with its pip
# (only ray and msgpack, which the venv lacks), on PYTHONPATH only for Ray's own commands (docs/four-nodes.md)
lab-ray: .lab/ray-site/.installed
.lab/ray-site/.installed: runbook/lab/install_vllm.sh $(LAB_VLLM_VENV)/.installed-vision
	bash runbook/lab/install_vllm.sh --vision --ray $(LAB_VLLM_VENV)
	touch $@

lab-up: install lab-deps
	$(PY) -m runbook lab up
lab-down: install
	$(PY) -m runbook lab down
lab-status: install
	$(PY) -m runbook lab status

# A lab profile (LAB=1) also needs the lab's CPU vLLM build.
LAB_PROFILE := $(shell grep -qs '^LAB=1' $(PROFILE) && echo yes)

# The whole runbook on PROFILE (default: the embedded lab).
runbook: install $(if $(LAB_PROFILE),lab-deps lab-vllm)
	$(PY) -m runbook run --profile $(PROFILE) $(ARGS)

# Rehearse a recipe profile on the lab before touching your Sparks: make rehearse PROFILE=env/exl3-v41.env
rehearse: install lab-deps lab-vllm
	$(PY) -m runbook run --rehearse --profile $(PROFILE) $(ARGS)

# Both print diagnose's measured accuracy on the tests' corpus first (its floor is a unit test).
test: install lab-deps lab-vllm lab-ray browser-deps
	$(PY) -m runbook diagnose --accuracy
	$(PY) -m pytest tests -n 2 --dist loadgroup $(ARGS)

test-unit: install
	$(PY) -m runbook diagnose --accuracy
	$(PY) -m pytest tests/unit $(ARGS)

# The quick loop, no lab and no root: lint, the layer test, the unit tests but the slow ones (two workers; those
# that time the reference server, marked timed, after them in one process: a busy second worker skews their clocks),
# then notebooks 05-08 executed with nbmake against the shipped fakes (tests/run_notebooks.py).
check: install
	$(PY) -m pyflakes runbook tests
	$(PY) -m pytest tests/unit/test_layers.py -q
	$(PY) -m pytest tests/unit -n 2 -m "not slow and not timed" -q --ignore=tests/unit/test_layers.py $(ARGS)
	$(PY) -m pytest tests/unit -m "timed and not slow" -q $(ARGS)
	$(PY) tests/run_notebooks.py

# JupyterLab in the repo, new notebooks on the runbook kernel; JUPYTER_ARGS="--no-browser --port=8899" etc.
JUPYTER_ARGS ?=
jupyter: install
	$(VENV)/bin/jupyter lab --notebook-dir=. --ip=127.0.0.1 --MappingKernelManager.default_kernel_name=runbook \
	  --ServerApp.kernel_manager_class=jupyter_server.services.kernels.kernelmanager.AsyncMappingKernelManager \
	  $(if $(filter 0,$(shell id -u)),--allow-root) $(JUPYTER_ARGS)

# The JupyterLab browser test (tests/lab/test_jupyter_ui.py): Debian's chromium + playwright-core.
BROWSER_DIR := tests/browser
browser-deps: $(BROWSER_DIR)/node_modules/.installed
	@command -v chromium >/dev/null 2>&1 || { echo "browser-deps: installing chromium"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
$(BROWSER_DIR)/node_modules/.installed: $(BROWSER_DIR)/package.json $(BROWSER_DIR)/package-lock.json
	cd $(BROWSER_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

test-browser: install lab-deps browser-deps
	$(PY) -m pytest tests/lab/test_jupyter_ui.py $(ARGS)

clean-results:
	find results -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
