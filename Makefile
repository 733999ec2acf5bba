# Two commands do everything on a fresh machine with Python 3 and make:
#   make demo   bake a project with the defaults and train it on offline synthetic data
#   make test   run the template's whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR := build/demo
DEMO_PROJECT := $(DEMO_DIR)/vision_project

.PHONY: demo test lint clean

$(STAMP): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-test.txt
	touch $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/cookiecutter --no-input --output-dir $(DEMO_DIR) .
	$(BIN)/python -m pip install --quiet --no-deps -e $(DEMO_PROJECT)
	cd $(DEMO_PROJECT) && $(abspath $(BIN))/python train.py --config configs/synthetic.yaml --accelerator cpu

test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist worksteal --durations=15 tests

lint: $(STAMP)
	$(BIN)/ruff check hooks tests
	$(BIN)/ruff format --check hooks tests

clean:
	rm -rf $(VENV) build
