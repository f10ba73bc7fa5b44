# Two commands from a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,train]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mesh demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[test,train,bench]'

clean:
	rm -rf $(VENV) build *.egg-info
