# Two commands do everything on a fresh machine with Python 3 and make:
#   make demo   bake a project with the defaults, install it with the library, and train it on offline synthetic data
#   make test   run the library's test suite, then the template's
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LIBRARY := lightning-kit
DEMO_DIR := build/demo
DEMO_PROJECT := $(DEMO_DIR)/vision_project

.PHONY: demo test lint clean

# The pinned test environment, and the library from this checkout, editable: its tests and the template's
# import it, and a baked project's requirement of it (the folder beside the template) is met by it.
$(STAMP): requirements-test.txt $(LIBRARY)/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-test.txt
	$(BIN)/python -m pip install --quiet --no-deps -e ./$(LIBRARY)
	touch $(STAMP)

# The project requires the library beside this template (file:///.../lightning-kit): pip installs the project
# with it, and whatever else the project needs that the environment lacks. That install of the library is a
# built copy; the editable one goes back after it, so that the tests see the library's files as they are.
demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/cookiecutter --no-input --output-dir $(DEMO_DIR) .
	$(BIN)/python -m pip install --quiet -e $(DEMO_PROJECT)
	$(BIN)/python -m pip install --quiet --no-deps -e ./$(LIBRARY)
	cd $(DEMO_PROJECT) && $(abspath $(BIN))/python train.py --config configs/synthetic.yaml --accelerator cpu

# The library's suite (lightning-kit/tests, with its own conftest and settings) and the template's (tests/).
# pytest takes one rootdir and one conftest.py per folder name: two sessions, one after the other, so each
# suite runs under its own pyproject.toml; the second runs even when the first fails, and make fails if either does.
test: $(STAMP)
	cd $(LIBRARY) && $(abspath $(BIN))/python -m pytest -n auto --dist worksteal --durations=15 tests; \
	  library=$$?; \
	  cd .. && $(BIN)/python -m pytest -n auto --dist worksteal --durations=15 tests; \
	  template=$$?; \
	  test $$library -eq 0 && test $$template -eq 0

lint: $(STAMP)
	$(BIN)/ruff check hooks tests $(LIBRARY)
	$(BIN)/ruff format --check hooks tests $(LIBRARY)

clean:
	rm -rf $(VENV) build
