# Two commands do everything on a fresh machine with Python 3 and make:
#   make demo   bake a project with the defaults, install it with the library, and train it on offline synthetic data
#   make test   run the library's test suite, then the template's
# CI (.ci/run) runs `make test-lowest` after them: the audit's suite and a baked project's at the lowest versions declared.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LIBRARY := lightning-kit
DEMO_DIR := build/demo
DEMO_PROJECT := $(DEMO_DIR)/vision_project

# The environment of the lowest versions declared (requirements-lowest.txt), apart from .venv.
LOWEST_VENV := .venv-lowest
LOWEST_BIN := $(LOWEST_VENV)/bin
LOWEST_STAMP := $(LOWEST_VENV)/.installed
LOWEST_PROJECT := build/lowest/vision_project
# The audit's suite: the simulated GPU, the audit and its command, the GPU-only branches, DDP's passes, the batches
# Lightning's move leaves on the CPU; and the private names of other projects the library relies on and the
# wording of jsonargparse's errors the one-line messages read (lightning_kit.upstream).
AUDIT_TESTS := test_simulated_gpu.py test_audit.py test_gpu_branches.py test_ddp.py test_placement_main.py \
	test_unmoved_batches.py test_upstream.py test_upstream_jsonargparse.py
LOWEST_TESTS := $(patsubst $(LIBRARY)/%,%,$(wildcard $(addprefix $(LIBRARY)/tests/,$(AUDIT_TESTS))))

.PHONY: demo test test-lowest lint clean

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

# A new environment whenever the pins change, so that nothing newer is left from an earlier install.
$(LOWEST_STAMP): requirements-lowest.txt $(LIBRARY)/pyproject.toml
	rm -rf $(LOWEST_VENV)
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_BIN)/python -m pip install --quiet -r requirements-lowest.txt
	$(LOWEST_BIN)/python -m pip install --quiet --no-deps -e ./$(LIBRARY)
	touch $(LOWEST_STAMP)

# The audit's suite, then a baked project's own suite (the sequence task: no torchvision imports beside the lowest
# torch), at the lowest versions declared; the second runs even when the first fails, and make fails if either does.
test-lowest: $(LOWEST_STAMP)
	cd $(LIBRARY) && $(abspath $(LOWEST_BIN))/python -m pytest -n auto --dist worksteal $(LOWEST_TESTS); \
	  audit=$$?; \
	  cd .. && rm -rf $(dir $(LOWEST_PROJECT)) && \
	  $(LOWEST_BIN)/cookiecutter --no-input --output-dir $(dir $(LOWEST_PROJECT)) . task=sequence && \
	  cd $(LOWEST_PROJECT) && $(abspath $(LOWEST_BIN))/python -m pytest -n auto --dist worksteal; \
	  project=$$?; \
	  test $$audit -eq 0 && test $$project -eq 0

lint: $(STAMP)
	$(BIN)/ruff check hooks tests $(LIBRARY)
	$(BIN)/ruff format --check hooks tests $(LIBRARY)

clean:
	rm -rf $(VENV) $(LOWEST_VENV) build
