# blasnet: every target installs what it needs first (into .venv).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CORE   := $(VENV)/.installed-core
STAMP  := $(VENV)/.installed

.PHONY: install run test bench clean

install: $(STAMP)

# Re-install only when the project metadata changes; otherwise this is instant. The core
# (numpy, scipy, threadpoolctl, numba) first: `make test` compiles the kernels beside the
# install of the extras.
$(CORE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The build backend (pyproject's build-system) in the venv itself: the two editable
	# installs below then skip building a throwaway build environment each (~2 s apiece).
	$(PY) -m pip install --quiet 'setuptools>=77'
	$(PY) -m pip install --quiet --no-build-isolation -e .
	touch $(CORE)

$(STAMP): $(CORE)
	$(PY) -m pip install --quiet --no-build-isolation -e '.[test,plot,interop,mpi]'
	touch $(STAMP)

run: install
	$(PY) -m engine train --verbose

# The kernels the tests need are compiled beside the install of the extras and then beside
# the tests, over every CPU (numba compiles lazily, one kernel at a time, in each test process
# otherwise): the tests compile what they reach first themselves and then load the rest from
# the shared disk cache. With a warm cache this only loads them. The tests run as two pytest
# processes at once (tests/run_groups.py). The exit status is the install's, else the tests'.
test: $(CORE)
	$(PY) -m kernels.precompile & \
	$(MAKE) --no-print-directory install && $(PY) tests/run_groups.py -q; status=$$?; wait; \
	exit $$status

# QUICK=1 runs a shortened bench (fewer rounds, no large shapes on one thread, fewer
# processes for the run-to-run spread, tiny shapes for the compile time).
bench: install
	$(PY) bench/run.py $(if $(QUICK),--quick,)
	$(PY) bench/spread.py $(if $(QUICK),--quick,)
	$(PY) bench/distributed.py $(if $(QUICK),--quick,)
	$(PY) bench/attention.py $(if $(QUICK),--quick,)
	$(PY) -m bench.checkpoint_memory $(if $(QUICK),--quick,) --out bench/results/checkpoint_memory.json >/dev/null
	$(PY) bench/compile_time.py $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache bench/results/*.json
